//! Live per-user overrides in the demo: the source every layer asks
//! ([`AppOverrides`]: in memory, or in Redis when the store is), and, with
//! an admin token, `PUT /admin/rate_limit/{policy}/{user}/override` (the
//! body is the override: `1000/min`, `5/s 100/h burst 10`, `exempt` or
//! `deny`; `?seconds=N`, N at least 1, makes it expire) and `DELETE` of the
//! same path, which clears it. As for the other admin routes, a route's policy name
//! stands for the route's family (the route's policy and every plan's):
//! the user's override holds whichever plan they are on.

use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use serde::Deserialize;
use tollgate::{
    Applied, FirstAnswer, Key, MemoryOverrides, Override, OverrideError, OverrideSource,
    OverrideTable, Policy, PolicyFamily, ToKey,
};
use tollgate_redis::RedisOverrides;

use crate::{AdminToken, AppConfig, KeySpec, UserId};

/// Where the demo's layers find each user's overrides: in this process,
/// or in Redis, shared by every instance on the same prefix.
#[derive(Clone, Debug)]
pub enum AppOverrides {
    /// Kept in this instance.
    Memory(MemoryOverrides),
    /// Kept in Redis (see [`RedisOverrides`]).
    Redis(RedisOverrides),
}

impl Default for AppOverrides {
    fn default() -> Self {
        Self::Memory(MemoryOverrides::new())
    }
}

impl OverrideSource for AppOverrides {
    fn applied(&self, key: &Key, policy: &Policy) -> Option<Applied> {
        match self {
            Self::Memory(memory) => memory.applied(key, policy),
            Self::Redis(redis) => redis.applied(key, policy),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Self::Memory(memory) => memory.is_empty(),
            Self::Redis(redis) => redis.is_empty(),
        }
    }

    fn first_answer(&self, key: &Key, policy: &Policy) -> Option<FirstAnswer> {
        match self {
            Self::Memory(memory) => memory.first_answer(key, policy),
            Self::Redis(redis) => redis.first_answer(key, policy),
        }
    }
}

impl AppOverrides {
    /// The overrides this instance applies.
    pub fn table(&self) -> &OverrideTable {
        match self {
            Self::Memory(memory) => memory.table(),
            Self::Redis(redis) => redis.table(),
        }
    }

    async fn set(
        &self,
        family: &PolicyFamily,
        key: &Key,
        rule: Override,
        expires_in: Option<Duration>,
    ) -> Result<(), OverrideError> {
        match self {
            Self::Memory(memory) => family.set_override(memory, key, rule, expires_in).await,
            Self::Redis(redis) => family.set_override(redis, key, rule, expires_in).await,
        }
    }

    async fn clear(&self, family: &PolicyFamily, key: &Key) -> Result<(), tollgate::StoreError> {
        match self {
            Self::Memory(memory) => family.clear_override(memory, key).await,
            Self::Redis(redis) => family.clear_override(redis, key).await,
        }
    }
}

/// How long an override lasts, if not until cleared.
#[derive(Debug, Clone, Copy, Deserialize)]
struct Expiry {
    seconds: Option<u64>,
}

