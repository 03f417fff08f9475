//! `RateLimiter` on a Redis store that goes down follows its failure
//! policy, like the layer: local (the default) decides in memory, carrying
//! over what Redis last said of the key; closed returns the error; open
//! admits. A server of the test's own, killed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use tollgate::{
    Algorithm, FailureMode, Key, MemoryStore, Policy, RateLimiter, StoreError, WaitError,
};
use tollgate_redis::RedisStore;
use tollgate_tests::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_on_a_redis_that_is_down_follows_its_failure_policy() {
    let mut server = RedisServer::spawn();
    let store = RedisStore::builder()
        .prefix("limiter-down")
        .deadline(Duration::from_millis(50))
        .connect(server.url())
        .await
        .unwrap();
    let policy = Policy::new("jobs", Algorithm::FixedWindow, "5/h").unwrap();
    let key = Key::custom("nightly-export");
    let local =
        RateLimiter::with_store(policy.clone(), store.clone()).local_fallback(MemoryStore::new());
    let closed =
        RateLimiter::with_store(policy.clone(), store.clone()).on_store_error(FailureMode::Closed);
    let open =
        RateLimiter::with_store(policy.clone(), store.clone()).on_store_error(FailureMode::Open);
    assert_eq!(local.failure_mode(), FailureMode::Local, "the default");

    // Redis decides while it is up: 3 of the 5 used.
    for _ in 0..3 {
        assert!(local.check(&key).await.unwrap().is_allowed());
    }

    server.kill();

    // Closed: the store's error, every time, never a hang.
    for _ in 0..3 {
        let error = closed.check(&key).await.unwrap_err();
        assert!(
            matches!(
                error,
                StoreError::Backend(_) | StoreError::Timeout(_) | StoreError::CircuitOpen
            ),
            "{error:?}"
        );
    }
    // Open: admitted, whatever the count.
    for _ in 0..10 {
        assert!(open.check(&key).await.unwrap().is_allowed());
    }
    // Local: exactly the 2 Redis had left, then denied; no fresh quota.
    let admitted = {
        let mut admitted = 0;
        for _ in 0..10 {
            admitted += usize::from(local.check(&key).await.unwrap().is_allowed());
        }
        admitted
    };
    assert_eq!(admitted, 2);
    // Waiting on the local decision gives up at once: the window is long.
    let wait = local.until_ready(&key, Duration::from_secs(1)).await;
    assert!(matches!(wait, Err(WaitError::TooLong { .. })), "{wait:?}");
}
