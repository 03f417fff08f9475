//! A limit's calendar period: its unit (day, week, month) in a calendar,
//! the boundaries of its periods, and the checks of a calendar policy.

use std::time::Duration;

use jiff::ToSpan;
use jiff::civil::{Date, Time};

use super::Calendar;
use crate::error::ConfigError;

/// The calendar of a policy (its own, or UTC's when it has a monthly
/// limit) and each limit's calendar period, checked: only the fixed window
/// takes them, each limit of a day or more is a day, week or month, and
/// the offset is shorter than the shortest.
pub(crate) fn calendar_periods(
    policy: &str,
    algorithm: crate::Algorithm,
    calendar: Option<Calendar>,
    limits: &[crate::Limit],
) -> Result<(Option<Calendar>, Vec<Option<CalendarPeriod>>), ConfigError> {
    let calendar = calendar.or_else(|| limits.iter().any(|l| l.is_monthly()).then(Calendar::utc));
    let Some(calendar) = calendar else {
        return Ok((None, vec![None; limits.len()]));
    };
    if algorithm != crate::Algorithm::FixedWindow {
        return Err(ConfigError::CalendarNeedsFixedWindow {
            policy: policy.to_owned(),
            algorithm,
        });
    }
    let mut periods = Vec::with_capacity(limits.len());
    for &limit in limits {
        periods.push(match Unit::of(limit) {
            None => None,
            Some(Ok(unit)) => Some(CalendarPeriod { calendar, unit }),
            Some(Err(())) => {
                return Err(ConfigError::NotACalendarPeriod {
                    policy: policy.to_owned(),
                    limit,
                });
            }
        });
    }
    if let Some(max) = periods.iter().flatten().map(|p| p.unit.least()).min()
        && calendar.offset() >= max
    {
        return Err(ConfigError::CalendarOffsetTooLong {
            policy: policy.to_owned(),
            offset: calendar.offset(),
            max,
        });
    }
    Ok((Some(calendar), periods))
}

/// The calendar unit of a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Unit {
    Day,
    Week,
    Month,
}

impl Unit {
    /// The unit of a limit under a calendar: `None` for a period shorter
    /// than a day (a fixed window, aligned to the epoch).
    pub(crate) fn of(limit: crate::Limit) -> Option<Result<Self, ()>> {
        const DAY: u64 = 86_400_000_000;
        if limit.is_monthly() {
            return Some(Ok(Unit::Month));
        }
        match limit.period_micros() {
            p if p < DAY => None,
            DAY => Some(Ok(Unit::Day)),
            p if p == 7 * DAY => Some(Ok(Unit::Week)),
            _ => Some(Err(())),
        }
    }

    /// The least length of a period of this unit, in civil time: an offset
    /// must be shorter.
    pub(crate) fn least(self) -> Duration {
        let days = match self {
            Unit::Day => 1,
            Unit::Week => 7,
            Unit::Month => 28,
        };
        Duration::from_secs(days * 86_400)
    }

    /// The first day of the period of this unit that holds `date`.
    fn first_day(self, date: Date) -> Date {
        match self {
            Unit::Day => date,
            Unit::Week => date
                .checked_sub(i64::from(date.weekday().to_monday_zero_offset()).days())
                .unwrap_or(date),
            Unit::Month => date.first_of_month(),
        }
    }

    /// The first day of the period after the one that starts on `first`.
    fn next(self, first: Date) -> Option<Date> {
        match self {
            Unit::Day => first.checked_add(1.day()).ok(),
            Unit::Week => first.checked_add(1.week()).ok(),
            Unit::Month => first.checked_add(1.month()).ok(),
        }
    }

    /// The first day of the period before the one that starts on `first`.
    fn previous(self, first: Date) -> Option<Date> {
        match self {
            Unit::Day => first.checked_sub(1.day()).ok(),
            Unit::Week => first.checked_sub(1.week()).ok(),
            Unit::Month => first.checked_sub(1.month()).ok(),
        }
    }
}

