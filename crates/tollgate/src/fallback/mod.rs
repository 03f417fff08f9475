//! Failure handling as a store: [`FallbackStore`] applies a
//! [`FailureMode`] to the failures of the store it wraps.

use std::num::NonZeroU64;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use tollgate_core::state::{self, PolicyState};
use tollgate_core::{
    Algorithm, DecidedBy, Decision, Key, LimitStatus, MemoryStore, Outcome, Policy, Settlement,
    Store, StoreError, Timestamp,
};

use crate::macros::failure_setters;

mod instances;
mod mode;

pub use instances::InstanceCount;
pub(crate) use mode::{Answer, FailureReport, Handled};
pub use mode::{FailureMode, UnknownFailureMode};

/// A store that applies a [`FailureMode`] to the failures of another, in
/// the spirit of tower-sessions' `CachingSessionStore`: under
/// [`FailureMode::Local`] (the default), a decision the wrapped store
/// cannot make is made by an in-memory store instead, with this
/// instance's share of the policy ([`FallbackStore::local_divisor`]),
/// seeded with what the wrapped store last knew of the key
/// ([`Store::last_known`]), so that a failure hands nobody a fresh quota.
///
/// [`RateLimitLayer`](crate::RateLimitLayer) and
/// [`RateLimiter`](crate::RateLimiter) wrap their store in one; it is
/// public for code that asks a store directly.
///
/// ```
/// use std::num::NonZeroU64;
/// use tollgate::{Algorithm, FailureMode, FallbackStore, Key, MemoryStore, Policy, Store};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = FallbackStore::new(MemoryStore::new())
///     .on_store_error(FailureMode::Local)
///     .local_divisor(NonZeroU64::new(4).unwrap());
/// let policy = Policy::new("api", Algorithm::Gcra, "100/min")?;
/// // The memory store never fails: decisions are its own.
/// assert_eq!(store.check(&Key::user("ada"), &policy, 1).await?.remaining(), 99);
/// # Ok(())
/// # }
/// ```
pub struct FallbackStore<S> {
    store: Arc<S>,
    settings: FailureSettings,
}

/// A failure policy's settings, kept once for [`FallbackStore`] and the
/// in-flight layer: the mode and, for [`FailureMode::Local`], the store it
/// decides with and how many instances share a limit.
#[derive(Clone)]
pub(crate) struct FailureSettings {
    pub(crate) mode: FailureMode,
    pub(crate) local: MemoryStore,
    pub(crate) instances: InstanceCount,
    /// Each policy's local share for an instance count, made on the
    /// policy's first failure under that count.
    shares: Arc<RwLock<Vec<Share>>>,
}

/// A policy's local share when `instances` share it.
struct Share {
    policy: Policy,
    instances: NonZeroU64,
    share: Policy,
}

impl Default for FailureSettings {
    /// [`FailureMode::Local`] on [`shared_fallback`], each instance
    /// enforcing the whole limit.
    fn default() -> Self {
        Self {
            mode: FailureMode::default(),
            local: shared_fallback().clone(),
            instances: InstanceCount::default(),
            shares: Arc::default(),
        }
    }
}

impl FailureSettings {
    /// These settings with `mode`.
    pub(crate) fn on_store_error(mut self, mode: FailureMode) -> Self {
        self.mode = mode;
        self
    }

    /// These settings with `instances` sharing each limit, for good.
    pub(crate) fn local_divisor(self, instances: NonZeroU64) -> Self {
        self.local_instances(InstanceCount::new(instances))
    }

    /// These settings with the instance count `instances`, which may
    /// change while they are in use; the shares made for the old count
    /// are dropped.
    pub(crate) fn local_instances(mut self, instances: InstanceCount) -> Self {
        self.instances = instances;
        self.shares = Arc::default();
        self
    }

    /// These settings deciding locally with `store`.
    pub(crate) fn local_fallback(mut self, store: MemoryStore) -> Self {
        self.local = store;
        self
    }

    /// `policy`'s local share under the instance count of now.
    fn share(&self, policy: &Policy) -> Policy {
        let instances = self.instances.get();
        if instances == NonZeroU64::MIN {
            return policy.clone();
        }
        let same = |s: &Share| Policy::ptr_eq(&s.policy, policy) || s.policy == *policy;
        let shares = self.shares.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = shares.iter().find(|s| same(s) && s.instances == instances) {
            return found.share.clone();
        }
        drop(shares);
        // `divided` fails only for zero, which NonZeroU64 rules out (a
        // share's burst is clamped to the span a policy holds).
        let share = policy
            .divided(instances.get())
            .unwrap_or_else(|_| policy.clone());
        let mut shares = self.shares.write().unwrap_or_else(PoisonError::into_inner);
        // The share of an older count goes. A handful of policies per
        // store; a bound all the same.
        shares.retain(|s| !same(s));
        if shares.len() >= 64 {
            shares.clear();
        }
        shares.push(Share {
            policy: policy.clone(),
            instances,
            share: share.clone(),
        });
        share
    }
}

