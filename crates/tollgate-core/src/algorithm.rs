//! The reference algorithms.
//!
//! [`PolicyState`] holds one key's state for one policy and decides requests
//! against it. The memory store keeps one per key; other stores (the Redis
//! Lua scripts) implement the same arithmetic and are tested against this
//! module. All arithmetic is in integer microseconds since the Unix epoch.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::{Algorithm, Policy, PolicyState, Timestamp};
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

use std::collections::VecDeque;
use std::time::Duration;

use smallvec::SmallVec;

use crate::decision::{Decision, LimitStatus, Outcome};
use crate::policy::{Algorithm, Layout, LimitParams, MAX_SPAN_US, Policy};
use crate::time::Timestamp;

/// The state of one limit under one algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitState {
    /// Fixed window: the current window's start and the cost counted in it.
    FixedWindow {
        /// Start of the window, a multiple of the period.
        start: u64,
        /// Cost admitted in the window.
        count: u64,
    },
    /// Sliding log: every admitted request of the last period.
    SlidingLog {
        /// `(time, cost)` of admitted requests, oldest first.
        entries: VecDeque<(u64, u64)>,
        /// The sum of the entries' costs.
        used: u64,
    },
    /// Sliding window counter.
    SlidingWindow {
        /// Start of the current window, a multiple of the period.
        start: u64,
        /// Cost admitted in the previous window.
        prev: u64,
        /// Cost admitted in the current window.
        curr: u64,
    },
    /// Token bucket.
    TokenBucket {
        /// Whole tokens in the bucket.
        tokens: u64,
        /// When the last whole token was added; refill progress counts from here.
        refilled_at: u64,
    },
    /// Leaky bucket (queue).
    LeakyBucket {
        /// When the queue can next release a request: the last admitted
        /// request's departure plus its cost in intervals.
        free_at: u64,
    },
    /// GCRA.
    Gcra {
        /// Theoretical arrival time.
        tat: u64,
    },
}

impl LimitState {
    fn fresh(algorithm: Algorithm, p: &LimitParams, now: u64) -> Self {
        match algorithm {
            Algorithm::FixedWindow => LimitState::FixedWindow {
                start: window_start(now, p.period_us),
                count: 0,
            },
            Algorithm::SlidingLog => LimitState::SlidingLog {
                entries: VecDeque::new(),
                used: 0,
            },
            Algorithm::SlidingWindow => LimitState::SlidingWindow {
                start: window_start(now, p.period_us),
                prev: 0,
                curr: 0,
            },
            Algorithm::TokenBucket => LimitState::TokenBucket {
                tokens: p.capacity,
                refilled_at: now,
            },
            Algorithm::LeakyBucket => LimitState::LeakyBucket { free_at: 0 },
            Algorithm::Gcra => LimitState::Gcra { tat: 0 },
        }
    }

    /// Brings the state up to `now` without changing what it means:
    /// rolls windows, drops expired log entries, adds refilled tokens.
    fn advance(&mut self, p: &LimitParams, now: u64) {
        let period = p.period_us;
        match self {
            LimitState::FixedWindow { start, count } => {
                let ws = window_start(now, period);
                if ws > *start {
                    *start = ws;
                    *count = 0;
                }
            }
            LimitState::SlidingLog { entries, used } => {
                while let Some(&(t, c)) = entries.front() {
                    if t.saturating_add(period) > now {
                        break;
                    }
                    *used -= c;
                    entries.pop_front();
                }
            }
            LimitState::SlidingWindow { start, prev, curr } => {
                let ws = window_start(now, period);
                if ws > *start {
                    *prev = if ws - *start == period { *curr } else { 0 };
                    *curr = 0;
                    *start = ws;
                }
            }
            LimitState::TokenBucket {
                tokens,
                refilled_at,
            } => {
                let gained = now.saturating_sub(*refilled_at) / p.per_interval;
                if gained >= p.capacity.saturating_sub(*tokens) {
                    *tokens = p.capacity;
                    *refilled_at = now.max(*refilled_at);
                } else {
                    *tokens += gained;
                    *refilled_at += gained * p.interval_us;
                }
            }
            LimitState::LeakyBucket { .. } | LimitState::Gcra { .. } => {}
        }
    }

