//! Rate limiting outside HTTP: jobs, workers, outbound API calls.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Decision, Key, MemoryStore, Outcome, Policy, Store, StoreError};

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
    /// The store failed.
    #[error("rate-limit store failed")]
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
    store: Arc<St>,
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
            policy,
            store: Arc::new(store),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The store.
    pub fn store(&self) -> &St {
        &self.store
    }
}

impl<St: Store> RateLimiter<St> {
    /// Checks and consumes one unit for `key`.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot decide.
    pub async fn check(&self, key: &Key) -> Result<Decision, StoreError> {
        self.check_n(key, 1).await
    }

    /// Checks and consumes `cost` units for `key`. A cost of 0 only reads.
    /// Every check is counted in [`telemetry::DECISIONS`](crate::telemetry::DECISIONS)
    /// as `allowed` or `limited`.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot decide.
    pub async fn check_n(&self, key: &Key, cost: u64) -> Result<Decision, StoreError> {
        let result = match self.store.try_check_now(key, &self.policy, cost) {
            Some(result) => result,
            None => self.store.check(key, &self.policy, cost).await,
        };
        match &result {
            Ok(decision) if decision.is_allowed() => {
                self.telemetry.decided(decision, Verdict::Allowed);
            }
            Ok(decision) => self.telemetry.decided(decision, Verdict::Limited),
            Err(error) => self.telemetry.store_failed(None, error),
        }
        result
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
                // A future outcome this code does not know: do not spin.
                _ => decision.reset(),
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
            store: self.store.clone(),
            telemetry: self.telemetry.clone(),
        }
    }
}

impl<St: fmt::Debug> fmt::Debug for RateLimiter<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("policy", &self.policy)
            .field("store", &self.store)
            .finish()
    }
}
