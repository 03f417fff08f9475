//! The in-flight limit on Redis: three app instances, each with a store of
//! its own, share one limit per key exactly; slots come back on
//! completion, on client disconnect and on a handler panic, and after
//! Redis loses them, at the running requests' next renewal; and the
//! memory store and Redis give the same answers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use futures::future::join_all;
use http::{Request, StatusCode};
use tokio::sync::Semaphore;
use tollgate::{
    GlobalKey, InFlightLayer, InFlightLimit, Key, MemoryStore, Renewal, SlotStore, Slots,
};
use tollgate_redis::RedisStore;
use tollgate_tests::{RedisServer, require_redis, unique_prefix};
use tower::ServiceExt;

async fn panics() -> &'static str {
    panic!("the handler failed")
}

async fn instance(prefix: &str, limit: &InFlightLimit, gate: &Gate) -> (Router, RedisStore) {
    let url = require_redis().await;
    let store = RedisStore::builder()
        .prefix(prefix)
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect(url.as_str())
        .await
        .unwrap();
    (gated_app(limit, &store, gate), store)
}

/// An app whose exports run until `gate` lets them go, `limit`ed in
/// `store`.
fn gated_app(limit: &InFlightLimit, store: &RedisStore, gate: &Gate) -> Router {
    let layer = InFlightLayer::new(limit.clone(), GlobalKey).store(store.clone());
    let gate = gate.clone();
    Router::new()
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
        .route_layer(layer)
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

/// What a slot operation answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Acquired(Slots),
    Renewed(Renewal),
    Released,
}

/// A slot operation: 0 acquires, 1 renews, anything else releases.
async fn slot_op(
    store: &impl SlotStore,
    key: &Key,
    limit: &InFlightLimit,
    op: u8,
    holder: u64,
) -> Answer {
    match op {
        0 => Answer::Acquired(store.acquire(key, limit, holder).await.unwrap()),
        1 => Answer::Renewed(store.renew(key, limit, holder).await.unwrap()),
        _ => {
            store.release(key, limit, holder).await.unwrap();
            Answer::Released
        }
    }
}

/// Acquire, renew and release give the same answers on memory and Redis,
/// a renewal of a slot that is gone included: taken back while there is
/// room, lost while there is none.
#[tokio::test]
async fn memory_and_redis_hold_slots_alike() {
    let url = require_redis().await;
    let redis = RedisStore::builder()
        .prefix(unique_prefix("inflight-same"))
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect(url.as_str())
        .await
        .unwrap();
    let memory = MemoryStore::new();
    let limit = InFlightLimit::new("same", 3).unwrap();
    let key = Key::user("ada");
    // Take 4 (3 fit), renew a holder and one that holds nothing (lost),
    // release one, renew the one without a slot (taken back), take again.
    let script = [
        (0, 1),
        (0, 2),
        (0, 3),
        (0, 4),
        (1, 2),
        (1, 4),
        (2, 2),
        (1, 4),
        (0, 5),
        (0, 6),
        (2, 9),
    ];
    let (mut on_memory, mut on_redis) = (Vec::new(), Vec::new());
    for (op, holder) in script {
        on_memory.push(slot_op(&memory, &key, &limit, op, holder).await);
        on_redis.push(slot_op(&redis, &key, &limit, op, holder).await);
    }
    assert_eq!(on_memory, on_redis);
    let slots = |acquired, held| Answer::Acquired(Slots { acquired, held });
    assert_eq!(
        on_redis,
        [
            slots(true, 1),
            slots(true, 2),
            slots(true, 3),
            slots(false, 3),
            Answer::Renewed(Renewal::Renewed),
            Answer::Renewed(Renewal::Lost),
            Answer::Released,
            Answer::Renewed(Renewal::Retaken),
            slots(false, 3),
            slots(false, 3),
            Answer::Released,
        ]
    );
}

/// Random sequences of acquire, renew and release on random limits: the
/// memory store and Redis give the same answers, case by case, renewals
/// that take a slot back or find it lost included.
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
            .response_timeout(Duration::from_secs(5))
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
    let renewals = std::sync::Mutex::new(std::collections::HashSet::new());
    proptest!(config, |(max in 1u64..5, ops in ops)| {
        let limit = InFlightLimit::new("prop", max).unwrap();
        let key = Key::user(format!("case-{}", CASE.fetch_add(1, Ordering::Relaxed)));
        let memory = MemoryStore::new();
        let (on_memory, on_redis) = runtime.block_on(async {
            let mut answers = (Vec::new(), Vec::new());
            for &(op, holder) in &ops {
                answers.0.push(slot_op(&memory, &key, &limit, op, holder).await);
                answers.1.push(slot_op(&redis, &key, &limit, op, holder).await);
            }
            answers
        });
        for answer in &on_redis {
            if let Answer::Renewed(renewal) = answer {
                renewals.lock().unwrap().insert(*renewal);
            }
        }
        prop_assert_eq!(on_memory, on_redis, "{:?}", ops);
    });
    // The cases met every answer of a renewal.
    let renewals = renewals.into_inner().unwrap();
    assert_eq!(
        renewals.len(),
        3,
        "renewed, retaken and lost all met: {renewals:?}"
    );
}

/// The slot sets of a store's in-flight limit `name`, as Redis holds them.
fn slot_sets(con: &mut redis::Connection, prefix: &str, name: &str) -> Vec<String> {
    redis::cmd("KEYS")
        .arg(format!("{prefix}:inflight/{name}:*"))
        .query(con)
        .unwrap()
}

