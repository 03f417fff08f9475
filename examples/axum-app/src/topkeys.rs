//! The demo's top keys: each policy's most limited and most active keys
//! ([`AppTopKeys`]: this instance's, or merged across instances through
//! Redis), and, with an admin token, `GET
//! /admin/top_keys/{policy}?ranking=limited|active&n=N`.
//!
//! Users are shown by their id (`user:alice`): the demo chooses to show
//! them. Every other key (a client's IP address, a header's value) is
//! shown as a hash keyed with a secret ([`DemoLabel`]), never as the raw
//! personal data: without the secret, a hash of the 2^32 IPv4 addresses
//! would take minutes to reverse.

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use tollgate::topkeys::{HashedLabel, KeyLabel, Ranking, Summary, TopKeys};
use tollgate::{ConfigError, Key, KeyKind, StoreError, TypeTag};
use tollgate_redis::{RedisTopKeys, SentinelConnection};

use crate::AdminToken;

/// The most keys `GET /admin/top_keys` lists.
const MAX_SHOWN: usize = 100;

/// Where the demo's top keys are read: this instance's counts with the
/// memory store, or every instance's merged through Redis.
#[derive(Clone, Debug)]
pub enum AppTopKeys {
    /// This instance's counts.
    Memory(TopKeys),
    /// Merged across the instances on one Redis prefix.
    Redis(RedisTopKeys),
    /// Merged across the instances, on Redis through Sentinel.
    Sentinel(RedisTopKeys<SentinelConnection>),
}

impl AppTopKeys {
    /// The counts the store records decisions in (wrap the store in a
    /// [`WatchedStore`](tollgate::topkeys::WatchedStore) of them).
    pub fn local(&self) -> &TopKeys {
        match self {
            Self::Memory(top) => top,
            Self::Redis(redis) => redis.local(),
            Self::Sentinel(redis) => redis.local(),
        }
    }

    /// The summary of `policy` under `ranking`, merged across instances
    /// on Redis.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when Redis could not be read.
    pub async fn top(&self, policy: &str, ranking: Ranking) -> Result<Summary, StoreError> {
        match self {
            Self::Memory(top) => Ok(top.summary(policy, ranking)),
            Self::Redis(redis) => redis.top(policy, ranking).await,
            Self::Sentinel(redis) => redis.top(policy, ranking).await,
        }
    }
}

/// The demo's counts, labelled by `label`.
///
/// # Errors
///
/// Never with these settings (a [`ConfigError`] for a bad one).
pub fn demo_top_keys(label: DemoLabel) -> Result<TopKeys, ConfigError> {
    TopKeys::builder().label(label).build()
}

/// How the demo names a key: a user by its id (`user:alice`), anything
/// else by [`HashedLabel::with_secret`]. Every instance that publishes to
/// one Redis must use the same secret, or their labels of one key differ.
///
/// ```
/// use axum_app::topkeys::DemoLabel;
/// use axum_app::UserId;
/// use tollgate::topkeys::KeyLabel;
/// use tollgate::{Key, ToKey};
///
/// let label = DemoLabel::new("the deployment's secret");
/// assert_eq!(label.label(&UserId("alice".into()).to_key()), "user:alice");
/// let key = Key::ip("192.0.2.1".parse().unwrap());
/// let ip = label.label(&key);
/// assert!(ip.starts_with("ip:") && !ip.contains("192"));
/// assert_ne!(ip, DemoLabel::new("another secret").label(&key));
/// ```
#[derive(Clone)]
pub struct DemoLabel(std::sync::Arc<HashedLabel>);

impl DemoLabel {
    /// Hashing keyed with `secret`.
    pub fn new(secret: impl AsRef<[u8]>) -> Self {
        Self(std::sync::Arc::new(HashedLabel::with_secret(secret)))
    }
}

impl std::fmt::Debug for DemoLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DemoLabel(..)")
    }
}

impl KeyLabel for DemoLabel {
    fn label(&self, key: &Key) -> String {
        label(&self.0, key)
    }
}

fn label(hashed: &HashedLabel, key: &Key) -> String {
    // The demo's user keys are text ids (`UserId`), tagged as text.
    let user = match key.as_bytes().split_first() {
        Some((&tag, id)) if key.kind() == KeyKind::User && tag == TypeTag::Str as u8 => {
            std::str::from_utf8(id).ok()
        }
        _ => None,
    };
    match user {
        Some(id) if !id.chars().any(char::is_control) => format!("user:{id}"),
        _ => hashed.label(key),
    }
}

#[derive(Debug, Deserialize)]
struct Params {
    #[serde(default)]
    ranking: Option<String>,
    #[serde(default)]
    n: Option<usize>,
}

/// `GET /admin/top_keys/{policy}?ranking=limited|active&n=N` (limited
/// and 10 by default, at most 100), with the admin token: the top keys of
/// `policy`, one of `policies` (any other is a 404, not an empty list
/// that a mistyped name would read as no traffic), as JSON, each with its
/// count and the most that count may overstate (`error`).
pub fn routes(top: &AppTopKeys, token: AdminToken, policies: Vec<String>) -> Router {
    let (top, policies) = (top.clone(), std::sync::Arc::new(policies));
    let handler = move |Path(policy): Path<String>, request: Request| {
        let (top, token, policies) = (top.clone(), token.clone(), policies.clone());
        async move {
            if let Some(refused) = token.refuses(&request) {
                return refused;
            }
            if !policies.contains(&policy) {
                return (StatusCode::NOT_FOUND, "no policy of that name\n").into_response();
            }
            let Ok(Query(params)) = Query::<Params>::try_from_uri(request.uri()) else {
                return bad_request("use ?ranking=limited|active&n=N");
            };
            let ranking = match params.ranking.as_deref() {
                None => Ranking::Limited,
                Some(name) => match Ranking::from_name(name) {
                    Some(ranking) => ranking,
                    None => return bad_request("ranking is limited or active"),
                },
            };
            let n = params.n.unwrap_or(10).min(MAX_SHOWN);
            match top.top(&policy, ranking).await {
                Ok(summary) => Json(summary_json(&summary.truncated(n))).into_response(),
                Err(_) => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the top keys are unavailable\n",
                )
                    .into_response(),
            }
        }
    };
    Router::new().route("/admin/top_keys/{policy}", get(handler))
}

/// `summary` as JSON: the total counted, the floor (the most a key not
/// listed may have), and each key's label, count and error.
pub(crate) fn summary_json(summary: &Summary) -> serde_json::Value {
    let keys: Vec<_> = summary
        .keys()
        .iter()
        .map(|k| serde_json::json!({ "label": k.label(), "count": k.count(), "error": k.error() }))
        .collect();
    serde_json::json!({ "total": summary.total(), "floor": summary.floor(), "keys": keys })
}

fn bad_request(detail: &'static str) -> Response {
    (StatusCode::BAD_REQUEST, detail).into_response()
}
