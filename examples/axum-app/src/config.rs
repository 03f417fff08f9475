//! The policy file.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU64;
use std::time::Duration;

use serde::Deserialize;
use tollgate::{
    Algorithm, ClientIp, ConfigError, FailureMode, HeaderStyle, InFlightLimit, Policy, PolicyFamily,
};

/// The routes of the app, fixed in code.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/health"),
    ("POST", "/login"),
    ("GET", "/api/items"),
    ("POST", "/api/items"),
    ("GET", "/api/search"),
    ("GET", "/api/export"),
    ("POST", "/api/complete"),
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    header_style: Option<String>,
    #[serde(default)]
    failure: Option<String>,
    #[serde(default)]
    instances: Option<i64>,
    #[serde(default)]
    trusted_proxies: Vec<String>,
    #[serde(default)]
    ipv6_prefix: Option<i64>,
    #[serde(default, rename = "route")]
    routes: Vec<RawRoute>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    method: String,
    path: String,
    name: String,
    key: String,
    algorithm: String,
    limits: Vec<String>,
    #[serde(default)]
    burst: Option<i64>,
    #[serde(default)]
    cost: Option<i64>,
    #[serde(default)]
    enforce_percent: Option<i64>,
    #[serde(default)]
    settle: Option<String>,
    #[serde(default)]
    in_flight: Option<i64>,
    #[serde(default)]
    in_flight_lease_ms: Option<i64>,
    /// `[route.plans.<plan>]`: what differs for users of that plan.
    #[serde(default)]
    plans: std::collections::BTreeMap<String, RawPlan>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlan {
    #[serde(default)]
    limits: Option<Vec<String>>,
    #[serde(default)]
    burst: Option<i64>,
    #[serde(default)]
    cost: Option<i64>,
}

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
    /// The route's policy and each plan's, named after the route: what an
    /// operator's block, reset and status of a user on the route cover,
    /// whichever plan the user is on.
    pub family: PolicyFamily,
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
}

impl AppConfig {
    /// Parses and checks a policy file.
    ///
    /// # Errors
    ///
    /// A [`ConfigFileError`] naming the field and the value at fault.
    pub fn parse(text: &str) -> Result<Self, ConfigFileError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigFileError(e.to_string()))?;
        let header_style = match raw.header_style.as_deref() {
            None | Some("github") => HeaderStyle::GitHub,
            Some("github_full") => HeaderStyle::GitHubFull,
            Some("ietf") => HeaderStyle::Ietf,
            Some("both") => HeaderStyle::Both,
            Some("none") => HeaderStyle::None,
            Some(other) => {
                return Err(bad(
                    "header_style",
                    other,
                    "expected github, github_full, ietf, both or none",
                ));
            }
        };
        let failure = match raw.failure.as_deref() {
            Some("open") => FailureMode::Open,
            Some("closed") => FailureMode::Closed,
            None | Some("local") => FailureMode::Local,
            Some(other) => return Err(bad("failure", other, "expected open, closed or local")),
        };
        let instances = match raw.instances {
            None => NonZeroU64::MIN,
            Some(n) => u64::try_from(n)
                .ok()
                .and_then(NonZeroU64::new)
                .ok_or_else(|| {
                    bad(
                        "instances",
                        &n.to_string(),
                        "must be at least 1 (the number of app servers sharing the limits)",
                    )
                })?,
        };
        let ipv6_prefix = match raw.ipv6_prefix {
            None => 56,
            Some(bits) => u8::try_from(bits)
                .ok()
                .filter(|b| (32..=128).contains(b))
                .ok_or_else(|| bad("ipv6_prefix", &bits.to_string(), "expected 32 to 128"))?,
        };
        let client_ip = ClientIp::new()
            .trusted_proxies(&raw.trusted_proxies)
            .and_then(|c| c.ipv6_prefix(ipv6_prefix))
            .map_err(|e| ConfigFileError(e.to_string()))?;
        if raw.routes.is_empty() {
            return Err(ConfigFileError(
                "no [[route]] entries: nothing would be limited".into(),
            ));
        }
        let routes = raw
            .routes
            .into_iter()
            .enumerate()
            .map(|(i, r)| route(i + 1, r))
            .collect::<Result<Vec<RouteConfig>, _>>()?;
        refuse_shared_names(&routes)?;
        Ok(Self {
            header_style,
            failure,
            instances,
            client_ip,
            trusted_proxies: raw.trusted_proxies,
            ipv6_prefix,
            routes,
        })
    }
}

