//! Tollgate's demo app: an Axum API with per-IP and per-user rate limits on
//! the embedded in-memory store.
//!
//! Run with: `cargo run -p axum-app`, then for example
//! `curl -i -X POST localhost:3000/login` (limited per IP) or
//! `curl -i -H 'Authorization: Bearer demo-ada' localhost:3000/api/hello`
//! (limited per user).

use std::fmt;

use axum::Router;
use axum::extract::{Extension, Request};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tollgate::{
    Algorithm, ConfigError, ExtensionKey, Key, MemoryStore, PeerIp, Policy, RateLimitLayer, ToKey,
};

/// The id of a user authenticated by the demo auth middleware.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserId(pub String);

impl ToKey for UserId {
    fn to_key(&self) -> Key {
        Key::user(&self.0)
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The demo's policies.
#[derive(Debug, Clone)]
pub struct Policies {
    /// `POST /login`, per client IP: brute-force protection.
    pub login: Policy,
    /// `/api/*`, per authenticated user.
    pub api: Policy,
}

impl Policies {
    /// The built-in policies.
    ///
    /// # Errors
    ///
    /// Never in practice; the policies are constants checked at start-up.
    pub fn demo() -> Result<Self, ConfigError> {
        Ok(Self {
            login: Policy::new("login", Algorithm::FixedWindow, "5/min")?,
            api: Policy::builder("api")
                .algorithm(Algorithm::Gcra)
                .limit("10/min")
                .burst(5)
                .build()?,
        })
    }
}

/// The app's router. Serve it with
/// `into_make_service_with_connect_info::<SocketAddr>()`: the login limit
/// is keyed by the peer address.
pub fn app(policies: &Policies, store: MemoryStore) -> Router {
    let login = Router::new()
        .route("/login", post(login))
        .layer(RateLimitLayer::new(policies.login.clone(), PeerIp::new()).store(store.clone()));
    let api = Router::new()
        .route("/api/hello", get(hello))
        .layer(
            RateLimitLayer::new(policies.api.clone(), ExtensionKey::<UserId>::new()).store(store),
        )
        .layer(middleware::from_fn(demo_auth));
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .merge(login)
        .merge(api)
}

/// `Authorization: Bearer demo-<user>` authenticates as `<user>`; anything
/// else gets 401.
async fn demo_auth(mut request: Request, next: Next) -> Response {
    let user = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer demo-"))
        .filter(|user| !user.is_empty() && user.len() <= 64)
        .map(|user| UserId(user.to_owned()));
    match user {
        Some(user) => {
            request.extensions_mut().insert(user);
            next.run(request).await
        }
        None => (
            StatusCode::UNAUTHORIZED,
            "use Authorization: Bearer demo-<user>\n",
        )
            .into_response(),
    }
}

async fn login() -> &'static str {
    "logged in (demo)\n"
}

async fn hello(Extension(user): Extension<UserId>) -> String {
    format!("hello, {user}\n")
}
