//! The algorithms: their names here, and one file each with the state it
//! keeps per limit and how it decides.
//!
//! Each file is one-to-one with a script in `tollgate-redis/src/lua/algorithm/`, which
//! does the same integer arithmetic in Redis. A file implements [`Rule`]
//! (`rule.rs`) for its state; `state.rs` dispatches over the six. The
//! compact forms a store may keep instead of the full state live next to
//! the algorithm they speed up: the one-time form in `gcra.rs` (shared by
//! the token and leaky buckets) and the window word in `fixed_window.rs`.

use std::fmt;

pub(crate) mod fixed_window;
pub(crate) mod gcra;
pub(crate) mod leaky_bucket;
pub(crate) mod rule;
pub(crate) mod sliding_log;
pub(crate) mod sliding_window;
pub(crate) mod token_bucket;

/// The rate-limiting algorithm of a policy.
///
/// Every store implements all six with identical decisions. The guide
/// "choosing an algorithm" compares them; in short:
///
/// | algorithm | admits | state per limit |
/// |---|---|---|
/// | [`FixedWindow`](Algorithm::FixedWindow) | N per window aligned to the Unix epoch; up to 2N across a boundary | 2 integers |
/// | [`SlidingLog`](Algorithm::SlidingLog) | exactly N in any period-long interval | one entry per admitted request |
/// | [`SlidingWindow`](Algorithm::SlidingWindow) | weighted estimate of the previous and current window | 3 integers |
/// | [`TokenBucket`](Algorithm::TokenBucket) | bursts up to the capacity, refilled continuously | 2 integers |
/// | [`LeakyBucket`](Algorithm::LeakyBucket) | shapes: admits with a delay so requests leave at the rate | 1 integer |
/// | [`Gcra`](Algorithm::Gcra) | rate plus burst, like `governor` | 1 integer |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Algorithm {
    /// Counts per window; windows are aligned to multiples of the period
    /// since the Unix epoch, as GitHub does.
    FixedWindow,
    /// Remembers every admitted request for one period: exact.
    SlidingLog,
    /// Sliding window counter: the current window's count plus the previous
    /// window's count weighted by how much of it still overlaps the sliding
    /// period.
    SlidingWindow,
    /// A bucket of `burst` tokens (default: the limit's count), refilled
    /// continuously at count per period.
    TokenBucket,
    /// A leaky bucket used as a queue: requests are admitted with a delay so
    /// that they leave at count per period; a request that finds the queue
    /// (`burst` places, default count) full is rejected.
    LeakyBucket,
    /// Generic cell rate algorithm: count per period with bursts of `burst`
    /// (default: the limit's count).
    Gcra,
}

impl Algorithm {
    /// Every algorithm, in a fixed order.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Gcra,
    ];

    /// The configuration name, such as `"sliding_window"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::Gcra => "gcra",
        }
    }

    /// Whether a policy with this algorithm accepts a `burst`.
    pub const fn has_burst(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra
        )
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
