//! The in-flight limit while Redis is down follows the failure policy as
//! the rate limit does: `closed` refuses with 503, `open` lets every
//! request run, and `local` enforces the limit in memory, this instance's
//! share of it. A give-back the store fails is tried again.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use futures::future::join_all;
use http::Request;
use tokio::sync::Semaphore;
use tollgate::{
    FailureMode, GlobalKey, InFlightLayer, InFlightLimit, Key, MemoryStore, SlotStore, StoreError,
};
use tollgate_redis::{BreakerState, RedisStore};
use tollgate_tests::{RedisServer, unique_prefix};
use tower::ServiceExt;

/// A route `/export` under `layer` whose handler counts itself running,
/// then waits for a permit of the semaphore returned: the route, how many
/// ran, and the semaphore.
fn exports(
    layer: InFlightLayer<GlobalKey, RedisStore>,
) -> (Router, Arc<AtomicUsize>, Arc<Semaphore>) {
    let running = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(Semaphore::new(0));
    let app = {
        let (running, go) = (running.clone(), go.clone());
        Router::new()
            .route(
                "/export",
                get(move || {
                    let (running, go) = (running.clone(), go.clone());
                    async move {
                        running.fetch_add(1, Ordering::SeqCst);
                        go.acquire().await.unwrap().forget();
                        "exported"
                    }
                }),
            )
            .route_layer(layer)
    };
    (app, running, go)
}

