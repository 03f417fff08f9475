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
//! | [`DECISIONS`] | counter | `policy`, `outcome` | requests decided: `allowed`, `limited` (rejected, an operator's block included), `shadow_limited` (would have been rejected; let through by shadow mode, which never waives a block), `denied` (refused by an operator's deny override, without asking the store) |
//! | [`KEYLESS`] | counter | `policy`, `outcome` | requests without a rate-limit key, by whose mistake it was: `client` (answered 400 by default), `unauthenticated` (401), `server` (500), or `let_through` (`MissingKey::Allow`: not asked) |
//! | [`STORE_ERRORS`] | counter | `policy`, `outcome` | store failures by kind: `timeout`, `circuit_open`, `full`, `backend`, `unavailable`, `overloaded`, `late` |
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
//! | [`WAITS`] | counter | `policy`, `outcome` | `RateLimiter::until_ready` calls that were told to wait, by how they ended: `admitted` or `gave_up`; their checks in between are not decisions |
//! | [`NEAR_LIMIT`] | counter | `policy`, `limit` | admitted requests that left a limit at least 80 % used; `limit` is the limit's text form (`10/s`), or `override` for a key's own limits |
//! | [`LEASE_GRANTS`] | counter | `policy` | leases a `LeasedStore` asked the store for |
//! | [`LEASE_DIRECT`] | counter | `policy` | requests a `LeasedStore` had the store decide, without a lease |
//! | [`LEASE_RETURNS`] | counter | `policy` | unused parts of ended leases given back to the store |
//! | [`LEASES_HELD`] | gauge | none | leases a `LeasedStore` holds, refreshed every lease interval |
//! | [`LEASE_UNITS`] | gauge | none | units those leases hold unspent, refreshed every lease interval |
//!
//! The `policy` label takes at most [`MAX_POLICY_LABELS`] names in each
//! layer, limiter or store; the policies seen past those (a chooser that
//! makes a policy per tenant, say) are counted together under
//! [`OTHER_POLICIES`], so that no deployment grows its series without end.
//!
//! Every metric is in [`ALL`], with its `# HELP` text; [`describe`] (with
//! the `metrics` feature) gives them to the installed recorder, and every
//! layer, limiter and store calls it when built. Handles are registered
//! when a layer, limiter or store is built: install the metrics recorder
//! first.

/// Counter of decisions, labelled `policy` and `outcome` (`allowed`,
/// `limited`, `shadow_limited`, `denied`).
pub const DECISIONS: &str = "tollgate_decisions_total";

/// Counter of requests without a rate-limit key, labelled `policy` and
/// `outcome`: `client`, `unauthenticated`, `server` (the extractor's
/// `MissingCause`) or `let_through`.
pub const KEYLESS: &str = "tollgate_keyless_requests_total";

/// Counter of store failures, labelled `policy` and `outcome`, the kind of
/// failure (`timeout`, `circuit_open`, `full`, `backend`, `unavailable`,
/// `overloaded`, `late`; see [`StoreError::kind`](crate::StoreError::kind)).
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

/// Bucket bounds, in seconds, for [`STORE_LATENCY`] in an exporter that
/// needs them (Prometheus): from 100 µs, a Redis on the same host, to 1 s,
/// past any sensible deadline.
///
/// ```
/// use tollgate_core::telemetry::STORE_LATENCY_BUCKETS;
/// assert!(STORE_LATENCY_BUCKETS.is_sorted());
/// ```
pub const STORE_LATENCY_BUCKETS: &[f64] = &[
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// Counter: `RateLimiter::until_ready` calls that were refused at least
/// once and so waited, labelled `policy` and `outcome`: `admitted` (in the
/// end) or `gave_up` (the wait would have been too long, or the cost can
/// never be admitted). The refusals while waiting are not counted in
/// [`DECISIONS`]: only the final answer is, `allowed` or `limited`.
pub const WAITS: &str = "tollgate_waits_total";

/// Counter: admitted requests that left one of their policy's limits at
/// least [`NEAR_LIMIT_PERCENT`] % used (envoy ratelimit's `near_limit`),
/// labelled `policy` and `limit`, the limit's text form (`10/s`), or
/// `override` when a key's own limits decided. A request near two limits
/// counts once for each.
pub const NEAR_LIMIT: &str = "tollgate_near_limit_total";

/// The most policy names a layer, limiter or store gives series of their
/// own; the policies seen past them are labelled [`OTHER_POLICIES`].
pub const MAX_POLICY_LABELS: usize = 1_024;

/// The `policy` label of the policies past [`MAX_POLICY_LABELS`]: a space
/// keeps it from being any policy's name.
pub const OTHER_POLICIES: &str = "other policies";

/// How much of a limit must be used, in percent, for [`NEAR_LIMIT`].
pub const NEAR_LIMIT_PERCENT: u64 = 80;

/// Counter: leases a `LeasedStore` asked its store for, labelled `policy`
/// (`LeaseCalls::grants`).
pub const LEASE_GRANTS: &str = "tollgate_lease_grants_total";

/// Counter: requests a `LeasedStore` had its store decide, without a
/// lease, labelled `policy` (`LeaseCalls::direct`).
pub const LEASE_DIRECT: &str = "tollgate_lease_direct_decisions_total";

/// Counter: unused parts of ended leases given back to the store, labelled
/// `policy` (`LeaseCalls::returns`).
pub const LEASE_RETURNS: &str = "tollgate_lease_returns_total";

/// Gauge: leases a `LeasedStore` holds (the first of
/// `LeasedStore::outstanding`), refreshed every lease interval and when
/// leases are returned.
pub const LEASES_HELD: &str = "tollgate_leases_held";

/// Gauge: units the leases of a `LeasedStore` hold unspent (the second of
/// `LeasedStore::outstanding`), refreshed as [`LEASES_HELD`] is.
pub const LEASE_UNITS: &str = "tollgate_lease_units_outstanding";

/// The kind of a metric. Not `#[non_exhaustive]`: an exporter's code
/// matches every kind, and a new one is a compile error there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution of samples, in seconds.
    Histogram,
}