/// The renewal script: after the slot set is deleted, a renewal re-adds
/// its holder with a fresh lease; once the set is full of other holders, a
/// renewal of a holder whose slot is gone adds nothing and says so.
#[tokio::test]
async fn a_renewal_after_the_slots_are_deleted_re_adds_the_holder() {
    let url = require_redis().await;
    let prefix = unique_prefix("inflight-renew");
    let store = RedisStore::builder()
        .prefix(prefix.as_str())
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect(url.as_str())
        .await
        .unwrap();
    let mut con = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let limit = InFlightLimit::new("renew", 2)
        .unwrap()
        .lease(Duration::from_secs(60))
        .unwrap();
    let key = Key::user("ada");
    assert!(store.acquire(&key, &limit, 11).await.unwrap().acquired);
    let [set] = <[String; 1]>::try_from(slot_sets(&mut con, &prefix, "renew")).unwrap();
    let _: () = redis::cmd("DEL").arg(&set).query(&mut con).unwrap();
    assert_eq!(
        store.renew(&key, &limit, 11).await.unwrap(),
        Renewal::Retaken
    );
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(&set)
        .arg(0)
        .arg(-1)
        .query(&mut con)
        .unwrap();
    assert_eq!(members, ["11"]);
    // With a fresh lease, and the set expiring with it.
    let ttl: i64 = redis::cmd("PTTL").arg(&set).query(&mut con).unwrap();
    assert!((59_000..=60_000).contains(&ttl), "{ttl}");
    assert_eq!(
        store.renew(&key, &limit, 11).await.unwrap(),
        Renewal::Renewed
    );
    // Deleted again, and two other requests take both slots first.
    let _: () = redis::cmd("DEL").arg(&set).query(&mut con).unwrap();
    assert!(store.acquire(&key, &limit, 12).await.unwrap().acquired);
    assert!(store.acquire(&key, &limit, 13).await.unwrap().acquired);
    assert_eq!(store.renew(&key, &limit, 11).await.unwrap(), Renewal::Lost);
    let held: u64 = redis::cmd("ZCARD").arg(&set).query(&mut con).unwrap();
    assert_eq!(held, 2);
    // Counted again once one is free.
    store.release(&key, &limit, 12).await.unwrap();
    assert_eq!(
        store.renew(&key, &limit, 11).await.unwrap(),
        Renewal::Retaken
    );
    assert!(!store.acquire(&key, &limit, 14).await.unwrap().acquired);
}

/// After Redis loses its data (FLUSHALL, on a server of the test's own),
/// the running requests take their slots back at their next renewal: then
/// no new request gets in while they run, and once they are done exactly
/// the limit does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn running_requests_take_their_slots_back_after_a_flushall() {
    let server = RedisServer::spawn();
    let prefix = unique_prefix("inflight-flush");
    // Renewed every second: a loaded machine would have to stall a
    // renewal for 3 s to lose a slot by its lease.
    let limit = InFlightLimit::new("exports", 2)
        .unwrap()
        .lease(Duration::from_secs(3))
        .unwrap();
    let renewal_period = limit.lease_duration() / 3;
    let store = RedisStore::builder()
        .prefix(prefix.as_str())
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect(server.url().as_str())
        .await
        .unwrap();
    let gate = Gate {
        running: Arc::default(),
        most: Arc::default(),
        go: Arc::new(Semaphore::new(0)),
    };
    let app = gated_app(&limit, &store, &gate);
    let mut con = server.connection();
    let held = |con: &mut redis::Connection| -> u64 {
        slot_sets(con, &prefix, "exports")
            .iter()
            .map(|set| redis::cmd("ZCARD").arg(set).query::<u64>(con).unwrap())
            .sum()
    };

    // Two long requests run.
    let running: Vec<_> = (0..2)
        .map(|_| tokio::spawn(app.clone().oneshot(export())))
        .collect();
    until("2 requests run", || {
        gate.running.load(Ordering::SeqCst) == 2
    })
    .await;
    assert_eq!(held(&mut con), 2);

    // Redis loses every slot; within a renewal period both are back.
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    let flushed = std::time::Instant::now();
    // A renewal period, and room for a loaded machine's scheduling.
    let deadline = renewal_period * 3;
    while held(&mut con) < 2 {
        assert!(
            flushed.elapsed() < deadline,
            "the slots came back within {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Of 5 new requests, none gets in while the two run.
    let statuses = join_all((0..5).map(|_| app.clone().oneshot(export()))).await;
    let statuses: Vec<StatusCode> = statuses.into_iter().map(|r| r.unwrap().status()).collect();
    assert_eq!(statuses, [StatusCode::TOO_MANY_REQUESTS; 5]);
    assert_eq!(gate.running.load(Ordering::SeqCst), 2);

    // The two finish and give their slots back.
    gate.go.add_permits(2);
    for call in running {
        let response = call.await.unwrap().unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        axum::body::to_bytes(Body::new(response.into_body()), 1024)
            .await
            .unwrap();
    }
    // Given back by a call in the background.
    let done = std::time::Instant::now();
    while held(&mut con) > 0 {
        assert!(
            done.elapsed() < Duration::from_secs(10),
            "the slots are given back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Of 5 new requests, exactly 2 run.
    let calls: Vec<_> = (0..5)
        .map(|_| tokio::spawn(app.clone().oneshot(export())))
        .collect();
    until("3 requests answered", || {
        calls.iter().filter(|call| call.is_finished()).count() == 3
    })
    .await;
    assert_eq!(gate.running.load(Ordering::SeqCst), 2);
    gate.go.add_permits(2);
    let mut statuses = Vec::new();
    for call in calls {
        let response = call.await.unwrap().unwrap();
        statuses.push(response.status());
        axum::body::to_bytes(Body::new(response.into_body()), 1024)
            .await
            .unwrap();
    }
    statuses.sort();
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(gate.most.load(Ordering::SeqCst), 2);
}
