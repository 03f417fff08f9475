//! The leaky bucket as a queue: requests are admitted with a delay so that
//! they leave at the limit's rate. Lua: `leaky_bucket.lua`; a single limit
//! is kept in the one-time form of `gcra.rs`.

use crate::algorithm::rule::{Rule, Seen, backlog_admits, charged, refunded, rescaled, saved_time};
use crate::policy::{LimitParams, MAX_SPAN_US};

/// When the queue can next release a request: the last admitted request's
/// departure plus its cost in intervals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeakyBucket {
    pub(crate) free_at: u64,
}

impl Rule for LeakyBucket {
    fn fresh(_p: &LimitParams, _now: u64) -> Self {
        LeakyBucket { free_at: 0 }
    }

    /// Each unit admitted moves the joint queue on by the policy's longest
    /// interval: a limit of a shorter one admits `1 + (room - interval) /
    /// step` more, where `room` is its capacity in time less the backlog
    /// (with one limit, `room / interval`, as GCRA counts).
    fn status(&self, p: &LimitParams, now: u64, queue_free: u64) -> (u64, u64) {
        let backlog = queue_free.saturating_sub(now);
        let room = (p.capacity * p.interval_us).saturating_sub(backlog);
        let remaining = match room.checked_sub(p.interval_us) {
            Some(beyond_one) => 1 + beyond_one / p.per_queue_step,
            None => 0,
        };
        (remaining, backlog)
    }

    fn admits(&self, p: &LimitParams, now: u64, cost: u64, queue_free: u64) -> Result<(), u64> {
        backlog_admits(p, queue_free, now, cost)
    }

    fn commit(&mut self, p: &LimitParams, now: u64, cost: u64, queue_free: u64) {
        self.free_at = queue_free.max(now) + cost * p.interval_us;
    }

    /// Like a request that queues: from the joint departure.
    fn charge(&mut self, p: &LimitParams, now: u64, n: u64, queue_free: u64) {
        self.free_at = charged(p, queue_free, now, n);
    }

    fn refund(&mut self, p: &LimitParams, now: u64, n: u64, since: u64) {
        self.free_at = refunded(p, self.free_at, now, n, since);
    }

    fn expires_at(&self, _p: &LimitParams) -> u64 {
        self.free_at
    }

    fn carried(self, old: &LimitParams, new: &LimitParams, now: u64) -> Self {
        LeakyBucket {
            free_at: rescaled(self.free_at, old.interval_us, new.interval_us, now),
        }
    }

    fn seeded(self, _p: &LimitParams, seen: Seen, now: u64) -> Self {
        LeakyBucket {
            free_at: now + seen.backlog_us.min(MAX_SPAN_US),
        }
    }

    fn save(&self, out: &mut Vec<u64>) {
        out.push(self.free_at);
    }

    fn load(_p: &LimitParams, words: &mut std::slice::Iter<'_, u64>) -> Option<Self> {
        Some(Self {
            free_at: saved_time(words)?,
        })
    }
}
