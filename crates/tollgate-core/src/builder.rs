//! Building a [`Policy`]: the builder, its validation, and the serde form.

use crate::algorithm::Algorithm;
use crate::calendar::Calendar;
use crate::calendar::period::calendar_periods;
use crate::error::ConfigError;
use crate::limit::Limit;
use crate::policy::{Divisor, LimitParams, MAX_SPAN_US, Policy};

impl Policy {
    /// Starts a policy named `name`. The algorithm defaults to
    /// [`Algorithm::Gcra`].
    pub fn builder(name: impl Into<String>) -> PolicyBuilder {
        PolicyBuilder {
            name: name.into(),
            algorithm: Algorithm::Gcra,
            limits: Vec::new(),
            burst: None,
            calendar: None,
            error: None,
        }
    }

    /// A policy with a single limit.
    ///
    /// ```
    /// use tollgate_core::{Algorithm, Policy};
    ///
    /// let policy = Policy::new("api", Algorithm::FixedWindow, "100/min")?;
    /// assert_eq!(policy.limits()[0].count(), 100);
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`PolicyBuilder::build`].
    pub fn new(
        name: impl Into<String>,
        algorithm: Algorithm,
        limit: impl IntoLimit,
    ) -> Result<Self, ConfigError> {
        Self::builder(name)
            .algorithm(algorithm)
            .limit(limit)
            .build()
    }

    /// This policy with every limit (and the burst) divided by `instances`,
    /// rounded down but at least 1: each of `instances` servers deciding
    /// alone gets a fair share of the global limit. Used for the local
    /// fallback when a shared store fails. A share's limit, rounded down,
    /// refills more slowly than its part of the global one: its burst is
    /// at most what refills in the longest span a policy holds (2^50 µs),
    /// as any policy's is.
    ///
    /// ```
    /// use tollgate_core::{Algorithm, Policy};
    ///
    /// let global = Policy::builder("api").limit("100/min").limit("10/s").build()?;
    /// let share = global.divided(4)?;
    /// assert_eq!(share.limits()[0].count(), 25);
    /// assert_eq!(share.limits()[1].count(), 2);
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] when `instances` is zero (a policy
    /// divides into any number of shares).
    pub fn divided(&self, instances: u64) -> Result<Policy, ConfigError> {
        if instances == 0 {
            return Err(ConfigError::InvalidSetting {
                setting: "instances",
                reason: "must be at least 1",
            });
        }
        let share = |n: u64| (n / instances).max(1);
        let mut builder = Policy::builder(self.name()).algorithm(self.algorithm());
        // The most burst every share limit holds: rounded down, a count
        // can lengthen the interval the burst is multiplied by (10 a day
        // in 6 shares is 1 a day, not 1.67).
        let mut most = u64::MAX;
        for limit in self.limits() {
            let limit = limit.with_count(share(limit.count()));
            most = most.min(MAX_SPAN_US / limit.interval_micros().max(1));
            builder = builder.limit(limit);
        }
        if let Some(calendar) = self.calendar() {
            builder = builder.calendar(calendar);
        }
        if let Some(burst) = self.burst() {
            builder = builder.burst(share(burst).min(most).max(1));
        }
        builder.build()
    }
}

/// Something that can become a [`Limit`]: a `Limit` or a string such as
/// `"100/min"`. A string that does not parse is reported by
/// [`PolicyBuilder::build`].
pub trait IntoLimit {
    /// Converts into a limit.
    ///
    /// # Errors
    ///
    /// When the value does not describe a valid limit.
    fn into_limit(self) -> Result<Limit, ConfigError>;
}

impl IntoLimit for Limit {
    fn into_limit(self) -> Result<Limit, ConfigError> {
        Ok(self)
    }
}

impl IntoLimit for &str {
    fn into_limit(self) -> Result<Limit, ConfigError> {
        self.parse()
    }
}

impl IntoLimit for String {
    fn into_limit(self) -> Result<Limit, ConfigError> {
        self.parse()
    }
}

impl IntoLimit for Result<Limit, ConfigError> {
    fn into_limit(self) -> Result<Limit, ConfigError> {
        self
    }
}

