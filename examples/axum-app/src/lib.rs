//! Tollgate's demo app: an Axum API whose rate limits come from a TOML
//! policy file (`policies.toml`), on the in-memory store or on Redis.
//!
//! Run with: `cargo run -p axum-app -- [--listen ADDR] [--redis-url URL] [--config FILE]`
//!
//! `Authorization: Bearer demo-<user>` authenticates as `<user>` on the
//! free plan, `Bearer demo-pro-<user>` on the pro plan; `/api/*`
//! answers 401 without it. Per-IP entries apply before authentication,
//! per-user ones after it.
//!
//! # Traces
//!
//! Every request goes through [`serve_layers`]: tower-http's request-id
//! layers (`x-request-id`, the client's if valid, else a new UUID, echoed
//! on the response) and its `TraceLayer`, whose `request` span (at `INFO`)
//! has these fields:
//!
//! | field | value |
//! |---|---|
//! | `request_id` | the request's `x-request-id` |
//! | `method` | `GET`, `POST`, ... |
//! | `path` | the route that matched (`/api/items`, `/admin/rate_limit/{policy}/{user}`), never the raw path or query; empty when none did |
//! | `tollgate.policy` | the policy that decided: of stacked layers, the one that refused, else the innermost that admitted (`items-read-pro` when the pro plan chose it) |
//! | `tollgate.outcome` | `allowed`, `limited` or `shadow_limited` |
//! | `tollgate.limit` | on a refusal, the limit that fired (`5/s`), as the `tollgate-exceeded` header names it; `blocked` for a key an operator blocked |
//! | `tollgate.store` | the store asked: `memory` or `redis` |
//! | `tollgate.fallback` | when the store failed: the failure policy's answer, `open`, `closed`, `local_allowed` or `local_limited`; empty otherwise |
//!
//! The `tollgate.*` names are [`tollgate::trace`]'s constants; see there
//! when each is recorded. `RUST_LOG=info,tower_http=debug` logs a line per
//! request and per response, inside its span; its formatter prints each
//! layer's record in turn, the innermost last.

pub mod config;
pub mod dashboard;
pub mod listen;
pub mod operators;
pub mod overload;
pub mod overrides;
pub mod serve;
pub mod topkeys;
pub mod usage;

use std::convert::Infallible;
use std::fmt;

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Query, Request};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, Route, on};
use axum::{Json, http};
use metrics_exporter_prometheus::{BuildError, PrometheusBuilder, PrometheusHandle};
use serde::Deserialize;
use tollgate::{
    ActualCost, BoxStore, ChosenPolicy, ClientIp, ExtensionKey, GlobalKey, HeaderKey,
    InFlightLayer, KeepBody, Key, KeyExtractor, MissingCause, PlanExtension, PlanMap,
    RateLimitLayer, Settle, ToKey,
};
use tower::layer::util::Identity;
use tower::{Layer, Service};

pub use dashboard::Dashboard;
pub use operators::AdminToken;
pub use overload::{Overload, OverloadConfig};
pub use overrides::AppOverrides;
pub use topkeys::AppTopKeys;
pub use usage::AppLedger;

pub use config::{
    AppConfig, ConfigFileError, KeySpec, PlanConfig, ROUTES, RouteConfig, SettleSpec,
};

/// The plan of an authenticated user: `free`, or `pro` for a token
/// `Bearer demo-pro-<user>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan(pub &'static str);

impl AsRef<str> for Plan {
    fn as_ref(&self) -> &str {
        self.0
    }
}

/// Each plan's policy and cost on a route, by the [`Plan`] in the request.
pub type AppPlans = PlanMap<PlanExtension<Plan>>;

/// The id of a user authenticated by the demo auth middleware.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserId(pub String);

