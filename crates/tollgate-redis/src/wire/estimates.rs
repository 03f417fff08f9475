//! The two estimates the word scripts' calls keep: which way the
//! one-time script starts, and Redis's clock.

use std::sync::atomic::{AtomicU32, Ordering};

use tollgate_core::Clock;

/// Which way the one-time script starts. Writing first (`SET ... NX GET`)
/// decides an idle key in one command but wastes work on a key that holds
/// a time; reading first (`GET`) costs an idle key one command more and
/// saves the rest more (`BENCHMARKS.md`, "Redis CPU per decision"). The
/// store writes first while fewer than a quarter of recent requests found
/// their key holding a time. Both ways decide exactly the same.
pub(crate) struct WriteOrder {
    fixed: Option<bool>,
    /// The share of recent requests whose key held a time, in 1/65,536,
    /// as a moving average over about 32 requests. Updated without a lock:
    /// a lost update only delays a switch.
    busy: AtomicU32,
}

impl WriteOrder {
    const SCALE: u32 = 1 << 16;
    /// A quarter: writing first saves an idle key a command and costs a
    /// busy key or a denial a dearer one, and by the instruction counts in
    /// `BENCHMARKS.md` ("Write order") it stops paying for denials first,
    /// at about this share.
    const THRESHOLD: u32 = Self::SCALE / 4;

    pub(crate) fn new(fixed: Option<bool>) -> Self {
        Self {
            fixed,
            busy: AtomicU32::new(0),
        }
    }

    /// Whether the one-time script writes first now.
    pub(crate) fn write_first(&self) -> bool {
        self.fixed
            .unwrap_or_else(|| self.busy.load(Ordering::Relaxed) < Self::THRESHOLD)
    }

    /// Counts how many of `words`, a reply's, found their key busy.
    pub(crate) fn observe(&self, words: &[(u64, u64)]) {
        let mut share = self.busy.load(Ordering::Relaxed);
        for &(now, old) in words {
            share -= share / 32;
            if old > now {
                share += Self::SCALE / 32;
            }
        }
        self.busy.store(share, Ordering::Relaxed);
    }
}

/// Redis's clock as the store last saw it, for stamping the decisions
/// whose reply leaves out Redis's time: the one-time script answers a
/// single key whose time is ahead with the gap alone (see `lua/shape/tat.lua`),
/// which decides the request exactly; only [`Decision::now`](tollgate_core::Decision::now) comes from
/// here. Kept as the offset in µs of Redis `TIME` from the store's
/// monotonic clock, taken from every reply that carries Redis's time, so
/// the estimate is within about half a round trip (plus, on a cluster, the
/// skew between nodes). Each offset is taken when the reply is read, after
/// Redis ran the script, so it is never above the true one: on one server
/// whose clock does not step, an estimate made when a call is sent is
/// never later than when Redis ran it, which a reset's fence relies on
/// (see `lua/lib/fence.lua`). The `INFO` read when the store connects, and
/// whenever it checks which server answers, gives the first offset; until
/// then (Redis was down at boot), the system clock stands in. On a
/// cluster, one offset serves every node: off by their skew.
pub(crate) struct RedisClock {
    offset: std::sync::atomic::AtomicI64,
}

impl RedisClock {
    /// Starts from the system clock, as the store's monotonic clock
    /// starts at 0.
    pub(crate) fn new() -> Self {
        let system = tollgate_core::SystemClock.now().as_micros();
        Self {
            offset: i64::try_from(system).unwrap_or(i64::MAX).into(),
        }
    }

    /// Redis said it was `redis_now` at about `local_now`.
    pub(crate) fn saw(&self, redis_now: u64, local_now: u64) {
        let offset = i64::try_from(redis_now)
            .unwrap_or(i64::MAX)
            .saturating_sub_unsigned(local_now);
        self.offset.store(offset, Ordering::Relaxed);
    }

    /// Redis's time at `local_now`, as estimated.
    pub(crate) fn at(&self, local_now: u64) -> u64 {
        local_now.saturating_add_signed(self.offset.load(Ordering::Relaxed))
    }
}
