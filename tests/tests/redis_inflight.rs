//! The in-flight limit on Redis: three app instances, each with a store of
//! its own, share one limit per key exactly; slots come back on
//! completion, on client disconnect and on a handler panic; and the
//! memory store and Redis give the same answers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use tokio::sync::Semaphore;
use tollgate::{GlobalKey, InFlightLayer, InFlightLimit, Key, MemoryStore, SlotStore};
use tollgate_redis::RedisStore;
use tollgate_tests::{require_redis, unique_prefix};
use tower::ServiceExt;

async fn panics() -> &'static str {
    panic!("the handler failed")
}

async fn instance(prefix: &str, limit: &InFlightLimit, gate: &Gate) -> (Router, RedisStore) {
    let url = require_redis().await;
    let store = RedisStore::builder()
        .prefix(prefix)
        .deadline(Duration::from_secs(5))
        .connect(url.as_str())
        .await
        .unwrap();
    let layer = InFlightLayer::new(limit.clone(), GlobalKey).store(store.clone());
    let gate = gate.clone();
    let app = Router::new()
        .route(
            "/export",
            get(move || {
                let gate = gate.clone();
                async move {
                    let now = gate.running.fetch_add(1, Ordering::SeqCst) + 1;
                    gate.most.fetch_max(now, Ordering::SeqCst);
                    gate.go.acquire().await.unwrap().forget();
                    gate.running.fetch_sub(1, Ordering::SeqCst);
                    "exported"
                }
            }),
        )
        .route("/panic", get(panics))
        .route_layer(layer);
    (app, store)
}

#[derive(Clone)]
struct Gate {
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    go: Arc<Semaphore>,
}

fn export() -> Request<Body> {
    Request::get("/export").body(Body::empty()).unwrap()
}

