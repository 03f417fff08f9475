//! The ledger's calendar: which hour, day and month bucket an instant
//! falls in, in the ledger's time zone, and how long each bucket is kept.

use std::time::Duration;

use jiff::tz::TimeZone;

use crate::error::ConfigError;
use crate::time::Timestamp;

/// The length of the buckets of a usage ledger.
///
/// Days and months begin at midnight in the ledger's time zone (see
/// [`LedgerSettings::time_zone`]), so a day across a daylight-saving change
/// lasts 23 or 25 hours, and a month lasts its own number of days. Hours
/// begin on the hour of the zone's offset at that instant: each real hour
/// is its own bucket, including the repeated hour of an autumn change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Granularity {
    /// An hour.
    Hour,
    /// A calendar day.
    Day,
    /// A calendar month.
    Month,
}

impl Granularity {
    /// Every granularity, shortest first.
    pub const ALL: [Granularity; 3] = [Granularity::Hour, Granularity::Day, Granularity::Month];

    /// Its name: `hour`, `day` or `month`.
    ///
    /// ```
    /// use tollgate_core::ledger::Granularity;
    /// assert_eq!(Granularity::Day.as_str(), "day");
    /// assert_eq!("month".parse::<Granularity>(), Ok(Granularity::Month));
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Granularity::Hour => "hour",
            Granularity::Day => "day",
            Granularity::Month => "month",
        }
    }

    /// The longest a bucket of this granularity lasts, in seconds: an hour,
    /// 25 hours (a day that gains an hour), 31 days and an hour.
    pub(crate) fn longest_secs(self) -> u64 {
        match self {
            Granularity::Hour => 3_600,
            Granularity::Day => 25 * 3_600,
            Granularity::Month => 31 * 86_400 + 3_600,
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            Granularity::Hour => 0,
            Granularity::Day => 1,
            Granularity::Month => 2,
        }
    }
}

impl std::str::FromStr for Granularity {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "hour" => Ok(Granularity::Hour),
            "day" => Ok(Granularity::Day),
            "month" => Ok(Granularity::Month),
            _ => Err(ConfigError::InvalidSetting {
                setting: "granularity",
                reason: "use hour, day or month",
            }),
        }
    }
}

impl std::fmt::Display for Granularity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The longest retention of any bucket: 10 years.
const MAX_RETENTION: Duration = Duration::from_secs(10 * 366 * 86_400);

/// The latest instant the calendar places exactly (year 9000); later
/// instants count in its last buckets.
const LATEST_SECS: i64 = 221_845_392_000;

/// A usage ledger's calendar and retention: the time zone its days and
/// months follow (UTC by default) and how long each granularity's buckets
/// are kept after they end (by default 7 days of hours, 90 days of days
/// and 400 days of months).
///
/// Time zones come from [jiff](https://docs.rs/jiff)'s copy of the IANA
/// database (the system's, `/usr/share/zoneinfo`): a calendar that must be
/// right across daylight-saving changes is not written by hand.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::ledger::{Granularity, LedgerSettings};
/// use tollgate_core::Timestamp;
///
/// let settings = LedgerSettings::new()
///     .time_zone("Europe/Berlin")?
///     .retention(Granularity::Hour, Duration::from_secs(2 * 86_400))?;
/// // 2026-03-31 22:30 UTC is already April 1st in Berlin.
/// let at = Timestamp::from_secs(1_774_996_200);
/// assert_eq!(settings.bucket_start(Granularity::Month, at), Timestamp::from_secs(1_774_994_400));
/// assert!(LedgerSettings::new().time_zone("Mars/Olympus").is_err());
/// # Ok::<(), tollgate_core::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct LedgerSettings {
    zone: TimeZone,
    retention: [Duration; 3],
}

impl Default for LedgerSettings {
    fn default() -> Self {
        Self::new()
    }
}

impl LedgerSettings {
    /// UTC, with the default retention.
    pub fn new() -> Self {
        Self {
            zone: TimeZone::UTC,
            retention: [
                Duration::from_secs(7 * 86_400),
                Duration::from_secs(90 * 86_400),
                Duration::from_secs(400 * 86_400),
            ],
        }
    }

    /// Days and months follow the IANA time zone `name` (`Europe/Berlin`,
    /// `UTC`).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidValue`] for a name the time-zone database
    /// does not know.
    pub fn time_zone(mut self, name: &str) -> Result<Self, ConfigError> {
        self.zone = TimeZone::get(name).map_err(|_| ConfigError::InvalidValue {
            setting: "time zone",
            value: name.chars().take(64).collect(),
            reason: "not a time zone of the IANA database",
        })?;
        Ok(self)
    }

