//! What the demo shows its users and its operators: `GET /rate_limit`
//! (tollgate's [`RateLimitStatus`]), the policy of the caller's plan on
//! every user-keyed route as GitHub's endpoint of that name shows it (the
//! binding limit), with each of the policy's limits under `limits`
//! (`search` has 2/s and 100/h), consuming nothing; and, with an admin token configured,
//! `DELETE /admin/rate_limit/{policy}/{user}`, which lets a spent user in
//! again, `POST /admin/rate_limit/{policy}/{user}/block?seconds=N` (N at least 1), which
//! shuts one out, and `GET /admin/rate_limit/{policy}/{user}`, which shows
//! the user's state. A route's policy name (`export`) stands for the
//! route's [`PolicyFamily`]: the route's policy and every plan's
//! (`export-pro`), so that a block holds whichever plan the user is on; a
//! plan's policy name stands for that policy alone. Resets and blocks go
//! through the layers' failure settings, so that a user blocked here stays
//! blocked on this app server through a Redis outage.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, Request};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde::Deserialize;
use tollgate::{
    BoxStore, FailureMode, PolicyFamily, RateLimitReport, RateLimitStatus, RateLimiter, ToKey,
};

use crate::{AppConfig, AppOverrides, KeySpec, RouteConfig, UserId, app_key, demo_auth};

/// Every user-keyed route entry.
type Entries = Arc<[RouteConfig]>;

/// `GET /rate_limit` (authenticated) and, with an admin token, `DELETE`
/// and `GET /admin/rate_limit/{policy}/{user}` and `POST
/// /admin/rate_limit/{policy}/{user}/block?seconds=N`.
pub(crate) fn routes(
    config: &AppConfig,
    store: &BoxStore,
    admin: Option<AdminToken>,
    overrides: &AppOverrides,
) -> Router {
    let user_keyed = config.routes.iter().filter(|r| r.key == KeySpec::User);
    let entries: Entries = user_keyed.clone().cloned().collect();
    let status = RateLimitStatus::new(store.clone()).overrides(overrides.clone());
    let shown = user_keyed.fold(status, |shown, r| {
        shown.route(app_key(config, r), r.plan_map.clone())
    });
    let router = Router::new().route(
        "/rate_limit",
        get(shown).layer(middleware::from_fn(demo_auth)),
    );
    // Without a token, the admin routes do not exist: 404.
    let Some(token) = admin else {
        return router;
    };
    let admin = Admin {
        entries,
        store: store.clone(),
        failure: config.failure,
        instances: config.instances,
        overrides: overrides.clone(),
        token,
    };
    let reset = {
        let admin = admin.clone();
        move |path, request| {
            let admin = admin.clone();
            async move { admin.act(path, None, request).await }
        }
    };
    let status = {
        let admin = admin.clone();
        move |path, request| {
            let admin = admin.clone();
            async move { admin.status(path, request).await }
        }
    };
    // The query is read once the token is checked: a request without one
    // learns nothing of what the route expects.
    let block = move |path, request: Request| {
        let admin = admin.clone();
        async move {
            if let Some(refused) = admin.refused(&request) {
                return refused;
            }
            match Query::<Block>::try_from_uri(request.uri()) {
                Ok(Query(block)) => admin.act(path, Some(block), request).await,
                Err(rejection) => rejection.into_response(),
            }
        }
    };
    router
        .route(
            "/admin/rate_limit/{policy}/{user}",
            delete(reset).get(status),
        )
        .route("/admin/rate_limit/{policy}/{user}/block", post(block))
}

fn unavailable() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "the rate limiter is unavailable\n",
    )
        .into_response()
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

    /// 401 for `request` without a bearer token, 403 with a wrong one;
    /// `None` for the right one.
    pub(crate) fn refuses(&self, request: &Request) -> Option<Response> {
        let given = request
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| crate::bearer(v.as_bytes()));
        match given {
            None => Some(
                (
                    StatusCode::UNAUTHORIZED,
                    [(http::header::WWW_AUTHENTICATE, "Bearer")],
                    "operators only: Authorization: Bearer <admin token>\n",
                )
                    .into_response(),
            ),
            Some(given) if !self.admits(given) => {
                Some((StatusCode::FORBIDDEN, "wrong admin token\n").into_response())
            }
            Some(_) => None,
        }
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

/// How long an operator blocks a user.
#[derive(Debug, Clone, Copy, Deserialize)]
struct Block {
    seconds: u64,
}