/// A calendar period by its zone (interned: one address per zone), offset
/// and unit, and the bounds last computed for it.
type Recent = Option<((usize, u64, Unit), [u64; 4])>;

thread_local! {
    /// The bounds this thread computed last, the most recent first.
    static RECENT: std::cell::RefCell<[Recent; 4]> = const { std::cell::RefCell::new([None; 4]) };
}

/// A limit's calendar period: its unit in a calendar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CalendarPeriod {
    pub(crate) calendar: Calendar,
    pub(crate) unit: Unit,
}

impl CalendarPeriod {
    /// When the period that starts on `first` (a local date) begins, in
    /// µs since the epoch.
    fn boundary(&self, first: Date) -> Option<u64> {
        let start = first
            .to_datetime(Time::midnight())
            .checked_add(self.calendar.offset_signed())
            .ok()?;
        let zoned = start.to_zoned(self.calendar.zone.tz.clone()).ok()?;
        u64::try_from(zoned.timestamp().as_microsecond()).ok()
    }

    /// The first local day of the period that holds `t` (µs), with the
    /// period's start and end.
    fn around(&self, t: u64) -> Option<(Date, u64, u64)> {
        let at = jiff::Timestamp::from_microsecond(i64::try_from(t).ok()?).ok()?;
        let local = self.calendar.zone.tz.to_datetime(at).date();
        let mut first = self.unit.first_day(local);
        let mut start = self.boundary(first)?;
        // The offset may put t before its local day's period start; a
        // daylight-saving change can move a start by an hour either way.
        while start > t {
            first = self.unit.previous(first)?;
            start = self.boundary(first)?;
        }
        let mut end = self.boundary(self.unit.next(first)?)?;
        while end <= t {
            first = self.unit.next(first)?;
            start = end;
            end = self.boundary(self.unit.next(first)?)?;
        }
        Some((first, start, end))
    }

    /// `(start, end)` of the period that holds `t`, in µs. Beyond jiff's
    /// range (the years -9999 to 9999), a period of the unit's least
    /// length aligned to the epoch, so that no time is without one.
    pub(crate) fn window(&self, t: u64) -> (u64, u64) {
        let [_, start, end, _] = self.bounds(t);
        (start, end)
    }

    /// The starts of the periods around `t`: the one before the period
    /// that holds `t`, that period's, and the next two. The Redis store
    /// sends them with each call, computed around its estimate of Redis's
    /// time, and the script picks the period holding Redis's own time.
    ///
    /// Each thread keeps the last few answers: a period lasts a day or
    /// more, so almost every decision finds its period there, with no
    /// time-zone arithmetic.
    pub(crate) fn bounds(&self, t: u64) -> [u64; 4] {
        let id = (
            std::ptr::from_ref(self.calendar.zone).addr(),
            self.calendar.offset_us,
            self.unit,
        );
        RECENT.with(|recent| {
            let mut recent = recent.borrow_mut();
            let hit = recent
                .iter()
                .flatten()
                .find(|(of, b)| *of == id && b[1] <= t && t < b[2])
                .map(|&(_, b)| b);
            hit.unwrap_or_else(|| {
                let bounds = self.compute_bounds(t);
                recent.rotate_right(1);
                recent[0] = Some((id, bounds));
                bounds
            })
        })
    }

    fn compute_bounds(&self, t: u64) -> [u64; 4] {
        let least = crate::time::duration_micros(self.unit.least());
        match self.around(t) {
            Some((first, start, end)) => {
                let before = self.unit.previous(first).and_then(|d| self.boundary(d));
                let after = self
                    .unit
                    .next(first)
                    .and_then(|d| self.boundary(self.unit.next(d)?));
                [
                    before.unwrap_or(start.saturating_sub(least)),
                    start,
                    end,
                    after.unwrap_or(end.saturating_add(least)),
                ]
            }
            None => {
                let start = t - t % least;
                let end = start.saturating_add(least);
                [
                    start.saturating_sub(least),
                    start,
                    end,
                    end.saturating_add(least),
                ]
            }
        }
    }

