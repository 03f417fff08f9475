//! The token bucket: bursts up to the capacity, refilled continuously.
//! Lua: `token_bucket.lua`; a single limit is kept in the one-time form of
//! `gcra.rs`, the time the bucket is full again.

use crate::algorithm::rule::{Rule, Seen, charged, refunded, rescaled, saved_count, saved_time};
use crate::policy::{LimitParams, MAX_SPAN_US};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TokenBucket {
    /// Whole tokens in the bucket.
    pub(crate) tokens: u64,
    /// When the last whole token was added; refill progress counts from here.
    pub(crate) refilled_at: u64,
}

impl TokenBucket {
    /// The bucket that is full again at `full_at`: whole tokens, and the
    /// last refill on the grid of intervals that ends there.
    pub(crate) fn full_at(full_at: u64, p: &LimitParams, now: u64) -> Self {
        if full_at <= now {
            return TokenBucket {
                tokens: p.capacity,
                refilled_at: now,
            };
        }
        let missing = (full_at - now).div_ceil(p.interval_us.max(1));
        let tokens = p.capacity.saturating_sub(missing);
        TokenBucket {
            tokens,
            refilled_at: full_at - (p.capacity - tokens) * p.interval_us,
        }
    }
}

impl Rule for TokenBucket {
    fn fresh(p: &LimitParams, now: u64) -> Self {
        TokenBucket {
            tokens: p.capacity,
            refilled_at: now,
        }
    }

    fn advance(&mut self, p: &LimitParams, now: u64) {
        let gained = now.saturating_sub(self.refilled_at) / p.per_interval;
        if gained >= p.capacity.saturating_sub(self.tokens) {
            self.tokens = p.capacity;
            self.refilled_at = now.max(self.refilled_at);
        } else {
            self.tokens += gained;
            self.refilled_at += gained * p.interval_us;
        }
    }

    fn status(&self, p: &LimitParams, now: u64, _queue_free: u64) -> (u64, u64) {
        let reset = if self.tokens >= p.capacity {
            0
        } else {
            (self.refilled_at + (p.capacity - self.tokens) * p.interval_us).saturating_sub(now)
        };
        (self.tokens, reset)
    }

    fn admits(&self, p: &LimitParams, now: u64, cost: u64, _queue_free: u64) -> Result<(), u64> {
        if cost <= self.tokens {
            Ok(())
        } else {
            Err((self.refilled_at + (cost - self.tokens) * p.interval_us).saturating_sub(now))
        }
    }

    fn commit(&mut self, _p: &LimitParams, _now: u64, cost: u64, _queue_free: u64) {
        self.tokens -= cost;
    }

    /// On the time the bucket is full again: below empty is a later time.
    fn charge(&mut self, p: &LimitParams, now: u64, n: u64, _queue_free: u64) {
        *self = TokenBucket::full_at(charged(p, self.expires_at(p), now, n), p, now);
    }

    fn refund(&mut self, p: &LimitParams, now: u64, n: u64, since: u64) {
        let full = self.expires_at(p);
        if full > now {
            *self = TokenBucket::full_at(refunded(p, full, now, n, since), p, now);
        }
    }

    fn expires_at(&self, p: &LimitParams) -> u64 {
        self.refilled_at + (p.capacity - self.tokens.min(p.capacity)) * p.interval_us
    }

    fn carried(self, old: &LimitParams, new: &LimitParams, now: u64) -> Self {
        let full_at = self.expires_at(old);
        TokenBucket::full_at(
            rescaled(full_at, old.interval_us, new.interval_us, now),
            new,
            now,
        )
    }

    fn seeded(self, p: &LimitParams, seen: Seen, now: u64) -> Self {
        TokenBucket::full_at(now + seen.backlog_us.min(MAX_SPAN_US), p, now)
    }

    fn save(&self, out: &mut Vec<u64>) {
        out.extend([self.tokens, self.refilled_at]);
    }

    /// A bucket holds at most its capacity.
    fn load(p: &LimitParams, words: &mut std::slice::Iter<'_, u64>) -> Option<Self> {
        Some(Self {
            tokens: saved_count(words).filter(|t| *t <= p.capacity)?,
            refilled_at: saved_time(words)?,
        })
    }
}
