//! The layer through `oneshot`, without TCP.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

#[path = "layer/headers.rs"]
mod headers;
#[path = "layer/rejections.rs"]
mod rejections;
#[path = "layer/routing.rs"]
mod routing;
#[path = "layer/stores.rs"]
mod stores;
#[path = "layer/waiting.rs"]
mod waiting;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, Response};
use tollgate::{FakeClock, GlobalKey, MemoryStore, RateLimitLayer, Timestamp};

/// 10:00:40 UTC on 2023-11-14; a whole minute.
const T0: u64 = 1_700_000_040;

fn clock_and_store() -> (FakeClock, MemoryStore) {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    (clock, store)
}

fn app(layer: RateLimitLayer<GlobalKey, MemoryStore>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

fn get_root() -> Request<Body> {
    Request::get("/").body(Body::empty()).unwrap()
}

fn header<'a>(res: &'a Response<impl Sized>, name: &str) -> Option<&'a str> {
    res.headers().get(name).map(|v| v.to_str().unwrap())
}

async fn body_json(
    res: Response<impl http_body::Body<Error = impl std::fmt::Debug>>,
) -> serde_json::Value {
    let bytes = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}
