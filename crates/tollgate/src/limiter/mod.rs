//! Rate limiting outside HTTP: jobs, workers, outbound API calls. The
//! limiter and its answers here; waiting for admission in `wait.rs`, its
//! jitter in `jitter.rs`; settling what a reservation cost in `settle.rs`.

mod jitter;
mod overridden;
mod settle;
mod wait;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use tollgate_core::{
    ConfigError, Decision, Key, MemoryStore, OverrideSource, Policy, PolicyFamily, Store,
    StoreError,
};

use crate::answer::Protocol;
use crate::answer::headers::HeaderStyle;
use crate::fallback::{Answer, FailureMode, FallbackStore, InstanceCount, let_through};
use crate::macros::failure_setters;
use crate::overrides::{own_limits, own_limits_each, own_limits_under};
use crate::report::{Telemetry, Verdict};
use jitter::Draws;
pub use jitter::Jitter;
use overridden::{Checked, checked};
pub use wait::WaitError;

/// A rate limiter for code that is not an HTTP handler: background jobs,
/// queue workers, and calls to third-party APIs with quotas. Put it in a
/// shared store (Redis) and every worker on every machine shares one limit.
///
/// Cloning is cheap; clones share state.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Algorithm, Key, Policy, RateLimiter};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // A partner API allows 10 calls per second and 300 per minute.
/// let policy = Policy::builder("partner-api")
///     .algorithm(Algorithm::Gcra)
///     .limit("10/s")
///     .limit("300/min")
///     .build()?;
/// let limiter = RateLimiter::new(policy);
/// let partner = Key::custom("partner");
///
/// // Non-blocking: is a call allowed right now?
/// assert!(limiter.check(&partner).await?.is_allowed());
///
/// // Blocking: wait for a slot, but no longer than 2 s.
/// limiter.until_ready(&partner, Duration::from_secs(2)).await?;
/// # Ok(())
/// # }
/// ```
pub struct RateLimiter<St = MemoryStore> {
    policy: Policy,
    family: PolicyFamily,
    store: FallbackStore<St>,
    telemetry: Arc<Telemetry>,
    jitter: Jitter,
    /// The jitter's random draws, shared by clones.
    draws: Arc<Draws>,
    /// The callers waiting on each key, shared by clones.
    lines: Arc<wait::Lines>,
    /// Where each key's overrides are found, if anywhere.
    overrides: Option<Arc<dyn OverrideSource>>,
}

impl RateLimiter<MemoryStore> {
    /// A limiter on a new [`MemoryStore`] with the system clock.
    pub fn new(policy: Policy) -> Self {
        Self::with_store(policy, MemoryStore::new())
    }
}

impl<St> RateLimiter<St> {
    /// A limiter on `store`.
    pub fn with_store(policy: Policy, store: St) -> Self {
        Self {
            telemetry: Arc::new(Telemetry::of(&policy)),
            family: PolicyFamily::from(policy.clone()),
            policy,
            store: FallbackStore::new(store),
            jitter: Jitter::default(),
            draws: Arc::new(Draws::new()),
            lines: Arc::default(),
            overrides: None,
        }
    }

    /// How [`until_ready`](RateLimiter::until_ready) spreads the wake-ups
    /// of callers waiting on one key (default [`Jitter::BULK`]);
    /// [`Jitter::NONE`] wakes them at the exact retry time.
    ///
    /// ```
    /// use tollgate::{Algorithm, Jitter, Policy, RateLimiter};
    ///
    /// let policy = Policy::new("partner-api", Algorithm::Gcra, "10/s")?;
    /// let limiter = RateLimiter::new(policy).jitter(Jitter::NONE);
    /// assert_eq!(limiter.wait_jitter(), Jitter::NONE);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Applies each key's override from `source`, as
    /// [`RateLimitLayer::overrides`](crate::RateLimitLayer::overrides)
    /// does: a key's own limits are checked under the policy's name; an
    /// exempt key is admitted without the store (every limit reported
    /// full); a denied key is refused, with the rest of the deny as its
    /// retry time, or for good ([`Outcome::CostExceedsCapacity`] of a
    /// capacity of 0) for a deny without expiry, so that
    /// [`until_ready`](Self::until_ready) gives up at once.
    ///
    /// ```
    /// use tollgate::{Algorithm, Key, MemoryOverrides, Override, OverrideStore, Policy, RateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let exports = Policy::new("exports", Algorithm::FixedWindow, "1/h")?;
    /// let overrides = MemoryOverrides::new();
    /// let limiter = RateLimiter::new(exports.clone()).overrides(overrides.clone());
    /// let acme = Key::user("acme");
    /// overrides.set(&acme, &exports, Override::limit("3/h")?, None).await?;
    /// for _ in 0..3 {
    ///     assert!(limiter.check(&acme).await?.is_allowed());
    /// }
    /// assert!(!limiter.check(&acme).await?.is_allowed());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`Outcome::CostExceedsCapacity`]: crate::Outcome::CostExceedsCapacity
    pub fn overrides(mut self, source: impl OverrideSource) -> Self {
        self.overrides = Some(Arc::new(source));
        self
    }

