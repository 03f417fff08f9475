//! The store behind the layer: one limit shared by clones and separate
//! `Layer::layer` calls, the failure modes, and the local fallback.

use std::convert::Infallible;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, Response, StatusCode};
use tollgate::{
    Algorithm, FailureMode, FakeClock, GlobalKey, HeaderKey, MemoryStore, Policy, RateLimitLayer,
    Timestamp,
};
use tower::{Service, ServiceExt, service_fn};

use super::{T0, clock_and_store, get_root, header};

#[tokio::test]
async fn clones_and_separate_layer_calls_share_one_limit() {
    let (_, store) = clock_and_store();
    let policy = Policy::new("shared", Algorithm::SlidingLog, "5/min").unwrap();
    let layer = RateLimitLayer::new(policy, GlobalKey).store(store);
    let inner =
        service_fn(|_: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) });
    let a = tower::Layer::layer(&layer, inner);
    let b = tower::Layer::layer(&layer, inner);
    let mut services = [a.clone(), a, b.clone(), b];
    let mut allowed = 0;
    for i in 0..20 {
        let svc = &mut services[i % 4];
        let res = svc.ready().await.unwrap().call(get_root()).await.unwrap();
        allowed += usize::from(res.status() == StatusCode::OK);
    }
    assert_eq!(allowed, 5);
}

/// A store that holds a single key, on a clock stopped at `T0`: its key
/// never expires to make room for another.
fn one_key_store() -> MemoryStore {
    MemoryStore::builder()
        .max_keys(1)
        .clock(FakeClock::new(Timestamp::from_secs(T0)))
        .build()
        .unwrap()
}

#[tokio::test]
async fn store_failures_follow_the_failure_mode() {
    // One key fits; a second key finds the store full.
    let store = one_key_store();
    let policy = Policy::new("full", Algorithm::FixedWindow, "5/min").unwrap();
    let by_header = HeaderKey::new(http::HeaderName::from_static("x-client"));
    let request = |client: &str| {
        Request::get("/")
            .header("x-client", client)
            .body(Body::empty())
            .unwrap()
    };
    let open = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(policy.clone(), by_header.clone())
            .store(store.clone())
            .on_store_error(FailureMode::Open),
    );
    assert_eq!(
        header(
            &open.clone().oneshot(request("a")).await.unwrap(),
            "x-ratelimit-remaining"
        ),
        Some("4")
    );
    let res = open.oneshot(request("b")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-ratelimit-remaining"), None);

    let closed = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(policy.clone(), by_header.clone())
            .store(store.clone())
            .on_store_error(FailureMode::Closed),
    );
    let res = closed.oneshot(request("b")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&res, "retry-after"), Some("1"));

    // Closed, as a gRPC server: UNAVAILABLE, to be retried in a second.
    let grpc = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(policy, by_header)
            .store(store)
            .on_store_error(FailureMode::Closed)
            .grpc(),
    );
    let res = grpc.oneshot(request("b")).await.unwrap();
    assert_eq!(header(&res, "grpc-status"), Some("14"));
    assert_eq!(header(&res, "retry-after"), Some("1"));
    assert_eq!(header(&res, "grpc-retry-pushback-ms"), Some("1000"));

    // Local: the same policy goes on in memory.
    let fallback = MemoryStore::builder()
        .clock(FakeClock::new(Timestamp::from_secs(T0)))
        .build()
        .unwrap();
    let policy = Policy::new("full", Algorithm::FixedWindow, "5/min").unwrap();
    let local = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(
            policy,
            HeaderKey::new(http::HeaderName::from_static("x-client")),
        )
        .store(one_key_store())
        .on_store_error(FailureMode::Local)
        .local_fallback(fallback.clone()),
    );
    local.clone().oneshot(request("a")).await.unwrap();
    let statuses: Vec<u16> = {
        let mut v = Vec::new();
        for _ in 0..6 {
            v.push(
                local
                    .clone()
                    .oneshot(request("b"))
                    .await
                    .unwrap()
                    .status()
                    .as_u16(),
            );
        }
        v
    };
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    assert_eq!(fallback.len(), 1, "b lives in the fallback store");
}

#[tokio::test]
async fn separate_layer_calls_share_the_local_fallback() {
    // axum calls `Layer::layer` per request when a `Router<()>` is used as a
    // service directly: the fallback must not start empty each time.
    let full = one_key_store();
    full.check_sync(
        &tollgate::Key::custom("filler"),
        &Policy::new("x", Algorithm::FixedWindow, "1/h").unwrap(),
        1,
    )
    .unwrap();
    // The default fallback runs on the system clock: GCRA, which has no
    // window that could end between two requests.
    let policy = Policy::new("fallback", Algorithm::Gcra, "3/min").unwrap();
    let layer = RateLimitLayer::new(policy, GlobalKey)
        .store(full)
        .on_store_error(FailureMode::Local);
    let inner =
        service_fn(|_: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) });
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let svc = tower::Layer::layer(&layer, inner);
        statuses.push(svc.oneshot(get_root()).await.unwrap().status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
}
