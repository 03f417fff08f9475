//! The policy file.

mod overload;
mod parse;
mod raw;
mod route;
#[cfg(test)]
mod tests;

use std::fmt;
use std::num::NonZeroU64;

use tollgate::{ClientIp, FailureMode, HeaderStyle, InFlightLimit, Policy};

use crate::AppPlans;

/// The routes of the app, fixed in code.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/health"),
    ("POST", "/login"),
    ("GET", "/api/items"),
    ("POST", "/api/items"),
    ("GET", "/api/search"),
    ("GET", "/api/export"),
    ("POST", "/api/complete"),
    ("GET", "/api/reports"),
];

/// Whether `path` needs an authenticated user.
pub fn is_authenticated(path: &str) -> bool {
    path.starts_with("/api/")
}

/// A policy file that could not be used; the message names the field and
/// the value.
#[derive(Debug)]
pub struct ConfigFileError(String);

impl fmt::Display for ConfigFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigFileError {}

/// What a route entry does for the users of one plan.
#[derive(Debug, Clone)]
pub struct PlanConfig {
    /// The plan's name, as the demo's auth finds it (`free`, `pro`).
    pub plan: String,
    /// The route's policy for the plan, named `<route name>-<plan>`.
    pub policy: Policy,
    /// The cost of each request.
    pub cost: u64,
}

/// How a route entry settles each request's cost after its response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleSpec {
    /// Not at all: a request costs what it reserved (the default).
    Reserved,
    /// To what the handler reports (`tollgate::ActualCost`), e.g. the
    /// tokens an LLM call used.
    Actual,
    /// Only responses with a status of 400 or above count; the others are
    /// refunded.
    Failures,
}

/// What a route entry keys requests by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySpec {
    /// The client IP (behind the trusted proxies).
    Ip,
    /// The authenticated user.
    User,
    /// A request header's value.
    Header(http::HeaderName),
    /// One bucket for everyone.
    Global,
}

impl KeySpec {
    /// Whether the entry applies after authentication.
    pub fn after_auth(&self) -> bool {
        *self == KeySpec::User
    }
}

impl fmt::Display for KeySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySpec::Ip => f.write_str("ip"),
            KeySpec::User => f.write_str("user"),
            KeySpec::Header(name) => write!(f, "header:{name}"),
            KeySpec::Global => f.write_str("global"),
        }
    }
}

/// One `[[route]]` entry, checked.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// `GET`, `POST`, ... or `*`.
    pub method: String,
    /// A path of [`ROUTES`], or a prefix ending in `/*`.
    pub path: String,
    /// What requests are keyed by.
    pub key: KeySpec,
    /// The policy, named after the entry.
    pub policy: Policy,
    /// The cost of each request.
    pub cost: u64,
    /// The percentage of keys whose denials are enforced; the others run in
    /// shadow mode (0: a dry run; 100, the default: enforced).
    pub enforce_percent: u8,
    /// The plans whose users the entry limits otherwise.
    pub plans: Vec<PlanConfig>,
    /// The route's policy and each plan's, by the plan the demo's auth
    /// puts into the request (the route's own for `free`). Its family,
    /// named after the route, is what an operator's block, reset and
    /// status of a user on the route cover, whichever plan the user is on.
    pub plan_map: AppPlans,
    /// How each request's cost is settled after its response.
    pub settle: SettleSpec,
    /// At most this many requests of one key in progress at once, under
    /// the route's name.
    pub in_flight: Option<InFlightLimit>,
}

impl RouteConfig {
    /// Whether the entry applies to `method` and `path`.
    pub fn matches(&self, method: &str, path: &str) -> bool {
        method_matches(&self.method, method) && path_matches(&self.path, path)
    }
}

/// The whole configuration, checked.
#[derive(Debug, Clone)]
pub struct AppConfig {
    /// Which rate-limit headers to send.
    pub header_style: HeaderStyle,
    /// What to do when the store fails.
    pub failure: FailureMode,
    /// How many app servers share the limits (default 1): under
    /// `failure = "local"`, while the store fails, each enforces its share,
    /// every limit divided by this.
    pub instances: NonZeroU64,
    /// How client IPs are found.
    pub client_ip: ClientIp,
    /// The trusted proxies as written, for display.
    pub trusted_proxies: Vec<String>,
    /// The IPv6 prefix length.
    pub ipv6_prefix: u8,
    /// The route entries.
    pub routes: Vec<RouteConfig>,
    /// `GET /work`'s stand-in backend and its protection (`[overload]`).
    pub overload: crate::overload::OverloadConfig,
}

fn method_matches(pattern: &str, method: &str) -> bool {
    pattern == "*" || pattern == method
}

/// `/api/*` matches every path under `/api/`; anything else matches itself.
fn path_matches(pattern: &str, path: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => pattern == path,
    }
}