    /// The jitter of [`until_ready`](RateLimiter::until_ready)'s waits.
    pub fn wait_jitter(&self) -> Jitter {
        self.jitter
    }

    failure_setters! {
        store;
        /// What to do when the store fails (default [`FailureMode::Local`], as
        /// for the layer): decide with an in-memory store, each instance
        /// enforcing its share ([`RateLimiter::local_divisor`]);
        /// [`FailureMode::Closed`] returns the error; [`FailureMode::Open`]
        /// admits, reporting every limit full.
        ///
        /// ```
        /// use tollgate::{Algorithm, FailureMode, Policy, RateLimiter};
        ///
        /// let policy = Policy::new("partner-api", Algorithm::Gcra, "10/s")?;
        /// let limiter = RateLimiter::new(policy).on_store_error(FailureMode::Closed);
        /// assert_eq!(limiter.failure_mode(), FailureMode::Closed);
        /// # Ok::<(), tollgate::ConfigError>(())
        /// ```
        on_store_error;
        /// How many instances share the limit, for [`FailureMode::Local`] (see
        /// [`FallbackStore::local_divisor`]). Default 1.
        local_divisor;
        /// The instance count as a handle that may change at runtime, for
        /// fleets that autoscale (see [`InstanceCount`](crate::InstanceCount)), in place of a
        /// fixed `local_divisor`.
        ///
        /// ```
        /// use std::num::NonZeroU64;
        /// use tollgate::{Algorithm, InstanceCount, Policy, RateLimiter};
        ///
        /// let instances = InstanceCount::new(NonZeroU64::new(3).unwrap());
        /// let policy = Policy::new("partner-api", Algorithm::Gcra, "30/s")?;
        /// let limiter = RateLimiter::new(policy).local_instances(instances.clone());
        /// instances.set(NonZeroU64::new(5).unwrap()); // the fleet grew
        /// # let _ = limiter;
        /// # Ok::<(), tollgate::ConfigError>(())
        /// ```
        local_instances;
        /// The in-memory store [`FailureMode::Local`] decides with (default:
        /// [`shared_fallback`](crate::shared_fallback)).
        local_fallback;
    }

