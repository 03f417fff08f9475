//! Reporting store failures: throttled warnings and metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate_core::StoreError;

use crate::response::FailureMode;

/// The counter of store failures, labelled `policy` and `failure_mode`
/// (`open`, `closed` or `local`), with the `metrics` feature.
pub const STORE_FAILURES: &str = "tollgate_store_failures_total";

/// Logs store failures at most once per interval, with the number of
/// failures not logged since, so an outage cannot flood the logs; and
/// counts every one of them as a metric.
#[derive(Debug)]
pub(crate) struct FailureReport {
    policy: Box<str>,
    origin: Instant,
    interval: Duration,
    /// When the last line was logged, in ms since `origin`, plus one (0: never).
    last: AtomicU64,
    suppressed: AtomicU64,
}

impl FailureReport {
    pub(crate) fn new(policy: &str) -> Self {
        Self {
            policy: policy.into(),
            origin: Instant::now(),
            interval: Duration::from_secs(1),
            last: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Reports one failure of the store, handled by `mode`.
    pub(crate) fn store_failed(&self, mode: FailureMode, error: &StoreError) {
        let policy = &*self.policy;
        let mode = match mode {
            FailureMode::Open => "open",
            FailureMode::Closed => "closed",
            _ => "local",
        };
        #[cfg(feature = "metrics")]
        metrics::counter!(STORE_FAILURES, "policy" => policy.to_owned(), "failure_mode" => mode)
            .increment(1);
        if let Some(suppressed) = self.may_log(Instant::now()) {
            tracing::warn!(
                error = error as &dyn std::error::Error,
                policy,
                failure_mode = mode,
                suppressed,
                "rate-limit store failed; applying the failure policy"
            );
        }
    }

    /// `Some(failures not logged since the last line)` if a line may be
    /// logged at `now`.
    fn may_log(&self, now: Instant) -> Option<u64> {
        let now_ms = u64::try_from(now.saturating_duration_since(self.origin).as_millis())
            .unwrap_or(u64::MAX - 1)
            + 1;
        let last = self.last.load(Ordering::Acquire);
        let interval = u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX);
        if last != 0 && now_ms.saturating_sub(last) < interval {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if self
            .last
            .compare_exchange(last, now_ms, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_once_per_second_with_the_count_of_the_rest() {
        let report = FailureReport::new("p");
        let t0 = report.origin;
        assert_eq!(report.may_log(t0), Some(0));
        for _ in 0..99 {
            assert_eq!(report.may_log(t0 + Duration::from_millis(500)), None);
        }
        assert_eq!(report.may_log(t0 + Duration::from_millis(999)), None);
        assert_eq!(report.may_log(t0 + Duration::from_millis(1_000)), Some(100));
        assert_eq!(report.may_log(t0 + Duration::from_millis(1_001)), None);
    }
}
