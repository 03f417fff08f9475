//! [`RateLimitReport`]: a key's state under its policies, in the JSON of
//! GitHub's `GET /rate_limit`.

use std::fmt::Write as _;

use bytes::Bytes;
use http::Response;
use tollgate_core::{Decision, Policy};

use super::http::json_escaped;

/// A key's state under each of its policies, as GitHub's `GET /rate_limit`
/// shows a caller's: under `resources`, an entry per policy, by name,
/// with its `limit`, `used`, `remaining`, `reset` (in Unix seconds) and
/// `resource` (its name), as the `x-ratelimit-*` headers show them (the
/// binding limit); and `rate`, the first policy's entry again, as GitHub's
/// `rate` repeats `core`. Beyond GitHub's fields, each entry lists every
/// limit of its policy under `limits` (its `rate`, such as `"100/h"`, and
/// the same four numbers), for policies with several. Without any policy,
/// `resources` is empty and `rate` left out.
///
/// What [`RateLimitStatus`](crate::RateLimitStatus) answers; build one
/// from [`PolicyFamily::status`](crate::PolicyFamily::status) to show an
/// operator a user's state on every plan of a route.
///
/// ```
/// use tollgate::{Algorithm, FakeClock, Key, MemoryStore, Policy, RateLimitReport, Store, Timestamp};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
/// let store = MemoryStore::builder().clock(clock).build()?;
/// let search = Policy::builder("search")
///     .algorithm(Algorithm::SlidingLog)
///     .limit("2/s".parse::<tollgate::Limit>()?)
///     .limit("100/h".parse::<tollgate::Limit>()?)
///     .build()?;
/// let ada = Key::user("ada");
/// store.check(&ada, &search, 1).await?;
/// let report = RateLimitReport::new(vec![(search.clone(), store.status(&ada, &search).await?)]);
/// assert_eq!(
///     report.to_json(),
///     concat!(
///         r#"{"resources":{"search":{"limit":2,"used":1,"remaining":1,"reset":1700000001,"resource":"search","#,
///         r#""limits":[{"rate":"2/s","limit":2,"used":1,"remaining":1,"reset":1700000001},"#,
///         r#"{"rate":"100/h","limit":100,"used":1,"remaining":99,"reset":1700003600}]}},"#,
///         r#""rate":{"limit":2,"used":1,"remaining":1,"reset":1700000001,"resource":"search","#,
///         r#""limits":[{"rate":"2/s","limit":2,"used":1,"remaining":1,"reset":1700000001},"#,
///         r#"{"rate":"100/h","limit":100,"used":1,"remaining":99,"reset":1700003600}]}}"#,
///     )
/// );
/// let response = report.into_http_response();
/// assert_eq!(response.status(), 200);
/// assert_eq!(response.headers()["content-type"], "application/json");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RateLimitReport {
    states: Vec<(Policy, Decision)>,
}

impl RateLimitReport {
    /// The report of `states`, each a policy and a key's state under it
    /// (a [`Decision`] from [`Store::status`](crate::Store::status)), in
    /// their order. A policy whose name came before is left out: stores
    /// keep state by name, so it would show the same.
    pub fn new(states: Vec<(Policy, Decision)>) -> Self {
        let mut kept: Vec<(Policy, Decision)> = Vec::with_capacity(states.len());
        for (policy, decision) in states {
            if !kept.iter().any(|(p, _)| p.name() == policy.name()) {
                kept.push((policy, decision));
            }
        }
        Self { states: kept }
    }

    /// Each policy and the key's state under it.
    pub fn states(&self) -> &[(Policy, Decision)] {
        &self.states
    }

    /// The report's JSON.
    pub fn to_json(&self) -> String {
        let mut out = String::from(r#"{"resources":{"#);
        for (i, (policy, decision)) in self.states.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, r#""{}":"#, json_escaped(policy.name()));
            entry(&mut out, policy, decision);
        }
        out.push('}');
        if let Some((policy, decision)) = self.states.first() {
            out.push_str(r#","rate":"#);
            entry(&mut out, policy, decision);
        }
        out.push('}');
        out
    }

    /// The report as a `200 OK` of `application/json`.
    pub fn into_http_response(self) -> Response<Bytes> {
        super::http::json_ok(self.to_json())
    }
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for RateLimitReport {
    fn into_response(self) -> axum::response::Response {
        self.into_http_response().map(axum::body::Body::from)
    }
}

/// One policy's entry: the binding limit's numbers, the policy's name,
/// and every limit.
fn entry(out: &mut String, policy: &Policy, d: &Decision) {
    let _ = write!(
        out,
        r#"{{"limit":{},"used":{},"remaining":{},"reset":{},"resource":"{}","limits":["#,
        d.limit(),
        d.used(),
        d.remaining(),
        d.reset_at().as_secs_ceil(),
        json_escaped(policy.name()),
    );
    for (i, l) in d.limits().iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            r#"{{"rate":"{}","limit":{},"used":{},"remaining":{},"reset":{}}}"#,
            json_escaped(&l.limit().to_string()),
            l.capacity(),
            l.used(),
            l.remaining(),
            (d.now() + l.reset()).as_secs_ceil(),
        );
    }
    out.push_str("]}");
}