    /// The failure mode.
    pub fn failure_mode(&self) -> FailureMode {
        self.store.failure_mode()
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The family of policies that [`reset`](RateLimiter::reset) and
    /// [`block`](RateLimiter::block) act on, the limiter's own policy among
    /// them: for a limiter whose keys move between policies (a customer's
    /// plan), so that an operator's block holds on every plan. By default
    /// the family of the limiter's policy alone.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Algorithm, Key, Policy, PolicyFamily, RateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let free = Policy::new("exports", Algorithm::FixedWindow, "1/h")?;
    /// let pro = Policy::new("exports-pro", Algorithm::FixedWindow, "10/h")?;
    /// let family = PolicyFamily::new("exports", [free.clone(), pro.clone()])?;
    /// let on_free = RateLimiter::new(free).in_family(family.clone())?;
    /// // Sharing the store: the same customer on the pro plan.
    /// let on_pro = RateLimiter::with_store(pro, on_free.store().clone()).in_family(family)?;
    /// let customer = Key::user("ada");
    /// on_free.block(&customer, Duration::from_secs(600)).await?;
    /// assert!(!on_pro.check(&customer).await?.is_allowed());
    /// on_free.reset(&customer).await?;
    /// assert!(on_pro.check(&customer).await?.is_allowed());
    ///
    /// // The limiter's own policy must be a member.
    /// let other = Policy::new("other", Algorithm::Gcra, "1/s")?;
    /// let family = on_pro.family().clone();
    /// assert!(RateLimiter::new(other).in_family(family).is_err());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError::NotAMember`] when the limiter's policy is not one of
    /// `family`'s members (by name).
    pub fn in_family(mut self, family: PolicyFamily) -> Result<Self, ConfigError> {
        if family.member(self.policy.name()).is_none() {
            return Err(ConfigError::NotAMember {
                family: family.name().to_owned(),
                policy: self.policy.name().to_owned(),
            });
        }
        self.family = family;
        Ok(self)
    }

    /// The family [`reset`](RateLimiter::reset) and
    /// [`block`](RateLimiter::block) act on.
    pub fn family(&self) -> &PolicyFamily {
        &self.family
    }

    /// The store.
    pub fn store(&self) -> &St {
        self.store.get_ref()
    }

    /// The answer to a request that `decision`, one of this limiter's,
    /// refused, as the layer gives it: 429 with an
    /// `application/problem+json` body naming the limiter's policy,
    /// `Retry-After`, and the rate-limit headers of `style`. For a
    /// middleware or handler that decides with a limiter (the same as
    /// [`rejection`](crate::rejection) with the policy's name). A key an
    /// operator's override denies gets the layer's answer to it: 403 with
    /// a problem body, and `Retry-After` the rest of the deny if it ends.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate::{Algorithm, HeaderStyle, Key, Policy, RateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::new(Policy::new("export", Algorithm::FixedWindow, "1/h")?);
    /// let key = Key::user("ada");
    /// limiter.check(&key).await?;
    /// let denied = limiter.check(&key).await?;
    /// let response = limiter.rejection(&denied, HeaderStyle::GitHub);
    /// assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    /// assert_eq!(response.headers()["x-ratelimit-resource"], "export");
    /// assert!(response.headers().contains_key("retry-after"));
    /// # Ok(())
    /// # }
    /// ```
    pub fn rejection(&self, decision: &Decision, style: HeaderStyle) -> Response<Bytes> {
        let name = self.policy.name();
        match overridden::denial(decision) {
            Some(ends_in) => crate::answer::denied_by_operator(name, ends_in, Protocol::Http),
            None => crate::answer::rejection(decision, name, style),
        }
    }
}

impl<St: Store> RateLimiter<St> {
    /// Checks and consumes one unit for `key`.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot decide under
    /// [`FailureMode::Closed`], or the local fallback cannot either.
    pub async fn check(&self, key: &Key) -> Result<Decision, StoreError> {
        self.check_n(key, 1).await
    }

    /// Checks and consumes `cost` units for `key`. A cost of 0 only reads.
    /// Every check is counted in [`telemetry::DECISIONS`](crate::telemetry::DECISIONS)
    /// as `allowed` or `limited`, or as `denied` when an operator's
    /// override denies the key.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot decide under
    /// [`FailureMode::Closed`], or the local fallback cannot either.
    pub async fn check_n(&self, key: &Key, cost: u64) -> Result<Decision, StoreError> {
        let (decision, counted) = self.decide(key, cost).await?;
        if counted {
            let verdict = if decision.is_allowed() {
                Verdict::Allowed
            } else {
                Verdict::Limited
            };
            (self.telemetry).decided(&decision, verdict, self.store.get_ref().name());
        }
        Ok(decision)
    }

