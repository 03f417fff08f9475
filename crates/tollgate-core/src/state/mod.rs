//! For store implementors: the reference decisions every store must match,
//! and the state a store keeps.
//!
//! [`PolicyState`] holds one key's state for one policy and decides
//! requests against it; [`KeyState`] adds an operator's block, and its
//! saved form (bytes) is all a new backend keeps: see "A store of your
//! own" under [`Store`](crate::Store). The memory store keeps states in
//! memory; the Redis store's Lua scripts implement the same arithmetic and
//! are tested against it. All arithmetic is in integer microseconds since
//! the Unix epoch.
//!
//! The conformance suite of the `testing` feature runs a store against
//! these decisions.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::{Algorithm, Policy, Timestamp};
//! use tollgate_core::state::PolicyState;
//!
//! let policy = Policy::new("jobs", Algorithm::FixedWindow, "2/min")?;
//! let now = Timestamp::from_secs(600); // the start of a minute
//! let mut state = PolicyState::new(&policy, now);
//! assert!(state.decide(&policy, now, 1).is_allowed());
//! assert!(state.decide(&policy, now, 1).is_allowed());
//! let third = state.decide(&policy, now, 1);
//! assert_eq!(third.retry_after(), Some(Duration::from_secs(60)));
//! # Ok::<(), tollgate_core::ConfigError>(())
//! ```

use std::time::Duration;

use smallvec::SmallVec;

#[doc(hidden)] // a storage encoding, shared with tollgate-redis: not part of the API
pub use crate::algorithm::fixed_window::decide_window_word;
#[doc(hidden)] // a storage encoding, shared with tollgate-redis: not part of the API
pub use crate::algorithm::gcra::decide_tat;

use crate::algorithm::Algorithm;
use crate::algorithm::rule::Seen;
use crate::decision::{Decision, LimitStatus, Outcome};
use crate::policy::Policy;
use crate::settle::{Change, Settlement};
use crate::time::Timestamp;

mod encoding;
mod limit;
mod saved;

use limit::LimitState;
pub use saved::{KeyState, SavedStateError};

/// The decision on any request of a key that an operator blocked until
/// `until` (see [`Store::block`](crate::Store::block)), at `now`, before
/// then: denied, whatever its cost (a peek included), with a `Retry-After`
/// of exactly the rest of the block; every limit shows nothing remaining
/// and resets when the block ends, when the key starts afresh. It says so
/// ([`Decision::is_blocked`]).
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{Algorithm, Policy, Timestamp};
/// use tollgate_core::state::blocked;
///
/// let policy = Policy::new("api", Algorithm::Gcra, "10/s")?;
/// let now = Timestamp::from_secs(1_700_000_000);
/// let until = Timestamp::from_micros(now.as_micros() + 90_000_000);
/// let decision = blocked(&policy, now, until);
/// assert_eq!(decision.retry_after(), Some(Duration::from_secs(90)));
/// assert_eq!(decision.remaining(), 0);
/// assert!(decision.is_blocked());
/// # Ok::<(), tollgate_core::ConfigError>(())
/// ```
pub fn blocked(policy: &Policy, now: Timestamp, until: Timestamp) -> Decision {
    let rest = Duration::from_micros(until.as_micros().saturating_sub(now.as_micros()));
    let statuses = policy
        .params()
        .iter()
        .enumerate()
        .map(|(i, p)| LimitStatus::new(i, p.limit, p.capacity, 0, rest, Some(rest)));
    let outcome = Outcome::Limited { retry_after: rest };
    Decision::new(policy, outcome, now, Duration::ZERO, statuses).into_blocked()
}

/// One key's state for one policy: the state of each limit, and the
/// policy it was built under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyState {
    policy: Policy,
    limits: SmallVec<[LimitState; 2]>,
}

