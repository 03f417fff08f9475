//! Plans chosen per request on the Redis store: each plan its own limit,
//! state and headers, exactly as on the memory store.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::Request;
use tollgate::{Algorithm, FakeClock, HeaderKey, Policy, RateLimitLayer, Timestamp};
use tollgate_redis::RedisStore;
use tollgate_tests::{require_redis, unique_prefix};
use tower::ServiceExt;

fn as_user(user: &str, plan: &str) -> Request<Body> {
    Request::get("/")
        .header("x-user", user)
        .header("x-plan", plan)
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn each_plan_has_its_own_limit_on_redis() {
    let url = require_redis().await;
    let store = RedisStore::builder()
        .prefix(unique_prefix("plans"))
        .test_clock(FakeClock::new(Timestamp::from_secs(1_700_000_040)))
        .connect(url.as_str())
        .await
        .unwrap();
    let free = Policy::new("api-free", Algorithm::SlidingWindow, "3/min").unwrap();
    let pro = Policy::new("api-pro", Algorithm::SlidingWindow, "7/min").unwrap();
    let layer = RateLimitLayer::new(
        free,
        HeaderKey::new(http::HeaderName::from_static("x-user")),
    )
    .store(store)
    .choose_policy(move |req: &Request<Body>| {
        (req.headers().get("x-plan")? == "pro").then(|| pro.clone())
    });
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);

    let mut seen = Vec::new();
    for (user, plan) in [("ada", "free"), ("bob", "pro"), ("ada", "pro")] {
        let mut admitted = 0;
        for _ in 0..10 {
            let res = app.clone().oneshot(as_user(user, plan)).await.unwrap();
            admitted += usize::from(res.status() == 200);
            let header = |name: &str| res.headers()[name].to_str().unwrap().to_owned();
            seen.push((header("x-ratelimit-resource"), header("x-ratelimit-limit")));
        }
        let expected = if plan == "pro" { 7 } else { 3 };
        assert_eq!(admitted, expected, "{user} on {plan}");
    }
    // Every response named its plan's policy and limit.
    assert!(
        seen[..10]
            .iter()
            .all(|s| *s == ("api-free".into(), "3".into()))
    );
    assert!(
        seen[10..]
            .iter()
            .all(|s| *s == ("api-pro".into(), "7".into()))
    );
}