/// Builds a [`Policy`]; see [`Policy::builder`].
#[derive(Debug, Clone)]
#[must_use = "call .build() to get the policy"]
pub struct PolicyBuilder {
    name: String,
    algorithm: Algorithm,
    limits: Vec<Limit>,
    burst: Option<u64>,
    calendar: Option<Calendar>,
    error: Option<ConfigError>,
}

impl PolicyBuilder {
    /// Sets the algorithm.
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Adds a limit. All limits of a policy must hold for a request to be
    /// admitted, and a request denied by one consumes nothing from the others.
    pub fn limit(mut self, limit: impl IntoLimit) -> Self {
        match limit.into_limit() {
            Ok(limit) => self.limits.push(limit),
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
        self
    }

    /// Sets the burst of a token bucket (its capacity), a leaky bucket (its
    /// queue size) or GCRA (its burst). It applies to every limit of the
    /// policy; the default is each limit's count.
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Aligns the policy's limits per day, week and month to `calendar`
    /// (see [`Calendar`]); limits under a day stay aligned to the epoch. A
    /// monthly limit without a calendar follows UTC's. Only
    /// [`Algorithm::FixedWindow`] takes calendar periods (its count resets
    /// at the boundary; the other algorithms spread a limit over a rolling
    /// period, with no boundary to align): `build` refuses the others with
    /// [`ConfigError::CalendarNeedsFixedWindow`]. A policy redeployed with
    /// another calendar (zone or offset), or without one, keeps each key's
    /// use: a window begun under the old calendar is taken for the new
    /// calendar's window that starts nearest its start, if that has begun,
    /// else for the one holding it (Berlin's March, begun on Feb 28 at
    /// 23:00 UTC, for UTC's March), and holds its count until that one
    /// ends. A change made before that nearest window began takes the
    /// window for the one holding its start instead, which ends sooner;
    /// windows of calendars far apart (weeks from Monday, and from Thursday
    /// without a calendar) are taken for the nearest, up to half a period
    /// apart.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::{Algorithm, Calendar, ConfigError, Policy};
    ///
    /// let policy = Policy::builder("reports")
    ///     .algorithm(Algorithm::FixedWindow)
    ///     .limit("50000/month")
    ///     .limit("5000/day")
    ///     .calendar(Calendar::new("Europe/Berlin")?.with_offset(Duration::from_secs(6 * 3600)))
    ///     .build()?;
    /// assert_eq!(policy.calendar().unwrap().zone(), "Europe/Berlin");
    ///
    /// let err = Policy::builder("reports").limit("50000/month").build().unwrap_err();
    /// assert!(matches!(err, ConfigError::CalendarNeedsFixedWindow { .. }));
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn calendar(mut self, calendar: Calendar) -> Self {
        self.calendar = Some(calendar);
        self
    }

    /// Checks the configuration and builds the policy.
    ///
    /// # Errors
    ///
    /// The first problem found: a limit that did not parse or is out of
    /// range, an invalid name, no limits or too many, two limits with one
    /// period, a zero burst or a burst
    /// for an algorithm without one, a calendar period that does not fit (an
    /// algorithm other than the fixed window, a limit of a day or more that
    /// is not a day, week or month, an offset too long), or derived values
    /// that overflow.
    pub fn build(self) -> Result<Policy, ConfigError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        validate_name(&self.name)?;
        if self.limits.is_empty() {
            return Err(ConfigError::NoLimits { policy: self.name });
        }
        if self.limits.len() > Policy::MAX_LIMITS {
            return Err(ConfigError::TooManyLimits {
                policy: self.name,
                count: self.limits.len(),
                max: Policy::MAX_LIMITS,
            });
        }
        for (i, limit) in self.limits.iter().enumerate() {
            if self.limits[..i]
                .iter()
                .any(|l| l.period() == limit.period())
            {
                return Err(ConfigError::DuplicatePeriod {
                    policy: self.name,
                    period: limit.period(),
                });
            }
        }
        if let Some(burst) = self.burst {
            if burst == 0 {
                return Err(ConfigError::ZeroBurst);
            }
            if !self.algorithm.has_burst() {
                return Err(ConfigError::BurstNotSupported {
                    algorithm: self.algorithm,
                });
            }
            if burst > Limit::MAX_COUNT {
                return Err(ConfigError::Overflow { what: "burst" });
            }
        }
        let (calendar, periods) =
            calendar_periods(&self.name, self.algorithm, self.calendar, &self.limits)?;
        let mut params = self
            .limits
            .iter()
            .zip(periods)
            .map(|(&limit, period)| {
                let mut params = params_for(self.algorithm, limit, self.burst)?;
                params.calendar = period;
                Ok(params)
            })
            .collect::<Result<Box<[_]>, ConfigError>>()?;
        // A joint queue (the leaky bucket's) moves by the slowest interval.
        let step = params.iter().map(|p| p.interval_us).max().unwrap_or(1);
        for p in &mut params {
            p.per_queue_step = Divisor::new(step);
        }
        Ok(Policy::from_parts(
            self.name,
            self.algorithm,
            self.burst,
            calendar,
            self.limits,
            params,
        ))
    }
}

