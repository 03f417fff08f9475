//! A limit: N requests per period.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::ConfigError;

/// "N per period": at most `count` units of cost per `period`.
///
/// Periods run from 1 ms to [`Limit::MAX_PERIOD`] in whole microseconds.
/// Limits parse from strings such as `"100/min"`, `"10/s"`, `"25/5s"`,
/// `"5000/1h"` and `"1000/day"`: a count, a slash, an optional multiplier
/// and a unit (`us`, `ms`, `s`/`sec`/`second`, `m`/`min`/`minute`,
/// `h`/`hour`, `d`/`day`, `w`/`week`; plurals are accepted), or
/// `month` (`mo`, `months`): a calendar month, which takes no multiplier.
///
/// A monthly limit always counts calendar months: in UTC, or in the zone
/// of the policy's [`Calendar`](crate::Calendar). A limit per day or per
/// week is a fixed period of 24 hours or 7 days, aligned to the Unix epoch
/// (UTC midnights), unless its policy has a calendar, which aligns it to
/// local midnights (weeks from Monday) and the calendar's offset.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::Limit;
///
/// let limit: Limit = "25/5s".parse()?;
/// assert_eq!(limit.count(), 25);
/// assert_eq!(limit.period(), Duration::from_secs(5));
/// assert_eq!(limit, Limit::new(25, Duration::from_secs(5))?);
/// assert_eq!(limit.to_string(), "25/5s");
///
/// assert!("0/min".parse::<Limit>().is_err());
///
/// let monthly: Limit = "50000/month".parse()?;
/// assert!(monthly.is_monthly());
/// assert_eq!(monthly, Limit::per_month(50_000)?);
/// assert_eq!(monthly.to_string(), "50000/month");
/// # Ok::<(), tollgate_core::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    count: u64,
    period_us: u64,
    monthly: bool,
}

impl Limit {
    /// The largest count a limit may have.
    pub const MAX_COUNT: u64 = u32::MAX as u64;
    /// The longest period a limit may have (366 days).
    pub const MAX_PERIOD: Duration = Duration::from_secs(366 * 86_400);
    /// The shortest period a limit may have.
    pub const MIN_PERIOD: Duration = Duration::from_millis(1);

    /// The period of a monthly limit: 31 days, the longest month, which
    /// is what [`Limit::period`] reports for one.
    const MONTH_US: u64 = 31 * 86_400_000_000;

    /// A limit from parts that were taken from a valid limit.
    pub(crate) const fn from_parts(count: u64, period_us: u64, monthly: bool) -> Self {
        Self {
            count,
            period_us,
            monthly,
        }
    }

    /// This limit's period with another count, which must be valid.
    pub(crate) const fn with_count(self, count: u64) -> Self {
        Self { count, ..self }
    }

    /// A limit of `count` per `period`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when `count` is zero or above [`Limit::MAX_COUNT`],
    /// or `period` is zero, under 1 ms, over [`Limit::MAX_PERIOD`] or not a
    /// whole number of microseconds.
    pub fn new(count: u64, period: Duration) -> Result<Self, ConfigError> {
        if count == 0 {
            return Err(ConfigError::ZeroCount);
        }
        if count > Self::MAX_COUNT {
            return Err(ConfigError::CountTooLarge {
                count,
                max: Self::MAX_COUNT,
            });
        }
        if period.is_zero() {
            return Err(ConfigError::ZeroPeriod);
        }
        if period < Self::MIN_PERIOD {
            return Err(ConfigError::PeriodTooShort { period });
        }
        if period > Self::MAX_PERIOD {
            return Err(ConfigError::PeriodTooLong {
                period,
                max: Self::MAX_PERIOD,
            });
        }
        if !period.subsec_nanos().is_multiple_of(1_000) {
            return Err(ConfigError::SubMicrosecondPeriod { period });
        }
        Ok(Self {
            count,
            period_us: crate::time::duration_micros(period),
            monthly: false,
        })
    }

    /// `count` per calendar month: in UTC, or in the zone of the policy's
    /// [`Calendar`](crate::Calendar). Only the fixed window takes it.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when `count` is zero or above [`Limit::MAX_COUNT`].
    pub fn per_month(count: u64) -> Result<Self, ConfigError> {
        let limit = Self::new(count, Duration::from_micros(Self::MONTH_US))?;
        Ok(Self {
            monthly: true,
            ..limit
        })
    }

    /// Whether this is a limit per calendar month.
    pub const fn is_monthly(&self) -> bool {
        self.monthly
    }