/// One of tollgate's metrics: its name, kind, labels and `# HELP` text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    name: &'static str,
    kind: MetricKind,
    labels: &'static [&'static str],
    help: &'static str,
}

impl Metric {
    const fn new(
        name: &'static str,
        kind: MetricKind,
        labels: &'static [&'static str],
        help: &'static str,
    ) -> Self {
        Self {
            name,
            kind,
            labels,
            help,
        }
    }

    /// The metric's name, as exporters print it.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Counter, gauge or histogram.
    pub fn kind(&self) -> MetricKind {
        self.kind
    }

    /// What it counts: the `# HELP` line.
    pub fn help(&self) -> &'static str {
        self.help
    }

    /// The labels tollgate gives it, as in the table of the [module
    /// docs](self) (a test keeps the two the same). An exporter may add
    /// its own: Prometheus's histogram buckets carry `le`.
    ///
    /// ```
    /// use tollgate_core::telemetry::{ALL, NEAR_LIMIT, STORE_LATENCY};
    ///
    /// let labels = |name: &str| ALL.iter().find(|m| m.name() == name).unwrap().labels();
    /// assert_eq!(labels(NEAR_LIMIT), ["policy", "limit"]);
    /// assert!(labels(STORE_LATENCY).is_empty());
    /// ```
    pub fn labels(&self) -> &'static [&'static str] {
        self.labels
    }
}

