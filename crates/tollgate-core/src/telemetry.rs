//! The names of tollgate's metrics.
//!
//! With the `metrics` feature of each crate, tollgate reports through the
//! [`metrics`](https://docs.rs/metrics) facade, so any exporter works
//! (Prometheus, StatsD, OpenTelemetry). Labels are the policy name and,
//! where it applies, a bounded `outcome`; raw keys never appear in labels
//! or logs.
//!
//! | name | kind | labels | counts |
//! |---|---|---|---|
//! | [`DECISIONS`] | counter | `policy`, `outcome` | requests decided: `allowed`, `limited` (rejected), `shadow_limited` (would have been rejected; let through by shadow mode) |
//! | [`STORE_ERRORS`] | counter | `policy`, `outcome` | store failures by kind: `timeout`, `circuit_open`, `full`, `backend` |
//! | [`FALLBACKS`] | counter | `policy`, `outcome` | requests the failure policy handled: `open` (let through), `closed` (503), `local_allowed`, `local_limited` |
//! | [`DENY_CACHE_HITS`] | counter | `policy` | denials the Redis store answered from its deny cache, without a round trip |
//! | [`MEMORY_STORE_KEYS`] | gauge | none | keys held by the process's memory stores |
//! | [`CIRCUITS_OPEN`] | gauge | none | the Redis store's circuit breakers open or probing (0 when every store is healthy); with tollgate-redis's `metrics` feature |
//! | [`INFLIGHT_SLOTS`] | gauge | `policy` | slots of an in-flight limit held by this process's requests |
//! | [`INFLIGHT_REJECTED`] | counter | `policy` | requests an in-flight limit turned away |
//! | [`ADAPTIVE_LIMIT`] | gauge | `policy` | the concurrency limit an adaptive layer has found |
//! | [`ADAPTIVE_IN_FLIGHT`] | gauge | `policy` | requests an adaptive layer lets run now |
//! | [`ADAPTIVE_QUEUED`] | gauge | `policy` | requests waiting for a slot of an adaptive layer |
//! | [`ADAPTIVE_SHED`] | counter | `policy`, `priority` | requests an adaptive layer shed, by class (`critical`, `default`, `sheddable`) |
//! | [`STORE_LATENCY`] | histogram | none | seconds from sending a Redis call to its reply, as the app observed it, one sample per call |
//!
//! Handles are registered when a layer, limiter or store is built: install
//! the metrics recorder first.

/// Counter of decisions, labelled `policy` and `outcome` (`allowed`,
/// `limited`, `shadow_limited`).
pub const DECISIONS: &str = "tollgate_decisions_total";

/// Counter of store failures, labelled `policy` and `outcome`, the kind of
/// failure (`timeout`, `circuit_open`, `full`, `backend`; see
/// [`StoreError::kind`](crate::StoreError::kind)).
pub const STORE_ERRORS: &str = "tollgate_store_errors_total";

/// Counter of requests handled by the failure policy, labelled `policy`
/// and `outcome` (`open`, `closed`, `local_allowed`, `local_limited`).
pub const FALLBACKS: &str = "tollgate_fallback_decisions_total";

/// Counter of denials served from the Redis store's deny cache, labelled
/// `policy`.
pub const DENY_CACHE_HITS: &str = "tollgate_deny_cache_hits_total";

/// Gauge of the keys held by all memory stores of the process.
pub const MEMORY_STORE_KEYS: &str = "tollgate_memory_store_keys";

/// Gauge of the circuit breakers that are open or half-open.
pub const CIRCUITS_OPEN: &str = "tollgate_circuits_open";

/// Gauge: slots of an in-flight limit held by this app server's requests
/// (label `policy`, the limit's name).
pub const INFLIGHT_SLOTS: &str = "tollgate_inflight_slots";

/// Counter: requests an in-flight limit turned away, every slot of their
/// key being taken (label `policy`).
pub const INFLIGHT_REJECTED: &str = "tollgate_inflight_rejected_total";

/// Gauge: the concurrency limit an adaptive layer has found (label
/// `policy`, the limit's name).
pub const ADAPTIVE_LIMIT: &str = "tollgate_adaptive_limit";

/// Gauge: the requests an adaptive layer lets run now (label `policy`).
pub const ADAPTIVE_IN_FLIGHT: &str = "tollgate_adaptive_in_flight";

/// Gauge: the requests waiting for a slot of an adaptive layer (label
/// `policy`).
pub const ADAPTIVE_QUEUED: &str = "tollgate_adaptive_queued";

/// Counter: requests an adaptive layer shed, labelled `policy` and
/// `priority` (`critical`, `default`, `sheddable`).
pub const ADAPTIVE_SHED: &str = "tollgate_adaptive_shed_total";

/// Histogram of the Redis store's latency in seconds: from sending a call
/// (a script call, which may carry a batch of decisions) to its reply, one
/// sample per call, as the app observed it. A call that missed its
/// deadline is not sampled; it is a `timeout` in [`STORE_ERRORS`].
///
/// Compare it with the deadline: a store whose samples stay far below the
/// deadline while requests time out is waiting on the app's own runtime,
/// not on Redis.
///
/// ```
/// assert_eq!(
///     tollgate_core::telemetry::STORE_LATENCY,
///     "tollgate_store_latency_seconds"
/// );
/// ```
pub const STORE_LATENCY: &str = "tollgate_store_latency_seconds";

/// The `# HELP` text of [`STORE_LATENCY`].
///
/// ```
/// assert!(tollgate_core::telemetry::STORE_LATENCY_HELP.starts_with("Seconds"));
/// ```
pub const STORE_LATENCY_HELP: &str =
    "Seconds from sending a Redis call to its reply, as the app observed it, one sample per call";
