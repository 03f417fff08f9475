//! Rate limiting outside HTTP: jobs, workers, outbound API calls.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{
    ConfigError, Decision, Key, MemoryStore, Outcome, Policy, PolicyFamily, Settlement, Store,
    StoreError,
};

use crate::fallback::{Answer, FailureMode, FallbackStore, let_through};
use crate::macros::failure_setters;
use crate::report::{Telemetry, Verdict};

/// Why [`RateLimiter::until_ready`] gave up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The cost is larger than a limit's capacity: waiting cannot help.
    #[error(
        "cost {cost} exceeds the capacity {capacity} of policy {policy}; it can never be admitted"
    )]
    CostExceedsCapacity {
        /// The policy's name.
        policy: String,
        /// The requested cost.
        cost: u64,
        /// The capacity it exceeds.
        capacity: u64,
    },
    /// Admission would come later than the maximum wait allows. Nothing was
    /// consumed, except for a leaky bucket, whose admission comes with a
    /// delay: a queued request's place is kept even when the wait is refused.
    #[error("admission in {needed:?} would exceed the maximum wait of {max_wait:?}")]
    TooLong {
        /// How long from the last check admission would take.
        needed: Duration,
        /// The maximum wait that was given.
        max_wait: Duration,
    },
    /// The store failed; the message says how.
    #[error("rate-limit store failed: {0}")]
    Store(#[from] StoreError),
}

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
            telemetry: Arc::new(Telemetry::new(policy.name())),
            family: PolicyFamily::from(policy.clone()),
            policy,
            store: FallbackStore::new(store),
        }
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
    /// as `allowed` or `limited`.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot decide under
    /// [`FailureMode::Closed`], or the local fallback cannot either.
    pub async fn check_n(&self, key: &Key, cost: u64) -> Result<Decision, StoreError> {
        let answer = self
            .store
            .check_reported(key, &self.policy, cost, &*self.telemetry)
            .await;
        match answer {
            Answer::Decided(decision) => {
                let verdict = if decision.is_allowed() {
                    Verdict::Allowed
                } else {
                    Verdict::Limited
                };
                self.telemetry.decided(&decision, verdict);
                Ok(decision)
            }
            Answer::LetThrough(_) => Ok(let_through(&self.policy)),
            Answer::Refused(refusal) => refusal.into_result(),
        }
    }

    /// The state of `key`, consuming nothing: every limit's limit,
    /// remaining, used and reset, as a request of cost 0 sees it.
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::check`].
    pub async fn status(&self, key: &Key) -> Result<Decision, StoreError> {
        self.store.status(key, &self.policy).await
    }

    /// The state of `key` under each policy of the limiter's
    /// [family](RateLimiter::in_family), consuming nothing, in the
    /// family's order.
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::check`].
    pub async fn family_status(&self, key: &Key) -> Result<Vec<(Policy, Decision)>, StoreError> {
        self.family.status(&self.store, key).await
    }

    /// Forgets what `key` has used under every policy of the limiter's
    /// [family](RateLimiter::in_family) (by default, its policy alone): it
    /// starts afresh, in the store and in the local fallback. For
    /// operators, to let a customer in again.
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
        self.family.reset(&self.store, key).await
    }

    /// Settles what a piece of work admitted earlier really cost: checked
    /// (reserved) at `reservation`'s cost `reserved`, it cost `actual`.
    /// Refunds the unused part or charges the rest (past the allowance,
    /// as debt: see [`Settlement`]), and returns the state after it.
    ///
    /// ```
    /// use tollgate::{Algorithm, Key, Policy, RateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let tokens = RateLimiter::new(Policy::new("llm-tokens", Algorithm::TokenBucket, "1000/min")?);
    /// let tenant = Key::user("acme");
    /// let reservation = tokens.check_n(&tenant, 300).await?;
    /// assert!(reservation.is_allowed());
    /// let used = 120; // what the model call really took
    /// let after = tokens.settle(&tenant, &reservation, 300, used).await?;
    /// assert_eq!(after.remaining(), 880);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::check`], except that no failure mode turns a
    /// failed settlement into a decision: the caller decides whether to
    /// retry it.
    pub async fn settle(
        &self,
        key: &Key,
        reservation: &Decision,
        reserved: u64,
        actual: u64,
    ) -> Result<Decision, StoreError> {
        let settlement = Settlement::of(reservation, reserved, actual);
        self.store.settle(key, &self.policy, settlement).await
    }

    /// Blocks `key` for `duration` under every policy of the limiter's
    /// [family](RateLimiter::in_family) (by default, its policy alone):
    /// its state is forgotten and every check
    /// is denied, with `Retry-After` exactly the rest of the block, until
    /// it ends; then the key starts afresh. [`RateLimiter::reset`] lifts
    /// it. Blocks the key in the local fallback too.
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
        self.family.block(&self.store, key, duration).await
    }

    /// Waits until one unit for `key` is admitted, for at most `max_wait`.
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::until_n_ready`].
    pub async fn until_ready(&self, key: &Key, max_wait: Duration) -> Result<Decision, WaitError> {
        self.until_n_ready(key, 1, max_wait).await
    }

    /// Waits until `cost` units for `key` are admitted, for at most
    /// `max_wait`, then returns the admitting decision. For a leaky bucket
    /// the returned future also waits out the shaping delay.
    ///
    /// It sleeps until the exact `retry_after` of each denial and checks
    /// again, so it competes fairly with other workers sharing the limit.
    /// It gives up at once, without sleeping, when admission cannot come
    /// within `max_wait`.
    ///
    /// # Errors
    ///
    /// [`WaitError::TooLong`] when admission would come after `max_wait`,
    /// [`WaitError::CostExceedsCapacity`] when it can never come, and
    /// [`WaitError::Store`] when the store fails.
    pub async fn until_n_ready(
        &self,
        key: &Key,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, WaitError> {
        let deadline = tokio::time::Instant::now() + max_wait;
        loop {
            let decision = self.check_n(key, cost).await?;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let wait = match decision.outcome() {
                Outcome::Allowed => {
                    let delay = decision.delay();
                    if delay > left {
                        return Err(WaitError::TooLong {
                            needed: delay,
                            max_wait,
                        });
                    }
                    tokio::time::sleep(delay).await;
                    return Ok(decision);
                }
                Outcome::CostExceedsCapacity { cost, capacity } => {
                    return Err(WaitError::CostExceedsCapacity {
                        policy: self.policy.name().to_owned(),
                        cost,
                        capacity,
                    });
                }
                Outcome::Limited { retry_after } => retry_after,
            };
            if wait > left {
                return Err(WaitError::TooLong {
                    needed: wait,
                    max_wait,
                });
            }
            tokio::time::sleep(wait).await;
        }
    }
}

impl<St> Clone for RateLimiter<St> {
    fn clone(&self) -> Self {
        Self {
            policy: self.policy.clone(),
            family: self.family.clone(),
            store: self.store.clone(),
            telemetry: self.telemetry.clone(),
        }
    }
}

impl<St: fmt::Debug> fmt::Debug for RateLimiter<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("policy", &self.policy)
            .field("family", &self.family)
            .field("store", &self.store)
            .finish()
    }
}