    /// Keeps buckets of `granularity` for `retention` after they end.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] for a retention under a second or
    /// over 10 years.
    pub fn retention(
        mut self,
        granularity: Granularity,
        retention: Duration,
    ) -> Result<Self, ConfigError> {
        if retention < Duration::from_secs(1) || retention > MAX_RETENTION {
            return Err(ConfigError::InvalidSetting {
                setting: "retention",
                reason: "keep buckets from 1 second to 10 years",
            });
        }
        self.retention[granularity.index()] = retention;
        Ok(self)
    }

    /// How long buckets of `granularity` are kept after they end.
    pub fn retention_of(&self, granularity: Granularity) -> Duration {
        self.retention[granularity.index()]
    }

    /// The IANA name of the time zone, if it has one.
    pub fn time_zone_name(&self) -> Option<&str> {
        self.zone.iana_name()
    }

    /// `text` as an instant: Unix seconds, an RFC 3339 timestamp, or a
    /// date (midnight in the time zone).
    pub(crate) fn parse_instant(&self, text: &str) -> Option<Timestamp> {
        let secs = if let Ok(secs) = text.parse::<u64>() {
            i64::try_from(secs).ok()?
        } else if let Ok(ts) = text.parse::<jiff::Timestamp>() {
            ts.as_second()
        } else {
            let date: jiff::civil::Date = text.parse().ok()?;
            date.to_zoned(self.zone.clone())
                .ok()?
                .timestamp()
                .as_second()
        };
        (0..=LATEST_SECS)
            .contains(&secs)
            .then(|| Timestamp::from_secs(secs.unsigned_abs()))
    }

    /// The start of the bucket of `granularity` that `at` falls in.
    pub fn bucket_start(&self, granularity: Granularity, at: Timestamp) -> Timestamp {
        Timestamp::from_secs(self.start_secs(granularity, secs(at)).max(0).unsigned_abs())
    }

    /// The start of the bucket after the one that starts at `start`.
    ///
    /// Hour buckets are named by the start of their local hour. Where a
    /// zone's offset changes by half an hour (Lord Howe Island's daylight
    /// saving time), the hour in which the change falls ends at the
    /// change, and the next one is named by its local hour's start, which
    /// comes before the change; see [`bucket_end`](Self::bucket_end).
    pub fn next_bucket(&self, granularity: Granularity, start: Timestamp) -> Timestamp {
        let end = self.next_secs(granularity, secs(start));
        let next = self.start_secs(granularity, end).max(secs(start) + 1);
        Timestamp::from_secs(next.max(0).unsigned_abs())
    }

    /// When the bucket of `granularity` that starts at `start` ends: the
    /// first instant that the next bucket holds. The same as
    /// [`next_bucket`](Self::next_bucket) but for an hour in which a
    /// zone's offset changes by half an hour.
    ///
    /// ```
    /// use tollgate_core::ledger::{Granularity, LedgerSettings};
    /// use tollgate_core::Timestamp;
    ///
    /// // Lord Howe Island: at 2 a.m. on 2025-10-05 (15:30 UTC the day
    /// // before) its clocks go from UTC+10:30 to UTC+11:00, 2:30 a.m.
    /// let settings = LedgerSettings::new().time_zone("Australia/Lord_Howe")?;
    /// let one_am = Timestamp::from_secs(1_759_588_200); // 14:30 UTC
    /// let change = Timestamp::from_secs(1_759_591_800); // 15:30 UTC
    /// assert_eq!(settings.bucket_end(Granularity::Hour, one_am), change);
    /// // The next hour is local 2 a.m. under the new offset, 15:00 UTC,
    /// // and holds the instants from the change to 16:00 UTC.
    /// let two_am = settings.next_bucket(Granularity::Hour, one_am);
    /// assert_eq!(two_am, Timestamp::from_secs(1_759_590_000));
    /// assert_eq!(settings.bucket_start(Granularity::Hour, change), two_am);
    /// assert_eq!(settings.bucket_end(Granularity::Hour, two_am), Timestamp::from_secs(1_759_593_600));
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    pub fn bucket_end(&self, granularity: Granularity, start: Timestamp) -> Timestamp {
        let end = self.next_secs(granularity, secs(start));
        Timestamp::from_secs(end.max(0).unsigned_abs())
    }

