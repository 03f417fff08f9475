//! The demo on Redis: two instances share one usage ledger, and `GET
//! /usage` on either, or on an instance started afterwards, shows every
//! request made through both, to the unit.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum_app::{AppConfig, AppLedger, app};
use http::Request;
use tollgate::ledger::MeteredStore;
use tollgate::{BoxStore, FakeClock, Timestamp};
use tollgate_redis::{RedisLedger, RedisStore};
use tollgate_tests::{require_redis, unique_prefix};
use tower::ServiceExt;

/// An instance of the demo on the Redis at `url`, under `prefix`, at
/// `clock`'s time.
async fn instance(url: &str, prefix: &str, clock: &FakeClock) -> Router {
    let config = AppConfig::parse(include_str!("../../examples/axum-app/policies.toml")).unwrap();
    let store = RedisStore::builder()
        .prefix(prefix)
        .deadline(Duration::from_secs(10))
        .response_timeout(Duration::from_secs(10))
        .test_clock(clock.clone())
        .connect(url)
        .await
        .unwrap();
    let ledger = AppLedger::Redis(RedisLedger::builder(&store).build().unwrap());
    let store = BoxStore::with_slots(MeteredStore::new(store, ledger.clone()));
    app(&config, store)
        .merge(axum_app::usage::routes(&config, &ledger, None))
        .layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 8], 4000))))
}

async fn send(app: &Router, method: &str, uri: &str, user: &str) -> (u16, String) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer demo-{user}"))
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

async fn totals(app: &Router) -> (u64, u64) {
    let uri = "/usage?granularity=day&from=2026-01-15&to=2026-01-16";
    let (status, body) = send(app, "GET", uri, "ada").await;
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let total = |p: &str| json["usage"][p]["total"].as_u64().unwrap();
    (total("items-write"), total("completion-tokens"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_on_redis_is_shared_and_survives_a_restart() {
    let url = require_redis().await;
    let prefix = unique_prefix("demo-usage");
    // 2026-01-15 12:00 UTC.
    let clock = FakeClock::new(Timestamp::from_secs(1_768_478_400));
    let a = instance(&url, &prefix, &clock).await;
    let b = instance(&url, &prefix, &clock).await;
    let (mut written, mut tokens) = (0, 0);
    for i in 0..24u64 {
        let app = if i % 2 == 0 { &a } else { &b };
        let (status, _) = send(app, "POST", "/api/items", "ada").await;
        written += u64::from(status == 201);
        let used = i * 7 % 300;
        let (status, _) = send(app, "POST", &format!("/api/complete?tokens={used}"), "ada").await;
        if status == 200 {
            tokens += used;
        }
    }
    assert_eq!(written, 20, "20 a minute, shared by both instances");
    // Each instance flushes its own records before it answers: once `a`
    // has, `b` answers for both, and then `a` too.
    totals(&a).await;
    assert_eq!(totals(&b).await, (written, tokens));
    assert_eq!(totals(&a).await, (written, tokens));
    drop((a, b));
    let restarted = instance(&url, &prefix, &clock).await;
    assert_eq!(totals(&restarted).await, (written, tokens));
}
