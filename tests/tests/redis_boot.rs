//! Booting while Redis is down: the store is built without it, answers by
//! the failure policy until Redis answers, then decides through Redis,
//! exactly, sharing one count with a store built after Redis came up.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use tollgate::{Algorithm, FailureMode, FallbackStore, Key, MemoryStore, Policy, Store};
use tollgate_redis::{RedisStore, RedisStoreError};
use tollgate_tests::{RedisServer, unique_prefix};

async fn store(url: &str, prefix: &str) -> RedisStore {
    RedisStore::builder()
        .prefix(prefix)
        .deadline(Duration::from_secs(2))
        .connect_timeout(Duration::from_millis(200))
        .circuit_breaker(1_000, Duration::from_millis(50))
        .connect(url)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_built_while_redis_is_down_decides_through_it_once_it_answers() {
    let mut server = RedisServer::spawn();
    let url = server.url();
    server.kill();
    let prefix = unique_prefix("boot");
    let policy = Policy::new("boot", Algorithm::FixedWindow, "50/h").unwrap();
    let key = Key::user("ada");

    // Built while Redis is down: no error, and a readiness probe that
    // says why it is not ready.
    let early = store(&url, &prefix).await;
    match early.health_check().await {
        Err(RedisStoreError::NotConnected { reason }) => {
            assert!(reason.contains("refused"), "{reason}");
        }
        other => panic!("expected no connection yet, got {other:?}"),
    }
    // Meanwhile the failure policy answers: each mode as it says.
    let local = FallbackStore::new(early.clone())
        .on_store_error(FailureMode::Local)
        .local_fallback(MemoryStore::new());
    let mut admitted = 0;
    for _ in 0..60 {
        admitted += u64::from(local.check(&key, &policy, 1).await.unwrap().is_allowed());
    }
    assert_eq!(admitted, 50, "the local fallback enforces the limit");
    let closed = FallbackStore::new(early.clone()).on_store_error(FailureMode::Closed);
    assert!(closed.check(&key, &policy, 1).await.is_err());

    // Redis starts: within a bounded time the early store decides through
    // it, and shares one exact count with a store built after it.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    while early.health_check().await.is_err() {
        assert!(Instant::now() < deadline, "never connected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let late = store(&url, &prefix).await;
    let mut admitted = 0;
    for i in 0..100 {
        let store = if i % 2 == 0 { &early } else { &late };
        admitted += u64::from(store.check(&key, &policy, 1).await.unwrap().is_allowed());
    }
    assert_eq!(admitted, 50, "one count in Redis, shared by both");
}

/// A local port with nothing listening: one the system gave out and took
/// back.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_and_cluster_stores_are_built_while_nothing_answers() {
    let port = closed_port();
    let policy = Policy::new("boot-topologies", Algorithm::FixedWindow, "5/h").unwrap();
    let key = Key::user("ada");
    let builder = || {
        RedisStore::builder()
            .prefix(unique_prefix("boot-topologies"))
            .connect_timeout(Duration::from_millis(200))
    };
    let sentinel = builder()
        .connect_sentinel_url(&format!("redis+sentinel://127.0.0.1:{port}/mymaster"))
        .await
        .unwrap();
    let cluster = builder()
        .connect_cluster([format!("redis://127.0.0.1:{port}")])
        .await
        .unwrap();
    match sentinel.decide(&key, &policy, 1).await {
        Err(RedisStoreError::NotConnected { reason }) => {
            assert!(reason.contains("refused"), "{reason}");
        }
        other => panic!("sentinel: expected no connection yet, got {other:?}"),
    }
    match cluster.decide(&key, &policy, 1).await {
        Err(RedisStoreError::NotConnected { .. }) => {}
        other => panic!("cluster: expected no connection yet, got {other:?}"),
    }
    // The failure policy answers meanwhile: exactly the limit, locally.
    for (name, admitted) in [
        ("sentinel", five_of_eight(sentinel).await),
        ("cluster", five_of_eight(cluster).await),
    ] {
        assert_eq!(admitted, 5, "{name}");
    }
}

/// 8 requests through `store` behind a local fallback of its own: how
/// many were admitted.
async fn five_of_eight<C: tollgate_redis::RedisConnection>(store: RedisStore<C>) -> u64 {
    let policy = Policy::new("boot-topologies", Algorithm::FixedWindow, "5/h").unwrap();
    let local = FallbackStore::new(store)
        .on_store_error(FailureMode::Local)
        .local_fallback(MemoryStore::new());
    let mut admitted = 0;
    for _ in 0..8 {
        let decision = local.check(&Key::user("ada"), &policy, 1).await.unwrap();
        admitted += u64::from(decision.is_allowed());
    }
    admitted
}