    /// `(remaining, reset)` in the current state. `queue_free` is the
    /// joint departure time of a leaky-bucket policy.
    fn status(&self, p: &LimitParams, now: u64, queue_free: u64) -> (u64, u64) {
        let (n, period, t, cap) = (p.limit.count(), p.period_us, p.interval_us, p.capacity);
        match *self {
            LimitState::FixedWindow { start, count } => (
                n.saturating_sub(count),
                (start + period).saturating_sub(now),
            ),
            LimitState::SlidingLog { ref entries, used } => (
                n.saturating_sub(used),
                entries
                    .back()
                    .map_or(0, |&(last, _)| (last + period).saturating_sub(now)),
            ),
            LimitState::SlidingWindow { start, prev, curr } => {
                let used = curr + weighted(prev, now.saturating_sub(start), period);
                let reset = if curr > 0 {
                    start + 2 * period
                } else if prev > 0 {
                    start + period
                } else {
                    now
                };
                (n.saturating_sub(used), reset.saturating_sub(now))
            }
            LimitState::TokenBucket {
                tokens,
                refilled_at,
            } => {
                let reset = if tokens >= cap {
                    0
                } else {
                    (refilled_at + (cap - tokens) * t).saturating_sub(now)
                };
                (tokens, reset)
            }
            LimitState::LeakyBucket { .. } => {
                let backlog = queue_free.saturating_sub(now);
                ((cap * t).saturating_sub(backlog) / p.per_interval, backlog)
            }
            LimitState::Gcra { tat } => {
                let backlog = tat.saturating_sub(now);
                ((cap * t).saturating_sub(backlog) / p.per_interval, backlog)
            }
        }
    }

