//! A key's state as a store keeps it, and its saved form: the contract a
//! store built on bytes meets without any code of its own for the
//! algorithms.

use std::fmt;
use std::time::Duration;

use super::limit::LimitState;
use super::{PolicyState, blocked};
use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::limit::Limit;
use crate::policy::Policy;
use crate::settle::Settlement;
use crate::time::Timestamp;

/// The first word of a saved state of limits, version 1 ("tg" and 1).
const LIMITS_V1: u64 = 0x7467_0000_0000_0001;
/// The first word of a saved block, version 1.
const BLOCK_V1: u64 = 0x7467_0000_0000_0002;

/// One key's state under one policy's name, as a store keeps it between
/// two decisions: the state of the policy's limits, or an operator's
/// block. With its saved form ([`to_bytes`](KeyState::to_bytes) and
/// [`from_bytes`](KeyState::from_bytes)), this is all a store needs to
/// give exactly the decisions of the reference algorithms: load the bytes
/// kept under the policy's name and the key, decide, and keep the new
/// bytes, atomically (under a lock, or with a compare-and-swap).
///
/// The saved form is opaque and versioned. It holds the configuration the
/// state was last decided under, so that a key carries over to a new
/// configuration of the policy (see [`PolicyState::carry_to`]) whichever
/// instance loads it first.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::state::KeyState;
/// use tollgate_core::{Algorithm, Policy, Timestamp};
///
/// let policy = Policy::new("api", Algorithm::Gcra, "2/s")?;
/// let now = Timestamp::from_secs(1_700_000_000);
/// let mut state = KeyState::new(&policy, now);
/// assert!(state.decide(&policy, now, 2).is_allowed());
/// let saved = state.to_bytes();
///
/// // Another instance loads it, under a larger configuration: the 2 used
/// // carry over.
/// let larger = Policy::new("api", Algorithm::Gcra, "5/s")?;
/// let mut loaded = KeyState::from_bytes(&larger, &saved)?;
/// let admitted = (0..5).filter(|_| loaded.decide(&larger, now, 1).is_allowed()).count();
/// assert_eq!(admitted, 3);
///
/// // A block: every request denied until it ends, then a fresh start.
/// let until = Timestamp::from_micros(now.as_micros() + 60_000_000);
/// let mut blocked = KeyState::from_bytes(&policy, &KeyState::BlockedUntil(until).to_bytes())?;
/// assert_eq!(blocked.decide(&policy, now, 1).retry_after(), Some(Duration::from_secs(60)));
/// assert!(blocked.decide(&policy, until, 1).is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyState {
    /// The state of the policy's limits.
    Limits(PolicyState),
    /// Blocked by an operator until this time (see
    /// [`Store::block`](crate::Store::block)).
    BlockedUntil(Timestamp),
}

impl KeyState {
    /// The state of a key that has never been seen.
    pub fn new(policy: &Policy, now: Timestamp) -> Self {
        KeyState::Limits(PolicyState::new(policy, now))
    }

    /// The state of a key blocked for `duration` from `now` (at most 2^50
    /// µs; longer saturates).
    pub fn blocked_for(now: Timestamp, duration: Duration) -> Self {
        let micros = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
        let until = now
            .as_micros()
            .saturating_add(micros.min(crate::policy::MAX_SPAN_US));
        KeyState::BlockedUntil(Timestamp::from_micros(until))
    }

    /// The limits' state at `now`: a block that has ended gives way to a
    /// fresh state; `None` while the block lasts.
    fn limits(&mut self, policy: &Policy, now: Timestamp) -> Result<&mut PolicyState, Timestamp> {
        if let KeyState::BlockedUntil(until) = *self {
            if until > now {
                return Err(until);
            }
            *self = KeyState::new(policy, now);
        }
        match self {
            KeyState::Limits(state) => Ok(state),
            KeyState::BlockedUntil(until) => Err(*until),
        }
    }

    /// Decides a request of `cost` (see [`PolicyState::decide`]); while a
    /// block lasts, the block's denial (see [`blocked`]).
    pub fn decide(&mut self, policy: &Policy, now: Timestamp, cost: u64) -> Decision {
        match self.limits(policy, now) {
            Ok(state) => state.decide(policy, now, cost),
            Err(until) => blocked(policy, now, until).with_cost(cost),
        }
    }

    /// Settles a request's actual cost (see [`PolicyState::settle`]);
    /// while a block lasts, nothing changes and the decision is the
    /// block's denial.
    pub fn settle(&mut self, policy: &Policy, now: Timestamp, settlement: &Settlement) -> Decision {
        match self.limits(policy, now) {
            Ok(state) => state.settle(policy, now, settlement),
            Err(until) => blocked(policy, now, until),
        }
    }