/// What the admin routes share.
#[derive(Clone)]
struct Admin {
    entries: Entries,
    /// The store the layers decide with.
    store: BoxStore,
    /// The layers' failure settings: what resets and blocks go through.
    failure: FailureMode,
    instances: NonZeroU64,
    /// The users' own limits, which the layers decide under: a status,
    /// reset or block of a user goes under them too.
    overrides: AppOverrides,
    token: AdminToken,
}

impl Admin {
    /// 401 without a bearer token, 403 with a wrong one.
    fn refused(&self, request: &Request) -> Option<Response> {
        self.token.refuses(request)
    }

    /// What `{policy}` stands for: a route's policy name, the route's
    /// family (its policy and every plan's); a plan's policy name, that
    /// policy alone.
    fn family(&self, policy: &str) -> Option<PolicyFamily> {
        let entries = || self.entries.iter();
        if let Some(route) = entries().find(|e| e.policy.name() == policy) {
            return Some(route.plan_map.family().clone());
        }
        entries()
            .flat_map(|e| e.plans.iter())
            .find(|p| p.policy.name() == policy)
            .map(|p| PolicyFamily::from(p.policy.clone()))
    }

    /// A limiter of `family` on the store, with the users' overrides, so
    /// that a user's own limits are read, reset and blocked as the layers
    /// count them (read under a plan's limits, a daily override's use
    /// would be dropped). Resets and blocks go through the layers' failure
    /// settings (`acting`), so that they reach the local fallback the
    /// layers decide with while the store fails (the process's shared
    /// one): a user blocked here stays blocked through a Redis outage, and
    /// a reset lifts a block there too. A status does not (not `acting`):
    /// it shows the store's state, or fails.
    fn limiter(&self, family: PolicyFamily, acting: bool) -> Option<RateLimiter<BoxStore>> {
        let first = family.members().first()?.clone();
        let limiter = match acting {
            true => RateLimiter::with_store(first, self.store.clone())
                .on_store_error(self.failure)
                .local_divisor(self.instances),
            false => {
                RateLimiter::with_store(first, self.store.clone()).on_store_error(FailureMode::Open)
            }
        };
        let limiter = limiter.in_family(family).ok()?;
        Some(limiter.overrides(self.overrides.clone()))
    }

    /// `DELETE /admin/rate_limit/{policy}/{user}` resets the user's state
    /// under the policy (a route's: under each of its plans' too), and
    /// `POST .../block?seconds=N` blocks the user for N seconds under it:
    /// 204; 401 without a bearer token, 403 with a wrong one, 404 for a
    /// policy that is not a user-keyed one of the file.
    async fn act(
        &self,
        Path((policy, user)): Path<(String, String)>,
        block: Option<Block>,
        request: Request,
    ) -> Response {
        if let Some(refused) = self.refused(&request) {
            return refused;
        }
        let Some(limiter) = self.family(&policy).and_then(|f| self.limiter(f, true)) else {
            return not_found();
        };
        if let Some(Block { seconds: 0 }) = block {
            // A block of no time would forget the user's use, as a reset.
            return (StatusCode::BAD_REQUEST, "seconds must be at least 1\n").into_response();
        }
        let key = UserId(user).to_key();
        let done = match block {
            None => limiter.reset(&key).await,
            Some(Block { seconds }) => limiter.block(&key, Duration::from_secs(seconds)).await,
        };
        match done {
            Ok(()) => StatusCode::NO_CONTENT.into_response(),
            Err(_) => unavailable(),
        }
    }

    /// `GET /admin/rate_limit/{policy}/{user}`: the user's state under the
    /// policy (a route's: under each of its plans' too), as `/rate_limit`
    /// shows a policy, by policy name; consuming nothing. Refused as
    /// [`act`](Admin::act) is.
    async fn status(
        &self,
        Path((policy, user)): Path<(String, String)>,
        request: Request,
    ) -> Response {
        if let Some(refused) = self.refused(&request) {
            return refused;
        }
        let Some(limiter) = self.family(&policy).and_then(|f| self.limiter(f, false)) else {
            return not_found();
        };
        let key = UserId(user).to_key();
        match limiter.family_status(&key).await {
            Ok(states) => RateLimitReport::new(states).into_response(),
            Err(_) => unavailable(),
        }
    }
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "no user-keyed policy of that name\n").into_response()
}