/// Every metric tollgate reports, with its `# HELP` text.
///
/// ```
/// use tollgate_core::telemetry::{ALL, DECISIONS, MetricKind};
///
/// let decisions = ALL.iter().find(|m| m.name() == DECISIONS).unwrap();
/// assert_eq!(decisions.kind(), MetricKind::Counter);
/// assert!(ALL.iter().all(|m| !m.help().is_empty()));
/// ```
pub const ALL: &[Metric] = {
    use MetricKind::{Counter, Gauge, Histogram};
    const POLICY: &[&str] = &["policy"];
    &[
        Metric::new(
            DECISIONS,
            Counter,
            &["policy", "outcome"],
            "Requests decided, by policy and outcome: allowed, limited (refused), shadow_limited (let through by shadow mode), denied (by an operator's deny override)",
        ),
        Metric::new(
            KEYLESS,
            Counter,
            &["policy", "outcome"],
            "Requests without a rate-limit key, by policy and whose mistake it was: client, unauthenticated, server; let_through when let through unasked",
        ),
        Metric::new(
            STORE_ERRORS,
            Counter,
            &["policy", "outcome"],
            "Rate-limit store failures, by policy and kind: timeout, circuit_open, full, backend, unavailable, overloaded, late",
        ),
        Metric::new(
            FALLBACKS,
            Counter,
            &["policy", "outcome"],
            "Requests the failure policy handled when the store failed, by policy and outcome: open, closed, local_allowed, local_limited",
        ),
        Metric::new(
            DENY_CACHE_HITS,
            Counter,
            POLICY,
            "Denials the Redis store answered from its deny cache, without a round trip, by policy",
        ),
        Metric::new(
            MEMORY_STORE_KEYS,
            Gauge,
            &[],
            "Keys held by the process's memory stores",
        ),
        Metric::new(
            CIRCUITS_OPEN,
            Gauge,
            &[],
            "Redis store circuit breakers open or probing (0 when every store is healthy)",
        ),
        Metric::new(
            INFLIGHT_SLOTS,
            Gauge,
            POLICY,
            "Slots of an in-flight limit held by this process's requests, by policy",
        ),
        Metric::new(
            INFLIGHT_REJECTED,
            Counter,
            POLICY,
            "Requests an in-flight limit turned away, by policy",
        ),
        Metric::new(
            ADAPTIVE_LIMIT,
            Gauge,
            POLICY,
            "The concurrency limit an adaptive layer has found, by policy",
        ),
        Metric::new(
            ADAPTIVE_IN_FLIGHT,
            Gauge,
            POLICY,
            "Requests an adaptive layer lets run now, by policy",
        ),
        Metric::new(
            ADAPTIVE_QUEUED,
            Gauge,
            POLICY,
            "Requests waiting for a slot of an adaptive layer, by policy",
        ),
        Metric::new(
            ADAPTIVE_SHED,
            Counter,
            &["policy", "priority"],
            "Requests an adaptive layer shed, by policy and priority: critical, default, sheddable",
        ),
        Metric::new(STORE_LATENCY, Histogram, &[], STORE_LATENCY_HELP),
        Metric::new(
            WAITS,
            Counter,
            &["policy", "outcome"],
            "RateLimiter::until_ready calls told to wait, by policy and how they ended: admitted, gave_up",
        ),
        Metric::new(
            NEAR_LIMIT,
            Counter,
            &["policy", "limit"],
            "Admitted requests that left a limit at least 80 % used, by policy and limit (its text form, or override)",
        ),
        Metric::new(
            LEASE_GRANTS,
            Counter,
            POLICY,
            "Leases a LeasedStore asked its store for, by policy",
        ),
        Metric::new(
            LEASE_DIRECT,
            Counter,
            POLICY,
            "Requests a LeasedStore had its store decide without a lease, by policy",
        ),
        Metric::new(
            LEASE_RETURNS,
            Counter,
            POLICY,
            "Unused parts of ended leases a LeasedStore gave back to its store, by policy",
        ),
        Metric::new(
            LEASES_HELD,
            Gauge,
            &[],
            "Leases a LeasedStore holds, refreshed every lease interval",
        ),
        Metric::new(
            LEASE_UNITS,
            Gauge,
            &[],
            "Units the leases of a LeasedStore hold unspent, refreshed every lease interval",
        ),
    ]
};

/// Gives every metric of [`ALL`] its `# HELP` text (and the histogram its
/// unit, seconds) with the installed recorder. Layers, limiters and stores
/// call it when built; call it yourself to have the text before any is.
///
/// ```
/// tollgate_core::telemetry::describe(); // without a recorder: nothing
/// ```
#[cfg(feature = "metrics")]
pub fn describe() {
    for metric in ALL {
        let (name, help) = (metric.name, metric.help);
        match metric.kind {
            MetricKind::Counter => metrics::describe_counter!(name, help),
            MetricKind::Gauge => metrics::describe_gauge!(name, help),
            MetricKind::Histogram => {
                metrics::describe_histogram!(name, metrics::Unit::Seconds, help);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ALL;

    /// The module docs' table gives each metric the kind and the labels
    /// (in order) of `ALL`.
    #[test]
    fn the_doc_table_names_each_metric_s_labels() {
        let source = include_str!("telemetry.rs");
        let mut rows = 0;
        for row in source.lines().filter_map(|l| l.strip_prefix("//! | [`")) {
            let cells: Vec<&str> = row.split(" | ").collect();
            let constant = cells[0].trim_end_matches("`]");
            let metric = ALL
                .iter()
                .find(|m| constant_of(m.name()) == constant)
                .unwrap_or_else(|| panic!("{constant} is not in ALL"));
            let documented: Vec<&str> = match cells[2] {
                "none" => vec![],
                labels => labels.split(", ").map(|l| l.trim_matches('`')).collect(),
            };
            assert_eq!(documented, metric.labels(), "{constant}");
            let kind = format!("{:?}", metric.kind()).to_lowercase();
            assert_eq!(cells[1], kind, "{constant}");
            rows += 1;
        }
        assert_eq!(rows, ALL.len());
    }

    /// The name of the constant that holds `name`, read from this file.
    fn constant_of(name: &str) -> &'static str {
        let source = include_str!("telemetry.rs");
        let quoted = format!("&str = \"{name}\";");
        let line = source
            .lines()
            .find(|l| l.starts_with("pub const ") && l.ends_with(&quoted))
            .unwrap_or_else(|| panic!("no constant holds {name}"));
        line["pub const ".len()..]
            .split(':')
            .next()
            .unwrap_or_default()
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<_> = ALL.iter().map(|m| m.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
    }
}