impl ToKey for UserId {
    fn to_key(&self) -> Key {
        self.0.to_key()
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The key extractor of a route entry.
#[derive(Debug, Clone)]
pub(crate) enum AppKey {
    Ip(ClientIp),
    User(ExtensionKey<UserId>),
    Header(HeaderKey),
    Global(GlobalKey),
}

impl KeyExtractor<Body> for AppKey {
    fn extract(&self, request: &Request) -> Option<Key> {
        match self {
            AppKey::Ip(e) => e.extract(request),
            AppKey::User(e) => e.extract(request),
            AppKey::Header(e) => e.extract(request),
            AppKey::Global(e) => e.extract(request),
        }
    }

    fn missing(&self, request: &Request) -> MissingCause {
        match self {
            AppKey::Ip(e) => e.missing(request),
            AppKey::User(e) => e.missing(request),
            AppKey::Header(e) => e.missing(request),
            AppKey::Global(e) => KeyExtractor::<Body>::missing(e, request),
        }
    }
}

/// The app's router, without admin routes. Serve it with
/// `into_make_service_with_connect_info::<SocketAddr>()`: IP keys need the
/// peer address.
pub fn app(config: &AppConfig, store: BoxStore) -> Router {
    app_with_admin(config, store, None)
}

/// The app's router, with `DELETE /admin/rate_limit/{policy}/{user}` for
/// requests that carry `Authorization: Bearer <admin token>`, if there is
/// an admin token.
pub fn app_with_admin(config: &AppConfig, store: BoxStore, admin: Option<AdminToken>) -> Router {
    app_with_overrides(config, store, admin, AppOverrides::default())
}

/// The app's router with admin routes, whose layers apply each user's
/// override from `overrides`; with an admin token, `PUT` and `DELETE
/// /admin/rate_limit/{policy}/{user}/override` set and clear them.
pub fn app_with_overrides(
    config: &AppConfig,
    store: BoxStore,
    admin: Option<AdminToken>,
    overrides: AppOverrides,
) -> Router {
    build(config, store, admin, overrides, None::<Identity>)
}

/// The app's router as [`app`] builds it, with `inner` around each
/// route's handler: inside every limit and the demo's auth, so that the
/// layers see the response `inner` makes of the handler's. A replay of
/// an access log answers with the logged status this way, and a
/// `settle = "failures"` route counts what the server failed. A request
/// that no handler answers (a limit's refusal, the auth's 401, a path or
/// method without a route) does not go through `inner`.
pub fn app_with_handler_layer<L>(config: &AppConfig, store: BoxStore, inner: L) -> Router
where
    L: Layer<Route> + Clone + Send + Sync + 'static,
    L::Service: Service<Request, Error = Infallible> + Clone + Send + Sync + 'static,
    <L::Service as Service<Request>>::Response: IntoResponse + 'static,
    <L::Service as Service<Request>>::Future: Send + 'static,
{
    build(config, store, None, AppOverrides::default(), Some(inner))
}

fn build<L>(
    config: &AppConfig,
    store: BoxStore,
    admin: Option<AdminToken>,
    overrides: AppOverrides,
    inner: Option<L>,
) -> Router
where
    L: Layer<Route> + Clone + Send + Sync + 'static,
    L::Service: Service<Request, Error = Infallible> + Clone + Send + Sync + 'static,
    <L::Service as Service<Request>>::Response: IntoResponse + 'static,
    <L::Service as Service<Request>>::Future: Send + 'static,
{
    let mut router = Router::new();
    for &(method, path) in ROUTES {
        let mut route: MethodRouter = handler(method, path);
        if let Some(inner) = &inner {
            route = route.route_layer(inner.clone());
        }
        let entries: Vec<&RouteConfig> = config
            .routes
            .iter()
            .filter(|r| r.matches(method, path))
            .collect();
        // Layers added later wrap earlier ones: add the innermost first, so
        // that the file's first entry is the outermost of its group. The
        // in-flight limits are innermost: a request turned away by a rate
        // limit never takes a slot. `route_layer`, not `layer`: a method
        // the route does not have is answered 405 before any limit, so
        // that it counts against none (five `GET /login` would otherwise
        // be five failed logins).
        for entry in entries.iter().rev() {
            if let Some(limit) = &entry.in_flight {
                let key = app_key(config, entry);
                // The failure settings of every layer are the file's.
                let in_flight = InFlightLayer::new(limit.clone(), key)
                    .store(store.clone())
                    .on_store_error(config.failure)
                    .local_divisor(config.instances);
                route = route.route_layer(in_flight);
            }
        }
        for entry in entries.iter().rev().filter(|e| e.key.after_auth()) {
            route = route.route_layer(layer(config, entry, &store, &overrides));
        }
        if config::is_authenticated(path) {
            route = route.route_layer(middleware::from_fn(demo_auth));
        }
        for entry in entries.iter().rev().filter(|e| !e.key.after_auth()) {
            route = route.route_layer(layer(config, entry, &store, &overrides));
        }
        router = router.route(path, route);
    }
    if let Some(admin) = &admin {
        router = router.merge(overrides::routes(config, &overrides, admin.clone()));
    }
    // Made into services now, once: a router left with its handlers
    // would build every layer again for each request it serves (axum
    // does so lazily until the state is given), each with fresh
    // telemetry and state of its own.
    let router = router.merge(operators::routes(config, &store, admin, &overrides));
    serve::record_route(router).with_state(())
}

fn layer(
    config: &AppConfig,
    entry: &RouteConfig,
    store: &BoxStore,
    overrides: &AppOverrides,
) -> RateLimitLayer<ChosenPolicy<AppKey, AppPlans>, BoxStore, KeepBody> {
    let layer = RateLimitLayer::new(entry.policy.clone(), app_key(config, entry))
        .store(store.clone())
        .cost(entry.cost)
        .headers(config.header_style)
        .on_store_error(config.failure)
        .local_divisor(config.instances)
        // Axum's own body type: axum need not box each response again.
        .keep_body_type()
        .plans(entry.plan_map.clone())
        .overrides(overrides.clone());
    let layer = match entry.settle {
        SettleSpec::Reserved => layer,
        SettleSpec::Actual => layer.settle(Settle::actual_cost()),
        SettleSpec::Failures => layer.settle(Settle::count_only(|status| status.as_u16() >= 400)),
    };
    // The config checked the percentage (0 to 100), so this cannot fail.
    match layer.clone().enforce_percent(entry.enforce_percent) {
        Ok(ramped) => ramped,
        Err(_) => layer,
    }
}

/// The key extractor of `entry`.
pub(crate) fn app_key(config: &AppConfig, entry: &RouteConfig) -> AppKey {
    match &entry.key {
        KeySpec::Ip => AppKey::Ip(config.client_ip.clone()),
        KeySpec::User => AppKey::User(ExtensionKey::new()),
        KeySpec::Header(name) => AppKey::Header(HeaderKey::new(name.clone())),
        KeySpec::Global => AppKey::Global(GlobalKey),
    }
}

/// Installs the Prometheus recorder as the process's `metrics` recorder.
/// Call it before [`app`]: layers register their counters when built.
///
/// # Errors
///
/// When another recorder is installed already.
pub fn install_metrics() -> Result<PrometheusHandle, BuildError> {
    metrics_builder()?.install_recorder()
}

/// The Prometheus exporter's settings: every metric's `# HELP` line comes
/// from tollgate (`telemetry::describe`); the store latency is a histogram
/// with tollgate's buckets, not a summary.
///
/// # Errors
///
/// Never with tollgate's buckets (the exporter refuses none).
pub fn metrics_builder() -> Result<PrometheusBuilder, BuildError> {
    use tollgate::telemetry::{STORE_LATENCY, STORE_LATENCY_BUCKETS};
    PrometheusBuilder::new().set_buckets_for_metric(
        metrics_exporter_prometheus::Matcher::Full(STORE_LATENCY.to_owned()),
        STORE_LATENCY_BUCKETS,
    )
}

/// `GET /metrics`: every tollgate metric in the Prometheus text format.
pub fn metrics_route(handle: PrometheusHandle) -> Router {
    serve::record_route(Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let text = handle.render();
            async move {
                (
                    [(
                        http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    text,
                )
            }
        }),
    ))
}

/// The layers every request of the demo goes through, around `router`,
/// outermost first:
///
/// - a client's `x-request-id` is kept if it is [valid](serve::valid_request_id)
///   (at most [`MAX_REQUEST_ID_LEN`](serve::MAX_REQUEST_ID_LEN) bytes),
///   and removed if not; tower-http's `SetRequestIdLayer` then gives a
///   request without one a new UUID v4;
/// - tower-http's `TraceLayer`, whose `request` span
///   ([`RequestSpan`](serve::RequestSpan)) carries the request id, the
///   method, the matched route and tollgate's decision (the fields of
///   [`tollgate::trace`]), and which logs a failed response (a 5xx) at
///   most once a second ([`ThrottledFailureLog`](serve::ThrottledFailureLog));
/// - tower-http's `PropagateRequestIdLayer`: the response carries the
///   request's `x-request-id`.
///
/// `main` serves the app through it; a test can drive the result with
/// `oneshot`.
pub fn serve_layers(router: Router) -> Router {
    use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
    use tower_http::trace::TraceLayer;
    router.layer(
        tower::ServiceBuilder::new()
            .layer(serve::request_id_check())
            .layer(SetRequestIdLayer::new(serve::REQUEST_ID, MakeRequestUuid))
            .layer(
                TraceLayer::new_for_http()
                    .make_span_with(serve::RequestSpan)
                    .on_failure(serve::ThrottledFailureLog::default()),
            )
            .layer(PropagateRequestIdLayer::new(serve::REQUEST_ID)),
    )
}

fn handler(method: &str, path: &str) -> MethodRouter {
    let filter = match method {
        "POST" => MethodFilter::POST,
        _ => MethodFilter::GET,
    };
    match (method, path) {
        ("GET", "/health") => on(filter, || async { "ok\n" }),
        ("POST", "/login") => on(filter, login),
        ("POST", "/api/complete") => on(filter, complete),
        ("GET", "/api/items") => on(filter, list_items),
        ("POST", "/api/items") => on(filter, create_item),
        ("GET", "/api/search") => on(filter, search),
        ("GET", "/api/reports") => on(filter, reports),
        _ => on(filter, export),
    }
}

/// The credentials of a `Bearer` authorization, whose scheme is
/// case-insensitive (RFC 9110: `bearer x` is `Bearer x`).
pub(crate) fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, credentials) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"Bearer ")
        .then_some(credentials)
}

