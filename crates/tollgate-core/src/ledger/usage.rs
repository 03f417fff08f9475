//! What a ledger is asked ([`UsageQuery`]) and what it answers
//! ([`Usage`]).

use crate::error::ConfigError;
use crate::time::Timestamp;

use super::calendar::{Granularity, LedgerSettings, secs};

/// The most buckets one query spans.
pub const MAX_BUCKETS: usize = 2_000;

/// A range of time to read a key's usage over, in buckets of one
/// granularity: every bucket that starts from the bucket holding `from`
/// up to (not including) `to`.
///
/// ```
/// use tollgate_core::ledger::{Granularity, UsageQuery};
/// use tollgate_core::Timestamp;
///
/// let day = |d: u64| Timestamp::from_secs(1_767_225_600 + d * 86_400); // 2026-01-01
/// assert!(UsageQuery::new(Granularity::Day, day(0), day(31)).is_ok());
/// assert!(UsageQuery::new(Granularity::Day, day(31), day(0)).is_err()); // backwards
/// assert!(UsageQuery::new(Granularity::Hour, day(0), day(365)).is_err()); // 8,760 hours
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageQuery {
    granularity: Granularity,
    from: Timestamp,
    to: Timestamp,
}

impl UsageQuery {
    /// The buckets of `granularity` from the one holding `from` to `to`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] (setting `range`) when `to` is
    /// before `from`, or the range may span more than [`MAX_BUCKETS`]
    /// buckets.
    pub fn new(
        granularity: Granularity,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<Self, ConfigError> {
        if to < from {
            return Err(ConfigError::InvalidSetting {
                setting: "range",
                reason: "the end is before the start",
            });
        }
        let shortest = match granularity {
            Granularity::Hour => 3_600,
            Granularity::Day => 23 * 3_600,
            Granularity::Month => 28 * 86_400,
        };
        let span = secs(to).saturating_sub(secs(from)).unsigned_abs();
        if span / shortest >= MAX_BUCKETS as u64 {
            return Err(ConfigError::InvalidSetting {
                setting: "range",
                reason: "a query spans at most 2,000 buckets",
            });
        }
        Ok(Self {
            granularity,
            from,
            to,
        })
    }

    /// The query a caller's parameters ask for (as strings, from a query
    /// string): `granularity` (`hour`, `day` or `month`; `day` by default),
    /// `from` (the start of the current month in `settings`' time zone by
    /// default) and `to` (`now` by default, its bucket included). An
    /// instant is Unix seconds, an RFC 3339 timestamp
    /// (`2026-01-31T23:00:00Z`), or a date (`2026-01-31`), midnight in the
    /// time zone.
    ///
    /// ```
    /// use tollgate_core::ledger::{Granularity, LedgerSettings, UsageQuery};
    /// use tollgate_core::Timestamp;
    ///
    /// let berlin = LedgerSettings::new().time_zone("Europe/Berlin")?;
    /// let now = Timestamp::from_secs(1_769_900_400); // 2026-02-01 00:00 in Berlin
    /// let query = UsageQuery::from_params(&berlin, now, None, None, None)?;
    /// assert_eq!(query.granularity(), Granularity::Day);
    /// assert_eq!(query.from(), Timestamp::from_secs(1_769_900_400));
    /// let query = UsageQuery::from_params(&berlin, now, Some("hour"), Some("2026-01-31"), Some("1769900400"))?;
    /// assert_eq!(query.from(), Timestamp::from_secs(1_769_814_000));
    /// assert!(UsageQuery::from_params(&berlin, now, Some("week"), None, None).is_err());
    /// assert!(UsageQuery::from_params(&berlin, now, None, Some("yesterday"), None).is_err());
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] or [`ConfigError::InvalidValue`],
    /// naming the parameter, for a value that does not parse or a range
    /// [`new`](Self::new) refuses.
    pub fn from_params(
        settings: &LedgerSettings,
        now: Timestamp,
        granularity: Option<&str>,
        from: Option<&str>,
        to: Option<&str>,
    ) -> Result<Self, ConfigError> {
        let granularity = granularity.map_or(Ok(Granularity::Day), str::parse)?;
        let instant = |name: &'static str, text: &str| {
            settings
                .parse_instant(text)
                .ok_or_else(|| ConfigError::InvalidValue {
                    setting: name,
                    value: text.chars().take(64).collect(),
                    reason: "use Unix seconds, an RFC 3339 timestamp or a date (YYYY-MM-DD)",
                })
        };
        let to = match to {
            Some(text) => instant("to", text)?,
            None => Timestamp::from_micros(now.as_micros().saturating_add(1)),
        };
        let from = match from {
            Some(text) => instant("from", text)?,
            None => settings.bucket_start(Granularity::Month, now),
        };
        Self::new(granularity, from, to)
    }

    /// The buckets' granularity.
    pub fn granularity(&self) -> Granularity {
        self.granularity
    }

    /// The start of the range as given.
    pub fn from(&self) -> Timestamp {
        self.from
    }

    /// The end of the range (not included).
    pub fn to(&self) -> Timestamp {
        self.to
    }

    /// The starts of the buckets the query covers, in order, under
    /// `settings`' calendar: for a ledger of your own, the buckets to read.
    ///
    /// ```
    /// use tollgate_core::ledger::{Granularity, LedgerSettings, UsageQuery};
    /// use tollgate_core::Timestamp;
    ///
    /// let jan = Timestamp::from_secs(1_767_225_600); // 2026-01-01
    /// let mid_march = Timestamp::from_secs(1_773_532_800); // 2026-03-15
    /// let query = UsageQuery::new(Granularity::Month, mid_march, Timestamp::from_secs(1_775_001_600))?;
    /// assert_eq!(query.bucket_starts(&LedgerSettings::new()).len(), 1); // March
    /// let query = UsageQuery::new(Granularity::Month, jan, mid_march)?;
    /// assert_eq!(query.bucket_starts(&LedgerSettings::new()).len(), 3);
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    pub fn bucket_starts(&self, settings: &LedgerSettings) -> Vec<Timestamp> {
        let g = self.granularity;
        let mut start = settings.bucket_start(g, self.from);
        // Where the bucket's instants begin: after its start, for an hour
        // begun at a change of offset by half an hour (see
        // `LedgerSettings::next_bucket`).
        let mut begins = self.from;
        let mut starts = Vec::new();
        while begins < self.to && starts.len() <= MAX_BUCKETS {
            starts.push(start);
            let next = settings.next_bucket(g, start);
            if next <= start {
                break;
            }
            begins = settings.bucket_end(g, start);
            start = next;
        }
        starts
    }
}