    /// When the bucket of `granularity` that starts at `start` may be
    /// forgotten: after the longest a bucket of it lasts (an hour, 25
    /// hours, 31 days and an hour) and its retention. Every ledger uses
    /// it, so memory and Redis forget alike.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::ledger::{Granularity, LedgerSettings};
    /// use tollgate_core::Timestamp;
    ///
    /// let settings = LedgerSettings::new().retention(Granularity::Hour, Duration::from_secs(60))?;
    /// let start = Timestamp::from_secs(1_767_225_600);
    /// assert_eq!(settings.expires_at(Granularity::Hour, start), Timestamp::from_secs(1_767_229_260));
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    pub fn expires_at(&self, granularity: Granularity, start: Timestamp) -> Timestamp {
        let secs = self.expires_at_secs(granularity, start.as_micros() / 1_000_000);
        Timestamp::from_secs(secs.min(u64::MAX / 1_000_000))
    }

    pub(crate) fn expires_at_secs(&self, granularity: Granularity, start_secs: u64) -> u64 {
        start_secs
            .saturating_add(granularity.longest_secs())
            .saturating_add(self.retention_of(granularity).as_secs())
    }

    /// The starts of the hour, day and month of `at`, in seconds, and the
    /// instants between which they stay the same.
    pub(crate) fn starts(&self, at_secs: i64) -> Span {
        let at = at_secs.clamp(0, LATEST_SECS);
        let starts = Granularity::ALL.map(|g| self.start_secs(g, at));
        let ends = Granularity::ALL.map(|g| self.next_secs(g, starts[g.index()]));
        // An hour begun at a change of offset starts, as a bucket, before
        // its first instant (see `hour_end`): the span starts at the change.
        let change = jiff::Timestamp::from_second(at + 1)
            .ok()
            .and_then(|ts| self.zone.preceding(ts).next())
            .map_or(0, |change| change.timestamp().as_second());
        Span {
            starts,
            from: starts.iter().copied().max().unwrap_or(at).max(change),
            until: ends.iter().copied().min().unwrap_or(at + 1),
        }
    }

    fn start_secs(&self, granularity: Granularity, at: i64) -> i64 {
        let at = at.clamp(0, LATEST_SECS);
        let Ok(ts) = jiff::Timestamp::from_second(at) else {
            return at;
        };
        let hour = {
            let offset = i64::from(self.zone.to_offset(ts).seconds());
            at - (at + offset).rem_euclid(3_600)
        };
        let zoned = ts.to_zoned(self.zone.clone());
        let civil = match granularity {
            Granularity::Hour => return hour,
            Granularity::Day => zoned.start_of_day(),
            Granularity::Month => zoned.first_of_month().and_then(|z| z.start_of_day()),
        };
        civil.map_or(hour, |z| z.timestamp().as_second())
    }

    /// Where the bucket of `granularity` that starts at `start` ends: the
    /// first instant after it that another bucket holds.
    fn next_secs(&self, granularity: Granularity, start: i64) -> i64 {
        let start = start.clamp(0, LATEST_SECS);
        let Ok(ts) = jiff::Timestamp::from_second(start) else {
            return start + 3_600;
        };
        let zoned = ts.to_zoned(self.zone.clone());
        let next = match granularity {
            Granularity::Hour => return self.hour_end(ts, start),
            Granularity::Day => zoned.tomorrow().and_then(|z| z.start_of_day()),
            Granularity::Month => zoned
                .first_of_month()
                .and_then(|z| z.checked_add(jiff::Span::new().months(1)))
                .and_then(|z| z.start_of_day()),
        };
        next.map_or(start + 3_600, |z| z.timestamp().as_second())
            .max(start + 1)
    }

    /// Where the hour bucket starting at `start` (`ts`) ends: an hour
    /// later, or at a change of the zone's offset within that hour that
    /// moves the instants after it to another local hour (a change by half
    /// an hour, as Lord Howe Island's). An hour bucket is named by the
    /// start of its local hour, which, after such a change, can come before
    /// its first instant: the hour begun at the change.
    fn hour_end(&self, ts: jiff::Timestamp, start: i64) -> i64 {
        let nominal = start + 3_600;
        for change in self.zone.following(ts) {
            let at = change.timestamp().as_second();
            if at >= nominal {
                break;
            }
            if at > start && self.start_secs(Granularity::Hour, at) != start {
                return at;
            }
        }
        nominal
    }
}

/// The buckets of an instant, and the span of instants that share them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    /// Hour, day and month starts, in seconds.
    pub(crate) starts: [i64; 3],
    pub(crate) from: i64,
    pub(crate) until: i64,
}

impl Span {
    pub(crate) fn holds(&self, at_secs: i64) -> bool {
        (self.from..self.until).contains(&at_secs)
    }
}

/// `at` in whole seconds.
pub(crate) fn secs(at: Timestamp) -> i64 {
    i64::try_from(at.as_micros() / 1_000_000).unwrap_or(i64::MAX)
}