/// `Authorization: Bearer demo-<user>` authenticates as `<user>` on the
/// free plan, `Bearer demo-pro-<user>` on the pro plan; anything else gets
/// 401.
pub(crate) async fn demo_auth(mut request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| bearer(v.as_bytes()))
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.strip_prefix("demo-"));
    let (plan, user) = match token {
        Some(token) => match token.strip_prefix("pro-") {
            Some(user) => (Plan("pro"), user),
            None => (Plan("free"), token),
        },
        None => (Plan("free"), ""),
    };
    let user = Some(user)
        .filter(|user| !user.is_empty() && user.len() <= 64)
        .map(|user| UserId(user.to_owned()));
    match user {
        Some(user) => {
            request.extensions_mut().insert(user);
            request.extensions_mut().insert(plan);
            next.run(request).await
        }
        None => (
            StatusCode::UNAUTHORIZED,
            "use Authorization: Bearer demo-<user> (free plan) or Bearer demo-pro-<user> (pro plan)\n",
        )
            .into_response(),
    }
}

async fn list_items(Extension(user): Extension<UserId>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "user": user.0, "items": ["apple", "pear"] }))
}

async fn create_item(Extension(user): Extension<UserId>) -> (StatusCode, Json<serde_json::Value>) {
    (
        StatusCode::CREATED,
        Json(serde_json::json!({ "user": user.0, "created": true })),
    )
}

