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