    /// `Ok` if this limit admits `cost` now (`cost <= capacity` holds),
    /// otherwise the exact time from `now` until it would.
    fn admits(&self, p: &LimitParams, now: u64, cost: u64, queue_free: u64) -> Result<(), u64> {
        let (n, period, t, cap) = (p.limit.count(), p.period_us, p.interval_us, p.capacity);
        match *self {
            LimitState::FixedWindow { start, count } => {
                if count + cost <= n {
                    Ok(())
                } else {
                    Err((start + period).saturating_sub(now))
                }
            }
            LimitState::SlidingLog { ref entries, used } => {
                if used + cost <= n {
                    return Ok(());
                }
                let need = used + cost - n;
                let mut freed = 0;
                for &(at, c) in entries {
                    freed += c;
                    if freed >= need {
                        return Err((at + period).saturating_sub(now));
                    }
                }
                Err(0) // unreachable while `cost <= n`
            }
            LimitState::SlidingWindow { start, prev, curr } => {
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
            LimitState::TokenBucket {
                tokens,
                refilled_at,
            } => {
                if cost <= tokens {
                    Ok(())
                } else {
                    Err((refilled_at + (cost - tokens) * t).saturating_sub(now))
                }
            }
            LimitState::LeakyBucket { .. } => {
                let departure = queue_free.max(now);
                if departure + cost * t - now <= cap * t {
                    Ok(())
                } else {
                    Err(departure + cost * t - cap * t - now)
                }
            }
            LimitState::Gcra { tat } => {
                let base = tat.max(now);
                if base + cost * t - now <= cap * t {
                    Ok(())
                } else {
                    Err(base + cost * t - cap * t - now)
                }
            }
        }
    }

    /// Consumes `cost` (which [`LimitState::admits`] accepted).
    fn commit(&mut self, p: &LimitParams, now: u64, cost: u64, queue_free: u64) {
        match self {
            LimitState::FixedWindow { count, .. } => *count += cost,
            LimitState::SlidingLog { entries, used } => {
                let at = entries.back().map_or(now, |&(last, _)| last.max(now));
                match entries.back_mut() {
                    Some((last, c)) if *last == at => *c += cost,
                    _ => entries.push_back((at, cost)),
                }
                *used += cost;
            }
            LimitState::SlidingWindow { curr, .. } => *curr += cost,
            LimitState::TokenBucket { tokens, .. } => *tokens -= cost,
            LimitState::LeakyBucket { free_at } => {
                *free_at = queue_free.max(now) + cost * p.interval_us;
            }
            LimitState::Gcra { tat } => *tat = (*tat).max(now) + cost * p.interval_us,
        }
    }

    /// From when on the state is indistinguishable from a fresh one.
    fn expires_at(&self, p: &LimitParams) -> u64 {
        match *self {
            LimitState::FixedWindow { start, count } => {
                if count == 0 {
                    0
                } else {
                    start + p.period_us
                }
            }
            LimitState::SlidingLog { ref entries, .. } => {
                entries.back().map_or(0, |&(at, _)| at + p.period_us)
            }
            LimitState::SlidingWindow { start, prev, curr } => {
                if curr > 0 {
                    start + 2 * p.period_us
                } else if prev > 0 {
                    start + p.period_us
                } else {
                    0
                }
            }
            LimitState::TokenBucket {
                tokens,
                refilled_at,
            } => refilled_at + (p.capacity - tokens.min(p.capacity)) * p.interval_us,
            LimitState::LeakyBucket { free_at } => free_at,
            LimitState::Gcra { tat } => tat,
        }
    }
}

impl LimitState {
    /// This state, built under `old`, as the state of `new`, a limit of
    /// the same algorithm and period whose count, interval or capacity may
    /// differ: the amount already used carries over. Counts of a window or
    /// log mean the same under any count; a time ahead of now (a GCRA's
    /// arrival time, a queue's departure, when a token bucket is full
    /// again) is a backlog of used intervals, rescaled to the new interval.
    fn carried(&self, old: &LimitParams, new: &LimitParams, now: u64) -> LimitState {
        match *self {
            LimitState::Gcra { tat } => LimitState::Gcra {
                tat: rescaled(tat, old.interval_us, new.interval_us, now),
            },
            LimitState::LeakyBucket { free_at } => LimitState::LeakyBucket {
                free_at: rescaled(free_at, old.interval_us, new.interval_us, now),
            },
            LimitState::TokenBucket { .. } => {
                let full_at = self.expires_at(old);
                token_bucket_full_at(
                    rescaled(full_at, old.interval_us, new.interval_us, now),
                    new,
                    now,
                )
            }
            _ => self.clone(),
        }
    }
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

/// The token bucket that is full again at `full_at`: whole tokens, and
/// the last refill on the grid of intervals that ends there.
fn token_bucket_full_at(full_at: u64, p: &LimitParams, now: u64) -> LimitState {
    if full_at <= now {
        return LimitState::TokenBucket {
            tokens: p.capacity,
            refilled_at: now,
        };
    }
    let missing = (full_at - now).div_ceil(p.interval_us.max(1));
    let tokens = p.capacity.saturating_sub(missing);
    LimitState::TokenBucket {
        tokens,
        refilled_at: full_at - (p.capacity - tokens) * p.interval_us,
    }
}

fn window_start(now: u64, period: u64) -> u64 {
    now - now % period
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

/// One key's state for one policy: a [`LimitState`] per limit, and the
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

    /// Each limit's state, in the policy's order.
    pub fn limits(&self) -> &[LimitState] {
        &self.limits
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
    /// use tollgate_core::{Algorithm, Policy, PolicyState, Timestamp};
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
                *state = before.carried(q, p, now);
            }
        }
    }

