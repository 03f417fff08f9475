//! GCRA, the generic cell rate algorithm: one theoretical arrival time per
//! limit. Also the one-time compact form ([`decide_tat`]) that a single
//! GCRA, token-bucket or leaky-bucket limit is kept in. Lua: `gcra.lua`,
//! and `tat.lua` for the compact form.

use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::algorithm::rule::{
    Rule, Seen, backlog_admits, backlog_status, charged, refunded, rescaled, saved_time,
};
use crate::decision::{Decision, LimitStatus, Outcome};
use crate::policy::{LimitParams, MAX_SPAN_US, Policy};
use crate::time::Timestamp;

/// The theoretical arrival time: when the limit's backlog clears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Gcra {
    pub(crate) tat: u64,
}

impl Rule for Gcra {
    fn fresh(_p: &LimitParams, _now: u64) -> Self {
        Gcra { tat: 0 }
    }

    fn status(&self, p: &LimitParams, now: u64, _queue_free: u64) -> (u64, u64) {
        backlog_status(p, self.tat, now)
    }

    fn admits(&self, p: &LimitParams, now: u64, cost: u64, _queue_free: u64) -> Result<(), u64> {
        backlog_admits(p, self.tat, now, cost)
    }

    fn commit(&mut self, p: &LimitParams, now: u64, cost: u64, _queue_free: u64) {
        self.tat = self.tat.max(now) + cost * p.interval_us;
    }

    fn charge(&mut self, p: &LimitParams, now: u64, n: u64, _queue_free: u64) {
        self.tat = charged(p, self.tat, now, n);
    }

    fn refund(&mut self, p: &LimitParams, now: u64, n: u64, since: u64) {
        self.tat = refunded(p, self.tat, now, n, since);
    }

    fn expires_at(&self, _p: &LimitParams) -> u64 {
        self.tat
    }

    fn carried(self, old: &LimitParams, new: &LimitParams, now: u64) -> Self {
        Gcra {
            tat: rescaled(self.tat, old.interval_us, new.interval_us, now),
        }
    }

    fn seeded(self, _p: &LimitParams, seen: Seen, now: u64) -> Self {
        Gcra {
            tat: now + seen.backlog_us.min(MAX_SPAN_US),
        }
    }

    fn save(&self, out: &mut Vec<u64>) {
        out.push(self.tat);
    }

    fn load(_p: &LimitParams, words: &mut std::slice::Iter<'_, u64>) -> Option<Self> {
        Some(Self {
            tat: saved_time(words)?,
        })
    }
}

/// [`PolicyState::decide`](crate::state::PolicyState::decide) for a policy
/// of [`Shape::Tat`](crate::Shape::Tat), whose whole state is one time,
/// `word`, in microseconds since the Unix epoch: a GCRA's theoretical
/// arrival time, when a token bucket is full again, or when a leaky
/// bucket's queue is next free (0 for a new key; any time up to `now`
/// means the same). The same arithmetic, without building a
/// [`PolicyState`](crate::state::PolicyState); a property test holds the
/// two equal. An admitted request moves `word` forward; nothing else
/// changes it.
///
/// ```
/// use tollgate_core::{Algorithm, Policy, Timestamp};
/// use tollgate_core::state::decide_tat;
///
/// let policy = Policy::new("api", Algorithm::Gcra, "2/s")?;
/// let now = Timestamp::from_secs(1_700_000_000);
/// let mut word = 0;
/// assert!(decide_tat(&policy, &mut word, now, 1).is_allowed());
/// // The theoretical arrival time is now half a second ahead.
/// assert_eq!(word, now.as_micros() + 500_000);
/// assert!(decide_tat(&policy, &mut word, now, 1).is_allowed());
/// let third = decide_tat(&policy, &mut word, now, 1);
/// assert_eq!(third.retry_after().unwrap().as_millis(), 500);
/// # Ok::<(), tollgate_core::ConfigError>(())
/// ```
#[inline(always)]
pub fn decide_tat(policy: &Policy, word: &mut u64, now: Timestamp, cost: u64) -> Decision {
    let Some(p) = policy.params().first() else {
        return Decision::new(policy, Outcome::Allowed, now, Duration::ZERO, []);
    };
    let (t, cap, now_us) = (p.interval_us, p.capacity, now.as_micros());
    let status = |word: u64, retry: Option<u64>| {
        let backlog = word.saturating_sub(now_us);
        let remaining = (cap * t).saturating_sub(backlog) / p.per_interval;
        LimitStatus::from_micros(0, p.limit, cap, remaining, backlog, retry)
    };
    if cost > cap {
        let outcome = Outcome::CostExceedsCapacity {
            cost,
            capacity: cap,
        };
        return Decision::single(outcome, now, Duration::ZERO, status(*word, None), cost);
    }
    let base = (*word).max(now_us);
    if cost > 0 && base + cost * t - now_us > cap * t {
        let retry = base + cost * t - cap * t - now_us;
        let outcome = Outcome::Limited {
            retry_after: Duration::from_micros(retry),
        };
        return Decision::single(
            outcome,
            now,
            Duration::ZERO,
            status(*word, Some(retry)),
            cost,
        );
    }
    let mut delay = Duration::ZERO;
    if cost > 0 {
        // Of the one-time forms, only a queue delays a request.
        let queues = match policy.algorithm() {
            Algorithm::LeakyBucket => true,
            Algorithm::Gcra | Algorithm::TokenBucket => false,
            Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow => false,
        };
        if queues {
            delay = Duration::from_micros((*word).saturating_sub(now_us));
        }
        *word = base + cost * t;
    }
    Decision::single(Outcome::Allowed, now, delay, status(*word, None), cost)
}
