//! How far past its retry time a waiting caller wakes: [`Jitter`], and
//! the random draws behind it.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_core::{Algorithm, ConfigError, Limit};

/// How [`RateLimiter::until_ready`](crate::RateLimiter::until_ready)
/// spreads the wake-ups of callers waiting on one key: after a denial it
/// sleeps the exact `retry_after`, plus a random part of the refusing
/// limit's emission interval (its period divided by its count), never
/// past the caller's maximum wait.
///
/// Every worker refused by one limit is told the same retry time. Where
/// the limit frees several units at that instant (a fixed window's end,
/// a sliding log's entries admitted together: see
/// [`Algorithm::frees_in_bulk`]), the workers waking together are
/// admitted together, a burst that a partner counting by arrival sees as
/// one, and the store answers a crowd of checks at once. With jitter the
/// wake-ups spread over an interval, and so do the admissions. The rate
/// algorithms (GCRA, token and leaky bucket, sliding window) free one
/// unit per interval, so their waiters are admitted one at a time
/// anyway; there a late wake-up only loses time, which GCRA never makes
/// up (its next slot counts from the late admission).
///
/// The default, [`Jitter::BULK`], is one interval where the limit frees
/// in bulk and none elsewhere. See the outbound guide for what each
/// measured against a partner's own limit.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Algorithm, Jitter, Limit};
///
/// let per_second = Limit::new(10, Duration::from_secs(1))?;
/// assert_eq!(Jitter::default(), Jitter::BULK);
/// assert_eq!(Jitter::BULK.bound(Algorithm::SlidingLog, per_second), Duration::from_millis(100));
/// assert_eq!(Jitter::BULK.bound(Algorithm::Gcra, per_second), Duration::ZERO);
/// assert_eq!(Jitter::ONE_INTERVAL.bound(Algorithm::Gcra, per_second), Duration::from_millis(100));
/// let quarter = Jitter::percent_of_interval(25)?;
/// assert_eq!(quarter.bound(Algorithm::Gcra, per_second), Duration::from_millis(25));
/// assert_eq!(Jitter::NONE.bound(Algorithm::SlidingLog, per_second), Duration::ZERO);
/// assert!(Jitter::percent_of_interval(101).is_err());
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Jitter {
    percent: u8,
    /// Only after a refusal by an algorithm that frees in bulk.
    bulk_only: bool,
}

impl Jitter {
    /// No jitter: a waiting caller wakes at the exact retry time.
    pub const NONE: Self = Self {
        percent: 0,
        bulk_only: false,
    };

    /// Up to one emission interval after a refusal by an algorithm that
    /// frees units in bulk (fixed window, sliding log), none after the
    /// others (the default).
    pub const BULK: Self = Self {
        percent: 100,
        bulk_only: true,
    };

    /// Up to one emission interval after every refusal.
    pub const ONE_INTERVAL: Self = Self {
        percent: 100,
        bulk_only: false,
    };

    /// Up to `percent` of one emission interval after every refusal.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] for more than 100: a wake-up more
    /// than an interval late gives the interval away without spreading
    /// anything more.
    pub fn percent_of_interval(percent: u8) -> Result<Self, ConfigError> {
        if percent > 100 {
            return Err(ConfigError::InvalidSetting {
                setting: "jitter",
                reason: "at most 100 percent of one emission interval",
            });
        }
        Ok(Self {
            percent,
            bulk_only: false,
        })
    }

    /// The part of one emission interval, in percent, where the jitter
    /// applies.
    pub fn percent(&self) -> u8 {
        self.percent
    }

    /// The most this jitter adds to a wait that `limit`, of a policy of
    /// `algorithm`, refused: the part of its emission interval, to the
    /// microsecond, or zero.
    pub fn bound(&self, algorithm: Algorithm, limit: Limit) -> Duration {
        Duration::from_micros(self.bound_micros(algorithm, limit))
    }

    fn bound_micros(&self, algorithm: Algorithm, limit: Limit) -> u64 {
        if self.bulk_only && !algorithm.frees_in_bulk() {
            return 0;
        }
        let interval = u128::from(limit.interval_micros());
        let part = interval * u128::from(self.percent) / 100;
        u64::try_from(part).unwrap_or(u64::MAX)
    }
}

impl Default for Jitter {
    /// [`Jitter::BULK`].
    fn default() -> Self {
        Self::BULK
    }
}

/// A stream of random numbers shared by a limiter's clones (SplitMix64:
/// one atomic add per draw, no lock). Not for secrets: it only spreads
/// wake-ups.
#[derive(Debug)]
pub(crate) struct Draws {
    state: AtomicU64,
}

