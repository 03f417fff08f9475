//! The adaptive layer's metrics: its limit, requests in flight and
//! waiting, and the requests shed per class.

use tollgate_core::Priority;

/// The layer's gauges and counters (with the `metrics` feature).
pub(super) struct Telemetry {
    #[cfg(feature = "metrics")]
    limit: metrics::Gauge,
    #[cfg(feature = "metrics")]
    in_flight: metrics::Gauge,
    #[cfg(feature = "metrics")]
    queued: metrics::Gauge,
    /// Per class, in [`Priority::ALL`]'s order.
    #[cfg(feature = "metrics")]
    shed: [metrics::Counter; 3],
}

impl Telemetry {
    pub(super) fn new(_name: &str) -> Self {
        #[cfg(feature = "metrics")]
        {
            use tollgate_core::telemetry::{
                ADAPTIVE_IN_FLIGHT, ADAPTIVE_LIMIT, ADAPTIVE_QUEUED, ADAPTIVE_SHED,
            };
            tollgate_core::telemetry::describe();
            let name = _name.to_owned();
            let shed = Priority::ALL.map(|class| {
                metrics::counter!(ADAPTIVE_SHED, "policy" => name.clone(), "priority" => class.as_str())
            });
            Self {
                limit: metrics::gauge!(ADAPTIVE_LIMIT, "policy" => name.clone()),
                in_flight: metrics::gauge!(ADAPTIVE_IN_FLIGHT, "policy" => name.clone()),
                queued: metrics::gauge!(ADAPTIVE_QUEUED, "policy" => name),
                shed,
            }
        }
        #[cfg(not(feature = "metrics"))]
        Self {}
    }

    /// The limit, the requests in flight and those waiting, as they are now.
    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    pub(super) fn observe(&self, _limit: u32, _in_flight: u32, _queued: usize) {
        #[cfg(feature = "metrics")]
        {
            self.limit.set(f64::from(_limit));
            self.in_flight.set(f64::from(_in_flight));
            self.queued.set(_queued as f64);
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    pub(super) fn in_flight(&self, _in_flight: u32) {
        #[cfg(feature = "metrics")]
        self.in_flight.set(f64::from(_in_flight));
    }

    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    pub(super) fn queued(&self, _queued: usize) {
        #[cfg(feature = "metrics")]
        self.queued.set(_queued as f64);
    }

    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    pub(super) fn shed(&self, _class: Priority) {
        #[cfg(feature = "metrics")]
        self.shed[_class.index()].increment(1);
    }
}