    /// The state whose compact form is `word`, for a policy whose whole
    /// state is one number ([`PolicyState::is_one_word`] or
    /// [`PolicyState::is_window_word`]); `None` for any other policy. With
    /// [`PolicyState::word`], this lets a store that keeps words carry a
    /// key over to a policy of another layout.
    ///
    /// ```
    /// use tollgate_core::{Algorithm, Policy, PolicyState, Timestamp};
    ///
    /// let gcra = Policy::new("api", Algorithm::Gcra, "2/s")?;
    /// let now = Timestamp::from_secs(1_700_000_000);
    /// let state = PolicyState::from_word(&gcra, now.as_micros() + 500_000, now).unwrap();
    /// assert_eq!(state.word(), Some(now.as_micros() + 500_000));
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    pub fn from_word(policy: &Policy, word: u64, now: Timestamp) -> Option<Self> {
        let [p] = policy.params() else {
            return None;
        };
        let limit = match (policy.layout(), policy.algorithm()) {
            (Layout::Word, Algorithm::Gcra) => LimitState::Gcra { tat: word },
            (Layout::Word, Algorithm::LeakyBucket) => LimitState::LeakyBucket { free_at: word },
            (Layout::Word, _) => token_bucket_full_at(word, p, now.as_micros()),
            (Layout::WindowWord, _) => {
                let start = window_start(word, p.period_us.max(1));
                LimitState::FixedWindow {
                    start,
                    count: word - start,
                }
            }
            (Layout::Full, _) => return None,
        };
        Some(Self {
            policy: policy.clone(),
            limits: std::iter::once(limit).collect(),
        })
    }

