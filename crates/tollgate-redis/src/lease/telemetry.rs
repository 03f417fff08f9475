//! The lease metrics, with the `metrics` feature: the calls a
//! [`LeasedStore`](super::LeasedStore) makes to the store it wraps, by
//! policy, and the leases it holds.

/// A call to the wrapped store, as [`LeaseCalls`](super::LeaseCalls)
/// counts it.
#[derive(Debug, Clone, Copy)]
pub(super) enum Call {
    /// A lease asked for.
    Grant,
    /// A request decided by the store, without a lease.
    Direct,
    /// The unused part of a lease given back.
    Return,
}

/// The counters of every policy seen, and the gauges of leases held. The
/// gauges are the process's: each store adds what it holds, as a change
/// from what it reported last, and takes it off when dropped (set, the
/// last store to report overwrote the others').
#[derive(Default)]
pub(super) struct LeaseMetrics {
    #[cfg(feature = "metrics")]
    counters: crate::series::ByPolicy<[metrics::Counter; 3]>,
    #[cfg(feature = "metrics")]
    gauges: Option<[metrics::Gauge; 2]>,
    /// What this store reported last: `(leases, units)`.
    #[cfg(feature = "metrics")]
    reported: std::sync::Mutex<(f64, f64)>,
}

impl LeaseMetrics {
    /// Registers the gauges with the installed recorder.
    pub(super) fn new() -> Self {
        #[cfg(feature = "metrics")]
        {
            use tollgate_core::telemetry::{LEASE_UNITS, LEASES_HELD, describe};
            describe();
            Self {
                counters: crate::series::ByPolicy::default(),
                gauges: Some([metrics::gauge!(LEASES_HELD), metrics::gauge!(LEASE_UNITS)]),
                reported: std::sync::Mutex::default(),
            }
        }
        #[cfg(not(feature = "metrics"))]
        Self {}
    }

    /// Counts `call`, made for a request under the policy named `policy`.
    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    pub(super) fn count(&self, _call: Call, _policy: &str) {
        #[cfg(feature = "metrics")]
        {
            use tollgate_core::telemetry::{LEASE_DIRECT, LEASE_GRANTS, LEASE_RETURNS};
            let index = match _call {
                Call::Grant => 0,
                Call::Direct => 1,
                Call::Return => 2,
            };
            let make = |label: &str| {
                [LEASE_GRANTS, LEASE_DIRECT, LEASE_RETURNS]
                    .map(|name| metrics::counter!(name, "policy" => label.to_owned()))
            };
            self.counters
                .with(_policy, make, |counters| counters[index].increment(1));
        }
    }

    /// Reports what this store holds: `(leases, units)`.
    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    pub(super) fn held(&self, _outstanding: (usize, u64)) {
        #[cfg(feature = "metrics")]
        {
            #[allow(clippy::cast_precision_loss)] // a gauge is a float
            let now = (_outstanding.0 as f64, _outstanding.1 as f64);
            self.change_to(now);
        }
    }

    /// Moves the gauges by the change from what this store reported last
    /// to `now`.
    #[cfg(feature = "metrics")]
    fn change_to(&self, now: (f64, f64)) {
        use std::sync::PoisonError;
        let Some([leases, units]) = &self.gauges else {
            return;
        };
        let mut reported = self.reported.lock().unwrap_or_else(PoisonError::into_inner);
        leases.increment(now.0 - reported.0);
        units.increment(now.1 - reported.1);
        *reported = now;
    }
}

#[cfg(feature = "metrics")]
impl Drop for LeaseMetrics {
    fn drop(&mut self) {
        self.change_to((0.0, 0.0));
    }
}
