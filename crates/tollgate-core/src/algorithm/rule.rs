//! What every algorithm implements for one limit, and the arithmetic
//! several share. All times are integer microseconds since the Unix epoch.

use crate::policy::{LimitParams, MAX_SPAN_US};

/// One limit's state under one algorithm, and how it decides.
///
/// `queue_free` is the joint departure time of a leaky-bucket policy (a
/// request leaves when every limit's queue lets it); other algorithms
/// ignore it.
pub(crate) trait Rule: Sized {
    /// The state of a key never seen.
    fn fresh(p: &LimitParams, now: u64) -> Self;

    /// Brings the state up to `now` without changing what it means: rolls
    /// windows, drops expired log entries, adds refilled tokens.
    fn advance(&mut self, _p: &LimitParams, _now: u64) {}

    /// `(remaining, reset)` in the current state.
    fn status(&self, p: &LimitParams, now: u64, queue_free: u64) -> (u64, u64);

    /// `Ok` if this limit admits `cost` now (`cost <= capacity` holds),
    /// otherwise the exact time from `now` until it would.
    fn admits(&self, p: &LimitParams, now: u64, cost: u64, queue_free: u64) -> Result<(), u64>;

    /// Consumes `cost`, which [`Rule::admits`] accepted.
    fn commit(&mut self, p: &LimitParams, now: u64, cost: u64, queue_free: u64);

    /// Charges `n` more after the fact (on a state advanced to `now`):
    /// never denied, past the allowance it is debt (see
    /// [`Settlement`](crate::Settlement)).
    fn charge(&mut self, p: &LimitParams, now: u64, n: u64, queue_free: u64);

    /// Gives back up to `n` of what a request reserved at `since` took (on
    /// a state advanced to `now`).
    fn refund(&mut self, p: &LimitParams, now: u64, n: u64, since: u64);

    /// From when on the state is indistinguishable from a fresh one.
    fn expires_at(&self, p: &LimitParams) -> u64;

    /// This state, built under `old`, as the state of `new`, a limit of the
    /// same algorithm and period whose count, interval or capacity may
    /// differ: the amount already used carries over. Counts of a window or
    /// log mean the same under any count (the default); a time ahead of now
    /// is a backlog of used intervals, rescaled to the new interval.
    fn carried(self, _old: &LimitParams, _new: &LimitParams, _now: u64) -> Self {
        self
    }

    /// A fresh state (`self`) that has used what `seen` says at `now`, as
    /// another store reported: windows and logs count its units at `now`,
    /// buckets take its backlog from then.
    fn seeded(self, p: &LimitParams, seen: Seen, now: u64) -> Self;

    /// Appends the words this state is made of: its saved form (see
    /// `state::KeyState::to_bytes`).
    fn save(&self, out: &mut Vec<u64>);

