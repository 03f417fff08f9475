//! Costs settled after the response: LLM tokens reserved and settled to
//! what was used, and logins where only failures count.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum_app::app;
use http::Request;
use tollgate::{BoxStore, FakeClock, MemoryStore, Timestamp};
use tollgate_redis::RedisStore;
use tollgate_tests::{require_redis, unique_prefix};
use tower::ServiceExt;

use super::{Seen, T0, config, json, send};

/// `POST /api/complete?tokens=N`: a reservation of 200 settled to the N
/// tokens used, the headers after settling, debt past the allowance; and
/// `/login`, where only failures count.
async fn settled(store: BoxStore, clock: &FakeClock) -> Vec<Seen> {
    clock.set(Timestamp::from_secs(T0));
    let app = app(&config(), store).layer(MockConnectInfo(SocketAddr::from((
        [198, 51, 100, 10],
        5555,
    ))));
    let mut seen = Vec::new();
    let complete = |tokens: u64| format!("/api/complete?tokens={tokens}");
    // What `GET /rate_limit` shows of a user's tokens. (The response's own
    // headers show the tightest of the route's limits, here the per-IP
    // one; the layer's tests check a settled response's headers.)
    let tokens_left = |user: &'static str, policy: &'static str| {
        let app = app.clone();
        async move {
            let request = Request::get("/rate_limit")
                .header("authorization", format!("Bearer demo-{user}"))
                .body(Body::empty())
                .unwrap();
            json(&app, request).await.1["resources"][policy]["remaining"]
                .as_u64()
                .unwrap()
        }
    };
    // 2,000 tokens a minute. Used 150 of the 200 reserved: 1,850 left.
    let s = send(&app, "POST", &complete(150), Some("cleo")).await;
    assert_eq!(s.status, 200);
    assert_eq!(tokens_left("cleo", "completion-tokens").await, 1_850);
    seen.push(s);
    // Used 1,900: 50 in debt. At 2,000 a minute (one per 30 ms), the next
    // reservation of 200 waits for 250 tokens: 7.5 s.
    let s = send(&app, "POST", &complete(1_900), Some("cleo")).await;
    assert_eq!(s.status, 200);
    assert_eq!(tokens_left("cleo", "completion-tokens").await, 0);
    seen.push(s);
    let s = send(&app, "POST", &complete(10), Some("cleo")).await;
    assert_eq!((s.status, s.get("retry-after")), (429, Some("8")));
    assert_eq!(s.get("x-ratelimit-resource"), Some("completion-tokens"));
    seen.push(s);
    clock.advance(Duration::from_millis(7_500));
    let s = send(&app, "POST", &complete(10), Some("cleo")).await;
    assert_eq!(s.status, 200);
    assert_eq!(tokens_left("cleo", "completion-tokens").await, 190);
    seen.push(s);
    // The pro plan: 20,000 a minute, reserving 1,000.
    let s = send(&app, "POST", &complete(300), Some("pro-cleo")).await;
    assert_eq!(s.status, 200);
    assert_eq!(
        tokens_left("pro-cleo", "completion-tokens-pro").await,
        19_700
    );
    seen.push(s);

    // Only `POST /login` is a login: six `GET /login` are answered 405,
    // limited by nothing and counted nowhere, and the right password then
    // logs in with the whole allowance left.
    for _ in 0..6 {
        let s = send(&app, "GET", "/login", None).await;
        assert_eq!((s.status, s.headers.len()), (405, 0));
        seen.push(s);
    }
    // Logins: successes are refunded, so any number pass; 5 failures lock
    // the client out, right password or not.
    let login = |password: &str| {
        Request::post("/login")
            .header("content-type", "application/json")
            .body(Body::from(format!(r#"{{"password": "{password}"}}"#)))
            .unwrap()
    };
    for _ in 0..8 {
        let res = app.clone().oneshot(login("demo")).await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.headers()["x-ratelimit-remaining"], "5");
    }
    for remaining in ["4", "3", "2", "1", "0"] {
        let res = app.clone().oneshot(login("hunter2")).await.unwrap();
        assert_eq!(res.status(), 401);
        assert_eq!(res.headers()["x-ratelimit-remaining"], remaining);
    }
    let res = app.clone().oneshot(login("demo")).await.unwrap();
    assert_eq!(res.status(), 429);
    seen
}

#[tokio::test]
async fn costs_settled_after_the_response_on_memory_and_the_same_on_redis() {
    let clock = FakeClock::default();
    let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let on_memory = settled(BoxStore::with_slots(memory), &clock).await;

    let url = require_redis().await;
    let redis = RedisStore::builder()
        .prefix(unique_prefix("app-settle"))
        .deadline(Duration::from_secs(5))
        .test_clock(clock.clone())
        .connect(url.as_str())
        .await
        .unwrap();
    let on_redis = settled(BoxStore::with_slots(redis), &clock).await;
    assert_eq!(on_memory, on_redis);
}
