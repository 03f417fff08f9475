//! What the demo shows its users and its operators: `GET /rate_limit`,
//! every user-keyed limit of the caller as GitHub's endpoint of that name
//! shows it, consuming nothing; and, with an admin token configured,
//! `DELETE /admin/rate_limit/{policy}/{user}`, which lets a spent user in
//! again.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use tollgate::{BoxStore, KeyExtractor, Policy, Store, ToKey};

use crate::{
    AppConfig, AppKey, KeySpec, PlanChooser, RouteConfig, UserId, app_key, demo_auth, plan_chooser,
};

/// Every route entry, with its key extractor and its plans' chooser.
type Entries = Arc<[(RouteConfig, AppKey, PlanChooser)]>;

/// `GET /rate_limit` (authenticated) and, with an admin token, `DELETE
/// /admin/rate_limit/{policy}/{user}`.
pub(crate) fn routes(config: &AppConfig, store: &BoxStore, admin: Option<AdminToken>) -> Router {
    let entries: Entries = config
        .routes
        .iter()
        .filter(|r| r.key == KeySpec::User)
        .map(|r| (r.clone(), app_key(config, r), plan_chooser(r.plans.clone())))
        .collect();
    let shown = {
        let (entries, store) = (entries.clone(), store.clone());
        move |request: Request| rate_limit(entries.clone(), store.clone(), request)
    };
    let router = Router::new().route(
        "/rate_limit",
        get(shown).layer(middleware::from_fn(demo_auth)),
    );
    // Without a token, the admin routes do not exist: 404.
    let Some(token) = admin else {
        return router;
    };
    let store = store.clone();
    let reset =
        move |path, request| reset(entries.clone(), store.clone(), token.clone(), path, request);
    router.route("/admin/rate_limit/{policy}/{user}", delete(reset))
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

/// The admin token, checked in time independent of where a guess first
/// differs.
#[derive(Clone)]
pub struct AdminToken(Arc<str>);

impl AdminToken {
    /// An admin token: requests must carry `Authorization: Bearer <token>`.
    /// `None` for an empty token, which would let anyone in.
    pub fn new(token: &str) -> Option<Self> {
        (!token.is_empty()).then(|| Self(token.into()))
    }

    fn admits(&self, given: &[u8]) -> bool {
        let expected = self.0.as_bytes();
        let differ = expected
            .iter()
            .zip(given)
            .fold(expected.len() ^ given.len(), |d, (a, b)| {
                d | usize::from(a ^ b)
            });
        differ == 0
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(***)")
    }
}

/// `DELETE /admin/rate_limit/{policy}/{user}`: 204 after resetting the
/// user's state under the policy; 401 without a bearer token, 403 with a
/// wrong one, 404 for a policy that is not a user-keyed one of the file.
async fn reset(
    entries: Entries,
    store: BoxStore,
    token: AdminToken,
    Path((policy, user)): Path<(String, String)>,
    request: Request,
) -> Response {
    let given = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    match given {
        None => {
            return (
                StatusCode::UNAUTHORIZED,
                [(http::header::WWW_AUTHENTICATE, "Bearer")],
                "operators only: Authorization: Bearer <admin token>\n",
            )
                .into_response();
        }
        Some(given) if !token.admits(given) => {
            return (StatusCode::FORBIDDEN, "wrong admin token\n").into_response();
        }
        Some(_) => {}
    }
    let found = entries
        .iter()
        .filter(|(e, _, _)| e.key == KeySpec::User)
        .flat_map(|(e, _, _)| std::iter::once(&e.policy).chain(e.plans.iter().map(|p| &p.policy)))
        .find(|p| p.name() == policy);
    let Some(policy) = found else {
        return (StatusCode::NOT_FOUND, "no user-keyed policy of that name\n").into_response();
    };
    match store.reset(&UserId(user).to_key(), policy).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the rate limiter is unavailable\n",
        )
            .into_response(),
    }
}