    /// The time the state stops mattering and may be forgotten: from then
    /// on it decides as a fresh one.
    pub fn expires_at(&self, policy: &Policy) -> Timestamp {
        match self {
            KeyState::Limits(state) => state.expires_at(policy),
            KeyState::BlockedUntil(until) => *until,
        }
    }

    /// The saved form, for a store to keep.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut words = Vec::with_capacity(8);
        match self {
            KeyState::BlockedUntil(until) => words.extend([BLOCK_V1, until.as_micros()]),
            KeyState::Limits(state) => {
                let policy = state.policy();
                words.extend([
                    LIMITS_V1,
                    policy.algorithm().code(),
                    policy.burst().map_or(0, |b| b.saturating_add(1)),
                    policy.limits().len() as u64,
                ]);
                for limit in policy.limits() {
                    words.extend([limit.count(), limit.period_micros()]);
                }
                for limit in &state.limits {
                    limit.save(&mut words);
                }
            }
        }
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// The state saved by [`to_bytes`](KeyState::to_bytes), to be decided
    /// under `policy`. A state saved under another configuration of the
    /// policy carries over when it is next decided.
    ///
    /// # Errors
    ///
    /// [`SavedStateError`] when the bytes are not a saved state of this
    /// version, hold a configuration no policy can have, or a state no
    /// store could have written (a time beyond 2^62 µs, a count beyond
    /// 2^52, a token bucket above its capacity, a log out of order). A
    /// store reports it as [`StoreError::backend`](crate::StoreError::backend),
    /// and its failure policy answers. Keep bytes with an expiry (the
    /// state's [`expires_at`](KeyState::expires_at), or a block's end), so
    /// that bytes no version can read do not fail their key for ever.
    pub fn from_bytes(policy: &Policy, bytes: &[u8]) -> Result<Self, SavedStateError> {
        let corrupt = |reason| SavedStateError { reason };
        if !bytes.len().is_multiple_of(8) {
            return Err(corrupt("its length is not a whole number of words"));
        }
        let words: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect();
        let mut words = words.iter();
        let state = match words.next() {
            Some(&BLOCK_V1) => {
                let until = *words.next().ok_or(corrupt("a block has no end"))?;
                KeyState::BlockedUntil(Timestamp::from_micros(until))
            }
            Some(&LIMITS_V1) => KeyState::Limits(load_limits(policy, &mut words)?),
            Some(_) | None => return Err(corrupt("it is not a saved state of this version")),
        };
        if words.next().is_some() {
            return Err(corrupt("words follow the state"));
        }
        Ok(state)
    }
}

/// The limits' state saved under some configuration of `policy`'s name.
fn load_limits(
    policy: &Policy,
    words: &mut std::slice::Iter<'_, u64>,
) -> Result<PolicyState, SavedStateError> {
    let corrupt = |reason| SavedStateError { reason };
    let mut next = || words.next().copied().ok_or(corrupt("it ends too soon"));
    let code = next()?;
    let algorithm = Algorithm::ALL
        .into_iter()
        .find(|a| a.code() == code)
        .ok_or(corrupt("its algorithm is unknown"))?;
    let burst = next()?.checked_sub(1);
    let count = usize::try_from(next()?).unwrap_or(usize::MAX);
    if count > Policy::MAX_LIMITS {
        return Err(corrupt("it has more limits than a policy may"));
    }
    let mut limits = Vec::with_capacity(count);
    for _ in 0..count {
        let (n, period) = (next()?, next()?);
        // A monthly limit is saved as its period, 31 days: a fixed
        // window of 31 days reads back as monthly.
        let limit = if algorithm == Algorithm::FixedWindow
            && Limit::per_month(n).is_ok_and(|m| m.period_micros() == period)
        {
            Limit::per_month(n)
        } else {
            Limit::new(n, Duration::from_micros(period))
        }
        .map_err(|_| corrupt("a limit is not valid"))?;
        limits.push(limit);
    }
    let saved_under = if algorithm == policy.algorithm()
        && burst == policy.burst()
        && limits == policy.limits()
    {
        policy.clone()
    } else {
        let mut builder = Policy::builder(policy.name()).algorithm(algorithm);
        if let Some(burst) = burst {
            builder = builder.burst(burst);
        }
        for limit in limits {
            builder = builder.limit(limit);
        }
        builder
            .build()
            .map_err(|_| corrupt("its configuration is not a valid policy"))?
    };
    let states = saved_under
        .params()
        .iter()
        .map(|p| LimitState::load(algorithm, p, words))
        .collect::<Option<_>>()
        .ok_or(corrupt("a limit's state ends too soon or is out of range"))?;
    Ok(PolicyState {
        policy: saved_under,
        limits: states,
    })
}

/// Bytes that are not a key's saved state (see [`KeyState::from_bytes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedStateError {
    reason: &'static str,
}

impl fmt::Display for SavedStateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a saved rate-limit state: {}", self.reason)
    }
}

impl std::error::Error for SavedStateError {}
