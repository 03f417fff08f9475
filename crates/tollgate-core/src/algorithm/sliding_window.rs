//! The sliding window counter: the current window's count plus the
//! previous window's, weighted by how much of it the sliding period still
//! overlaps. Lua: `sliding_window.lua`.

use crate::algorithm::rule::{Rule, Seen, saved_count, saved_time, window_start};
use crate::policy::{LimitParams, MAX_SPAN_US};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlidingWindow {
    /// Start of the current window, a multiple of the period.
    pub(crate) start: u64,
    /// Cost admitted in the previous window.
    pub(crate) prev: u64,
    /// Cost admitted in the current window.
    pub(crate) curr: u64,
}

impl Rule for SlidingWindow {
    fn fresh(p: &LimitParams, now: u64) -> Self {
        SlidingWindow {
            start: window_start(now, p.period_us),
            prev: 0,
            curr: 0,
        }
    }

    fn advance(&mut self, p: &LimitParams, now: u64) {
        let period = p.period_us;
        let ws = window_start(now, period);
        if ws > self.start {
            self.prev = if ws - self.start == period {
                self.curr
            } else {
                0
            };
            self.curr = 0;
            self.start = ws;
        }
    }

    fn status(&self, p: &LimitParams, now: u64, _queue_free: u64) -> (u64, u64) {
        let period = p.period_us;
        let used = self.curr + weighted(self.prev, now.saturating_sub(self.start), period);
        let reset = if self.curr > 0 {
            self.start + 2 * period
        } else if self.prev > 0 {
            self.start + period
        } else {
            now
        };
        (
            p.limit.count().saturating_sub(used),
            reset.saturating_sub(now),
        )
    }

    fn admits(&self, p: &LimitParams, now: u64, cost: u64, _queue_free: u64) -> Result<(), u64> {
        let (n, period) = (p.limit.count(), p.period_us);
        let SlidingWindow { start, prev, curr } = *self;
        let elapsed = now.saturating_sub(start);
        if curr + weighted(prev, elapsed, period) + cost <= n {
            return Ok(());
        }
        // Later in this window: prev * (P - e) <= (n - curr - cost) * P.
        if let Some(budget) = n.checked_sub(curr + cost) {
            let e = first_offset(prev, u128::from(budget) * u128::from(period), period);
            if e < period {
                return Err((start + e).saturating_sub(now));
            }
        }
        // In the next window, where `curr` becomes the previous count.
        let budget = u128::from(n - cost) * u128::from(period);
        let e = first_offset(curr, budget, period);
        Err((start + period + e).saturating_sub(now))
    }

    fn commit(&mut self, _p: &LimitParams, _now: u64, cost: u64, _queue_free: u64) {
        self.curr += cost;
    }

    fn charge(&mut self, _p: &LimitParams, _now: u64, n: u64, _queue_free: u64) {
        self.curr = (self.curr + n).min(MAX_SPAN_US);
    }

    /// From the window the request was reserved in, current or previous.
    fn refund(&mut self, p: &LimitParams, _now: u64, n: u64, since: u64) {
        let reserved_in = window_start(since, p.period_us);
        if reserved_in == self.start {
            self.curr -= n.min(self.curr);
        } else if reserved_in.checked_add(p.period_us) == Some(self.start) {
            self.prev -= n.min(self.prev);
        }
    }

    fn expires_at(&self, p: &LimitParams) -> u64 {
        if self.curr > 0 {
            self.start + 2 * p.period_us
        } else if self.prev > 0 {
            self.start + p.period_us
        } else {
            0
        }
    }

    /// In the current window, unless the limit is whole again by its end:
    /// then the use was all in the previous window, whose count is at
    /// least what makes it weigh `used` now. (Put in the current window, it
    /// counted for two periods, past the wait told.) A limit seen with
    /// nothing left may hide a debt (a settled charge) that weighs more
    /// than the count: it is held until the window's end.
    fn seeded(self, p: &LimitParams, seen: Seen, now: u64) -> Self {
        let left = (self.start + p.period_us).saturating_sub(now);
        if seen.backlog_us > left || left == 0 {
            return SlidingWindow {
                curr: seen.used,
                ..self
            };
        }
        let prev = match seen.used >= p.limit.count() {
            true => u128::from(MAX_SPAN_US),
            false => (u128::from(seen.used) * u128::from(p.period_us)).div_ceil(u128::from(left)),
        };
        SlidingWindow {
            prev: u64::try_from(prev).unwrap_or(u64::MAX).min(MAX_SPAN_US),
            curr: 0,
            ..self
        }
    }

    fn save(&self, out: &mut Vec<u64>) {
        out.extend([self.start, self.prev, self.curr]);
    }

    fn load(_p: &LimitParams, words: &mut std::slice::Iter<'_, u64>) -> Option<Self> {
        Some(Self {
            start: saved_time(words)?,
            prev: saved_count(words)?,
            curr: saved_count(words)?,
        })
    }
}

/// `ceil(prev * (P - e) / P)`: the previous window's weighted count,
/// rounded up so that `curr + weighted + cost <= n` holds exactly when
/// `curr + prev * (P - e) / P + cost <= n` does in real numbers.
fn weighted(prev: u64, elapsed: u64, period: u64) -> u64 {
    let left = u128::from(period.saturating_sub(elapsed));
    let w = (u128::from(prev) * left).div_ceil(u128::from(period));
    u64::try_from(w).unwrap_or(u64::MAX)
}

/// The smallest offset `e` in `0..=P` into a window with
/// `count * (P - e) <= budget`.
fn first_offset(count: u64, budget: u128, period: u64) -> u64 {
    if count == 0 {
        return 0;
    }
    let k = budget / u128::from(count);
    let k = u64::try_from(k).unwrap_or(u64::MAX).min(period);
    period - k
}