    /// The compact form of this state, if its policy keeps one (see
    /// [`PolicyState::from_word`]): the time a single GCRA, token-bucket or
    /// leaky-bucket limit's backlog clears, or a single fixed window's
    /// start plus its count (at most the period less 1 µs, which denies as
    /// any count above the limit does).
    pub fn word(&self) -> Option<u64> {
        let ([state], [p]) = (&self.limits[..], self.policy.params()) else {
            return None;
        };
        match (self.policy.layout(), state) {
            (Layout::Word, _) => Some(state.expires_at(p)),
            (Layout::WindowWord, &LimitState::FixedWindow { start, count }) => {
                Some(start + count.min(p.period_us.saturating_sub(1)))
            }
            _ => None,
        }
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
    /// use tollgate_core::{Algorithm, Policy, PolicyState, Timestamp};
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
            let used = u64::try_from(
                (u128::from(used) * u128::from(p.capacity)).div_ceil(u128::from(seen_cap)),
            )
            .unwrap_or(u64::MAX);
            if used == 0 {
                continue;
            }
            let backlog = used.saturating_mul(p.interval_us).min(MAX_SPAN_US);
            *limit = match limit {
                LimitState::FixedWindow { start, .. } => LimitState::FixedWindow {
                    start: *start,
                    count: used,
                },
                LimitState::SlidingWindow { start, .. } => LimitState::SlidingWindow {
                    start: *start,
                    prev: 0,
                    curr: used,
                },
                LimitState::SlidingLog { .. } => LimitState::SlidingLog {
                    entries: std::iter::once((t0, used)).collect(),
                    used,
                },
                LimitState::TokenBucket { .. } => token_bucket_full_at(t0 + backlog, p, t0),
                LimitState::LeakyBucket { .. } => LimitState::LeakyBucket {
                    free_at: t0 + backlog,
                },
                LimitState::Gcra { .. } => LimitState::Gcra { tat: t0 + backlog },
            };
        }
        state
    }

    /// Decides a request of `cost` at `now` and, if it is admitted, consumes
    /// it from every limit. If any limit denies, nothing is consumed.
    ///
    /// A cost of 0 is a peek: it is always admitted and changes nothing. A
    /// cost above a limit's capacity is [`Outcome::CostExceedsCapacity`].
    /// A state built under another configuration of the policy is first
    /// [carried over](PolicyState::carry_to).
    pub fn decide(&mut self, policy: &Policy, now: Timestamp, cost: u64) -> Decision {
        self.carry_to(policy, now);
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
        let delay = if policy.algorithm() == Algorithm::LeakyBucket && cost > 0 {
            Duration::from_micros(queue_free.saturating_sub(now_us))
        } else {
            Duration::ZERO
        };
        let queue_free = self.queue_free();
        self.decision(policy, Outcome::Allowed, now, delay, queue_free, |_| None)
    }

    /// Whether `policy`'s whole state is one time in microseconds: true
    /// for a single GCRA limit (the theoretical arrival time), a single
    /// token-bucket limit (when the bucket is full again: its level is the
    /// whole intervals until then, and refills stay on the same grid) or a
    /// single leaky-bucket limit (when the queue is next free). Such a
    /// state is fresh once that time has passed, and
    /// [`PolicyState::decide_word`] decides on it directly.
    ///
    /// ```
    /// use tollgate_core::{Algorithm, Policy, PolicyState};
    ///
    /// let gcra = Policy::new("api", Algorithm::Gcra, "10/s")?;
    /// assert!(PolicyState::is_one_word(&gcra));
    /// let window = Policy::new("api", Algorithm::FixedWindow, "10/s")?;
    /// assert!(!PolicyState::is_one_word(&window));
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    pub fn is_one_word(policy: &Policy) -> bool {
        policy.layout() == Layout::Word
    }

    /// [`PolicyState::decide`] for a policy whose whole state is one time,
    /// `word`, in microseconds since the Unix epoch (see
    /// [`PolicyState::is_one_word`]; 0 for a new key, and any time up to
    /// `now` means the same). The same arithmetic, without building a
    /// [`PolicyState`]; a property test holds the two equal. An admitted
    /// request moves `word` forward; nothing else changes it.
    ///
    /// ```
    /// use tollgate_core::{Algorithm, Policy, PolicyState, Timestamp};
    ///
    /// let policy = Policy::new("api", Algorithm::Gcra, "2/s")?;
    /// let now = Timestamp::from_secs(1_700_000_000);
    /// let mut word = 0;
    /// assert!(PolicyState::decide_word(&policy, &mut word, now, 1).is_allowed());
    /// // The theoretical arrival time is now half a second ahead.
    /// assert_eq!(word, now.as_micros() + 500_000);
    /// assert!(PolicyState::decide_word(&policy, &mut word, now, 1).is_allowed());
    /// let third = PolicyState::decide_word(&policy, &mut word, now, 1);
    /// assert_eq!(third.retry_after().unwrap().as_millis(), 500);
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    #[inline(always)]
    pub fn decide_word(policy: &Policy, word: &mut u64, now: Timestamp, cost: u64) -> Decision {
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
            return Decision::single(outcome, now, Duration::ZERO, status(*word, None));
        }
        let base = (*word).max(now_us);
        if cost > 0 && base + cost * t - now_us > cap * t {
            let retry = base + cost * t - cap * t - now_us;
            let outcome = Outcome::Limited {
                retry_after: Duration::from_micros(retry),
            };
            return Decision::single(outcome, now, Duration::ZERO, status(*word, Some(retry)));
        }
        let mut delay = Duration::ZERO;
        if cost > 0 {
            if policy.algorithm() == Algorithm::LeakyBucket {
                delay = Duration::from_micros((*word).saturating_sub(now_us));
            }
            *word = base + cost * t;
        }
        Decision::single(Outcome::Allowed, now, delay, status(*word, None))
    }

    /// Whether `policy`'s whole state is one number on the scale of a time:
    /// true for a single fixed-window limit whose count is below its period
    /// in microseconds (any limit short of a million a second). The number,
    /// the *window word*, is the window's start plus the cost counted in it;
    /// since the count never reaches the period, both are read back from
    /// it (the start is the word rounded down to a multiple of the period).
    /// [`PolicyState::decide_window_word`] decides on it.
    ///
    /// ```
    /// use tollgate_core::{Algorithm, Policy, PolicyState};
    ///
    /// let window = Policy::new("api", Algorithm::FixedWindow, "100/min")?;
    /// assert!(PolicyState::is_window_word(&window));
    /// // A million per second counts up to the period in µs: not one word.
    /// let dense = Policy::new("api", Algorithm::FixedWindow, "1000000/s")?;
    /// assert!(!PolicyState::is_window_word(&dense));
    /// let gcra = Policy::new("api", Algorithm::Gcra, "100/min")?;
    /// assert!(!PolicyState::is_window_word(&gcra));
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    pub fn is_window_word(policy: &Policy) -> bool {
        policy.layout() == Layout::WindowWord
    }

    /// [`PolicyState::decide`] for a policy whose state is a window word
    /// (see [`PolicyState::is_window_word`]; 0 for a new key, and a word of
    /// an earlier window means the same). The same arithmetic, without
    /// building a [`PolicyState`]; a property test holds the two equal. An
    /// admitted request adds its cost to `word`, or starts it afresh at the
    /// current window; nothing else changes it.
    ///
    /// ```
    /// use tollgate_core::{Algorithm, Policy, PolicyState, Timestamp};
    ///
    /// let policy = Policy::new("api", Algorithm::FixedWindow, "2/min")?;
    /// let now = Timestamp::from_secs(1_700_000_010); // 30 s before a minute ends
    /// let mut word = 0;
    /// assert!(PolicyState::decide_window_word(&policy, &mut word, now, 1).is_allowed());
    /// // The minute's start, plus one request.
    /// assert_eq!(word, Timestamp::from_secs(1_699_999_980).as_micros() + 1);
    /// assert!(PolicyState::decide_window_word(&policy, &mut word, now, 1).is_allowed());
    /// let third = PolicyState::decide_window_word(&policy, &mut word, now, 1);
    /// assert_eq!(third.retry_after().unwrap().as_secs(), 30);
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    #[inline(always)]
    pub fn decide_window_word(
        policy: &Policy,
        word: &mut u64,
        now: Timestamp,
        cost: u64,
    ) -> Decision {
        let Some(p) = policy.params().first() else {
            return Decision::new(policy, Outcome::Allowed, now, Duration::ZERO, []);
        };
        let (n, period, now_us) = (p.limit.count(), p.period_us.max(1), now.as_micros());
        // The word's window and count, rolled on to now's window if that
        // is later (as `LimitState::advance` does).
        let (mut start, mut count) = (window_start(*word, period), *word % period);
        let current = window_start(now_us, period);
        if current > start {
            (start, count) = (current, 0);
        }
        let reset = (start + period).saturating_sub(now_us);
        let status = |count: u64, retry: Option<u64>| {
            LimitStatus::from_micros(
                0,
                p.limit,
                p.capacity,
                n.saturating_sub(count),
                reset,
                retry,
            )
        };
        if cost > p.capacity {
            let outcome = Outcome::CostExceedsCapacity {
                cost,
                capacity: p.capacity,
            };
            return Decision::single(outcome, now, Duration::ZERO, status(count, None));
        }
        if cost > 0 && count + cost > n {
            let outcome = Outcome::Limited {
                retry_after: Duration::from_micros(reset),
            };
            return Decision::single(outcome, now, Duration::ZERO, status(count, Some(reset)));
        }
        if cost > 0 {
            count += cost;
            *word = start + count;
        }
        Decision::single(Outcome::Allowed, now, Duration::ZERO, status(count, None))
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
            .map(|s| match *s {
                LimitState::LeakyBucket { free_at } => free_at,
                _ => 0,
            })
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