/// Waits (real time, bounded) until `done`.
async fn until(what: &str, done: impl Fn() -> bool) {
    let started = std::time::Instant::now();
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(10), "{what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Whether a slot of the global key under `limit` is free now (taken and
/// given back at once to find out).
async fn is_free(store: &RedisStore, limit: &InFlightLimit) -> bool {
    let key = Key::global();
    let taken = store.acquire(&key, limit, 2_000).await.unwrap().acquired;
    if taken {
        store.release(&key, limit, 2_000).await.unwrap();
    }
    taken
}

/// Whether a slot comes free within a second: slots are given back by a
/// call in the background.
async fn comes_free(store: &RedisStore, limit: &InFlightLimit) -> bool {
    for _ in 0..200 {
        if is_free(store, limit).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_share_one_in_flight_limit_exactly() {
    let prefix = unique_prefix("inflight");
    let limit = InFlightLimit::new("exports", 5).unwrap();
    let gate = Gate {
        running: Arc::default(),
        most: Arc::default(),
        go: Arc::new(Semaphore::new(0)),
    };
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(instance(&prefix, &limit, &gate).await);
    }
    // 50 slow requests of one key, spread over the three instances.
    let calls: Vec<_> = (0..50)
        .map(|i| tokio::spawn(apps[i % 3].0.clone().oneshot(export())))
        .collect();
    until("5 requests run", || {
        gate.running.load(Ordering::SeqCst) == 5
    })
    .await;
    // The other 45 are turned away while the 5 run.
    until("45 requests answered", || {
        calls.iter().filter(|call| call.is_finished()).count() == 45
    })
    .await;
    gate.go.add_permits(5);
    let (mut ok, mut rejected) = (0, 0);
    for call in calls {
        let response = call.await.unwrap().unwrap();
        match response.status() {
            StatusCode::OK => {
                axum::body::to_bytes(Body::new(response.into_body()), 1024)
                    .await
                    .unwrap();
                ok += 1;
            }
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(response.headers()["x-concurrency-limit"], "5");
                rejected += 1;
            }
            other => panic!("{other}"),
        }
    }
    assert_eq!((ok, rejected), (5, 45));
    assert_eq!(gate.most.load(Ordering::SeqCst), 5);

    // Every slot is back (released in the background).
    let store = &apps[0].1;
    assert!(comes_free(store, &limit).await, "the slots came back");

    // A client that goes away, and a handler that panics, on another
    // instance than the one asking.
    let one = InFlightLimit::new("exports-one", 1).unwrap();
    let (app, _) = instance(&prefix, &one, &gate).await;
    let (_, other) = instance(&prefix, &one, &gate).await;
    let running = gate.running.load(Ordering::SeqCst);
    let call = tokio::spawn(app.clone().oneshot(export()));
    until("the request runs", || {
        gate.running.load(Ordering::SeqCst) == running + 1
    })
    .await;
    assert!(!is_free(&other, &one).await, "held while the request runs");
    call.abort();
    let _ = call.await;
    assert!(
        comes_free(&other, &one).await,
        "given back when the client went away"
    );
    let call = tokio::spawn(
        app.clone()
            .oneshot(Request::get("/panic").body(Body::empty()).unwrap()),
    );
    assert!(call.await.unwrap_err().is_panic());
    assert!(
        comes_free(&other, &one).await,
        "given back when the handler panicked"
    );
    gate.go.add_permits(10);
}

/// Acquire, renew and release give the same answers on memory and Redis.
#[tokio::test]
async fn memory_and_redis_hold_slots_alike() {
    let url = require_redis().await;
    let redis = RedisStore::builder()
        .prefix(unique_prefix("inflight-same"))
        .connect(url.as_str())
        .await
        .unwrap();
    let memory = MemoryStore::new();
    let limit = InFlightLimit::new("same", 3).unwrap();
    let key = Key::user("ada");
    let mut answers = [Vec::new(), Vec::new()];
    for (i, answers) in answers.iter_mut().enumerate() {
        let store: &dyn Fn(u8, u64) -> _ = &|op, holder| {
            let (redis, memory, key, limit) =
                (redis.clone(), memory.clone(), key.clone(), limit.clone());
            async move {
                let (acquired, held) = match (i, op) {
                    (0, 0) => {
                        let s = memory.acquire(&key, &limit, holder).await.unwrap();
                        (s.acquired, s.held)
                    }
                    (_, 0) => {
                        let s = redis.acquire(&key, &limit, holder).await.unwrap();
                        (s.acquired, s.held)
                    }
                    (0, 1) => (memory.renew(&key, &limit, holder).await.unwrap(), 0),
                    (_, 1) => (redis.renew(&key, &limit, holder).await.unwrap(), 0),
                    (0, _) => {
                        memory.release(&key, &limit, holder).await.unwrap();
                        (true, 0)
                    }
                    _ => {
                        redis.release(&key, &limit, holder).await.unwrap();
                        (true, 0)
                    }
                };
                (op, holder, acquired, held)
            }
        };
        // Take 4 (3 fit), renew a holder and one that holds nothing,
        // release one, take again.
        let script = [
            (0, 1),
            (0, 2),
            (0, 3),
            (0, 4),
            (1, 2),
            (1, 4),
            (2, 2),
            (0, 5),
            (0, 6),
            (2, 9),
        ];
        for (op, holder) in script {
            answers.push(store(op, holder).await);
        }
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(
        answers[0][..4]
            .iter()
            .map(|a| (a.2, a.3))
            .collect::<Vec<_>>(),
        [(true, 1), (true, 2), (true, 3), (false, 3)]
    );
}

/// Random sequences of acquire, renew and release on random limits: the
/// memory store and Redis give the same answers, case by case.
#[test]
fn slot_operations_agree_on_memory_and_redis_for_random_sequences() {
    use proptest::prelude::*;
    use std::sync::atomic::AtomicU64;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let redis = runtime.block_on(async {
        let url = require_redis().await;
        RedisStore::builder()
            .prefix(unique_prefix("inflight-prop"))
            .deadline(Duration::from_secs(5))
            .connect(url.as_str())
            .await
            .unwrap()
    });
    static CASE: AtomicU64 = AtomicU64::new(0);
    let ops = prop::collection::vec((0u8..3, 0u64..6), 1..40);
    let config = ProptestConfig {
        cases: 300,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(max in 1u64..5, ops in ops)| {
        let limit = InFlightLimit::new("prop", max).unwrap();
        let key = Key::user(format!("case-{}", CASE.fetch_add(1, Ordering::Relaxed)));
        let memory = MemoryStore::new();
        let (on_memory, on_redis) = runtime.block_on(async {
            let mut answers = (Vec::new(), Vec::new());
            for &(op, holder) in &ops {
                let (m, r) = match op {
                    0 => (
                        memory.acquire(&key, &limit, holder).await.map(|s| (s.acquired, s.held)),
                        redis.acquire(&key, &limit, holder).await.map(|s| (s.acquired, s.held)),
                    ),
                    1 => (
                        memory.renew(&key, &limit, holder).await.map(|r| (r, 0)),
                        redis.renew(&key, &limit, holder).await.map(|r| (r, 0)),
                    ),
                    _ => (
                        memory.release(&key, &limit, holder).await.map(|()| (true, 0)),
                        redis.release(&key, &limit, holder).await.map(|()| (true, 0)),
                    ),
                };
                answers.0.push(m.unwrap());
                answers.1.push(r.unwrap());
            }
            answers
        });
        prop_assert_eq!(on_memory, on_redis, "{:?}", ops);
    });
}