impl<S> FallbackStore<S> {
    /// Wraps `store`, falling back locally on [`crate::shared_fallback`],
    /// each instance enforcing the whole limit.
    pub fn new(store: S) -> Self {
        Self::shared(Arc::new(store))
    }

    pub(crate) fn shared(store: Arc<S>) -> Self {
        Self {
            store,
            settings: FailureSettings::default(),
        }
    }

    /// This fallback's settings around another store.
    pub(crate) fn rewrapped<S2>(self, store: S2) -> FallbackStore<S2> {
        FallbackStore {
            store: Arc::new(store),
            settings: self.settings,
        }
    }

    failure_setters! {
        settings;
        /// What to do when the wrapped store fails (default
        /// [`FailureMode::Local`]).
        on_store_error;
        /// How many instances share the limit, for [`FailureMode::Local`]:
        /// while the store fails, each enforces the policy's limits divided by
        /// `instances` (see [`Policy::divided`]). Default 1.
        local_divisor;
        /// The instance count as a handle that may change at runtime (see
        /// [`InstanceCount`]), in place of a fixed
        /// [`local_divisor`](FallbackStore::local_divisor).
        local_instances;
        /// The in-memory store [`FailureMode::Local`] decides with (default:
        /// [`shared_fallback`](crate::shared_fallback)).
        local_fallback;
    }

    /// The failure mode.
    pub fn failure_mode(&self) -> FailureMode {
        self.settings.mode
    }

    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.store
    }
}

impl<S: Store> FallbackStore<S> {
    /// Applies the failure mode to `result`, the wrapped store's answer:
    /// under [`FailureMode::Local`] a failure is decided locally, seeded
    /// with what the store last knew of the key.
    pub(crate) fn answer(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
        result: Result<Decision, StoreError>,
        report: &impl FailureReport,
    ) -> Answer<Decision> {
        let local = || {
            let share = self.settings.share(policy);
            let local = match self.store.last_known(key, policy) {
                Some(last) if last.is_blocked() => self.blocked(key, &share, cost, last.reset_at()),
                Some(last) => {
                    // The store answered the key unblocked well after a
                    // block made here: lifted, by a reset through another
                    // instance, say. Not within `LIFT_MARGIN` of it: the
                    // store's clock is not this one, and a decision on its
                    // way when the block was made may be recorded after.
                    self.settings
                        .local
                        .lift_block_before(key, &share, last.now() - LIFT_MARGIN);
                    let state = PolicyState::seeded(&share, &last);
                    // A full fallback decides below as it would anyway.
                    let _ = self.settings.local.seed(key, &share, state);
                    self.settings.local.check_sync(key, &share, cost)
                }
                None => self.settings.local.check_sync(key, &share, cost),
            };
            let local = local.map(|decision| for_now(decision, policy, &share, cost));
            if let Ok(decision) = &local {
                report.handled(match decision.is_allowed() {
                    true => Handled::LocalAllowed,
                    false => Handled::LocalLimited,
                });
            }
            local.map(|decision| decision.with_decided_by(DecidedBy::LocalFallback))
        };
        self.settings.mode.apply(result, local, report)
    }

    /// The local decision of a key the store last answered blocked until
    /// `until` (by its clock): blocked here too while the block lasts,
    /// whatever the cost. A seeded state would hold the key back only for
    /// its current window. The block leaves no trace in the local store, so
    /// that once the store answers the key lifted, a later failure seeds
    /// it as any other.
    fn blocked(
        &self,
        key: &Key,
        share: &Policy,
        cost: u64,
        until: Timestamp,
    ) -> Result<Decision, StoreError> {
        let local = &self.settings.local;
        // A peek, for the local store's time.
        let now = local.check_sync(key, share, 0)?.now();
        if until > now {
            Ok(state::blocked(share, now, until).with_cost(cost))
        } else {
            local.check_sync(key, share, cost)
        }
    }

