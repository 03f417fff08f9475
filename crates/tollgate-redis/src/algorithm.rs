//! Everything the Redis store knows of each algorithm, one entry each:
//! the one match over [`Algorithm`] in this crate. A new algorithm is a
//! compile error here until it has its script, its leasing and its keys.
//!
//! The rest of an algorithm lives in tollgate-core: its rule in
//! `algorithm/<name>.rs` (decisions, settling, carry-over, saved form) and
//! its compact form, if any, in `Shape`. Its script,
//! `lua/algorithm/<name>.lua`, runs inside the shared prelude and
//! epilogue, and `lua/lib/carry.lua` carries its state over to a new
//! configuration by the algorithm's name.

use std::time::Duration;

use tollgate_core::{Algorithm, Decision, Policy};

/// The general decision script of an algorithm, from its file under
/// `lua/algorithm/`, inside the shared libraries.
macro_rules! decision_script {
    ($file:literal) => {
        concat!(
            include_str!("lua/lib/arith.lua"),
            include_str!("lua/lib/carry.lua"),
            include_str!("lua/lib/block.lua"),
            include_str!("lua/lib/fence.lua"),
            include_str!("lua/lib/prelude.lua"),
            include_str!(concat!("lua/algorithm/", $file)),
            include_str!("lua/lib/epilogue.lua"),
        )
    };
}

/// What the Redis store knows of one algorithm.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unit {
    /// The general script (any number of limits, any shape).
    pub(crate) script: &'static str,
    /// Whether a lease may hold its units, and how long.
    pub(crate) leasing: Leasing,
    /// Whether each limit keeps a log of its own beside the state key (a
    /// sorted set per period; see `keys::log_keys`).
    pub(crate) logs: bool,
}

/// The entry of `algorithm`.
pub(crate) const fn unit(algorithm: Algorithm) -> Unit {
    match algorithm {
        Algorithm::FixedWindow => Unit {
            script: decision_script!("fixed_window.lua"),
            leasing: Leasing::Window,
            logs: false,
        },
        Algorithm::SlidingLog => Unit {
            script: decision_script!("sliding_log.lua"),
            leasing: Leasing::Never,
            logs: true,
        },
        Algorithm::SlidingWindow => Unit {
            script: decision_script!("sliding_window.lua"),
            leasing: Leasing::Window,
            logs: false,
        },
        Algorithm::TokenBucket => Unit {
            script: decision_script!("token_bucket.lua"),
            leasing: Leasing::Rate,
            logs: false,
        },
        Algorithm::LeakyBucket => Unit {
            script: decision_script!("leaky_bucket.lua"),
            leasing: Leasing::Never,
            logs: false,
        },
        Algorithm::Gcra => Unit {
            script: decision_script!("gcra.lua"),
            leasing: Leasing::Rate,
            logs: false,
        },
    }
}

/// How a policy's algorithm lends itself to leases (each algorithm's is
/// in its [`Unit`]), and when a lease must end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leasing {
    /// Every request is decided by the store. A sliding log remembers when
    /// each request came, and a lease would date its units to the grant,
    /// letting them age out of the log before the requests that used them;
    /// a leaky bucket delays each request by when it comes.
    Never,
    /// GCRA and the token bucket: units reserved early and spent later
    /// only leave the key's traffic more conformant than the store saw it,
    /// so a lease may live as long as its lifetime.
    Rate,
    /// Fixed and sliding windows: units count in the window of the grant,
    /// so a lease also ends with that window.
    Window,
}

impl Leasing {
    pub(crate) fn of(policy: &Policy) -> Self {
        unit(policy.algorithm()).leasing
    }

    /// Whether a lease may hold units of such a policy at all.
    pub(crate) const fn leases(self) -> bool {
        match self {
            Leasing::Never => false,
            Leasing::Rate | Leasing::Window => true,
        }
    }

    /// How long after `sent` (the local time the grant was asked for) a
    /// lease granted by `base` may be spent, given `lifetime`. Measured
    /// from the sending, which precedes the store's decision, so a window
    /// lease ends no later than its window in the store.
    pub(crate) fn lifetime(self, policy: &Policy, base: &Decision, lifetime: Duration) -> Duration {
        match self {
            Leasing::Never => Duration::ZERO,
            Leasing::Rate => lifetime,
            Leasing::Window => {
                let now = base.now().as_micros();
                policy
                    .params()
                    .iter()
                    // The window's end: a multiple of the period, or the
                    // calendar boundary.
                    .map(|p| Duration::from_micros(p.window(now).1.saturating_sub(now)))
                    .fold(lifetime, Duration::min)
            }
        }
    }
}
