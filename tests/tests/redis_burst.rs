//! One client's burst is that client's business: 2,000 requests at once
//! from one user on a three-limit policy admit exactly the limit, none of
//! them meets the failure policy, and another user polling meanwhile gets
//! only 200s, under every failure mode, with the store's default deadline
//! and breaker; and the same on a single-limit policy, whose requests share
//! batched calls with every other key's. Requests dropped on their way to
//! Redis are not Redis failing either.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::BTreeMap;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use tollgate::{Algorithm, ExtensionKey, FailureMode, Policy, RateLimitLayer};
use tollgate_redis::RedisStore;
use tollgate_tests::{RedisServer, require_redis, unique_prefix};
use tower::ServiceExt;

fn request(user: &str) -> Request<Body> {
    let mut request = Request::get("/").body(Body::empty()).unwrap();
    request.extensions_mut().insert(user.to_owned());
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_2000_from_one_user_admits_exactly_the_limit_and_fails_nobody() {
    let url = require_redis().await;
    // Three limits (the general script); at 100 an hour, GCRA gives one
    // back every 36 s, far longer than the burst takes.
    let three = Policy::builder("burst")
        .algorithm(Algorithm::Gcra)
        .limit("100/h")
        .limit("1000/d")
        .limit("5000/7d")
        .build()
        .unwrap();
    // One limit (the one-time script, whose requests of all keys batch).
    let one = Policy::new("burst-one", Algorithm::Gcra, "100/h").unwrap();
    for (policy, failure) in [
        (&three, FailureMode::Open),
        (&three, FailureMode::Closed),
        (&three, FailureMode::Local),
        (&one, FailureMode::Closed),
    ] {
        // The store's defaults: a 50 ms deadline and the circuit breaker.
        let store = RedisStore::builder()
            .prefix(unique_prefix("burst"))
            .connect(url.as_str())
            .await
            .unwrap();
        let app = Router::new().route("/", get(|| async { "ok" })).layer(
            RateLimitLayer::new(policy.clone(), ExtensionKey::<String>::new())
                .store(store.clone())
                .on_store_error(failure),
        );
        let burst: Vec<_> = (0..2_000)
            .map(|_| {
                let app = app.clone();
                tokio::spawn(async move { app.oneshot(request("burst")).await.unwrap().status() })
            })
            .collect();
        // Another user, polling while the burst is under way.
        let poller = {
            let app = app.clone();
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..40 {
                    statuses.push(
                        app.clone()
                            .oneshot(request("other"))
                            .await
                            .unwrap()
                            .status(),
                    );
                    tokio::task::yield_now().await;
                }
                statuses
            })
        };
        let mut counts: BTreeMap<u16, usize> = BTreeMap::new();
        for task in burst {
            *counts.entry(task.await.unwrap().as_u16()).or_default() += 1;
        }
        let expected: BTreeMap<u16, usize> = [(200, 100), (429, 1_900)].into();
        let case = format!("{policy}, {failure:?}");
        assert_eq!(counts, expected, "{case}");
        let other = poller.await.unwrap();
        assert!(
            other.iter().all(|s| *s == StatusCode::OK),
            "{case}: the other user got {other:?}"
        );
        assert_eq!(
            store.breaker_state(),
            tollgate_redis::BreakerState::Closed,
            "{failure:?}"
        );
    }
}

/// Clients that go away while their decision is on its way to Redis (or a
/// timeout above the store that gives up on it) are not Redis failing:
/// twenty requests dropped mid-call leave a breaker of three failures
/// closed, and the next request is decided by Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_dropped_on_their_way_to_redis_do_not_open_the_breaker() {
    use tollgate::{Key, Store};
    use tollgate_redis::BreakerState;

    let server = RedisServer::spawn();
    let url = server.url();
    let store = RedisStore::builder()
        .prefix(unique_prefix("burst-dropped"))
        .deadline(std::time::Duration::from_secs(2))
        .circuit_breaker(3, std::time::Duration::from_secs(30))
        .connect(url.as_str())
        .await
        .unwrap();
    let policy = Policy::new("dropped", Algorithm::Gcra, "1000/s").unwrap();
    // Connected first; then every request is surely still waiting when
    // it is dropped.
    let first = store.check(&Key::user("first"), &policy, 1).await.unwrap();
    assert!(first.is_allowed());
    server.pause_writes(300);
    for i in 0..20 {
        let key = Key::user(format!("gone-{i}"));
        let mut deciding = Box::pin(store.check(&key, &policy, 1));
        assert!(
            futures::poll!(deciding.as_mut()).is_pending(),
            "on its way to Redis"
        );
        drop(deciding);
    }
    assert_eq!(store.breaker_state(), BreakerState::Closed);
    let decision = store.check(&Key::user("stays"), &policy, 1).await.unwrap();
    assert!(decision.is_allowed());
}