    /// `count` per second.
    ///
    /// # Errors
    ///
    /// As [`Limit::new`].
    pub fn per_second(count: u64) -> Result<Self, ConfigError> {
        Self::new(count, Duration::from_secs(1))
    }

    /// `count` per minute.
    ///
    /// # Errors
    ///
    /// As [`Limit::new`].
    pub fn per_minute(count: u64) -> Result<Self, ConfigError> {
        Self::new(count, Duration::from_secs(60))
    }

    /// `count` per hour.
    ///
    /// # Errors
    ///
    /// As [`Limit::new`].
    pub fn per_hour(count: u64) -> Result<Self, ConfigError> {
        Self::new(count, Duration::from_secs(3_600))
    }

    /// `count` per day.
    ///
    /// # Errors
    ///
    /// As [`Limit::new`].
    pub fn per_day(count: u64) -> Result<Self, ConfigError> {
        Self::new(count, Duration::from_secs(86_400))
    }

    /// How many units of cost the limit allows per period.
    pub const fn count(&self) -> u64 {
        self.count
    }

    /// The period; for a [monthly](Limit::is_monthly) limit, 31 days, the
    /// longest month.
    pub const fn period(&self) -> Duration {
        Duration::from_micros(self.period_us)
    }

    /// The period in microseconds.
    pub const fn period_micros(&self) -> u64 {
        self.period_us
    }

    /// The time one unit of cost takes to come back for the rate-based
    /// algorithms (token bucket, leaky bucket, GCRA): `period / count`,
    /// rounded up to a whole microsecond so that the rate is never exceeded.
    pub const fn interval_micros(&self) -> u64 {
        self.period_us.div_ceil(self.count)
    }
}

const UNITS: &[(&str, u64)] = &[
    ("us", 1),
    ("ms", 1_000),
    ("s", 1_000_000),
    ("sec", 1_000_000),
    ("second", 1_000_000),
    ("m", 60_000_000),
    ("min", 60_000_000),
    ("minute", 60_000_000),
    ("h", 3_600_000_000),
    ("hr", 3_600_000_000),
    ("hour", 3_600_000_000),
    ("d", 86_400_000_000),
    ("day", 86_400_000_000),
    ("w", 604_800_000_000),
    ("week", 604_800_000_000),
];

pub(crate) fn unit_micros(unit: &str) -> Option<u64> {
    let singular = match unit.strip_suffix('s') {
        Some(stem) if unit.len() > 2 && unit != "ms" && unit != "us" => stem,
        _ => unit,
    };
    UNITS
        .iter()
        .find(|(name, _)| *name == unit || *name == singular)
        .map(|&(_, micros)| micros)
}

impl FromStr for Limit {
    type Err = ConfigError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let invalid = |reason| ConfigError::InvalidLimit {
            input: input.to_owned(),
            reason,
        };
        let (count, period) = input
            .split_once('/')
            .ok_or_else(|| invalid("expected COUNT/PERIOD, such as \"100/min\""))?;
        let count = count.trim();
        if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid("the count must be a whole number"));
        }
        let count: u64 = count
            .parse()
            .map_err(|_| invalid("the count is too large"))?;
        let period = period.trim();
        let digits = period.bytes().take_while(u8::is_ascii_digit).count();
        let (multiplier, unit) = period.split_at(digits);
        let multiplier: u64 = if multiplier.is_empty() {
            1
        } else {
            multiplier
                .parse()
                .map_err(|_| invalid("the period multiplier is too large"))?
        };
        let unit = unit.trim().to_ascii_lowercase();
        if matches!(unit.as_str(), "mo" | "month" | "months") {
            if digits > 0 {
                return Err(invalid("a month period takes no multiplier"));
            }
            return Limit::per_month(count);
        }
        if unit.is_empty() {
            return Err(invalid("the period needs a unit: ms, s, min, h or day"));
        }
        let unit = unit_micros(&unit).ok_or_else(|| {
            invalid("unknown period unit: use us, ms, s, sec, second, m, min, minute, h, hour, d, day, w, week or month")
        })?;
        let micros = multiplier
            .checked_mul(unit)
            .ok_or_else(|| invalid("the period is too long"))?;
        Limit::new(count, Duration::from_micros(micros))
    }
}

impl TryFrom<&str> for Limit {
    type Error = ConfigError;

    fn try_from(value: &str) -> Result<Self, Self::Error> {
        value.parse()
    }
}

