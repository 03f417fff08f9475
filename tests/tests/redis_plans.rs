//! Plans chosen per request on the Redis store: each plan its own limit,
//! state and headers, exactly as on the memory store; a plan map's
//! `/rate_limit` and an operator's block, reset and status over every plan,
//! the same on Redis as on memory.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::Request;
use std::time::Duration;

use tollgate::{
    Algorithm, BoxStore, Choice, FakeClock, HeaderKey, Key, MemoryStore, PlanMap, Policy,
    RateLimitLayer, RateLimitReport, RateLimitStatus, Timestamp,
};
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
        .deadline(Duration::from_secs(2))
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

/// `/api` under a plan map (the `x-plan` header names the plan), its
/// `/rate_limit`, and an operator's block and reset of a user on every plan:
/// what each step shows.
async fn plans_and_operators(store: BoxStore, clock: &FakeClock) -> Vec<String> {
    clock.set(Timestamp::from_secs(1_700_000_040));
    let plans = PlanMap::builder(Policy::new("api", Algorithm::SlidingWindow, "3/min").unwrap())
        .plan(
            "pro",
            Choice::new(Policy::new("api-pro", Algorithm::Gcra, "10/min").unwrap()).cost(2),
        )
        .plan_from(|req: &Request<Body>| {
            Some(req.headers().get("x-plan")?.to_str().ok()?.to_owned())
        })
        .unwrap();
    let user = HeaderKey::new(http::HeaderName::from_static("x-user"));
    let layer = RateLimitLayer::new(plans.default_choice().policy().clone(), user.clone())
        .store(store.clone())
        .plans(plans.clone());
    let app = Router::new()
        .route("/api", get(|| async { "ok" }).layer(layer))
        .route(
            "/rate_limit",
            get(RateLimitStatus::new(store.clone()).route(user, plans.clone())),
        );
    let send = |path: &'static str, plan: &'static str| {
        let app = app.clone();
        async move {
            let req = Request::get(path)
                .header("x-user", "ada")
                .header("x-plan", plan)
                .body(Body::empty())
                .unwrap();
            let res = app.oneshot(req).await.unwrap();
            let status = res.status().as_u16();
            let body = axum::body::to_bytes(res.into_body(), 1 << 16)
                .await
                .unwrap();
            (status, String::from_utf8(body.to_vec()).unwrap())
        }
    };
    let mut seen = Vec::new();
    for _ in 0..2 {
        assert_eq!(send("/api", "pro").await.0, 200);
    }
    assert_eq!(send("/api", "free").await.0, 200);
    for plan in ["pro", "free", "gold"] {
        let (status, body) = send("/rate_limit", plan).await;
        assert_eq!(status, 200);
        seen.push(body);
    }
    let ada = Key::header("ada");
    plans
        .family()
        .block(&store, &ada, Duration::from_secs(90))
        .await
        .unwrap();
    assert_eq!(send("/api", "pro").await.0, 429);
    assert_eq!(send("/api", "free").await.0, 429);
    let blocked = plans.family().status(&store, &ada).await.unwrap();
    seen.push(RateLimitReport::new(blocked).to_json());
    plans.family().reset(&store, &ada).await.unwrap();
    assert_eq!(send("/api", "pro").await.0, 200);
    seen.push(send("/rate_limit", "pro").await.1);
    seen
}

#[tokio::test]
async fn a_plan_maps_rate_limit_and_operators_are_the_same_on_redis_as_on_memory() {
    let clock = FakeClock::default();
    let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let on_memory = plans_and_operators(BoxStore::new(memory), &clock).await;
    let t = 1_700_000_040;
    let entry = |name: &str, limit: u64, used: u64, reset: u64, rate: &str| {
        format!(
            r#"{{"limit":{limit},"used":{used},"remaining":{},"reset":{reset},"resource":"{name}","limits":[{{"rate":"{rate}","limit":{limit},"used":{used},"remaining":{},"reset":{reset}}}]}}"#,
            limit - used,
            limit - used,
        )
    };
    let report = |name: &str, e: String| format!(r#"{{"resources":{{"{name}":{e}}},"rate":{e}}}"#);
    // Pro: 2 requests of cost 2 under GCRA 10/min (one unit per 6 s).
    let pro = entry("api-pro", 10, 4, t + 24, "10/min");
    assert_eq!(on_memory[0], report("api-pro", pro));
    // Free, and a plan the map does not know: the default's 3/min (a
    // sliding window's request weighs on the next window too).
    let free = entry("api", 3, 1, t + 120, "3/min");
    assert_eq!(on_memory[1], report("api", free.clone()));
    assert_eq!(on_memory[2], report("api", free));
    // Blocked on both plans for 90 s.
    let blocked_api = entry("api", 3, 3, t + 90, "3/min");
    let blocked_pro = entry("api-pro", 10, 10, t + 90, "10/min");
    assert_eq!(
        on_memory[3],
        format!(
            r#"{{"resources":{{"api":{blocked_api},"api-pro":{blocked_pro}}},"rate":{blocked_api}}}"#
        )
    );
    // Reset: afresh on the pro plan.
    assert_eq!(
        on_memory[4],
        report("api-pro", entry("api-pro", 10, 2, t + 12, "10/min"))
    );

    let url = require_redis().await;
    let redis = RedisStore::builder()
        .prefix(unique_prefix("plan-map"))
        .deadline(Duration::from_secs(5))
        .test_clock(clock.clone())
        .connect(url.as_str())
        .await
        .unwrap();
    let on_redis = plans_and_operators(BoxStore::new(redis), &clock).await;
    assert_eq!(on_memory, on_redis);
}
