//! The in-flight layer's metrics and throttled logs.

use std::sync::Arc;

use tollgate_core::Renewal;

use crate::fallback::{FailureMode, FailureReport, Handled};
use crate::report::LogThrottle;
/// The layer's metrics (with the `metrics` feature) and throttled logs.
#[derive(Clone)]
pub(super) struct Telemetry {
    #[cfg(feature = "metrics")]
    held: metrics::Gauge,
    #[cfg(feature = "metrics")]
    rejected: metrics::Counter,
    throttle: Arc<LogThrottle>,
    gone: Arc<LogThrottle>,
    /// Counts store failures and what the failure policy made of them,
    /// as a rate limit of the same name does.
    failures: Arc<crate::report::Telemetry>,
}

impl Telemetry {
    pub(super) fn new(_name: &str) -> Self {
        #[cfg(feature = "metrics")]
        tollgate_core::telemetry::describe();
        Self {
            #[cfg(feature = "metrics")]
            held: metrics::gauge!(
                tollgate_core::telemetry::INFLIGHT_SLOTS,
                "policy" => _name.to_owned()
            ),
            #[cfg(feature = "metrics")]
            rejected: metrics::counter!(
                tollgate_core::telemetry::INFLIGHT_REJECTED,
                "policy" => _name.to_owned()
            ),
            throttle: Arc::new(LogThrottle::new(std::time::Duration::from_secs(1))),
            gone: Arc::new(LogThrottle::new(std::time::Duration::from_secs(1))),
            failures: Arc::new(crate::report::Telemetry::new(_name)),
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    pub(super) fn held(&self, _change: f64) {
        #[cfg(feature = "metrics")]
        self.held.increment(_change);
    }

    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    pub(super) fn rejected(&self) {
        #[cfg(feature = "metrics")]
        self.rejected.increment(1);
    }

    /// A renewal found its slot gone: the store lost it, or its lease ran
    /// out before the renewal came.
    pub(super) fn slot_gone(&self, renewal: Renewal) {
        if let Some(suppressed) = self.gone.may_log(tokio::time::Instant::now()) {
            if renewal.past_limit() {
                tracing::warn!(
                    suppressed,
                    "in-flight limit: a running request's slot was gone and new requests held every slot; taken back past the limit, and no new request runs until fewer than the limit do"
                );
            } else {
                tracing::warn!(
                    suppressed,
                    "in-flight limit: a running request's slot was gone; taken back"
                );
            }
        }
    }
}

impl FailureReport for Telemetry {
    fn store_failed(&self, mode: FailureMode, error: &tollgate_core::StoreError) {
        self.failures.count_store_error(error);
        if let Some(suppressed) = self.throttle.may_log(tokio::time::Instant::now()) {
            tracing::warn!(
                error = error as &dyn std::error::Error,
                failure_mode = ?mode,
                suppressed,
                "in-flight limit: the store failed; applying the failure policy"
            );
        }
    }

    fn handled(&self, outcome: Handled) {
        self.failures.count_handled(outcome);
    }
}