impl fmt::Display for Limit {
    /// Writes the limit in the form it parses from, with the largest unit
    /// that divides the period: `100/1m` is written `100/min`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.monthly {
            return write!(f, "{}/month", self.count);
        }
        const SHOWN: &[(&str, u64)] = &[
            ("day", 86_400_000_000),
            ("h", 3_600_000_000),
            ("min", 60_000_000),
            ("s", 1_000_000),
            ("ms", 1_000),
            ("us", 1),
        ];
        let (unit, micros) = SHOWN
            .iter()
            .copied()
            .find(|&(_, micros)| self.period_us.is_multiple_of(micros))
            .unwrap_or(("us", 1));
        match self.period_us / micros {
            1 => write!(f, "{}/{unit}", self.count),
            n => write!(f, "{}/{n}{unit}", self.count),
        }
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Limit {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Limit {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Limit;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a limit such as \"100/min\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Limit, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_documented_form() {
        let cases = [
            ("100/min", 100, 60_000_000),
            ("10/s", 10, 1_000_000),
            ("25/5s", 25, 5_000_000),
            ("5000/1h", 5000, 3_600_000_000),
            ("1000/day", 1000, 86_400_000_000),
            ("3/250ms", 3, 250_000),
            ("7/2 minutes", 7, 120_000_000),
            (" 8 / 3sec ", 8, 3_000_000),
            ("1/second", 1, 1_000_000),
            ("1/hours", 1, 3_600_000_000),
            ("2/2days", 2, 172_800_000_000),
            ("9/1500us", 9, 1_500),
            ("9/M", 9, 60_000_000),
            ("3/week", 3, 604_800_000_000),
            ("4/2w", 4, 1_209_600_000_000),
        ];
        for (input, count, micros) in cases {
            let limit: Limit = input.parse().unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(
                (limit.count(), limit.period_micros()),
                (count, micros),
                "{input}"
            );
            let again: Limit = limit.to_string().parse().expect("display round-trips");
            assert_eq!(again, limit, "{input}");
        }
    }

    #[test]
    fn rejects_bad_strings_with_named_reasons() {
        let bad = [
            ("", "expected COUNT/PERIOD"),
            ("100", "expected COUNT/PERIOD"),
            ("x/min", "count must be a whole number"),
            ("-1/min", "count must be a whole number"),
            ("1.5/min", "count must be a whole number"),
            ("99999999999999999999999/s", "count is too large"),
            ("10/", "needs a unit"),
            ("10/5", "needs a unit"),
            ("10/fortnight", "unknown period unit"),
            ("10/2month", "takes no multiplier"),
            ("10/99999999999999999999s", "multiplier is too large"),
            ("10/9999999999999999d", "period is too long"),
        ];
        for (input, reason) in bad {
            let err = input.parse::<Limit>().expect_err(input).to_string();
            assert!(err.contains(reason), "{input}: {err}");
        }
    }

    #[test]
    fn rejects_out_of_range_values() {
        assert_eq!("0/min".parse::<Limit>(), Err(ConfigError::ZeroCount));
        assert_eq!("5/0s".parse::<Limit>(), Err(ConfigError::ZeroPeriod));
        assert_eq!(
            Limit::new(5, Duration::from_micros(999)),
            Err(ConfigError::PeriodTooShort {
                period: Duration::from_micros(999)
            })
        );
        assert!(matches!(
            "5/367d".parse::<Limit>(),
            Err(ConfigError::PeriodTooLong { .. })
        ));
        assert!(matches!(
            Limit::new(5, Duration::from_nanos(1_000_500)),
            Err(ConfigError::SubMicrosecondPeriod { .. })
        ));
        assert!(matches!(
            "4294967296/s".parse::<Limit>(),
            Err(ConfigError::CountTooLarge { .. })
        ));
    }

    #[test]
    fn interval_rounds_up() {
        assert_eq!(
            Limit::per_second(3).map(|l| l.interval_micros()),
            Ok(333_334)
        );
        assert_eq!(
            Limit::per_minute(100).map(|l| l.interval_micros()),
            Ok(600_000)
        );
    }

    #[cfg(feature = "serde")]
    #[test]
    fn serde_uses_the_string_form() {
        let limit: Limit = serde_json::from_str("\"25/5s\"").expect("valid");
        assert_eq!(
            limit,
            Limit::new(25, Duration::from_secs(5)).expect("valid")
        );
        assert_eq!(
            serde_json::to_string(&limit).expect("serializes"),
            "\"25/5s\""
        );
        let err = serde_json::from_str::<Limit>("\"0/s\"").expect_err("zero count");
        assert!(err.to_string().contains("at least 1"), "{err}");
    }
}