impl Draws {
    /// A stream seeded from the process's random hashing keys.
    pub(crate) fn new() -> Self {
        let seed = std::collections::hash_map::RandomState::new().hash_one(0x746f_6c6c_u64);
        Self::seeded(seed)
    }

    /// The stream of `seed`: the same draws every time.
    pub(crate) fn seeded(seed: u64) -> Self {
        Self {
            state: AtomicU64::new(seed),
        }
    }

    /// The next number of the stream.
    fn next(&self) -> u64 {
        const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut z = self
            .state
            .fetch_add(GAMMA, Ordering::Relaxed)
            .wrapping_add(GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A jitter of `jitter` for a wait that `limit`, of a policy of
    /// `algorithm`, refused, at most `room`: uniform over whole
    /// microseconds below the bound (zero without room or jitter).
    pub(crate) fn draw(
        &self,
        jitter: Jitter,
        algorithm: Algorithm,
        limit: Limit,
        room: Duration,
    ) -> Duration {
        let room = u64::try_from(room.as_micros()).unwrap_or(u64::MAX);
        let bound = jitter.bound_micros(algorithm, limit).min(room);
        if bound == 0 {
            return Duration::ZERO;
        }
        // Multiply-shift: uniform below `bound` without a division.
        let below = (u128::from(self.next()) * u128::from(bound)) >> 64;
        Duration::from_micros(u64::try_from(below).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GCRA: Algorithm = Algorithm::Gcra;

    fn limit(count: u64, period_ms: u64) -> Limit {
        Limit::new(count, Duration::from_millis(period_ms)).unwrap()
    }

    #[test]
    fn draws_stay_below_the_bound_and_the_room() {
        let draws = Draws::seeded(7);
        let per_second = limit(10, 1_000);
        let mut seen = Vec::new();
        for _ in 0..1_000 {
            let d = draws.draw(
                Jitter::ONE_INTERVAL,
                GCRA,
                per_second,
                Duration::from_secs(5),
            );
            assert!(d < Duration::from_millis(100), "{d:?}");
            seen.push(d);
        }
        // Spread over the interval: draws in each tenth of it.
        for tenth in 0..10 {
            let (low, high) = (
                Duration::from_millis(10 * tenth),
                Duration::from_millis(10 * (tenth + 1)),
            );
            assert!(
                seen.iter().any(|d| *d >= low && *d < high),
                "none in {low:?}"
            );
        }
        for _ in 0..1_000 {
            let d = draws.draw(
                Jitter::ONE_INTERVAL,
                GCRA,
                per_second,
                Duration::from_millis(3),
            );
            assert!(d < Duration::from_millis(3), "{d:?}");
        }
        let none = draws.draw(Jitter::NONE, GCRA, per_second, Duration::from_secs(5));
        assert_eq!(none, Duration::ZERO);
        let no_room = draws.draw(Jitter::ONE_INTERVAL, GCRA, per_second, Duration::ZERO);
        assert_eq!(no_room, Duration::ZERO);
    }

    #[test]
    fn a_seed_gives_the_same_draws() {
        let (a, b) = (Draws::seeded(42), Draws::seeded(42));
        let per_second = limit(10, 1_000);
        let room = Duration::from_secs(1);
        for _ in 0..100 {
            assert_eq!(
                a.draw(Jitter::ONE_INTERVAL, GCRA, per_second, room),
                b.draw(Jitter::ONE_INTERVAL, GCRA, per_second, room)
            );
        }
    }

    #[test]
    fn the_bound_is_the_part_of_the_interval() {
        let daily = limit(500, 86_400_000);
        assert_eq!(
            Jitter::ONE_INTERVAL.bound(GCRA, daily),
            Duration::from_micros(172_800_000)
        );
        let half = Jitter::percent_of_interval(50).unwrap();
        assert_eq!(
            half.bound(GCRA, limit(3, 1_000)),
            Duration::from_micros(166_667)
        );
        // The default: only where a limit frees in bulk.
        for algorithm in Algorithm::ALL {
            let bound = Jitter::BULK.bound(algorithm, daily);
            let expected = match algorithm.frees_in_bulk() {
                true => Duration::from_micros(172_800_000),
                false => Duration::ZERO,
            };
            assert_eq!(bound, expected, "{algorithm:?}");
        }
        assert_eq!(
            Jitter::percent_of_interval(101),
            Err(ConfigError::InvalidSetting {
                setting: "jitter",
                reason: "at most 100 percent of one emission interval",
            })
        );
    }
}