    /// The word of the state descriptor naming the calendar: ` cal:`, the
    /// zone and the offset (each limit's unit follows from its period).
    /// No digit is followed by a `/`, so `carry.lua` reads no limit in it.
    pub(crate) fn describe(&self, out: &mut String) {
        out.push_str(" cal:");
        out.push_str(&self.calendar.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(s: &str) -> u64 {
        let ts: jiff::Timestamp = s.parse().expect("a timestamp");
        u64::try_from(ts.as_microsecond()).expect("after 1970")
    }

    fn period(zone: &str, unit: Unit, offset_h: u64) -> CalendarPeriod {
        CalendarPeriod {
            calendar: Calendar::new(zone)
                .expect("zone")
                .with_offset(Duration::from_secs(offset_h * 3600)),
            unit,
        }
    }

    #[test]
    fn months_of_every_length() {
        let m = period("UTC", Unit::Month, 0);
        let cases = [
            (
                "2027-02-15T00:00:00Z",
                "2027-02-01T00:00:00Z",
                "2027-03-01T00:00:00Z",
            ),
            (
                "2028-02-29T23:59:59Z",
                "2028-02-01T00:00:00Z",
                "2028-03-01T00:00:00Z",
            ),
            (
                "2027-04-30T12:00:00Z",
                "2027-04-01T00:00:00Z",
                "2027-05-01T00:00:00Z",
            ),
            (
                "2027-12-31T23:59:59Z",
                "2027-12-01T00:00:00Z",
                "2028-01-01T00:00:00Z",
            ),
        ];
        for (t, start, end) in cases {
            assert_eq!(m.window(us(t)), (us(start), us(end)), "{t}");
        }
    }

    #[test]
    fn berlin_days_across_daylight_saving() {
        let d = period("Europe/Berlin", Unit::Day, 0);
        // 23 hours on 2027-03-28, 25 on 2027-10-31.
        let (s, e) = d.window(us("2027-03-28T12:00:00Z"));
        assert_eq!(
            (s, e),
            (us("2027-03-27T23:00:00Z"), us("2027-03-28T22:00:00Z"))
        );
        let (s, e) = d.window(us("2027-10-31T12:00:00Z"));
        assert_eq!(
            (s, e),
            (us("2027-10-30T22:00:00Z"), us("2027-10-31T23:00:00Z"))
        );
    }

    #[test]
    fn offsets_and_weeks() {
        let d = period("UTC", Unit::Day, 8);
        assert_eq!(
            d.window(us("2027-05-10T07:59:59Z")),
            (us("2027-05-09T08:00:00Z"), us("2027-05-10T08:00:00Z"))
        );
        let w = period("Europe/Berlin", Unit::Week, 0);
        // Monday 2027-03-29 00:00 CEST, after the change.
        assert_eq!(
            w.window(us("2027-03-28T21:59:59Z")),
            (us("2027-03-21T23:00:00Z"), us("2027-03-28T22:00:00Z"))
        );
        let b = period("Europe/Berlin", Unit::Month, 0).bounds(us("2027-10-15T00:00:00Z"));
        assert_eq!(
            b,
            [
                us("2027-08-31T22:00:00Z"),
                us("2027-09-30T22:00:00Z"),
                us("2027-10-31T23:00:00Z"),
                us("2027-11-30T23:00:00Z"),
            ]
        );
    }

    #[test]
    fn bad_calendar_policies_are_named_errors() {
        use crate::{Algorithm, Policy};
        let berlin = Calendar::new("Europe/Berlin").expect("zone");
        let fixed = |limits: &[&str], calendar: Calendar| {
            limits
                .iter()
                .fold(
                    Policy::builder("p").algorithm(Algorithm::FixedWindow),
                    |b, l| b.limit(*l),
                )
                .calendar(calendar)
                .build()
        };
        assert_eq!(
            Policy::builder("p").limit("5/month").build(),
            Err(ConfigError::CalendarNeedsFixedWindow {
                policy: "p".into(),
                algorithm: Algorithm::Gcra
            })
        );
        assert_eq!(
            fixed(&["5/2d"], berlin),
            Err(ConfigError::NotACalendarPeriod {
                policy: "p".into(),
                limit: "5/2d".parse().expect("limit"),
            })
        );
        let day = Duration::from_secs(86_400);
        assert_eq!(
            fixed(&["5/min", "9/day", "50/month"], berlin.with_offset(day)),
            Err(ConfigError::CalendarOffsetTooLong {
                policy: "p".into(),
                offset: day,
                max: day,
            })
        );
        // Under a day the limit stays aligned to the epoch; the month's
        // offset may be up to 28 days less 1 µs.
        let ok = fixed(&["5/min", "50/month"], berlin.with_offset(27 * day)).expect("valid");
        assert_eq!(
            ok.to_string(),
            "p (fixed_window, 5/min, 50/month, calendar Europe/Berlin+27d)"
        );
        assert_eq!(
            Calendar::new("europe/berlin").map(|c| c.zone()),
            Ok("Europe/Berlin")
        );
    }

    #[cfg(feature = "serde")]
    #[test]
    fn calendars_deserialize_with_the_policy() {
        let policy: crate::Policy = serde_json::from_str(
            r#"{"name": "reports", "algorithm": "fixed_window", "limits": ["50000/month"],
                "calendar": {"zone": "Europe/Berlin", "offset": "1d 6h"}}"#,
        )
        .expect("valid");
        let calendar = policy.calendar().expect("a calendar");
        assert_eq!(calendar.to_string(), "Europe/Berlin+1d6h");
        let again: crate::Policy =
            serde_json::from_str(&serde_json::to_string(&policy).expect("serializes"))
                .expect("round-trips");
        assert_eq!(again, policy);
        let err = serde_json::from_str::<crate::Policy>(
            r#"{"name": "r", "algorithm": "fixed_window", "limits": ["5/day"],
                "calendar": {"zone": "Nowhere/Land"}}"#,
        )
        .expect_err("unknown zone");
        assert!(
            err.to_string()
                .contains("unknown time zone \"Nowhere/Land\""),
            "{err}"
        );
    }

