//! The demo's traces: each request's span, made by tower-http's
//! `TraceLayer` in `serve_layers`, carries its request id, method, matched
//! route and tollgate's decision; the response echoes the request id.
//! The spans are captured by a `tracing-subscriber` layer, exactly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum_app::{AppConfig, app, serve_layers};
use http::{Request, Response};
use tollgate::{BoxStore, FakeClock, MemoryStore, Timestamp};
use tollgate_redis::RedisStore;
use tower::ServiceExt;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// The fields of one span, by name, as text.
type Fields = BTreeMap<String, String>;

/// Every span made, in order, with the fields it has been given.
#[derive(Clone, Default)]
struct Spans {
    made: Arc<Mutex<Vec<(&'static str, Fields)>>>,
    /// A live span's place in `made` (the registry reuses the ids of
    /// closed spans).
    live: Arc<Mutex<HashMap<Id, usize>>>,
}

struct Text<'a>(&'a mut Fields);

impl Visit for Text<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = Fields::new();
        attrs.record(&mut Text(&mut fields));
        let mut made = self.made.lock().unwrap();
        made.push((attrs.metadata().name(), fields));
        self.live.lock().unwrap().insert(id.clone(), made.len() - 1);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let Some(&at) = self.live.lock().unwrap().get(id) else {
            return;
        };
        values.record(&mut Text(&mut self.made.lock().unwrap()[at].1));
    }
}

impl Spans {
    /// The `request` spans made since the last call.
    fn take_requests(&self) -> Vec<Fields> {
        let made = std::mem::take(&mut *self.made.lock().unwrap());
        self.live.lock().unwrap().clear();
        made.into_iter()
            .filter(|(name, _)| *name == "request")
            .map(|(_, fields)| fields)
            .collect()
    }
}

fn fields(pairs: &[(&str, &str)]) -> Fields {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The bundled policy file.
fn config() -> AppConfig {
    AppConfig::parse(include_str!("../policies.toml")).unwrap()
}

/// The demo as `main` serves it: its router behind a fallback service,
/// through `serve_layers`, every request from one client address.
fn served(store: BoxStore) -> Router {
    serve_layers(Router::new().fallback_service(app(&config(), store)))
        .layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 9], 5555))))
}

/// On the memory store, on a clock that stands still.
fn on_memory() -> Router {
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    served(BoxStore::new(store))
}

async fn get(app: &Router, uri: &str, user: &str, request_id: Option<&str>) -> Response<Body> {
    let mut request = Request::get(uri).header("authorization", format!("Bearer demo-{user}"));
    if let Some(id) = request_id {
        request = request.header("x-request-id", id);
    }
    app.clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap()
}

fn header<'a>(response: &'a Response<Body>, name: &str) -> &'a str {
    response.headers()[name].to_str().unwrap()
}

/// A request id the demo made: a UUID (version 4, random).
fn assert_generated(id: &str) {
    let uuid = uuid::Uuid::parse_str(id).unwrap_or_else(|e| panic!("{id}: {e}"));
    assert_eq!(uuid.get_version_num(), 4, "{id}");
    assert_eq!(uuid.hyphenated().to_string(), id);
}

#[tokio::test]
async fn an_admitted_request_s_span_names_the_innermost_policy_and_the_store() {
    let spans = Spans::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let app = on_memory();

    // `GET /api/items` passes two layers: per IP (`api-ip`), then per
    // user (`items-read`); the innermost that admitted is on the span.
    let response = get(&app, "/api/items", "ada", Some("client-7f3a")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-request-id"), "client-7f3a");
    assert_eq!(
        spans.take_requests(),
        [fields(&[
            ("request_id", "client-7f3a"),
            ("method", "GET"),
            ("path", "/api/items"),
            ("tollgate.policy", "items-read"),
            ("tollgate.outcome", "allowed"),
            ("tollgate.store", "memory"),
        ])]
    );

    // The route, not the raw path's query; a pro user's plan policy.
    let response = get(&app, "/api/items?page=2", "pro-bo", None).await;
    assert_eq!(response.status(), 200);
    let id = header(&response, "x-request-id");
    assert_generated(id);
    assert_eq!(
        spans.take_requests(),
        [fields(&[
            ("request_id", id),
            ("method", "GET"),
            ("path", "/api/items"),
            ("tollgate.policy", "items-read-pro"),
            ("tollgate.outcome", "allowed"),
            ("tollgate.store", "memory"),
        ])]
    );
}

#[tokio::test]
async fn a_refused_request_s_span_names_the_policy_and_the_limit_that_fired() {
    let spans = Spans::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let app = on_memory();

    // `items-read`: 5/s with bursts of 10, on a clock that stands still.
    for _ in 0..10 {
        assert_eq!(get(&app, "/api/items", "ada", None).await.status(), 200);
    }
    spans.take_requests();
    let response = get(&app, "/api/items", "ada", None).await;
    assert_eq!(response.status(), 429);
    assert_eq!(
        header(&response, "tollgate-exceeded"),
        "items-read; limit=5/s"
    );
    let id = header(&response, "x-request-id");
    assert_generated(id);
    assert_eq!(
        spans.take_requests(),
        [fields(&[
            ("request_id", id),
            ("method", "GET"),
            ("path", "/api/items"),
            ("tollgate.policy", "items-read"),
            ("tollgate.outcome", "limited"),
            ("tollgate.limit", "5/s"),
            ("tollgate.store", "memory"),
        ])]
    );

    // The outer layer refuses: 120 API calls a minute per IP, whoever
    // the users are. Its refusal is on the span, not the inner layer.
    for user in 0..109 {
        let response = get(&app, "/api/items", &format!("u{user}"), None).await;
        assert_eq!(response.status(), 200, "call {user}");
    }
    spans.take_requests();
    let response = get(
        &app,
        "/api/items",
        "cy",
        Some("a-very-long-id-".repeat(5).as_str()),
    )
    .await;
    assert_eq!(response.status(), 429);
    assert_eq!(
        header(&response, "tollgate-exceeded"),
        "api-ip; limit=120/min"
    );
    // An id over 64 bytes is not kept: the demo makes one.
    let id = header(&response, "x-request-id");
    assert_generated(id);
    assert_eq!(
        spans.take_requests(),
        [fields(&[
            ("request_id", id),
            ("method", "GET"),
            ("path", "/api/items"),
            ("tollgate.policy", "api-ip"),
            ("tollgate.outcome", "limited"),
            ("tollgate.limit", "120/min"),
            ("tollgate.store", "memory"),
        ])]
    );
}

/// A local port with nothing listening: one the system gave out and took
/// back.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test]
async fn when_redis_fails_the_span_tells_the_failure_policy_s_answer() {
    let spans = Spans::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    // The file's failure policy is `local`: the in-memory fallback decides.
    let url = format!("redis://127.0.0.1:{}", closed_port());
    let store = RedisStore::connect(&url).await.unwrap();
    let app = served(BoxStore::new(store));

    let response = get(&app, "/api/items", "ada", Some("bad id with spaces")).await;
    assert_eq!(response.status(), 200);
    let id = header(&response, "x-request-id");
    assert_generated(id);
    assert_eq!(
        spans.take_requests(),
        [fields(&[
            ("request_id", id),
            ("method", "GET"),
            ("path", "/api/items"),
            ("tollgate.policy", "items-read"),
            ("tollgate.fallback", "local_allowed"),
            ("tollgate.outcome", "allowed"),
            ("tollgate.store", "redis"),
        ])]
    );
}