/// `PUT` and `DELETE /admin/rate_limit/{policy}/{user}/override`, behind
/// `admin`.
pub(crate) fn routes(config: &AppConfig, overrides: &AppOverrides, admin: AdminToken) -> Router {
    let families = families(config);
    let set = {
        let (families, overrides, admin) = (families.clone(), overrides.clone(), admin.clone());
        move |Path((policy, user)): Path<(String, String)>, request: Request| async move {
            if let Some(refused) = admin.refuses(&request) {
                return refused;
            }
            // Read once the token is checked, as the block's.
            let expiry = match Query::<Expiry>::try_from_uri(request.uri()) {
                Ok(Query(expiry)) => expiry,
                Err(rejection) => return rejection.into_response(),
            };
            if expiry.seconds == Some(0) {
                // An override that ends as it is set.
                return (StatusCode::BAD_REQUEST, "seconds must be at least 1\n").into_response();
            }
            let Some(named) = find(&families, &policy) else {
                return not_found();
            };
            let body = axum::body::to_bytes(request.into_body(), 1024).await;
            let Ok(body) = body else {
                return (
                    StatusCode::BAD_REQUEST,
                    "an override is at most 1024 bytes\n",
                )
                    .into_response();
            };
            let Ok(text) = String::from_utf8(body.to_vec()) else {
                return (StatusCode::BAD_REQUEST, "an override is UTF-8 text\n").into_response();
            };
            let rule = match text.parse::<Override>() {
                Ok(rule) => rule,
                Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
            };
            if let Some(refused) = named.too_small(&rule) {
                return (StatusCode::BAD_REQUEST, refused).into_response();
            }
            let family = &named.family;
            let expires_in = expiry.seconds.map(Duration::from_secs);
            match overrides
                .set(family, &UserId(user).to_key(), rule, expires_in)
                .await
            {
                Ok(()) => StatusCode::NO_CONTENT.into_response(),
                Err(OverrideError::Config(e)) => {
                    (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response()
                }
                Err(_) => unavailable(),
            }
        }
    };
    let clear = {
        let overrides = overrides.clone();
        move |Path((policy, user)): Path<(String, String)>, request: Request| async move {
            if let Some(refused) = admin.refuses(&request) {
                return refused;
            }
            let Some(named) = find(&families, &policy) else {
                return not_found();
            };
            match overrides.clear(&named.family, &UserId(user).to_key()).await {
                Ok(()) => StatusCode::NO_CONTENT.into_response(),
                Err(_) => unavailable(),
            }
        }
    };
    Router::new().route(
        "/admin/rate_limit/{policy}/{user}/override",
        put(set).delete(clear),
    )
}

/// Each name an operator may give, and the family it stands for: a
/// user-keyed route's policy name, its family; a plan's, that policy.
fn families(config: &AppConfig) -> std::sync::Arc<[Named]> {
    let user_keyed = config.routes.iter().filter(|r| r.key == KeySpec::User);
    let mut all = Vec::new();
    for route in user_keyed {
        let plans = route.plans.iter().map(|p| (p.policy.clone(), p.cost));
        all.push(Named {
            name: route.policy.name().to_owned(),
            family: route.plan_map.family().clone(),
            costs: std::iter::once((route.policy.clone(), route.cost))
                .chain(plans)
                .collect(),
        });
        for plan in &route.plans {
            all.push(Named {
                name: plan.policy.name().to_owned(),
                family: plan.policy.clone().into(),
                costs: vec![(plan.policy.clone(), plan.cost)],
            });
        }
    }
    all.into()
}

/// A name an operator may give: the family it stands for, and each of the
/// family's policies with the cost of a request under it.
struct Named {
    name: String,
    family: PolicyFamily,
    costs: Vec<(Policy, u64)>,
}

impl Named {
    /// Why `rule` would admit no request of a policy of the family, if it
    /// would not: its limits hold less than a request costs, as the policy
    /// file refuses for a route's own limits.
    fn too_small(&self, rule: &Override) -> Option<String> {
        let (limits, burst) = match rule {
            Override::Limits { limits, burst } => (limits, *burst),
            Override::Exempt | Override::Deny => return None,
        };
        self.costs.iter().find_map(|(policy, cost)| {
            let mut own = Policy::builder(policy.name()).algorithm(policy.algorithm());
            for &limit in limits {
                own = own.limit(limit);
            }
            if let Some(burst) = burst {
                own = own.burst(burst);
            }
            // One that does not build is refused when it is set.
            let capacity = own
                .build()
                .ok()?
                .params()
                .iter()
                .map(|p| p.capacity)
                .min()?;
            (capacity < *cost).then(|| {
                format!(
                    "the override holds {capacity} under '{}', less than a request's cost of \
                     {cost}: no request would be admitted\n",
                    policy.name()
                )
            })
        })
    }
}

fn find<'a>(families: &'a [Named], policy: &str) -> Option<&'a Named> {
    families.iter().find(|named| named.name == policy)
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "no user-keyed policy of that name\n").into_response()
}

fn unavailable() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "the overrides are unavailable\n",
    )
        .into_response()
}
