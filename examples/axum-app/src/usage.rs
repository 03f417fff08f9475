//! What the demo shows of the usage ledger: `GET /usage`, the caller's
//! settled usage under every plan's policy of every user-keyed route
//! (tollgate's [`UsageStatus`]), over `?granularity=hour|day|month`,
//! `from` and `to` (Unix seconds, RFC 3339 or a date; by default the
//! days of the current month in UTC); and, with an admin token, `GET
//! /admin/usage/{user}`, any user's, with the same parameters.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Request};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tollgate::ledger::{Ledger, LedgerSettings, MemoryLedger, Usage, UsageQuery};
use tollgate::{Key, KeyKind, StoreError, Timestamp, ToKey, UsageReport, UsageStatus};
use tollgate_redis::{RedisLedger, SentinelConnection};

use crate::{AdminToken, AppConfig, KeySpec, UserId, app_key, demo_auth};

/// The ledger the demo's store records in: in memory with the memory
/// store, on Redis with a Redis store. Users' use only: an IP-keyed
/// limit's admissions are nobody's bill.
#[derive(Debug, Clone)]
pub enum AppLedger {
    /// In this process.
    Memory(MemoryLedger),
    /// On Redis, shared by every instance on the prefix.
    Redis(RedisLedger),
    /// On Redis through Sentinel.
    Sentinel(RedisLedger<SentinelConnection>),
}

/// Whether `key`'s use is billed: a user's. The limits keyed by IP address
/// meter no one (an address is not a customer), and a flood of made-up
/// addresses would fill the ledger's bound, after which new customers'
/// records would be dropped.
fn billed(key: &Key) -> bool {
    key.kind() == KeyKind::User
}

impl Ledger for AppLedger {
    fn settings(&self) -> &LedgerSettings {
        match self {
            AppLedger::Memory(l) => Ledger::settings(l),
            AppLedger::Redis(l) => Ledger::settings(l),
            AppLedger::Sentinel(l) => Ledger::settings(l),
        }
    }

    fn record(&self, key: &Key, policy: &str, at: Timestamp, units: u64) {
        if !billed(key) {
            return;
        }
        match self {
            AppLedger::Memory(l) => l.record(key, policy, at, units),
            AppLedger::Redis(l) => l.record(key, policy, at, units),
            AppLedger::Sentinel(l) => l.record(key, policy, at, units),
        }
    }

    fn refund(&self, key: &Key, policy: &str, at: Timestamp, units: u64) {
        if !billed(key) {
            return;
        }
        match self {
            AppLedger::Memory(l) => l.refund(key, policy, at, units),
            AppLedger::Redis(l) => l.refund(key, policy, at, units),
            AppLedger::Sentinel(l) => l.refund(key, policy, at, units),
        }
    }

    async fn usage(&self, key: &Key, policy: &str, query: UsageQuery) -> Result<Usage, StoreError> {
        match self {
            AppLedger::Memory(l) => l.usage(key, policy, query).await,
            AppLedger::Redis(l) => l.usage(key, policy, query).await,
            AppLedger::Sentinel(l) => l.usage(key, policy, query).await,
        }
    }

    async fn flush(&self) -> Result<(), StoreError> {
        match self {
            AppLedger::Memory(l) => l.flush().await,
            AppLedger::Redis(l) => l.flush().await,
            AppLedger::Sentinel(l) => l.flush().await,
        }
    }
}

/// `GET /usage` (authenticated) and, with an admin token, `GET
/// /admin/usage/{user}`.
pub fn routes(config: &AppConfig, ledger: &AppLedger, admin: Option<AdminToken>) -> Router {
    crate::serve::record_route(own_routes(config, ledger, admin))
}

fn own_routes(config: &AppConfig, ledger: &AppLedger, admin: Option<AdminToken>) -> Router {
    let user_keyed = config.routes.iter().filter(|r| r.key == KeySpec::User);
    let policies: Arc<[String]> = user_keyed
        .clone()
        .flat_map(|r| r.plan_map.family().members().iter())
        .map(|p| p.name().to_owned())
        .collect();
    let shown = user_keyed.fold(UsageStatus::new(ledger.clone()), |shown, r| {
        shown.route(app_key(config, r), r.plan_map.clone())
    });
    let router = Router::new().route(
        "/usage",
        get(shown.clone()).layer(middleware::from_fn(demo_auth)),
    );
    let Some(token) = admin else {
        return router;
    };
    let any_user = move |Path(user): Path<String>, request: Request| {
        let (shown, policies, token) = (shown.clone(), policies.clone(), token.clone());
        async move {
            if let Some(refused) = token.refuses(&request) {
                return refused;
            }
            let query = match shown.query(&request) {
                Ok(query) => query,
                Err(error) => {
                    return problem(StatusCode::BAD_REQUEST, &error.to_string());
                }
            };
            let key = UserId(user).to_key();
            let names = policies.iter().map(String::as_str);
            match UsageReport::read(shown.ledger(), &key, names, query).await {
                Ok(report) => report.into_response(),
                Err(_) => unavailable(),
            }
        }
    };
    router.route("/admin/usage/{user}", get(any_user))
}

fn unavailable() -> Response {
    let mut response = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "the usage ledger is unavailable",
    );
    response.headers_mut().insert(
        axum::http::header::RETRY_AFTER,
        axum::http::HeaderValue::from_static("1"),
    );
    response
}

/// `status` with an `application/problem+json` body saying `detail`, as
/// the caller's own `GET /usage` answers.
fn problem(status: StatusCode, detail: &str) -> Response {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    (
        status,
        [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/problem+json"),
        )],
        body.to_string(),
    )
        .into_response()
}
