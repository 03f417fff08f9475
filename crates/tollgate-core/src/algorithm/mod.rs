//! The algorithms: their names here, and one file each with the state it
//! keeps per limit and how it decides, settles, carries over to a new
//! configuration and is saved (the [`Rule`](rule::Rule) trait).
//!
//! An algorithm is one unit, and the compiler finds each of its places:
//! a variant here (with its place in [`Algorithm::next`], which `ALL` is
//! checked against at compile time), its rule in `<name>.rs`, its arm in
//! `state/limit.rs`'s one match over the states, and in tollgate-redis
//! its entry in `algorithm.rs` (its script `lua/algorithm/<name>.lua`, its
//! leasing, its keys). The compact forms a store may keep instead of the
//! full state live next to the algorithm they speed up: the one-time form
//! in `gcra.rs` (shared by the token and leaky buckets) and the window
//! word in `fixed_window.rs`.

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

    /// The algorithm after this one in [`ALL`](Algorithm::ALL). A new
    /// algorithm must be given its place here, and the check below then
    /// fails to compile until `ALL` holds it too.
    const fn next(self) -> Option<Algorithm> {
        match self {
            Algorithm::FixedWindow => Some(Algorithm::SlidingLog),
            Algorithm::SlidingLog => Some(Algorithm::SlidingWindow),
            Algorithm::SlidingWindow => Some(Algorithm::TokenBucket),
            Algorithm::TokenBucket => Some(Algorithm::LeakyBucket),
            Algorithm::LeakyBucket => Some(Algorithm::Gcra),
            Algorithm::Gcra => None,
        }
    }

    /// The algorithm's code in a saved state (see `state::KeyState`):
    /// fixed forever, whatever the order of [`ALL`](Algorithm::ALL); a
    /// new algorithm takes a code never used before.
    pub(crate) const fn code(self) -> u64 {
        match self {
            Algorithm::FixedWindow => 0,
            Algorithm::SlidingLog => 1,
            Algorithm::SlidingWindow => 2,
            Algorithm::TokenBucket => 3,
            Algorithm::LeakyBucket => 4,
            Algorithm::Gcra => 5,
        }
    }

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
        match self {
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra => true,
            Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow => false,
        }
    }

    /// Whether a full limit can free several units at one instant: a fixed
    /// window all of them at its end, a sliding log the entries admitted
    /// together when they leave it. Then callers refused together and told
    /// the same retry time would be admitted together, as a burst. The
    /// others free one unit per emission interval (the sliding window's
    /// weighted count falls steadily).
    ///
    /// ```
    /// use tollgate_core::Algorithm;
    ///
    /// assert!(Algorithm::SlidingLog.frees_in_bulk());
    /// assert!(!Algorithm::Gcra.frees_in_bulk());
    /// ```
    pub const fn frees_in_bulk(self) -> bool {
        match self {
            Algorithm::FixedWindow | Algorithm::SlidingLog => true,
            Algorithm::SlidingWindow
            | Algorithm::TokenBucket
            | Algorithm::LeakyBucket
            | Algorithm::Gcra => false,
        }
    }
}

/// `ALL` holds every algorithm, in the order of [`Algorithm::next`].
const _: () = {
    let mut at = Some(Algorithm::ALL[0]);
    let mut i = 0;
    while let Some(algorithm) = at {
        assert!(
            Algorithm::ALL[i] as u8 == algorithm as u8,
            "Algorithm::ALL is out of order"
        );
        i += 1;
        at = algorithm.next();
    }
    assert!(
        i == Algorithm::ALL.len(),
        "Algorithm::ALL lists an algorithm twice"
    );
};

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