    /// Checks and consumes `cost` units for `key`, without counting the
    /// decision; `true` with a decision that counts in
    /// [`telemetry::DECISIONS`](crate::telemetry::DECISIONS) (the store's or
    /// the local fallback's, not an override's or a let-through). A key
    /// whose override is not known yet waits for it, up to the source's
    /// bound (whatever the caller's own wait: decided under its plan, the
    /// key would lose the state of its own limits).
    async fn decide(&self, key: &Key, cost: u64) -> Result<(Decision, bool), StoreError> {
        let found = match self.overrides.as_deref() {
            None => None,
            Some(source) => match checked(source, key, &self.policy, cost) {
                // Boxed: only the rare request that waits pays for the
                // wait's room in the future.
                Some(Checked::Pending) => Box::pin(self.first_answer(source, key, cost)).await,
                found @ (None | Some(Checked::Limits(_) | Checked::Decided(_))) => found,
            },
        };
        let own;
        let policy = match found {
            None | Some(Checked::Pending) => &self.policy,
            Some(Checked::Limits(policy)) => {
                own = policy;
                &own
            }
            Some(Checked::Decided(decision)) => {
                // An operator's deny is counted, as the layer counts it; an
                // exemption's let-through is not a decision.
                if overridden::denial(&decision).is_some() {
                    self.telemetry.denied_by_operator();
                }
                return Ok((decision, false));
            }
        };
        let answer = self
            .store
            .check_reported(
                key,
                policy,
                cost,
                &self.telemetry.reporter(self.store.get_ref().name()),
            )
            .await;
        match answer {
            Answer::Decided(decision) | Answer::Local(decision) => Ok((decision, true)),
            Answer::LetThrough(_) => Ok((let_through(policy).with_cost(cost), false)),
            Answer::Refused(refusal) => refusal.into_result(),
        }
    }

    /// What `source` says of `key` once its first answer about it is in,
    /// or once `source` stops waiting for it.
    async fn first_answer(
        &self,
        source: &dyn OverrideSource,
        key: &Key,
        cost: u64,
    ) -> Option<Checked> {
        // `None`: the answer came in meanwhile.
        if let Some(first) = source.first_answer(key, &self.policy) {
            first.await;
        }
        checked(source, key, &self.policy, cost)
    }

    /// The state of `key`, consuming nothing: every limit's limit,
    /// remaining, used and reset, as a request of cost 0 sees it.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store fails, but under
    /// [`FailureMode::Local`](crate::FailureMode::Local), which reads the
    /// local fallback's state instead. (A failure `check` lets through
    /// under `FailureMode::Open` has no state to read: an error here.)
    pub async fn status(&self, key: &Key) -> Result<Decision, StoreError> {
        let own = own_limits(self.overrides.as_deref(), key, &self.policy).await;
        self.store
            .status(key, own.as_ref().unwrap_or(&self.policy))
            .await
    }

    /// The state of `key` under each policy of the limiter's
    /// [family](RateLimiter::in_family), consuming nothing, in the
    /// family's order. Under a policy where the key has limits of its own
    /// (an [override](RateLimiter::overrides) in force), the state is read
    /// under them, and that policy, with those limits, is the one returned
    /// with it: read under the policy's own limits, a limit the override
    /// adds (a daily one, say) would be carried over and dropped, as when
    /// the override ends, and the key's next request would find it fresh.
    ///
    /// ```
    /// use tollgate::{Algorithm, Key, MemoryOverrides, OverrideStore, Policy, RateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let api = Policy::new("api", Algorithm::FixedWindow, "10/s")?;
    /// let overrides = MemoryOverrides::new();
    /// let acme = Key::user("acme");
    /// overrides.set(&acme, &api, "1000/day".parse()?, None).await?;
    /// let limiter = RateLimiter::new(api).overrides(overrides);
    /// assert!(limiter.check_n(&acme, 1000).await?.is_allowed());
    /// let status = limiter.family_status(&acme).await?;
    /// assert_eq!(status[0].1.limit(), 1000);
    /// assert_eq!(status[0].1.remaining(), 0);
    /// assert!(!limiter.check(&acme).await?.is_allowed());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::status`].
    pub async fn family_status(&self, key: &Key) -> Result<Vec<(Policy, Decision)>, StoreError> {
        let members = self.family.members();
        let owns = own_limits_each(self.overrides.as_deref(), key, members).await;
        let mut states = Vec::with_capacity(members.len());
        for (member, own) in members.iter().zip(owns) {
            let policy = own.unwrap_or_else(|| member.clone());
            let decision = self.store.status(key, &policy).await?;
            states.push((policy, decision));
        }
        Ok(states)
    }