impl PolicyState {
    /// The state of a key that has never been seen.
    pub fn new(policy: &Policy, now: Timestamp) -> Self {
        Self {
            policy: policy.clone(),
            limits: policy
                .params()
                .iter()
                .map(|p| LimitState::fresh(policy.algorithm(), p, now.as_micros()))
                .collect(),
        }
    }

    /// The policy the state was built under (or last carried to).
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    fn fits(&self, policy: &Policy) -> bool {
        Policy::ptr_eq(&self.policy, policy) || self.policy.fingerprint() == policy.fingerprint()
    }

    /// Makes this state, built under another configuration of the policy
    /// (the same name, other limits), the state of `policy` at `now`, so
    /// that what was used carries over. Nothing changes if the state was
    /// built under `policy`.
    ///
    /// Limits are matched by period (a policy has at most one limit per
    /// period): a limit of `policy` whose period the old configuration had
    /// takes that limit's use, whatever its count, burst or interval; a
    /// limit it did not have starts empty; an old limit `policy` no longer
    /// has is dropped. A change of algorithm starts every limit afresh.
    ///
    /// ```
    /// use tollgate_core::{Algorithm, Policy, Timestamp};
    /// use tollgate_core::state::PolicyState;
    ///
    /// let old = Policy::builder("api").limit("100/h").limit("20/min").build()?;
    /// let new = Policy::builder("api").limit("100/h").limit("25/min").build()?;
    /// let now = Timestamp::from_secs(1_700_000_000);
    /// let mut state = PolicyState::new(&old, now);
    /// for _ in 0..20 {
    ///     assert!(state.decide(&old, now, 1).is_allowed());
    /// }
    /// assert!(!state.decide(&old, now, 1).is_allowed());
    /// // The new configuration admits the 5 more it allows, not 25.
    /// let admitted = (0..25).filter(|_| state.decide(&new, now, 1).is_allowed()).count();
    /// assert_eq!(admitted, 5);
    /// assert_eq!(state.policy(), &new);
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    pub fn carry_to(&mut self, policy: &Policy, now: Timestamp) {
        if self.fits(policy) {
            return;
        }
        let old = std::mem::replace(self, Self::new(policy, now));
        if old.policy.algorithm() != policy.algorithm() {
            return;
        }
        let now = now.as_micros();
        let old_params = old.policy.params();
        for (state, p) in self.limits.iter_mut().zip(policy.params()) {
            let matched = old_params.iter().position(|q| q.period_us == p.period_us);
            if let Some((before, q)) =
                matched.and_then(|j| Some((old.limits.get(j)?, &old_params[j])))
            {
                *state = before.clone().carried(q, p, now);
            }
        }
    }

    /// Whether state kept under `from` carries over to `to` whole: the
    /// same algorithm, and every limit of `from` has one of its period in
    /// `to`, so that [`carry_to`](Self::carry_to) drops nothing. (As
    /// tollgate-redis's carry.lua tells it from two descriptors.)
    pub(crate) fn carries_whole(from: &Policy, to: &Policy) -> bool {
        from.algorithm() == to.algorithm()
            && (from.params().iter())
                .all(|q| to.params().iter().any(|p| p.period_us == q.period_us))
    }

    /// Whether this state, kept under `policy`, still holds use at `now`
    /// that carrying it over to another configuration could drop: a limit
    /// whose expiry is ahead. Under a calendar, whose periods' ends a store
    /// that keeps only the configuration's descriptor cannot tell, any
    /// limit that is not empty. (As tollgate-redis's carry.lua tells it.)
    pub(crate) fn holds_use(&self, policy: &Policy, now: Timestamp) -> bool {
        let calendar = policy.params().iter().any(|p| p.calendar.is_some());
        let after = if calendar { 0 } else { now.as_micros() };
        (self.limits.iter().zip(policy.params())).any(|(s, p)| s.expires_at(p) > after)
    }

