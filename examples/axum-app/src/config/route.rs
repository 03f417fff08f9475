//! Checking one `[[route]]` entry: its route, key, algorithm, limits,
//! plans, settlement and in-flight limit.

use std::time::Duration;

use tollgate::{Algorithm, Calendar, Choice, ConfigError, InFlightLimit, PlanMap, Policy};

use crate::Plan;

use super::raw::RawRoute;
use super::{
    ConfigFileError, KeySpec, PlanConfig, ROUTES, RouteConfig, SettleSpec, is_authenticated,
    method_matches, path_matches,
};

pub(super) fn route(n: usize, r: RawRoute) -> Result<RouteConfig, ConfigFileError> {
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
    let calendar = match &r.calendar {
        None => None,
        Some(c) => {
            let calendar =
                Calendar::new(&c.zone).map_err(|e| at("calendar.zone", &c.zone, &e.to_string()))?;
            Some(match &c.offset {
                None => calendar,
                Some(offset) => calendar.with_offset(
                    Calendar::parse_offset(offset)
                        .map_err(|e| at("calendar.offset", offset, &e.to_string()))?,
                ),
            })
        }
    };
    let shape = Shape {
        algorithm,
        calendar,
    };
    let policy = policy_of(&r.name, shape, &r.limits, r.burst, "", &at)?;
    let cost = cost_of(r.cost, 1, &policy, "", &at)?;
    let plans = r
        .plans
        .iter()
        .map(|(plan, p)| {
            let field = format!("plans.{plan}.");
            let name = format!("{}-{plan}", r.name);
            let limits = p.limits.as_deref().unwrap_or(&r.limits);
            let burst = p.burst.or(r.burst);
            let policy = policy_of(&name, shape, limits, burst, &field, &at)?;
            Ok(PlanConfig {
                plan: plan.clone(),
                cost: cost_of(p.cost, cost, &policy, &field, &at)?,
                policy,
            })
        })
        .collect::<Result<Vec<_>, ConfigFileError>>()?;
    let plan_map = plans
        .iter()
        .fold(PlanMap::builder(policy.clone()), |map, p| {
            map.plan(p.plan.clone(), Choice::new(p.policy.clone()).cost(p.cost))
        })
        .from_extension::<Plan>()
        .map_err(|e| {
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
        plan_map,
        settle,
        in_flight,
    })
}

/// The policy `name` of `algorithm`, `limits` and `burst`; errors name the
/// field after `prefix` (`plans.pro.` for a plan's).
/// What a route's policies and its plans' share: the algorithm and the
/// calendar.
#[derive(Clone, Copy)]
struct Shape {
    algorithm: Algorithm,
    calendar: Option<Calendar>,
}

fn policy_of(
    name: &str,
    Shape {
        algorithm,
        calendar,
    }: Shape,
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
    if let Some(calendar) = calendar {
        builder = builder.calendar(calendar);
    }
    builder.build().map_err(|e| {
        let (f, value) = match &e {
            ConfigError::CalendarOffsetTooLong { offset, .. } => {
                ("calendar.offset".to_owned(), format!("{offset:?}"))
            }
            ConfigError::InvalidName { .. } => ("name".to_owned(), name.to_owned()),
            ConfigError::ZeroBurst | ConfigError::BurstNotSupported { .. } => (
                field("burst"),
                burst.map(|b| b.to_string()).unwrap_or_default(),
            ),
            // "burst", or "burst x interval": the burst is what to change.
            ConfigError::Overflow { what } if what.starts_with("burst") => (
                field("burst"),
                burst.map(|b| b.to_string()).unwrap_or_default(),
            ),
            _ => (field("limits"), limits.join(", ")),
        };
        at(&f, &value, &e.to_string())
    })
}

/// The cost `given`, or `default`, of a request under `policy`: at least
/// 1 (a cost of 0 only reads: the route would be limited by nothing), and
/// no more than the smallest capacity of its limits (a request of more is
/// never admitted: every one would be refused).
fn cost_of(
    given: Option<i64>,
    default: u64,
    policy: &Policy,
    prefix: &str,
    at: &impl Fn(&str, &str, &str) -> ConfigFileError,
) -> Result<u64, ConfigFileError> {
    let field = format!("{prefix}cost");
    let cost = match given {
        None => default,
        Some(c) => u64::try_from(c)
            .ok()
            .filter(|&c| c >= 1)
            .ok_or_else(|| at(&field, &c.to_string(), "must be at least 1"))?,
    };
    let capacity = policy.params().iter().map(|p| p.capacity).min();
    match capacity {
        Some(capacity) if cost > capacity => Err(at(
            &field,
            &cost.to_string(),
            &format!("exceeds {capacity}, what the limits hold: no request would be admitted"),
        )),
        Some(_) | None => Ok(cost),
    }
}