/// The usage of one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageBucket {
    start: Timestamp,
    end: Timestamp,
    units: u64,
}

impl UsageBucket {
    /// When the bucket begins.
    pub fn start(&self) -> Timestamp {
        self.start
    }

    /// When the next bucket begins.
    pub fn end(&self) -> Timestamp {
        self.end
    }

    /// The settled units used in it.
    pub fn units(&self) -> u64 {
        self.units
    }
}

/// A key's usage under a policy over a [`UsageQuery`]'s range: each bucket
/// with any use, in order, and their total (saturating at `u64::MAX`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    granularity: Granularity,
    buckets: Vec<UsageBucket>,
    total: u64,
}

impl Usage {
    /// The usage that `units` gives, the units of each bucket of `query`
    /// by its start: for a ledger of your own. Buckets of no use are left
    /// out; each bucket ends where `settings`' calendar ends it (see
    /// [`LedgerSettings::bucket_end`]).
    pub fn from_buckets(
        settings: &LedgerSettings,
        query: &UsageQuery,
        units: impl IntoIterator<Item = (Timestamp, u64)>,
    ) -> Self {
        let g = query.granularity;
        let buckets: Vec<UsageBucket> = units
            .into_iter()
            .filter(|&(_, units)| units > 0)
            .map(|(start, units)| UsageBucket {
                start,
                end: settings.bucket_end(g, start),
                units,
            })
            .collect();
        let total = buckets.iter().fold(0u64, |t, b| t.saturating_add(b.units));
        Self {
            granularity: g,
            buckets,
            total,
        }
    }

    /// The buckets' granularity.
    pub fn granularity(&self) -> Granularity {
        self.granularity
    }

    /// Each bucket with any use, oldest first.
    pub fn buckets(&self) -> &[UsageBucket] {
        &self.buckets
    }

    /// The units used over the whole range.
    pub fn total(&self) -> u64 {
        self.total
    }
}