    /// A state of `policy` that has used what `decision` (made by another
    /// store, perhaps under another configuration or share of the policy)
    /// reports used, at the decision's time: of each limit of `policy`, the
    /// share of its capacity that the decision's limit of the same period
    /// had used, rounded up. For a store that takes over a key from a store
    /// that failed, so that the key does not start afresh. Conservative:
    /// windows and logs count the whole use at the decision's time, buckets
    /// as a backlog from then; limits without a match start empty.
    ///
    /// ```
    /// use tollgate_core::{Algorithm, Policy, Timestamp};
    /// use tollgate_core::state::PolicyState;
    ///
    /// let policy = Policy::builder("api").limit("10/h").limit("100/d").build()?;
    /// let now = Timestamp::from_secs(1_700_000_000);
    /// let mut elsewhere = PolicyState::new(&policy, now);
    /// for _ in 0..8 {
    ///     elsewhere.decide(&policy, now, 1);
    /// }
    /// let last = elsewhere.decide(&policy, now, 0);
    /// // Half the policy on each of two servers: 4 of this one's 5 used.
    /// let share = policy.divided(2)?;
    /// let mut here = PolicyState::seeded(&share, &last);
    /// let admitted = (0..5).filter(|_| here.decide(&share, now, 1).is_allowed()).count();
    /// assert_eq!(admitted, 1);
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    pub fn seeded(policy: &Policy, decision: &Decision) -> Self {
        let now = decision.now();
        let mut state = Self::new(policy, now);
        let t0 = now.as_micros();
        for (limit, p) in state.limits.iter_mut().zip(policy.params()) {
            let Some(seen) = decision
                .limits()
                .iter()
                .find(|s| s.limit().period_micros() == p.period_us)
            else {
                continue;
            };
            let seen_cap = seen.capacity().max(1);
            let used = seen_cap.saturating_sub(seen.remaining());
            let mut used = u64::try_from(
                (u128::from(used) * u128::from(p.capacity)).div_ceil(u128::from(seen_cap)),
            )
            .unwrap_or(u64::MAX);
            // A rate-based limit's reset is its backlog, the time until it
            // is whole again, which holds its debt too (a settlement charged
            // past the allowance), where what remains stops at nothing: the
            // backlog, to the microsecond, in this limit's time (its share
            // of the seen limit's span), keeps it. A window's or a log's
            // reset, when its use is back, is the same under a share.
            let backlog_us = match policy.algorithm() {
                Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                    let span = u128::from(p.capacity) * u128::from(p.interval_us);
                    let seen_span =
                        u128::from(seen_cap) * u128::from(seen.limit().interval_micros());
                    let backlog = (seen.reset().as_micros() * span).div_ceil(seen_span.max(1));
                    let owed = backlog.div_ceil(u128::from(p.interval_us.max(1)));
                    used = used.max(u64::try_from(owed).unwrap_or(u64::MAX));
                    backlog
                }
                Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog => {
                    seen.reset().as_micros()
                }
            };
            let backlog_us = u64::try_from(backlog_us).unwrap_or(u64::MAX);
            if used > 0 {
                let fresh = LimitState::fresh(policy.algorithm(), p, t0);
                *limit = fresh.seeded(p, Seen { used, backlog_us }, t0);
            }
        }
        state
    }

    /// This state and `other` (both of `policy`) in one: each limit as
    /// the one of the two that leaves less remaining at `now`, or, where
    /// both leave the same, the later to be whole again (a debt past the
    /// allowance leaves nothing remaining too); this one's where they tie.
    pub(crate) fn more_used(mut self, mut other: Self, policy: &Policy, now: Timestamp) -> Self {
        let mine = self.decide(policy, now, 0);
        let theirs = other.decide(policy, now, 0);
        let limits = self
            .limits
            .into_iter()
            .zip(other.limits)
            .zip(mine.limits().iter().zip(theirs.limits()))
            .map(|((a, b), (m, t))| {
                let theirs = (t.remaining(), std::cmp::Reverse(t.reset()));
                if theirs < (m.remaining(), std::cmp::Reverse(m.reset())) {
                    b
                } else {
                    a
                }
            })
            .collect();
        Self {
            policy: self.policy,
            limits,
        }
    }

    /// Decides a request of `cost` at `now` and, if it is admitted, consumes
    /// it from every limit. If any limit denies, nothing is consumed.
    ///
    /// A cost of 0 is a peek: it is always admitted and changes nothing. A
    /// cost above a limit's capacity is [`Outcome::CostExceedsCapacity`].
    /// A state built under another configuration of the policy is first
    /// [carried over](PolicyState::carry_to).
    pub fn decide(&mut self, policy: &Policy, now: Timestamp, cost: u64) -> Decision {
        self.decided(policy, now, cost).with_cost(cost)
    }

    /// Carries this state over to `policy` ([`PolicyState::carry_to`]) and
    /// advances every limit to `now`: what the Redis scripts store of a
    /// key they carried over, whatever the request (see
    /// [`PolicyState::decided`]).
    pub(crate) fn carry_and_advance(&mut self, policy: &Policy, now: Timestamp) {
        self.carry_to(policy, now);
        let now = now.as_micros();
        for (state, p) in self.limits.iter_mut().zip(policy.params()) {
            state.advance(p, now);
        }
    }

    /// [`PolicyState::decide`], but for the cost in the decision.
    ///
    /// A fixed window's decision that consumes nothing (a peek, a status,
    /// a denial, a cost above the capacity) keeps the windows as they were
    /// stored, as the Redis scripts store nothing then, unless the state
    /// was carried over or a window realigned (then both keep what the
    /// decision advanced). A window rolled on to the current one would
    /// carry nothing of the last one's use into another calendar's window
    /// that overlaps it, where the stored one carries it.
    fn decided(&mut self, policy: &Policy, now: Timestamp, cost: u64) -> Decision {
        let carried = !self.fits(policy);
        self.carry_to(policy, now);
        let stored = match policy.algorithm() {
            Algorithm::FixedWindow if !carried => self.unmoved_windows(policy, now),
            Algorithm::FixedWindow
            | Algorithm::SlidingLog
            | Algorithm::SlidingWindow
            | Algorithm::TokenBucket
            | Algorithm::LeakyBucket
            | Algorithm::Gcra => None,
        };
        let decision = self.advanced(policy, now, cost);
        if let Some(stored) = stored
            && (cost == 0 || !decision.is_allowed())
        {
            self.limits.clear();
            self.limits.extend(stored);
        }
        decision
    }

    /// The limits' fixed windows as they are, if advancing them to `now`
    /// would at most roll them on (none realigned to another calendar).
    fn unmoved_windows(
        &self,
        policy: &Policy,
        now: Timestamp,
    ) -> Option<SmallVec<[LimitState; 4]>> {
        let now = now.as_micros();
        let unmoved = (self.limits.iter().zip(policy.params())).all(|(state, p)| match state {
            LimitState::FixedWindow(window) => !window.realigns(p, now),
            LimitState::SlidingLog(_)
            | LimitState::SlidingWindow(_)
            | LimitState::TokenBucket(_)
            | LimitState::LeakyBucket(_)
            | LimitState::Gcra(_) => false,
        });
        unmoved.then(|| self.limits.iter().cloned().collect())
    }

    /// [`PolicyState::decided`] after the carry-over: every limit advanced
    /// to `now`, then the request decided and, if admitted, consumed.
    fn advanced(&mut self, policy: &Policy, now: Timestamp, cost: u64) -> Decision {
        let params = policy.params();
        let now_us = now.as_micros();
        for (state, p) in self.limits.iter_mut().zip(params) {
            state.advance(p, now_us);
        }
        let queue_free = self.queue_free();

        let too_costly = params.iter().find(|p| cost > p.capacity);
        if let Some(p) = too_costly {
            let outcome = Outcome::CostExceedsCapacity {
                cost,
                capacity: p.capacity,
            };
            return self.decision(policy, outcome, now, Duration::ZERO, queue_free, |_| None);
        }

        let denials: SmallVec<[Option<u64>; 2]> = self
            .limits
            .iter()
            .zip(params)
            // A peek is never denied, not even by a limit in debt (one whose
            // use, carried over from a larger configuration, is above it).
            .map(|(state, p)| {
                if cost == 0 {
                    return None;
                }
                state.admits(p, now_us, cost, queue_free).err()
            })
            .collect();
        if let Some(retry) = denials.iter().flatten().max() {
            let outcome = Outcome::Limited {
                retry_after: Duration::from_micros(*retry),
            };
            return self.decision(policy, outcome, now, Duration::ZERO, queue_free, |i| {
                denials[i].map(Duration::from_micros)
            });
        }

        if cost > 0 {
            for (state, p) in self.limits.iter_mut().zip(params) {
                state.commit(p, now_us, cost, queue_free);
            }
        }
        // Only a queue (a leaky bucket's) delays a request: for every other
        // algorithm the queue is free at 0, and the delay is none.
        let delay = if cost > 0 {
            Duration::from_micros(queue_free.saturating_sub(now_us))
        } else {
            Duration::ZERO
        };
        let queue_free = self.queue_free();
        self.decision(policy, Outcome::Allowed, now, delay, queue_free, |_| None)
    }

    /// Settles a request's actual cost against what it reserved (see
    /// [`Settlement`]) on every limit, and reports the state after it: an
    /// [`Outcome::Allowed`] decision, whose remaining and reset are what
    /// the response's headers show. A state built under another
    /// configuration of the policy is first [carried
    /// over](PolicyState::carry_to).
    pub fn settle(&mut self, policy: &Policy, now: Timestamp, settlement: &Settlement) -> Decision {
        // Nothing to charge or refund: the state as a peek reads it, and
        // stored as a peek leaves it.
        if let Change::None = settlement.change() {
            return self.decided(policy, now, 0);
        }
        self.carry_to(policy, now);
        let params = policy.params();
        let now_us = now.as_micros();
        for (state, p) in self.limits.iter_mut().zip(params) {
            state.advance(p, now_us);
        }
        let queue_free = self.queue_free();
        for (state, p) in self.limits.iter_mut().zip(params) {
            match settlement.change() {
                Change::None => {}
                Change::Charge(n) => state.charge(p, now_us, n, queue_free),
                Change::Refund { amount, since } => state.refund(p, now_us, amount, since),
            }
        }
        let queue_free = self.queue_free();
        self.decision(
            policy,
            Outcome::Allowed,
            now,
            Duration::ZERO,
            queue_free,
            |_| None,
        )
    }

    /// The time the state stops mattering: from then on it is
    /// indistinguishable from a fresh one and may be forgotten.
    pub fn expires_at(&self, policy: &Policy) -> Timestamp {
        let at = self
            .limits
            .iter()
            .zip(policy.params())
            .map(|(s, p)| s.expires_at(p))
            .max()
            .unwrap_or(0);
        Timestamp::from_micros(at)
    }

    /// The joint departure time of a leaky-bucket policy: a request leaves
    /// when every limit's queue lets it.
    fn queue_free(&self) -> u64 {
        self.limits
            .iter()
            .map(LimitState::queue_free)
            .max()
            .unwrap_or(0)
    }

    fn decision(
        &self,
        policy: &Policy,
        outcome: Outcome,
        now: Timestamp,
        delay: Duration,
        queue_free: u64,
        retry: impl Fn(usize) -> Option<Duration>,
    ) -> Decision {
        let now_us = now.as_micros();
        let statuses =
            self.limits
                .iter()
                .zip(policy.params())
                .enumerate()
                .map(|(i, (state, p))| {
                    let (remaining, reset) = state.status(p, now_us, queue_free);
                    LimitStatus::new(
                        i,
                        p.limit,
                        p.capacity,
                        remaining,
                        Duration::from_micros(reset),
                        retry(i),
                    )
                });
        Decision::new(policy, outcome, now, delay, statuses)
    }
}