#[derive(Deserialize)]
struct SearchQuery {
    #[serde(default)]
    q: String,
}

async fn search(
    Extension(user): Extension<UserId>,
    Query(query): Query<SearchQuery>,
) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "user": user.0, "query": query.q, "results": [] }))
}

/// `GET /api/reports`: the caller's monthly report (a stand-in), under a
/// calendar-month quota in the bundled policy file.
async fn reports(Extension(user): Extension<UserId>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "user": user.0, "report": [] }))
}

/// `POST /login` with `{"password": "demo"}` succeeds; anything else is
/// 401 (a body that is not that JSON included).
async fn login(body: axum::body::Bytes) -> (StatusCode, &'static str) {
    #[derive(Deserialize)]
    struct Login {
        password: String,
    }
    match serde_json::from_slice::<Login>(&body) {
        Ok(login) if login.password == "demo" => (StatusCode::OK, "logged in (demo)\n"),
        _ => (StatusCode::UNAUTHORIZED, "wrong password\n"),
    }
}

#[derive(Deserialize)]
struct CompleteQuery {
    #[serde(default)]
    tokens: u64,
}

/// The most tokens a call to `/api/complete` may say it used.
const MAX_TOKENS: u64 = 100_000;

/// `POST /api/complete?tokens=N` stands in for an LLM call that used N
/// tokens, known only when it is done: it reports them to the layer, which
/// settles the request's reservation to them. A real service measures the
/// tokens itself; here the client says, so a count above [`MAX_TOKENS`],
/// or one that does not parse, is the client's mistake, a 400 that used no
/// tokens, rather than a charge that would lock the user out for years.
async fn complete(
    Extension(user): Extension<UserId>,
    query: Result<Query<CompleteQuery>, QueryRejection>,
) -> Result<
    (Extension<ActualCost>, Json<serde_json::Value>),
    (StatusCode, Extension<ActualCost>, String),