    /// Forgets what `key` has used under every policy of the limiter's
    /// [family](RateLimiter::in_family) (by default, its policy alone): it
    /// starts afresh, in the store and in the local fallback. For
    /// operators, to let a customer in again. A key with limits of its own
    /// (an [override](RateLimiter::overrides) in force) is reset under
    /// them too, so that the refunds of its requests reserved before are
    /// fenced as long as those limits reach.
    ///
    /// ```
    /// use tollgate::{Algorithm, Key, Policy, RateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::new(Policy::new("exports", Algorithm::FixedWindow, "1/h")?);
    /// let customer = Key::user("ada");
    /// assert!(limiter.check(&customer).await?.is_allowed());
    /// assert!(!limiter.check(&customer).await?.is_allowed());
    /// limiter.reset(&customer).await?;
    /// assert_eq!(limiter.status(&customer).await?.remaining(), 1);
    /// assert!(limiter.check(&customer).await?.is_allowed());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot reach the key's state,
    /// whatever the failure mode; the family's members after the failing
    /// one are not tried (see [`PolicyFamily::block`]).
    pub async fn reset(&self, key: &Key) -> Result<(), StoreError> {
        let owns = self.own_limits_in_family(key).await;
        self.family.reset(&self.store, key).await?;
        for own in owns {
            self.store.reset(key, &own).await?;
        }
        // The key's callers in line wait for a time the reset made old.
        self.lines.renew(key);
        Ok(())
    }

    /// The limits of `key`'s own (its overrides in force) under each
    /// member of the family that has them. A reset or a block of the key
    /// is made under them too: its requests were reserved under them, and
    /// the fence that keeps their refunds out of the fresh state must
    /// reach as far as theirs (a daily override of a per-second plan,
    /// say), where a later reset or block never shortens a fence.
    async fn own_limits_in_family(&self, key: &Key) -> Vec<Policy> {
        let members = self.family.members();
        own_limits_under(self.overrides.as_deref(), key, members).await
    }

    /// Blocks `key` for `duration` under every policy of the limiter's
    /// [family](RateLimiter::in_family) (by default, its policy alone):
    /// its state is forgotten and every check
    /// is denied, with `Retry-After` exactly the rest of the block, until
    /// it ends; then the key starts afresh. [`RateLimiter::reset`] lifts
    /// it. Blocks the key in the local fallback too, and under its own
    /// limits as well as the family's (see [`RateLimiter::reset`]). A key
    /// with an `exempt` [`Override`](tollgate_core::Override) is let
    /// through without the store, so a block does not hold against it
    /// while the exemption lasts: to shut such a key out, set a `deny`
    /// override in the exemption's place.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Algorithm, Key, Policy, RateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::new(Policy::new("api", Algorithm::Gcra, "100/min")?);
    /// let abuser = Key::ip("203.0.113.9".parse()?);
    /// limiter.block(&abuser, Duration::from_secs(900)).await?;
    /// let denied = limiter.check(&abuser).await?;
    /// // The rest of the block: 900 s, less the microseconds since.
    /// let wait = denied.retry_after().unwrap();
    /// assert!(wait <= Duration::from_secs(900) && wait > Duration::from_secs(899));
    /// limiter.reset(&abuser).await?;
    /// assert!(limiter.check(&abuser).await?.is_allowed());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot reach the key's state,
    /// whatever the failure mode; the family's members after the failing
    /// one are not tried (see [`PolicyFamily::block`]).
    pub async fn block(&self, key: &Key, duration: Duration) -> Result<(), StoreError> {
        let owns = self.own_limits_in_family(key).await;
        self.family.block(&self.store, key, duration).await?;
        for own in owns {
            self.store.block(key, &own, duration).await?;
        }
        Ok(())
    }
}

impl<St> Clone for RateLimiter<St> {
    fn clone(&self) -> Self {
        Self {
            policy: self.policy.clone(),
            family: self.family.clone(),
            store: self.store.clone(),
            telemetry: self.telemetry.clone(),
            jitter: self.jitter,
            draws: self.draws.clone(),
            lines: self.lines.clone(),
            overrides: self.overrides.clone(),
        }
    }
}

impl<St: fmt::Debug> fmt::Debug for RateLimiter<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("policy", &self.policy)
            .field("family", &self.family)
            .field("store", &self.store)
            .field("jitter", &self.jitter)
            .finish()
    }
}