fn params_for(
    algorithm: Algorithm,
    limit: Limit,
    burst: Option<u64>,
) -> Result<LimitParams, ConfigError> {
    let capacity = if algorithm.has_burst() {
        burst.unwrap_or(limit.count())
    } else {
        limit.count()
    };
    let interval_us = limit.interval_micros();
    if algorithm.has_burst()
        && capacity
            .checked_mul(interval_us)
            .is_none_or(|span| span > MAX_SPAN_US)
    {
        return Err(ConfigError::Overflow {
            what: "burst x interval",
        });
    }
    Ok(LimitParams {
        limit,
        period_us: limit.period_micros(),
        interval_us,
        capacity,
        per_interval: Divisor::new(interval_us),
        per_queue_step: Divisor::new(interval_us),
        calendar: None,
    })
}

pub(crate) fn validate_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::InvalidName {
            name: name.to_owned(),
        })
    }
}

/// The serialized form of a [`Policy`].
#[cfg(feature = "serde")]
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyConfig {
    name: String,
    algorithm: Algorithm,
    limits: Vec<Limit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    burst: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    calendar: Option<Calendar>,
}

#[cfg(feature = "serde")]
impl serde::Serialize for Policy {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        PolicyConfig {
            name: self.name().to_owned(),
            algorithm: self.algorithm(),
            limits: self.limits().to_vec(),
            burst: self.burst(),
            calendar: self.calendar(),
        }
        .serialize(serializer)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Policy {
    /// Deserializes `{ name, algorithm, limits = ["N/period", ...], burst?,
    /// calendar? }` (a calendar as `{ zone = "Europe/Berlin", offset =
    /// "8h" }`, see [`Calendar`]) and validates it like
    /// [`PolicyBuilder::build`].
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let config = PolicyConfig::deserialize(deserializer)?;
        let mut builder = Policy::builder(config.name).algorithm(config.algorithm);
        for limit in config.limits {
            builder = builder.limit(limit);
        }
        if let Some(burst) = config.burst {
            builder = builder.burst(burst);
        }
        if let Some(calendar) = config.calendar {
            builder = builder.calendar(calendar);
        }
        builder.build().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A share whose count rounds down to a longer interval keeps a burst
    /// that fits: 10 a day with a burst of 100,000, in 6 shares, failed to
    /// divide, and the local fallback then gave each instance the whole
    /// global limit (found by an audit).
    #[test]
    fn every_policy_divides_into_shares_no_larger_than_their_part() {
        use crate::Algorithm;
        let cases = [
            (Algorithm::Gcra, "10/day", 100_000, 6),
            (Algorithm::Gcra, "10/day", 100_000, 7),
            (Algorithm::TokenBucket, "3/s", 3_000_000_000, 2),
            (Algorithm::LeakyBucket, "1/366d", 35, 1_000),
        ];
        for (algorithm, limit, burst, instances) in cases {
            let global = Policy::builder("share")
                .algorithm(algorithm)
                .limit(limit)
                .burst(burst)
                .build()
                .unwrap();
            let share = global.divided(instances).unwrap();
            let params = &share.params()[0];
            assert!(params.capacity <= (burst / instances).max(1), "{limit}");
            assert!(
                params.capacity * params.interval_us <= MAX_SPAN_US,
                "{limit}"
            );
        }
        // Where it fits, the burst is divided as it was.
        let global = Policy::builder("share")
            .limit("10/s")
            .burst(100)
            .build()
            .unwrap();
        assert_eq!(global.divided(4).unwrap().burst(), Some(25));
    }

    #[test]
    fn every_bad_setting_is_a_named_error() {
        let cases: Vec<(PolicyBuilder, ConfigError)> = vec![
            (
                Policy::builder("").limit("1/s"),
                ConfigError::InvalidName {
                    name: String::new(),
                },
            ),
            (
                Policy::builder("has space").limit("1/s"),
                ConfigError::InvalidName {
                    name: "has space".into(),
                },
            ),
            (
                Policy::builder("x".repeat(65)).limit("1/s"),
                ConfigError::InvalidName {
                    name: "x".repeat(65),
                },
            ),
            (
                Policy::builder("p"),
                ConfigError::NoLimits { policy: "p".into() },
            ),
            (
                (0..9).fold(Policy::builder("p"), |b, _| b.limit("1/s")),
                ConfigError::TooManyLimits {
                    policy: "p".into(),
                    count: 9,
                    max: 8,
                },
            ),
            (
                Policy::builder("p").limit("1/s").burst(0),
                ConfigError::ZeroBurst,
            ),
            (
                Policy::builder("p").limit("5/s").limit("9/1000ms"),
                ConfigError::DuplicatePeriod {
                    policy: "p".into(),
                    period: std::time::Duration::from_secs(1),
                },
            ),
            (
                Policy::builder("p")
                    .algorithm(Algorithm::FixedWindow)
                    .limit("1/s")
                    .burst(3),
                ConfigError::BurstNotSupported {
                    algorithm: Algorithm::FixedWindow,
                },
            ),
            (
                Policy::builder("p").limit("1/366d").burst(1_000_000_000),
                ConfigError::Overflow {
                    what: "burst x interval",
                },
            ),
            (
                Policy::builder("p").limit("1/s").limit("0/s"),
                ConfigError::ZeroCount,
            ),
        ];
        for (builder, expected) in cases {
            assert_eq!(builder.build(), Err(expected));
        }
    }

    #[test]
    fn capacity_is_burst_for_rate_algorithms_only() {
        let gcra = Policy::builder("g")
            .limit("10/s")
            .burst(3)
            .build()
            .expect("valid");
        assert_eq!(gcra.params()[0].capacity, 3);
        assert_eq!(gcra.params()[0].interval_us, 100_000);
        let fixed = Policy::new("f", Algorithm::FixedWindow, "10/s").expect("valid");
        assert_eq!(fixed.params()[0].capacity, 10);
    }

    #[test]
    fn fingerprints_are_stable_across_builds() {
        let policy = Policy::builder("a")
            .limit("10/s")
            .limit("300/min")
            .build()
            .expect("valid");
        // Pinned (checked with an independent FNV-1a): a change here resets
        // every key in every shared store.
        assert_eq!(policy.fingerprint(), 0x5256_f54a_0cd4_4c95);
        let renamed = Policy::builder("b")
            .limit("10/s")
            .limit("300/min")
            .build()
            .expect("valid");
        assert_eq!(renamed.fingerprint(), policy.fingerprint());
        let other = Policy::builder("a")
            .limit("10/s")
            .limit("301/min")
            .build()
            .expect("valid");
        assert_ne!(other.fingerprint(), policy.fingerprint());
    }

    #[test]
    fn algorithm_names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.as_str().parse::<Algorithm>(), Ok(a));
        }
        assert!(matches!(
            "lru".parse::<Algorithm>(),
            Err(ConfigError::UnknownAlgorithm { .. })
        ));
    }

    #[cfg(feature = "serde")]
    #[test]
    fn serde_validates() {
        let json = r#"{"name":"search","algorithm":"gcra","limits":["25/5s","300/min"],"burst":5}"#;
        let policy: Policy = serde_json::from_str(json).expect("valid");
        assert_eq!(policy.limits().len(), 2);
        assert_eq!(policy.burst(), Some(5));
        assert_eq!(serde_json::to_string(&policy).expect("serializes"), json);
        let err = serde_json::from_str::<Policy>(
            r#"{"name":"s","algorithm":"fixed_window","limits":["1/s"],"burst":5}"#,
        )
        .expect_err("burst on fixed window");
        assert!(err.to_string().contains("has no burst"), "{err}");
        let err = serde_json::from_str::<Policy>(
            r#"{"name":"s","algorithm":"gcra","limits":["1/s"],"colour":5}"#,
        )
        .expect_err("unknown field");
        assert!(err.to_string().contains("colour"), "{err}");
    }
}