    #[test]
    fn offsets_parse() {
        let h = |n: u64| Duration::from_secs(n * 3600);
        assert_eq!(Calendar::parse_offset("8h"), Ok(h(8)));
        assert_eq!(Calendar::parse_offset("2d 6h"), Ok(h(54)));
        assert_eq!(
            Calendar::parse_offset("1h30min"),
            Ok(h(1) + Duration::from_secs(1800))
        );
        assert!(Calendar::parse_offset("").is_err());
        assert!(Calendar::parse_offset("h").is_err());
        assert!(Calendar::parse_offset("3 weeks").is_err());
    }

    #[test]
    fn the_bounds_a_thread_remembers_are_those_it_would_compute() {
        let periods = [
            period("Europe/Berlin", Unit::Day, 0),
            period("Europe/Berlin", Unit::Month, 0),
            period("Europe/Berlin", Unit::Month, 8),
            period("America/Santiago", Unit::Day, 0),
            period("UTC", Unit::Week, 0),
        ];
        // Back and forth across Berlin's autumn change and a month end, in
        // an order that keeps evicting and finding entries.
        let base = us("2027-10-30T12:00:00Z");
        let mut x: u64 = 7;
        for _ in 0..5_000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let p = &periods[usize::try_from(x >> 61).unwrap_or(0) % periods.len()];
            let t = base + (x >> 20) % (3 * 86_400_000_000);
            assert_eq!(p.bounds(t), p.compute_bounds(t), "{p:?} at {t}");
            let (start, end) = p.window(t);
            assert!(start <= t && t < end);
        }
    }
}
