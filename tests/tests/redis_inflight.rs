//! The in-flight limit on Redis: three app instances, each with a store of
//! its own, share one limit per key exactly; slots come back on
//! completion, on client disconnect and on a handler panic, and after
//! Redis loses them, at the running requests' next renewal; and the
//! memory store and Redis give the same answers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

#[path = "redis_inflight/instances.rs"]
mod instances;
#[path = "redis_inflight/runtimes.rs"]
mod runtimes;
#[path = "redis_inflight/slots.rs"]
mod slots;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::Request;
use tokio::sync::Semaphore;
use tollgate::{GlobalKey, InFlightLayer, InFlightLimit, Key, SlotStore};
use tollgate_redis::RedisStore;
use tollgate_tests::require_redis;

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

/// The slot sets of a store's in-flight limit `name`, as Redis holds them
/// (not the sets of holders given back beside them).
fn slot_sets(con: &mut redis::Connection, prefix: &str, name: &str) -> Vec<String> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:inflight/{name}:*"))
        .query(con)
        .unwrap();
    keys.into_iter()
        .filter(|k| !k.ends_with(GIVEN_BACK))
        .collect()
}

/// How the set of holders given back while they held no slot is named:
/// after its slot set.
const GIVEN_BACK: &str = ":given-back";