/// Ten requests of one key at once, through an in-flight limit of 4
/// shared by two instances, on a Redis that is down: how many ran at once,
/// and the status of each answer the layer gave itself.
async fn ten_at_once(store: &RedisStore, mode: FailureMode) -> (usize, Vec<u16>) {
    let limit = InFlightLimit::new("exports", 4).unwrap();
    let layer = InFlightLayer::new(limit, GlobalKey)
        .store(store.clone())
        .on_store_error(mode)
        .local_divisor(NonZeroU64::new(2).unwrap())
        .local_fallback(MemoryStore::new());
    let (app, running, go) = exports(layer);
    let answered = Arc::new(AtomicUsize::new(0));
    let requests: Vec<_> = (0..10)
        .map(|_| {
            let (app, answered) = (app.clone(), answered.clone());
            tokio::spawn(async move {
                let request = Request::get("/export").body(Body::empty()).unwrap();
                let response = app.oneshot(request).await.unwrap();
                let status = response.status().as_u16();
                if status != 200 {
                    answered.fetch_add(1, Ordering::SeqCst);
                }
                let _ = axum::body::to_bytes(response.into_body(), 1 << 20).await;
                status
            })
        })
        .collect();
    // Every request is running or answered by the layer; then the runners
    // finish.
    let started = std::time::Instant::now();
    while running.load(Ordering::SeqCst) + answered.load(Ordering::SeqCst) < 10 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "requests stuck"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let at_once = running.load(Ordering::SeqCst);
    go.add_permits(10);
    let statuses = join_all(requests)
        .await
        .into_iter()
        .map(Result::unwrap)
        .filter(|&status| status != 200)
        .collect();
    (at_once, statuses)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_flight_limit_follows_the_failure_policy_while_redis_is_down() {
    let mut server = RedisServer::spawn();
    let store = RedisStore::builder()
        .prefix(unique_prefix("inflight-down"))
        .deadline(Duration::from_millis(200))
        .connect(server.url().as_str())
        .await
        .unwrap();
    server.kill();

    let (at_once, refused) = ten_at_once(&store, FailureMode::Local).await;
    assert_eq!(at_once, 2, "local: this instance's half of the limit");
    assert_eq!(refused, vec![429; 8]);

    let (at_once, refused) = ten_at_once(&store, FailureMode::Open).await;
    assert_eq!((at_once, refused), (10, vec![]), "open: every request runs");

    let (at_once, refused) = ten_at_once(&store, FailureMode::Closed).await;
    assert_eq!(at_once, 0);
    assert_eq!(refused, vec![503; 10], "closed: every request refused");
}

/// A slot whose give-back finds the store's breaker open is given back
/// once the breaker closes. Sent once and lost, it held the key's only
/// slot for the rest of its lease (30 s): every request of the key was
/// refused long after Redis was fine again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_that_finds_the_breaker_open_is_tried_again() {
    let server = RedisServer::spawn();
    // One failure opens the breaker, for 2 s.
    let store = RedisStore::builder()
        .prefix(unique_prefix("inflight-breaker"))
        .deadline(Duration::from_millis(100))
        .circuit_breaker(1, Duration::from_secs(2))
        .connect(server.url().as_str())
        .await
        .unwrap();
    let limit = InFlightLimit::new("exports", 1).unwrap();
    assert_eq!(limit.lease_duration(), Duration::from_secs(30));
    let layer = InFlightLayer::new(limit.clone(), GlobalKey)
        .store(store.clone())
        .on_store_error(FailureMode::Closed);
    let (app, running, go) = exports(layer);
    // An export takes the key's only slot, and runs.
    let export = tokio::spawn({
        let app = app.clone();
        async move {
            let request = Request::get("/export").body(Body::empty()).unwrap();
            let response = app.oneshot(request).await.unwrap();
            let status = response.status().as_u16();
            let _ = axum::body::to_bytes(response.into_body(), 1 << 20).await;
            status
        }
    });
    let started = std::time::Instant::now();
    while running.load(Ordering::SeqCst) == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "export stuck");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Redis stalls for 1.5 s: a call misses its deadline, and the breaker
    // opens (another limit's slot, so as not to touch the export's).
    server.pause_writes(1_500);
    let other = InFlightLimit::new("other", 1).unwrap();
    let tripped = SlotStore::acquire(&store, &Key::global(), &other, 1).await;
    assert!(tripped.is_err(), "{tripped:?}");
    let refused = SlotStore::acquire(&store, &Key::global(), &other, 2).await;
    assert!(
        matches!(refused, Err(StoreError::CircuitOpen)),
        "{refused:?}"
    );
    // The export ends while the breaker is open: its give-back is refused.
    go.add_permits(1);
    assert_eq!(export.await.unwrap(), 200);
    assert_eq!(store.breaker_state(), BreakerState::Open);
    // Once the breaker closes, the slot is given back: a new holder takes
    // it, within seconds, not the 30 s of the lease.
    let freed = std::time::Instant::now();
    loop {
        let slots = SlotStore::acquire(&store, &Key::global(), &limit, 3).await;
        if slots.as_ref().is_ok_and(|slots| slots.acquired) {
            break;
        }
        assert!(
            freed.elapsed() < Duration::from_secs(8),
            "the export's slot is still held: {slots:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Requests running on slots taken in Redis count in the local fallback
/// when Redis fails: with a limit of 4 shared by two instances (a share
/// of 2) and two exports of this instance running, the next two requests
/// are refused locally, told this instance's share, not run beside them.
/// The fallback counted only the slots it gave itself, and the instance
/// ran twice its share through the outage (and told the whole limit).
/// Once the exports end, the fallback's slots are free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_held_in_redis_count_in_the_local_fallback_when_redis_fails() {
    let mut server = RedisServer::spawn();
    let store = RedisStore::builder()
        .prefix(unique_prefix("inflight-held-down"))
        .deadline(Duration::from_millis(200))
        .connect(server.url().as_str())
        .await
        .unwrap();
    let limit = InFlightLimit::new("exports", 4).unwrap();
    let layer = InFlightLayer::new(limit, GlobalKey)
        .store(store.clone())
        .on_store_error(FailureMode::Local)
        .local_divisor(NonZeroU64::new(2).unwrap())
        .local_fallback(MemoryStore::new());
    let (app, running, go) = exports(layer);
    let send = |app: &Router| {
        let app = app.clone();
        tokio::spawn(async move {
            let request = Request::get("/export").body(Body::empty()).unwrap();
            let response = app.oneshot(request).await.unwrap();
            let status = response.status().as_u16();
            let told = response
                .headers()
                .get("x-concurrency-limit")
                .map(|v| v.to_str().unwrap().to_owned());
            let _ = axum::body::to_bytes(response.into_body(), 1 << 20).await;
            (status, told)
        })
    };
    let held = [send(&app), send(&app)];
    let started = std::time::Instant::now();
    while running.load(Ordering::SeqCst) < 2 {
        assert!(started.elapsed() < Duration::from_secs(10), "exports stuck");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.kill();
    for _ in 0..2 {
        // Run, it would wait for a permit: refused, it answers at once.
        let answered = tokio::time::timeout(Duration::from_secs(10), send(&app)).await;
        let (status, told) = answered.expect("refused at once, not run").unwrap();
        assert_eq!((status, told.as_deref()), (429, Some("2")));
    }
    assert_eq!(running.load(Ordering::SeqCst), 2);
    go.add_permits(2);
    for export in held {
        assert_eq!(export.await.unwrap().0, 200);
    }
    // Their slots are given back to the fallback: the next one runs there.
    let next = send(&app);
    let started = std::time::Instant::now();
    while running.load(Ordering::SeqCst) < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the next export stuck"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    go.add_permits(1);
    assert_eq!(next.await.unwrap().0, 200);
}
