//! The client side: the partner's limits as Tollgate limiters, shared
//! by every worker through one store, and how a worker is let through.

use std::time::Duration;

use tollgate::{
    Algorithm, ConfigError, Jitter, Key, Limit, Outcome, Policy, RateLimiter, Store, WaitError,
};

use crate::partner::PartnerQuota;

/// How the workers pace their calls to the partner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Pacing {
    /// The peak as GCRA with a burst of 1 (calls spaced by one emission
    /// interval), waited for with `until_ready`; the day as a fixed window
    /// of a UTC day, taken first, without waiting. Two limiters: a
    /// policy's burst applies to each of its limits.
    Gcra,
    /// Both limits in one sliding-log policy, waited for with
    /// `until_ready`.
    SlidingLog,
}

/// Why a worker stops asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The day's quota is spent: no call until the partner's next day.
    DayIsOver,
    /// No call could be let through within the wait allowed.
    NotInTime,
    /// The store failed, or the limiter refused otherwise; the message
    /// says how.
    Failed(String),
}

/// The partner's limits at its own figures, on one store.
#[derive(Debug, Clone)]
pub struct PartnerLimits<St> {
    /// The peak (and, for [`Pacing::SlidingLog`], the day too).
    peak: RateLimiter<St>,
    /// The day, for [`Pacing::Gcra`].
    daily: Option<RateLimiter<St>>,
    /// The peak's period: a wait longer than this is the day's.
    period: Duration,
}

impl<St: Store + Clone> PartnerLimits<St> {
    /// The limits of `quota`, paced as `pacing`, on `store`, waking
    /// waiters with `jitter`.
    ///
    /// # Errors
    ///
    /// When the quota is not a valid policy.
    pub fn new(
        quota: PartnerQuota,
        pacing: Pacing,
        jitter: Jitter,
        store: St,
    ) -> Result<Self, ConfigError> {
        let peak = Limit::new(quota.peak, quota.period)?;
        let day = Limit::per_day(quota.daily)?;
        let (peak, daily) = match pacing {
            Pacing::Gcra => {
                let peak = Policy::builder("partner-peak")
                    .algorithm(Algorithm::Gcra)
                    .limit(peak)
                    .burst(1)
                    .build()?;
                let daily = Policy::new("partner-day", Algorithm::FixedWindow, day)?;
                let daily = RateLimiter::with_store(daily, store.clone());
                (peak, Some(daily))
            }
            Pacing::SlidingLog => {
                let both = Policy::builder("partner")
                    .algorithm(Algorithm::SlidingLog)
                    .limit(peak)
                    .limit(day)
                    .build()?;
                (both, None)
            }
        };
        Ok(Self {
            peak: RateLimiter::with_store(peak, store).jitter(jitter),
            daily,
            period: quota.period,
        })
    }

    /// Waits, at most `max_wait`, until a call to the partner of
    /// `account` is allowed, or says why no call should be made.
    ///
    /// # Errors
    ///
    /// [`Stop::DayIsOver`] once the day's quota is spent,
    /// [`Stop::NotInTime`] when the peak lets no call through within
    /// `max_wait`, and [`Stop::Failed`] when the store fails.
    pub async fn admit(&self, account: &Key, max_wait: Duration) -> Result<(), Stop> {
        // The day first, without waiting: a worker that holds a unit of
        // the day then waits for the peak, and gives the unit back if it
        // cannot have the peak.
        let day = match &self.daily {
            Some(daily) => {
                let day = daily.check(account).await.map_err(failed)?;
                match day.outcome() {
                    Outcome::Allowed => Some((daily, day)),
                    Outcome::Limited { .. } | Outcome::CostExceedsCapacity { .. } => {
                        return Err(Stop::DayIsOver);
                    }
                }
            }
            None => None,
        };
        let waited = self.peak.until_ready(account, max_wait).await;
        if let (Err(_), Some((daily, day))) = (&waited, day) {
            // A refund of a unit not used; should it fail, the unit is
            // lost for the day, never counted twice.
            let _ = daily.settle(account, &day, 1, 0).await;
        }
        match waited {
            Ok(_) => Ok(()),
            Err(WaitError::Store(error)) => Err(failed(error)),
            // The peak never makes a worker wait longer than its period.
            Err(WaitError::TooLong { needed, .. }) if needed > self.period => Err(Stop::DayIsOver),
            Err(WaitError::TooLong { .. }) => Err(Stop::NotInTime),
            // `WaitError` may grow: whatever else it says, waiting on is
            // no use today.
            Err(_) => Err(Stop::DayIsOver),
        }
    }
}

fn failed(error: impl std::error::Error) -> Stop {
    Stop::Failed(error.to_string())
}
