//! What the demo shows its users and its operators: `GET /rate_limit`,
//! every limit of the caller as GitHub's endpoint of that name shows it,
//! consuming nothing; and `POST /admin/reset?user=<name>`, which lets a
//! spent user in again.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, Request};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use tollgate::{BoxStore, KeyExtractor, Policy, Store, ToKey};

use crate::{
    AppConfig, AppKey, KeySpec, PlanChooser, RouteConfig, UserId, app_key, demo_auth, plan_chooser,
};

/// The token of the demo's operator. A demo's: a real service checks its
/// operators as it checks any other caller.
pub const ADMIN_TOKEN: &str = "Bearer admin-demo";

/// Every route entry, with its key extractor and its plans' chooser.
type Entries = Arc<[(RouteConfig, AppKey, PlanChooser)]>;

/// `GET /rate_limit` (authenticated) and `POST /admin/reset`.
pub(crate) fn routes(config: &AppConfig, store: &BoxStore) -> Router {
    let entries: Entries = config
        .routes
        .iter()
        .map(|r| (r.clone(), app_key(config, r), plan_chooser(r.plans.clone())))
        .collect();
    let shown = {
        let (entries, store) = (entries.clone(), store.clone());
        move |request: Request| rate_limit(entries.clone(), store.clone(), request)
    };
    let reset = {
        let store = store.clone();
        move |Query(who): Query<Who>, request: Request| {
            reset(entries.clone(), store.clone(), request, who)
        }
    };
    Router::new()
        .route(
            "/rate_limit",
            get(shown).layer(middleware::from_fn(demo_auth)),
        )
        .route("/admin/reset", post(reset))
}

/// The policy `entry` limits `request` by: its plan's, if it has one.
fn policy_for(entry: &RouteConfig, plans: &PlanChooser, request: &Request) -> Policy {
    plans(request).map_or_else(|| entry.policy.clone(), |choice| choice.policy().clone())
}

async fn rate_limit(entries: Entries, store: BoxStore, request: Request) -> Response {
    let mut resources = serde_json::Map::new();
    for (entry, key, plans) in entries.iter() {
        let Some(key) = KeyExtractor::<Body>::extract(key, &request) else {
            continue;
        };
        let policy = policy_for(entry, plans, &request);
        match store.status(&key, &policy).await {
            Ok(d) => {
                let shown = serde_json::json!({
                    "limit": d.limit(),
                    "remaining": d.remaining(),
                    "used": d.used(),
                    "reset": d.reset_at().as_secs_ceil(),
                });
                resources.insert(policy.name().to_owned(), shown);
            }
            Err(_) => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the rate limiter is unavailable\n",
                )
                    .into_response();
            }
        }
    }
    axum::Json(serde_json::json!({ "resources": resources })).into_response()
}

/// The user an operator acts on.
#[derive(Debug, Deserialize)]
struct Who {
    user: String,
}

async fn reset(entries: Entries, store: BoxStore, request: Request, who: Who) -> Response {
    let authorized = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .is_some_and(|v| v == ADMIN_TOKEN);
    if !authorized {
        return (StatusCode::FORBIDDEN, "operators only\n").into_response();
    }
    let key = UserId(who.user).to_key();
    let mut done = Vec::new();
    for (entry, _, _) in entries.iter().filter(|(e, _, _)| e.key == KeySpec::User) {
        let policies = std::iter::once(&entry.policy).chain(entry.plans.iter().map(|p| &p.policy));
        for policy in policies {
            if store.reset(&key, policy).await.is_err() {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the rate limiter is unavailable\n",
                )
                    .into_response();
            }
            done.push(policy.name().to_owned());
        }
    }
    axum::Json(serde_json::json!({ "reset": done })).into_response()
}