> {
    // Refused before the handler, it would keep its whole reservation.
    let Query(query) = query.map_err(|rejection| {
        let message = format!("{}\n", rejection.body_text());
        (StatusCode::BAD_REQUEST, Extension(ActualCost(0)), message)
    })?;
    if query.tokens > MAX_TOKENS {
        let message = format!("tokens must be at most {MAX_TOKENS}\n");
        return Err((StatusCode::BAD_REQUEST, Extension(ActualCost(0)), message));
    }
    let body = serde_json::json!({ "user": user.0, "completion": "...", "tokens": query.tokens });
    Ok((Extension(ActualCost(query.tokens)), Json(body)))
}

#[derive(Deserialize)]
struct ExportQuery {
    #[serde(default = "default_rows")]
    rows: u32,
}

fn default_rows() -> u32 {
    10
}

/// `GET /api/export?rows=N` (at most 1,000): an expensive export, streamed
/// one row per 100 ms; its in-flight slot is held until the last row is
/// out.
async fn export(
    Extension(user): Extension<UserId>,
    Query(query): Query<ExportQuery>,
) -> axum::body::Body {
    let rows = query.rows.min(1_000);
    let stream = futures::stream::unfold(0, move |row| {
        let user = user.clone();
        async move {
            if row == rows {
                return None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            let line = format!("export for {user}: row {row}\n");
            Some((Ok::<_, std::convert::Infallible>(line), row + 1))
        }
    });
    axum::body::Body::from_stream(stream)
}

/// The policy table printed at start-up.
pub fn policy_table(config: &AppConfig) -> String {
    let mut out = String::from("  METHOD PATH          KEY     POLICY\n");
    for r in &config.routes {
        let cost = match (r.cost, r.settle) {
            (1, SettleSpec::Reserved) => String::new(),
            (cost, SettleSpec::Reserved) => format!(", cost {cost}"),
            (cost, SettleSpec::Actual) => format!(", reserves {cost}, settles to the actual cost"),
            (_, SettleSpec::Failures) => ", counts failures only".to_owned(),
        };
        out.push_str(&format!(
            "  {:<6} {:<13} {:<7} {}{cost}\n",
            r.method,
            r.path,
            r.key.to_string(),
            r.policy
        ));
        for plan in &r.plans {
            let cost = match (plan.cost, r.settle) {
                (1, SettleSpec::Reserved) | (_, SettleSpec::Failures) => String::new(),
                (cost, SettleSpec::Reserved) => format!(", cost {cost}"),
                (cost, SettleSpec::Actual) => format!(", reserves {cost}"),
            };
            out.push_str(&format!(
                "  {:<6} {:<13} {:<7} {}{cost}\n",
                "",
                format!("  plan {}", plan.plan),
                "",
                plan.policy
            ));
        }
    }
    out
}
