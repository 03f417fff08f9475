//! The named synthetic traffic patterns and their knobs.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use tollgate_core::Timestamp;

use super::{Arrival, Phase, Start, Workload};

/// A named synthetic traffic pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pattern {
    /// One key sending evenly at `rate` for `duration`.
    Steady,
    /// One key sending `burst` requests at once every `every`, for
    /// `duration`.
    Burst,
    /// The "150 calls, then one every 2 s" scenario: nothing before
    /// t = 150 s; then 150 calls within 5 s, each retried after its
    /// `Retry-After` (whole seconds) until admitted; once all succeeded,
    /// 150 more, one every 2 s.
    BurstThenSteady,
    /// `burst` requests in the last 100 ms before a minute boundary and
    /// `burst` more in the first 100 ms after it, every 2 minutes for
    /// `duration`: what a fixed window admits twice over.
    Boundary,
}

impl Pattern {
    /// Every pattern, by name.
    pub const ALL: [(&'static str, Pattern); 4] = [
        ("steady", Pattern::Steady),
        ("burst", Pattern::Burst),
        ("burst-then-steady", Pattern::BurstThenSteady),
        ("boundary", Pattern::Boundary),
    ];
}

impl FromStr for Pattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Pattern::ALL
            .iter()
            .find(|(name, _)| *name == s)
            .map(|(_, p)| *p)
            .ok_or_else(|| {
                let names: Vec<&str> = Pattern::ALL.iter().map(|(n, _)| *n).collect();
                format!(
                    "unknown pattern {s:?}: expected one of {}",
                    names.join(", ")
                )
            })
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Pattern::ALL
            .iter()
            .find(|(_, p)| p == self)
            .map_or("pattern", |(n, _)| *n);
        f.write_str(name)
    }
}

/// The knobs of the synthetic patterns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternOptions {
    /// Time zero; a whole minute, so that fixed windows align with it.
    pub start: Timestamp,
    /// [`Pattern::Steady`]'s rate: this many requests per this period
    /// (default 2 per second).
    pub rate: (u64, Duration),
    /// Requests per burst (default 100).
    pub burst: u64,
    /// Time between bursts (default 1 minute).
    pub every: Duration,
    /// How long the pattern runs (default 10 minutes).
    pub duration: Duration,
    /// Whether rejected requests are retried at their `Retry-After`.
    pub retry: bool,
}

impl Default for PatternOptions {
    fn default() -> Self {
        Self {
            // 2026-01-01T00:00:00Z.
            start: Timestamp::from_secs(1_767_225_600),
            rate: (2, Duration::from_secs(1)),
            burst: 100,
            every: Duration::from_secs(60),
            duration: Duration::from_secs(600),
            retry: false,
        }
    }
}

/// The most requests a pattern makes: each takes memory for the whole
/// replay (about 24 bytes, and its attempts), so a larger one is refused
/// rather than run out of memory.
pub const MAX_PATTERN_REQUESTS: u64 = 20_000_000;

/// Why a pattern's requests cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PatternError {
    /// The options make more requests than [`MAX_PATTERN_REQUESTS`].
    #[error(
        "the pattern would make {requests} requests, more than {MAX_PATTERN_REQUESTS}: \
         shorten --duration, or lower --rate or --burst"
    )]
    TooManyRequests {
        /// How many it would make (at least).
        requests: u128,
    },
}

impl Pattern {
    /// How many requests the pattern makes with `options`.
    fn requests(self, options: &PatternOptions) -> u128 {
        let duration_us = u128::from(micros(options.duration));
        match self {
            Pattern::Steady => steady_count(options.rate, duration_us),
            Pattern::Burst => {
                let every = u128::from(micros(options.every).max(1));
                duration_us.div_ceil(every) * u128::from(options.burst)
            }
            Pattern::BurstThenSteady => 300,
            Pattern::Boundary => {
                let boundaries = duration_us.max(60_000_001).saturating_sub(60_000_000);
                boundaries.div_ceil(120_000_000) * 2 * u128::from(options.burst)
            }
        }
    }

    /// The pattern's requests.
    ///
    /// ```
    /// use tollgate_sim::{Pattern, PatternOptions};
    ///
    /// let w = Pattern::BurstThenSteady.workload(&PatternOptions::default())?;
    /// assert_eq!(w.len(), 300);
    /// assert!(w.retry);
    /// # Ok::<(), tollgate_sim::PatternError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`PatternError::TooManyRequests`] when `options` make more than
    /// [`MAX_PATTERN_REQUESTS`].
    pub fn workload(self, options: &PatternOptions) -> Result<Workload, PatternError> {
        let requests = self.requests(options);
        if requests > u128::from(MAX_PATTERN_REQUESTS) {
            return Err(PatternError::TooManyRequests { requests });
        }
        let arrival = |offset_us: u64| Arrival {
            offset_us,
            key: 0,
            cost: 1,
        };
        let duration_us = micros(options.duration);
        let origin = options.start;
        let at = |offset: u64| Start::At(Timestamp::from_micros(origin.as_micros() + offset));
        let (phases, retry) = match self {
            Pattern::Steady => {
                // Request i at i periods over the count (rounded down):
                // never sooner than the rate, where a rounded interval
                // ran ahead of it.
                let (count, period) = options.rate;
                let (count, period) = (u128::from(count.max(1)), u128::from(micros(period).max(1)));
                let arrivals = (0..steady_count(options.rate, u128::from(duration_us)))
                    .map(|i| arrival(u64::try_from(i * period / count).unwrap_or(u64::MAX)))
                    .collect();
                (
                    vec![Phase {
                        start: at(0),
                        arrivals,
                    }],
                    options.retry,
                )
            }
            Pattern::Burst => {
                let every = micros(options.every).max(1);
                let arrivals = (0..duration_us.div_ceil(every))
                    .flat_map(|i| (0..options.burst).map(move |_| i * every))
                    .map(arrival)
                    .collect();
                (
                    vec![Phase {
                        start: at(0),
                        arrivals,
                    }],
                    options.retry,
                )
            }
            Pattern::BurstThenSteady => {
                // 150 calls spread evenly over 5 s, from t = 150 s.
                let burst = (0..150).map(|i| arrival(i * 5_000_000 / 150)).collect();
                let steady = (0..150).map(|i| arrival(i * 2_000_000)).collect();
                let phases = vec![
                    Phase {
                        start: at(150_000_000),
                        arrivals: burst,
                    },
                    Phase {
                        start: Start::AfterPrevious,
                        arrivals: steady,
                    },
                ];
                (phases, true)
            }
            Pattern::Boundary => {
                // Bursts around t = 60 s, 180 s, 300 s...: 100 ms either side.
                let mut arrivals = Vec::new();
                let mut boundary = 60_000_000;
                while boundary < duration_us.max(60_000_001) {
                    for half in [boundary - 100_000, boundary] {
                        for i in 0..options.burst {
                            arrivals.push(arrival(half + i * 100_000 / options.burst.max(1)));
                        }
                    }
                    boundary += 120_000_000;
                }
                (
                    vec![Phase {
                        start: at(0),
                        arrivals,
                    }],
                    options.retry,
                )
            }
        };
        Ok(Workload {
            origin,
            keys: vec!["client".to_owned()],
            phases,
            retry,
        })
    }
}

/// How many requests a steady `rate` (count per period) makes in
/// `duration_us`: whole ones, the first at 0.
fn steady_count((count, period): (u64, Duration), duration_us: u128) -> u128 {
    let period = u128::from(micros(period).max(1));
    (duration_us * u128::from(count.max(1))).div_ceil(period)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