    /// The state [`save`](Rule::save) wrote for a limit of `p`, read from
    /// the front of `words`; `None` when they are too few, or make no
    /// state the arithmetic can take (see [`saved_time`] and
    /// [`saved_count`]).
    fn load(p: &LimitParams, words: &mut std::slice::Iter<'_, u64>) -> Option<Self>;
}

/// The start of the window of `period` holding `now`.
/// The latest time a loaded state may hold: far beyond any clock (2^62
/// µs is about 146,000 years), and far enough below `u64::MAX` that a
/// time plus any span of the arithmetic (at most 2^50 µs) cannot overflow.
pub(crate) const MAX_SAVED_TIME: u64 = 1 << 62;

/// The largest count a loaded state may hold: above any the arithmetic
/// makes (a charge stops at 2^50, and one request adds at most a limit's
/// capacity), and far below `u64::MAX`.
pub(crate) const MAX_SAVED_COUNT: u64 = 1 << 52;

/// The next word of a saved state, as a time: `None` beyond
/// [`MAX_SAVED_TIME`].
pub(crate) fn saved_time(words: &mut std::slice::Iter<'_, u64>) -> Option<u64> {
    words.next().copied().filter(|t| *t <= MAX_SAVED_TIME)
}

/// The next word of a saved state, as a count: `None` beyond
/// [`MAX_SAVED_COUNT`].
pub(crate) fn saved_count(words: &mut std::slice::Iter<'_, u64>) -> Option<u64> {
    words.next().copied().filter(|c| *c <= MAX_SAVED_COUNT)
}

pub(crate) fn window_start(now: u64, period: u64) -> u64 {
    now - now % period
}

/// `word`, a time when a backlog of intervals of `from` µs clears, as the
/// time the same number of intervals of `to` µs clears, rounded up, and at
/// most [`MAX_SPAN_US`] ahead of `now`. A time that has passed stays as it
/// is: it means no backlog under any interval.
pub(crate) fn rescaled(word: u64, from: u64, to: u64, now: u64) -> u64 {
    if word <= now || from == to {
        return word;
    }
    let backlog = u128::from(word - now) * u128::from(to);
    let backlog = backlog.div_ceil(u128::from(from.max(1)));
    now + u64::try_from(backlog).map_or(MAX_SPAN_US, |b| b.min(MAX_SPAN_US))
}

/// `used` units of `p` as a backlog of intervals, bounded.
pub(crate) fn backlog(p: &LimitParams, used: u64) -> u64 {
    used.saturating_mul(p.interval_us).min(MAX_SPAN_US)
}

/// A backlog that clears at `at`, charged `n` more units at `now`: it
/// grows from `now` if it had cleared, and saturates at [`MAX_SPAN_US`]
/// from now. It never shrinks: a backlog already beyond the cap (a clock
/// that stepped back) stays as it is. A charge is work already done, so a
/// larger one never leaves the key better off than a smaller one.
pub(crate) fn charged(p: &LimitParams, at: u64, now: u64, n: u64) -> u64 {
    let grown = at.max(now).saturating_add(backlog(p, n));
    grown.min(now.saturating_add(MAX_SPAN_US)).max(at)
}

/// A backlog that clears at `at`, at most `n` units smaller, never below
/// empty, for a refund of a request reserved at `since` (µs): no more than
/// that request's units can still be in the backlog ([`still_held`]).
/// The rest of the backlog is later requests', and a refund that took it
/// would admit them a second time.
pub(crate) fn refunded(p: &LimitParams, at: u64, now: u64, n: u64, since: u64) -> u64 {
    if at <= now {
        return at;
    }
    let n = n.min(still_held(p, since, now));
    at.saturating_sub(backlog(p, n)).max(now)
}

/// The most units of a request reserved at `since` (µs) that can still be
/// in a rate-based limit's backlog at `now`: it was admitted into a
/// backlog of at most capacity × interval, which drains from then on, so
/// its units are gone by `since` + capacity × interval (whatever was
/// charged after it, which queues behind it). Rounded up: a unit partly
/// drained is still held.
pub(crate) fn still_held(p: &LimitParams, since: u64, now: u64) -> u64 {
    // At most 2^52 µs (in 2112), as the Redis scripts read it, whose
    // arithmetic on it must stay exact in a double.
    let gone_at = since.min(1 << 52).saturating_add(backlog(p, p.capacity));
    gone_at.saturating_sub(now).div_ceil(p.interval_us.max(1))
}

/// What another store reported of a limit, in this limit's terms
/// ([`Rule::seeded`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    /// The units used, rounded up.
    pub(crate) used: u64,
    /// The time in µs until the limit is whole again (its reset), to the
    /// microsecond: a rate-based limit's backlog (whole units would round
    /// it up to an interval), in this limit's time; when a window or a
    /// log has its use back.
    pub(crate) backlog_us: u64,
}

/// `(remaining, backlog)` of a limit whose state is the time `at` its
/// backlog clears: what GCRA reports.
pub(crate) fn backlog_status(p: &LimitParams, at: u64, now: u64) -> (u64, u64) {
    let backlog = at.saturating_sub(now);
    let remaining = (p.capacity * p.interval_us).saturating_sub(backlog) / p.per_interval;
    (remaining, backlog)
}

/// Whether `cost` more fits a backlog that clears at `at`; if not, the
/// time from `now` until it would.
pub(crate) fn backlog_admits(p: &LimitParams, at: u64, now: u64, cost: u64) -> Result<(), u64> {
    let (t, cap) = (p.interval_us, p.capacity);
    let base = at.max(now);
    if base + cost * t - now <= cap * t {
        Ok(())
    } else {
        Err(base + cost * t - cap * t - now)
    }
}