    /// Settles a request whose reservation was made `where`: in the
    /// wrapped store alone, or in the local fallback alone. A reservation
    /// the store made is settled there or not at all: its failure is
    /// returned, for the caller to report, and the reservation stands (a
    /// local fallback that took the settlement would lose it from the
    /// store for good). One the local fallback made is settled there: the
    /// store never charged it, and a refund there would be quota for free.
    pub(crate) async fn settle_reserved(
        &self,
        reserved: Reserved,
        key: &Key,
        policy: &Policy,
        settlement: Settlement,
    ) -> Result<Decision, StoreError> {
        match reserved {
            Reserved::InStore => self.store.settle(key, policy, settlement).await,
            Reserved::Locally => {
                let share = self.settings.share(policy);
                let settled = self.settings.local.settle_sync(key, &share, &settlement);
                settled.map(|decision| decision.with_decided_by(DecidedBy::LocalFallback))
            }
        }
    }

    /// Decides as [`Store::check`] does, under the failure policy,
    /// reporting failures to `report`.
    pub(crate) async fn check_reported(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
        report: &impl FailureReport,
    ) -> Answer<Decision> {
        let result = match self.store.try_check_now(key, policy, cost) {
            Some(result) => result,
            None => self.store.check(key, policy, cost).await,
        };
        self.answer(key, policy, cost, result, report)
    }
}

/// How long after a block made through the fallback the store must have
/// answered the key unblocked for the fallback to lift its own copy of the
/// block: more than the skew between the store's clock and this one, and
/// than a decision on its way when the block was made takes to be answered.
const LIFT_MARGIN: Duration = Duration::from_secs(1);

/// Where a request's reservation was made: in the wrapped store, or in
/// the local fallback that decided in its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reserved {
    /// The wrapped store decided ([`Answer::Decided`]).
    InStore,
    /// The local fallback decided ([`Answer::Local`]).
    Locally,
}

impl Reserved {
    /// Where the reservation `decided_by` made it was made; `None` when no
    /// one counted it, and its settlement changes nothing anywhere.
    pub(crate) fn by(decided_by: DecidedBy) -> Option<Self> {
        match decided_by {
            DecidedBy::Store => Some(Self::InStore),
            DecidedBy::LocalFallback => Some(Self::Locally),
            DecidedBy::NoOne => None,
        }
    }
}

/// An admitting decision that reports every limit of `policy` full: what
/// [`FailureMode::Open`] answers a caller that needs a decision.
pub(crate) fn let_through(policy: &Policy) -> Decision {
    let statuses =
        policy.params().iter().enumerate().map(|(i, p)| {
            LimitStatus::new(i, p.limit, p.capacity, p.capacity, Duration::ZERO, None)
        });
    let now = tollgate_core::Clock::now(&tollgate_core::SystemClock);
    Decision::new(policy, Outcome::Allowed, now, Duration::ZERO, statuses)
        .with_decided_by(DecidedBy::NoOne)
}

/// The local decision of a request of `cost` under `share`, this
/// instance's share of `policy`: one that costs more than the share holds
/// but no more than `policy` does is refused for now, not for good (the
/// store admits it once it is back, and a client told "never" gives up).
/// It is never admitted locally: the share bounds what this instance lets
/// through in an outage. So its retry is not the exact time of
/// [`Outcome::Limited`] but an estimate of when the store could admit it:
/// for each limit whose share is short, the time the limit makes `cost`
/// units at its rate, at most its period (and, of a fixed window, at most
/// the time to its end); the longest of those.
fn for_now(decision: Decision, policy: &Policy, share: &Policy, cost: u64) -> Decision {
    match decision.outcome() {
        Outcome::CostExceedsCapacity { .. }
            if policy.params().iter().all(|p| cost <= p.capacity) =>
        {
            // A fixed window admits the whole limit again at its end,
            // which the share's window shares.
            let windowed = policy.algorithm() == Algorithm::FixedWindow;
            let retry = |status: &LimitStatus| {
                let limit = policy.params().get(status.index())?.limit;
                let (period, count) = (limit.period_micros(), limit.count().max(1));
                let micros = (u128::from(cost) * u128::from(period)).div_ceil(u128::from(count));
                let micros = u64::try_from(micros).unwrap_or(u64::MAX).min(period);
                let retry = Duration::from_micros(micros);
                Some(if windowed {
                    retry.min(status.reset())
                } else {
                    retry
                })
            };
            let statuses: Vec<_> = decision
                .limits()
                .iter()
                .map(|s| {
                    let short = s.capacity() < cost;
                    let retry = if short { retry(s) } else { None };
                    LimitStatus::new(
                        s.index(),
                        s.limit(),
                        s.capacity(),
                        s.remaining(),
                        s.reset(),
                        retry,
                    )
                })
                .collect();
            let longest = statuses.iter().filter_map(LimitStatus::retry_after).max();
            let outcome = Outcome::Limited {
                retry_after: longest.unwrap_or_default(),
            };
            Decision::new(share, outcome, decision.now(), Duration::ZERO, statuses).with_cost(cost)
        }
        Outcome::Allowed | Outcome::Limited { .. } | Outcome::CostExceedsCapacity { .. } => {
            decision
        }
    }
}