/// A policy's name is the identity of its state: two routes with one name
/// would share counts, and with different limits would rewrite each
/// other's state on every request.
fn refuse_shared_names(routes: &[RouteConfig]) -> Result<(), ConfigFileError> {
    let mut first: HashMap<&str, (usize, &RouteConfig)> = HashMap::new();
    for (i, r) in routes.iter().enumerate() {
        let names = std::iter::once(r.policy.name()).chain(r.plans.iter().map(|p| p.policy.name()));
        for name in names {
            if let Some((n, earlier)) = first.insert(name, (i + 1, r)) {
                return Err(ConfigFileError(format!(
                    "route {} ({} {}): field `name`: invalid value {:?}: route {n} ({} {}) has that name \
                     already; a policy's name identifies its state, so give each route its own",
                    i + 1,
                    r.method,
                    r.path,
                    name,
                    earlier.method,
                    earlier.path,
                )));
            }
        }
    }
    Ok(())
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

fn bad(field: &str, value: &str, why: &str) -> ConfigFileError {
    ConfigFileError(format!("field `{field}`: invalid value {value:?}: {why}"))
}

fn route(n: usize, r: RawRoute) -> Result<RouteConfig, ConfigFileError> {
    let at = |field: &str, value: &str, why: &str| {
        ConfigFileError(format!(
            "route {n} ({} {}): field `{field}`: invalid value {value:?}: {why}",
            r.method, r.path
        ))
    };
    let method = r.method.to_ascii_uppercase();
    let known: Vec<String> = ROUTES.iter().map(|(m, p)| format!("{m} {p}")).collect();
    let known = known.join(", ");
    if !ROUTES.iter().any(|(_, p)| path_matches(&r.path, p)) {
        return Err(at(
            "path",
            &r.path,
            &format!("not a route of this app ({known})"),
        ));
    }
    let matched = |(m, p): &&(&str, &str)| path_matches(&r.path, p) && method_matches(&method, m);
    if !ROUTES.iter().any(|route| matched(&route)) {
        return Err(at("method", &r.method, &format!("no such route ({known})")));
    }
    let key = match r.key.as_str() {
        "ip" => KeySpec::Ip,
        "user" => KeySpec::User,
        "global" => KeySpec::Global,
        other => match other.strip_prefix("header:") {
            Some(name) => KeySpec::Header(
                http::HeaderName::try_from(name)
                    .map_err(|_| at("key", other, "not a valid header name"))?,
            ),
            None => {
                return Err(at(
                    "key",
                    other,
                    "expected ip, user, header:<name> or global",
                ));
            }
        },
    };
    if key == KeySpec::User
        && ROUTES
            .iter()
            .filter(matched)
            .any(|(_, p)| !is_authenticated(p))
    {
        return Err(at(
            "key",
            &r.key,
            "user keys need authenticated routes (/api/*)",
        ));
    }
    let algorithm: Algorithm = r
        .algorithm
        .parse()
        .map_err(|_| at("algorithm", &r.algorithm, "expected fixed_window, sliding_log, sliding_window, token_bucket, leaky_bucket or gcra"))?;
    if !r.plans.is_empty() && key != KeySpec::User {
        let plans: Vec<&str> = r.plans.keys().map(String::as_str).collect();
        return Err(at(
            "plans",
            &plans.join(", "),
            "plans come from authentication: only routes keyed by user have them",
        ));
    }
    let policy = policy_of(&r.name, algorithm, &r.limits, r.burst, "", &at)?;
    let cost = cost_of(r.cost, 1, "", &at)?;
    let plans = r
        .plans
        .iter()
        .map(|(plan, p)| {
            let field = format!("plans.{plan}.");
            let name = format!("{}-{plan}", r.name);
            let limits = p.limits.as_deref().unwrap_or(&r.limits);
            let burst = p.burst.or(r.burst);
            Ok(PlanConfig {
                plan: plan.clone(),
                policy: policy_of(&name, algorithm, limits, burst, &field, &at)?,
                cost: cost_of(p.cost, cost, &field, &at)?,
            })
        })
        .collect::<Result<Vec<_>, ConfigFileError>>()?;
    let members = std::iter::once(policy.clone()).chain(plans.iter().map(|p| p.policy.clone()));
    let family = PolicyFamily::new(&r.name, members).map_err(|e| {
        at(
            "plans",
            &r.plans.keys().cloned().collect::<Vec<_>>().join(", "),
            &e.to_string(),
        )
    })?;
    let enforce_percent = match r.enforce_percent {
        None => 100,
        Some(p) => u8::try_from(p)
            .ok()
            .filter(|p| *p <= 100)
            .ok_or_else(|| at("enforce_percent", &p.to_string(), "must be 0 to 100"))?,
    };
    let settle = match r.settle.as_deref() {
        None | Some("reserved") => SettleSpec::Reserved,
        Some("actual") => SettleSpec::Actual,
        Some("failures") => SettleSpec::Failures,
        Some(other) => return Err(at("settle", other, "expected reserved, actual or failures")),
    };
    let in_flight = match r.in_flight {
        None => None,
        Some(max) => {
            let max = u64::try_from(max)
                .map_err(|_| at("in_flight", &max.to_string(), "must be at least 1"))?;
            let limit = InFlightLimit::new(&r.name, max)
                .map_err(|e| at("in_flight", &max.to_string(), &e.to_string()))?;
            Some(match r.in_flight_lease_ms {
                None => limit,
                Some(ms) => {
                    let lease = Duration::from_millis(u64::try_from(ms).unwrap_or(0));
                    limit
                        .lease(lease)
                        .map_err(|e| at("in_flight_lease_ms", &ms.to_string(), &e.to_string()))?
                }
            })
        }
    };
    if in_flight.is_none() && r.in_flight_lease_ms.is_some() {
        return Err(at(
            "in_flight_lease_ms",
            &r.in_flight_lease_ms.unwrap_or_default().to_string(),
            "a lease needs `in_flight`",
        ));
    }
    Ok(RouteConfig {
        method,
        path: r.path,
        key,
        policy,
        cost,
        enforce_percent,
        plans,
        family,
        settle,
        in_flight,
    })
}

/// The policy `name` of `algorithm`, `limits` and `burst`; errors name the
/// field after `prefix` (`plans.pro.` for a plan's).
fn policy_of(
    name: &str,
    algorithm: Algorithm,
    limits: &[String],
    burst: Option<i64>,
    prefix: &str,
    at: &impl Fn(&str, &str, &str) -> ConfigFileError,
) -> Result<Policy, ConfigFileError> {
    let field = |f: &str| format!("{prefix}{f}");
    if limits.is_empty() {
        return Err(at(
            &field("limits"),
            "[]",
            "at least one limit such as \"100/min\"",
        ));
    }
    let mut builder = Policy::builder(name).algorithm(algorithm);
    for limit in limits {
        let parsed: tollgate::Limit = limit
            .parse()
            .map_err(|e: ConfigError| at(&field("limits"), limit, &e.to_string()))?;
        builder = builder.limit(parsed);
    }
    if let Some(burst) = burst {
        let value = u64::try_from(burst)
            .map_err(|_| at(&field("burst"), &burst.to_string(), "must be positive"))?;
        builder = builder.burst(value);
    }
    builder.build().map_err(|e| {
        let (f, value) = match &e {
            ConfigError::InvalidName { .. } => ("name".to_owned(), name.to_owned()),
            ConfigError::ZeroBurst | ConfigError::BurstNotSupported { .. } => (
                field("burst"),
                burst.map(|b| b.to_string()).unwrap_or_default(),
            ),
            _ => (field("limits"), limits.join(", ")),
        };
        at(&f, &value, &e.to_string())
    })
}

/// The cost `given`, or `default`; negative costs are refused.
fn cost_of(
    given: Option<i64>,
    default: u64,
    prefix: &str,
    at: &impl Fn(&str, &str, &str) -> ConfigFileError,
) -> Result<u64, ConfigFileError> {
    match given {
        None => Ok(default),
        Some(c) => u64::try_from(c).map_err(|_| {
            at(
                &format!("{prefix}cost"),
                &c.to_string(),
                "must not be negative",
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundled_file_is_valid() {
        let config = AppConfig::parse(include_str!("../policies.toml")).unwrap();
        assert_eq!(config.routes.len(), 7);
        let plans: Vec<_> = config
            .routes
            .iter()
            .flat_map(|r| r.plans.iter().map(|p| (p.policy.to_string(), p.cost)))
            .collect();
        assert_eq!(plans.len(), 3, "{plans:?}");
        let settled: Vec<_> = config
            .routes
            .iter()
            .map(|r| (r.policy.name(), r.settle))
            .filter(|(_, s)| *s != SettleSpec::Reserved)
            .collect();
        assert_eq!(
            settled,
            [
                ("login-failures", SettleSpec::Failures),
                ("completion-tokens", SettleSpec::Actual)
            ]
        );
        assert_eq!(config.failure, FailureMode::Local);
        assert_eq!(config.instances.get(), 1);
    }

    #[test]
    fn instances_is_a_count_of_at_least_one() {
        let base = "[[route]]\nmethod = \"GET\"\npath = \"/api/items\"\nname = \"n\"\nkey = \"user\"\nalgorithm = \"gcra\"\nlimits = [\"5/s\"]\n";
        let instances = |text: &str| AppConfig::parse(text).map(|c| c.instances.get());
        assert_eq!(instances(base).unwrap(), 1);
        assert_eq!(instances(&format!("instances = 3\n{base}")).unwrap(), 3);
        for n in ["0", "-2"] {
            let err = instances(&format!("instances = {n}\n{base}")).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "field `instances`: invalid value \"{n}\": must be at least 1 (the number of \
                     app servers sharing the limits)"
                )
            );
        }
        let err = instances(&format!("instances = \"two\"\n{base}")).unwrap_err();
        assert!(err.to_string().contains("instances"), "{err}");
    }

    #[test]
    fn errors_name_the_field_and_the_value() {
        let base = "[[route]]\nmethod = \"GET\"\npath = \"/api/items\"\nname = \"n\"\nkey = \"user\"\nalgorithm = \"gcra\"\nlimits = [\"5/s\"]\n";
        let cases = [
            (format!("colour = 1\n{base}"), "unknown field `colour`"),
            (
                format!("header_style = \"fancy\"\n{base}"),
                "field `header_style`: invalid value \"fancy\"",
            ),
            (
                format!("failure = \"maybe\"\n{base}"),
                "field `failure`: invalid value \"maybe\"",
            ),
            (
                format!("ipv6_prefix = 12\n{base}"),
                "field `ipv6_prefix`: invalid value \"12\"",
            ),
            (
                format!("trusted_proxies = [\"10.0.0.0/99\"]\n{base}"),
                "invalid trusted_proxies \"10.0.0.0/99\"",
            ),
            (
                base.replace("/api/items", "/api/nope"),
                "field `path`: invalid value \"/api/nope\"",
            ),
            (
                base.replace("\"GET\"", "\"DELETE\""),
                "field `method`: invalid value \"DELETE\"",
            ),
            (
                base.replace("\"user\"", "\"cookie\""),
                "field `key`: invalid value \"cookie\"",
            ),
            (
                base.replace("\"gcra\"", "\"magic\""),
                "field `algorithm`: invalid value \"magic\"",
            ),
            (
                format!("{base}settle = \"later\"\n"),
                "field `settle`: invalid value \"later\": expected reserved, actual or failures",
            ),
            (
                base.replace("5/s", "0/s"),
                "field `limits`: invalid value \"0/s\": limit count must be at least 1",
            ),
            (
                base.replace("5/s", "5/fortnight"),
                "field `limits`: invalid value \"5/fortnight\"",
            ),
            (
                base.replace("\"n\"", "\"a name\""),
                "field `name`: invalid value \"a name\"",
            ),
            (
                format!("{base}burst = 0\n"),
                "field `burst`: invalid value \"0\"",
            ),
            (
                format!("{base}cost = -1\n"),
                "field `cost`: invalid value \"-1\"",
            ),
            (
                format!("{base}enforce_percent = 101\n"),
                "field `enforce_percent`: invalid value \"101\"",
            ),
            (
                base.replace("/api/items", "/login").replace("GET", "POST"),
                "field `key`: invalid value \"user\"",
            ),
            (String::new(), "no [[route]] entries"),
            (
                format!("{base}[route.plans.pro]\nlimits = [\"0/s\"]\n"),
                "field `plans.pro.limits`: invalid value \"0/s\"",
            ),
            (
                format!("{base}[route.plans.pro]\ncost = -2\n"),
                "field `plans.pro.cost`: invalid value \"-2\"",
            ),
            (
                format!("{base}[route.plans.pro]\nspeed = 2\n"),
                "unknown field `speed`",
            ),
            (
                format!("{base}[route.plans.pro]\n")
                    .replace("/api/items", "/login")
                    .replace("GET", "POST")
                    .replace("\"user\"", "\"ip\""),
                "field `plans`: invalid value \"pro\"",
            ),
            (
                format!(
                    "{base}[route.plans.pro]\n{}",
                    base.replace("\"n\"", "\"n-pro\"").replace("GET", "POST")
                ),
                "field `name`: invalid value \"n-pro\"",
            ),
        ];
        for (text, expected) in cases {
            let err = AppConfig::parse(&text).unwrap_err().to_string();
            assert!(err.contains(expected), "expected {expected:?} in {err:?}");
        }
    }
}
