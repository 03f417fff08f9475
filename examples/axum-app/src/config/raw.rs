//! The policy file as TOML gives it, before any check.

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub(super) header_style: Option<String>,
    #[serde(default)]
    pub(super) failure: Option<String>,
    #[serde(default)]
    pub(super) instances: Option<i64>,
    #[serde(default)]
    pub(super) trusted_proxies: Vec<String>,
    #[serde(default)]
    pub(super) ipv6_prefix: Option<i64>,
    #[serde(default, rename = "route")]
    pub(super) routes: Vec<RawRoute>,
    #[serde(default)]
    pub(super) overload: Option<RawOverload>,
}

/// `[overload]`: the stand-in backend of `GET /work` and its protection.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOverload {
    pub(super) protect: Option<bool>,
    pub(super) workers: Option<i64>,
    pub(super) service_ms: Option<f64>,
    pub(super) algorithm: Option<String>,
    pub(super) min: Option<i64>,
    pub(super) max: Option<i64>,
    pub(super) initial: Option<i64>,
    pub(super) reserve_critical: Option<f64>,
    pub(super) reserve_default: Option<f64>,
    pub(super) queue: Option<i64>,
    pub(super) queue_wait_ms: Option<i64>,
    pub(super) warm_up_from: Option<i64>,
    pub(super) warm_up_secs: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) name: String,
    pub(super) key: String,
    pub(super) algorithm: String,
    pub(super) limits: Vec<String>,
    #[serde(default)]
    pub(super) burst: Option<i64>,
    #[serde(default)]
    pub(super) cost: Option<i64>,
    #[serde(default)]
    pub(super) enforce_percent: Option<i64>,
    #[serde(default)]
    pub(super) settle: Option<String>,
    #[serde(default)]
    pub(super) in_flight: Option<i64>,
    #[serde(default)]
    pub(super) in_flight_lease_ms: Option<i64>,
    /// `calendar = { zone = "Europe/Berlin", offset = "8h" }`: limits per
    /// day, week and month reset at that calendar's boundaries.
    #[serde(default)]
    pub(super) calendar: Option<RawCalendar>,
    /// `[route.plans.<plan>]`: what differs for users of that plan.
    #[serde(default)]
    pub(super) plans: std::collections::BTreeMap<String, RawPlan>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCalendar {
    pub(super) zone: String,
    #[serde(default)]
    pub(super) offset: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlan {
    #[serde(default)]
    pub(super) limits: Option<Vec<String>>,
    #[serde(default)]
    pub(super) burst: Option<i64>,
    #[serde(default)]
    pub(super) cost: Option<i64>,
}