impl<S: Store> Store for FallbackStore<S> {
    async fn check(&self, key: &Key, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        let result = self.store.check(key, policy, cost).await;
        self.answer(key, policy, cost, result, &()).into_result()
    }

    fn try_check_now(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        let result = self.store.try_check_now(key, policy, cost)?;
        Some(self.answer(key, policy, cost, result, &()).into_result())
    }

    /// The key's state in the wrapped store; when that fails, under
    /// [`FailureMode::Local`], in the local fallback.
    async fn status(&self, key: &Key, policy: &Policy) -> Result<Decision, StoreError> {
        let result = self.store.status(key, policy).await;
        self.answer(key, policy, 0, result, &()).into_result()
    }

    /// Resets the key in the wrapped store and in the local fallback, so
    /// that neither holds what it used. The wrapped store's failure is
    /// returned whatever the failure mode: a reset that did not happen is
    /// not papered over.
    async fn reset(&self, key: &Key, policy: &Policy) -> Result<(), StoreError> {
        self.settings
            .local
            .reset(key, &self.settings.share(policy))
            .await?;
        self.store.reset(key, policy).await
    }

    /// Settles where the reservation was made, as
    /// [`Settlement::decided_by`] says (kept from the decision by
    /// [`Settlement::of`]): one the wrapped store made is settled there or
    /// not at all (its failure is returned, and the reservation stands),
    /// one the local fallback made is settled in the fallback (the store
    /// never charged it: a refund there would be quota for free), and one
    /// no one counted changes nothing, and asks no store: it is answered
    /// as the failure policy lets a request through.
    async fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: Settlement,
    ) -> Result<Decision, StoreError> {
        match Reserved::by(settlement.decided_by()) {
            Some(reserved) => {
                self.settle_reserved(reserved, key, policy, settlement)
                    .await
            }
            None => Ok(let_through(policy)),
        }
    }

    /// Blocks the key in the local fallback and in the wrapped store, so
    /// that a fallback taking over while the store fails does not let the
    /// key in. The wrapped store's failure is returned whatever the
    /// failure mode.
    async fn block(
        &self,
        key: &Key,
        policy: &Policy,
        duration: Duration,
    ) -> Result<(), StoreError> {
        self.settings
            .local
            .block(key, &self.settings.share(policy), duration)
            .await?;
        self.store.block(key, policy, duration).await
    }

    fn last_known(&self, key: &Key, policy: &Policy) -> Option<Decision> {
        self.store.last_known(key, policy)
    }
    fn name(&self) -> &'static str {
        self.store.name()
    }
}

impl<S> Clone for FallbackStore<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            settings: self.settings.clone(),
        }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for FallbackStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FallbackStore")
            .field("store", &self.store)
            .field("mode", &self.settings.mode)
            .field("instances", &self.settings.instances)
            .finish_non_exhaustive()
    }
}

/// The in-memory store that every layer falls back to under
/// [`FailureMode::Local`], unless given its own with
/// [`RateLimitLayer::local_fallback`](crate::RateLimitLayer::local_fallback): one per process, made on first use,
/// with the system clock and [`MemoryStore::DEFAULT_MAX_KEYS`] keys.
///
/// Sharing it keeps the process bounded however many layers it has: the
/// keys held are at most the sum of `max_keys` over the stores the layers
/// decide with (each [`RateLimitLayer::new`](crate::RateLimitLayer::new) makes one, unless replaced with
/// [`store`](crate::RateLimitLayer::store)) plus this store's
/// [`max_keys`](MemoryStore::max_keys). State in it is per policy name and
/// key, like in any store, so layers of different policies do not mix.
///
/// ```
/// use tollgate::{MemoryStore, shared_fallback};
///
/// assert_eq!(shared_fallback().max_keys(), MemoryStore::DEFAULT_MAX_KEYS);
/// ```
pub fn shared_fallback() -> &'static MemoryStore {
    static FALLBACK: std::sync::OnceLock<MemoryStore> = std::sync::OnceLock::new();
    FALLBACK.get_or_init(MemoryStore::new)
}
