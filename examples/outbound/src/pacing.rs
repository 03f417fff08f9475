//! The client side: the partner's limits as Tollgate limiters, shared
//! by every worker through one store, and how a worker is let through.

use std::time::Duration;

use tollgate::{
    Algorithm, ConfigError, FailureMode, Jitter, Key, Limit, Outcome, Policy, RateLimiter, Store,
    WaitError,
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

/// The headroom the demo paces with by default: see [`PartnerLimits::new`].
pub const DEFAULT_HEADROOM: Duration = Duration::from_millis(100);

/// The partner's limits at its own figures, on one store.
#[derive(Debug, Clone)]
pub struct PartnerLimits<St> {
    /// The peak (and, for [`Pacing::SlidingLog`], the day too).
    peak: RateLimiter<St>,
    /// The day, for [`Pacing::Gcra`].
    daily: Option<RateLimiter<St>>,
    /// The peak's period as paced (the headroom included): a wait
    /// longer than this is the day's.
    period: Duration,
}

impl<St: Store + Clone> PartnerLimits<St> {
    /// The limits of `quota`, paced as `pacing`, on `store`, waking
    /// waiters with `jitter`, the peak spread over its period plus
    /// `headroom`.
    ///
    /// A call reaches the partner some time after it is let through, and
    /// that delay varies (scheduling, the network). Paced at the
    /// partner's exact figure, two calls let through a period apart can
    /// arrive less than a period apart, and the partner counts one more
    /// than its peak in a window. `headroom` is how much the delay may
    /// vary before that happens ([`DEFAULT_HEADROOM`]; `Duration::ZERO`
    /// paces at the exact figure, for a partner on the same clock).
    ///
    /// # Errors
    ///
    /// When the quota is not a valid policy.
    pub fn new(
        quota: PartnerQuota,
        pacing: Pacing,
        jitter: Jitter,
        headroom: Duration,
        store: St,
    ) -> Result<Self, ConfigError> {
        let peak = Limit::new(quota.peak, quota.period.saturating_add(headroom))?;
        let day = Limit::per_day(quota.daily)?;
        let (peak, daily) = match pacing {
            Pacing::Gcra => {
                let peak = Policy::builder("partner-peak")
                    .algorithm(Algorithm::Gcra)
                    .limit(peak)
                    .burst(1)
                    .build()?;
                let daily = Policy::new("partner-day", Algorithm::FixedWindow, day)?;
                let daily = RateLimiter::with_store(daily, store.clone())
                    .on_store_error(FailureMode::Closed);
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
            // A worker never calls the partner on a local guess: while
            // the store cannot say, no call is let through (the worker
            // asks again), since every process guessing alone would
            // exceed the partner's limits together.
            peak: RateLimiter::with_store(peak, store)
                .jitter(jitter)
                .on_store_error(FailureMode::Closed),
            daily,
            // The peak's period as paced: the partner's, and the headroom.
            period: quota.period.saturating_add(headroom),
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
            Err(error @ WaitError::DeniedByOperator { .. }) => Err(failed(error)),
            // `WaitError` may grow: whatever else it says, waiting on is
            // no use today.
            Err(_) => Err(Stop::DayIsOver),
        }
    }
}

fn failed(error: impl std::error::Error) -> Stop {
    Stop::Failed(error.to_string())
}
