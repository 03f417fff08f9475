//! The state of one limit under its policy's algorithm, and the one
//! match over the algorithms' states.

use crate::algorithm::Algorithm;
use crate::algorithm::fixed_window::FixedWindow;
use crate::algorithm::gcra::Gcra;
use crate::algorithm::leaky_bucket::LeakyBucket;
use crate::algorithm::rule::Rule;
use crate::algorithm::rule::Seen;
use crate::algorithm::sliding_log::SlidingLog;
use crate::algorithm::sliding_window::SlidingWindow;
use crate::algorithm::token_bucket::TokenBucket;
use crate::policy::LimitParams;

/// The state of one limit, under its policy's algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LimitState {
    FixedWindow(FixedWindow),
    SlidingLog(SlidingLog),
    SlidingWindow(SlidingWindow),
    TokenBucket(TokenBucket),
    LeakyBucket(LeakyBucket),
    Gcra(Gcra),
}

/// Applies `$body` to the algorithm's state `$s`, whichever it is: the one
/// match over the algorithms; `$wrap` rebuilds a [`LimitState`] from a
/// state of the same algorithm where the body returns one.
macro_rules! each {
    ($state:expr, $s:ident => $body:expr) => {
        match $state {
            LimitState::FixedWindow($s) => $body,
            LimitState::SlidingLog($s) => $body,
            LimitState::SlidingWindow($s) => $body,
            LimitState::TokenBucket($s) => $body,
            LimitState::LeakyBucket($s) => $body,
            LimitState::Gcra($s) => $body,
        }
    };
    ($state:expr, $s:ident => wrap $body:expr) => {
        match $state {
            LimitState::FixedWindow($s) => LimitState::FixedWindow($body),
            LimitState::SlidingLog($s) => LimitState::SlidingLog($body),
            LimitState::SlidingWindow($s) => LimitState::SlidingWindow($body),
            LimitState::TokenBucket($s) => LimitState::TokenBucket($body),
            LimitState::LeakyBucket($s) => LimitState::LeakyBucket($body),
            LimitState::Gcra($s) => LimitState::Gcra($body),
        }
    };
}

impl LimitState {
    pub(crate) fn fresh(algorithm: Algorithm, p: &LimitParams, now: u64) -> Self {
        match algorithm {
            Algorithm::FixedWindow => LimitState::FixedWindow(Rule::fresh(p, now)),
            Algorithm::SlidingLog => LimitState::SlidingLog(Rule::fresh(p, now)),
            Algorithm::SlidingWindow => LimitState::SlidingWindow(Rule::fresh(p, now)),
            Algorithm::TokenBucket => LimitState::TokenBucket(Rule::fresh(p, now)),
            Algorithm::LeakyBucket => LimitState::LeakyBucket(Rule::fresh(p, now)),
            Algorithm::Gcra => LimitState::Gcra(Rule::fresh(p, now)),
        }
    }

    pub(crate) fn advance(&mut self, p: &LimitParams, now: u64) {
        each!(self, s => s.advance(p, now));
    }

    pub(crate) fn status(&self, p: &LimitParams, now: u64, queue_free: u64) -> (u64, u64) {
        each!(self, s => s.status(p, now, queue_free))
    }

    pub(crate) fn admits(
        &self,
        p: &LimitParams,
        now: u64,
        cost: u64,
        queue_free: u64,
    ) -> Result<(), u64> {
        each!(self, s => s.admits(p, now, cost, queue_free))
    }

    pub(crate) fn commit(&mut self, p: &LimitParams, now: u64, cost: u64, queue_free: u64) {
        each!(self, s => s.commit(p, now, cost, queue_free));
    }

    pub(crate) fn charge(&mut self, p: &LimitParams, now: u64, n: u64, queue_free: u64) {
        each!(self, s => s.charge(p, now, n, queue_free));
    }

    pub(crate) fn refund(&mut self, p: &LimitParams, now: u64, n: u64, since: u64) {
        each!(self, s => s.refund(p, now, n, since));
    }

    pub(crate) fn expires_at(&self, p: &LimitParams) -> u64 {
        each!(self, s => s.expires_at(p))
    }

    pub(crate) fn carried(self, old: &LimitParams, new: &LimitParams, now: u64) -> Self {
        each!(self, s => wrap s.carried(old, new, now))
    }

    pub(crate) fn seeded(self, p: &LimitParams, seen: Seen, now: u64) -> Self {
        each!(self, s => wrap s.seeded(p, seen, now))
    }

    pub(crate) fn save(&self, out: &mut Vec<u64>) {
        each!(self, s => s.save(out));
    }

    /// The state of a limit of `p` under `algorithm`, saved at the front
    /// of `words`.
    pub(crate) fn load(
        algorithm: Algorithm,
        p: &LimitParams,
        words: &mut std::slice::Iter<'_, u64>,
    ) -> Option<Self> {
        Some(match algorithm {
            Algorithm::FixedWindow => LimitState::FixedWindow(Rule::load(p, words)?),
            Algorithm::SlidingLog => LimitState::SlidingLog(Rule::load(p, words)?),
            Algorithm::SlidingWindow => LimitState::SlidingWindow(Rule::load(p, words)?),
            Algorithm::TokenBucket => LimitState::TokenBucket(Rule::load(p, words)?),
            Algorithm::LeakyBucket => LimitState::LeakyBucket(Rule::load(p, words)?),
            Algorithm::Gcra => LimitState::Gcra(Rule::load(p, words)?),
        })
    }

    /// When this limit's queue lets a request leave: only a leaky bucket
    /// queues; every other algorithm lets it leave at once (0).
    pub(crate) fn queue_free(&self) -> u64 {
        match self {
            LimitState::LeakyBucket(bucket) => bucket.free_at,
            LimitState::FixedWindow(_)
            | LimitState::SlidingLog(_)
            | LimitState::SlidingWindow(_)
            | LimitState::TokenBucket(_)
            | LimitState::Gcra(_) => 0,
        }
    }
}
