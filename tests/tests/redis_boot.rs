//! Booting while Redis is down: the store is built without it, answers by
//! the failure policy until Redis answers, then decides through Redis,
//! exactly, sharing one count with a store built after Redis came up.
//!
//! The policies are GCRA, not fixed windows: these tests run on Redis's
//! real clock, and a window ending between two phases of a test would
//! admit a fresh limit.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use tollgate::{Algorithm, FailureMode, FallbackStore, Key, MemoryStore, Policy, Store};
use tollgate_redis::RedisConnection;
use tollgate_redis::{RedisStore, RedisStoreError};
use tollgate_tests::{RedisCluster, RedisSentinel, RedisServer, unique_prefix};

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
    let policy = Policy::new("boot", Algorithm::Gcra, "50/h").unwrap();
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

/// A Redis that is loading its data answers `INFO` but turns the
/// scripts away with `LOADING`: a store built then starts (its scripts
/// load on their first call), answers by the failure policy meanwhile,
/// then decides through Redis, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_built_while_redis_loads_its_data_decides_through_it_once_loaded() {
    let mut server = RedisServer::spawn();
    server.restart_loading(60_000);
    let url = server.url();
    let prefix = unique_prefix("boot-loading");
    let policy = Policy::new("boot-loading", Algorithm::Gcra, "50/h").unwrap();
    let key = Key::user("ada");

    let early = store(&url, &prefix).await;
    // Built during the load, not after it (the load takes a minute).
    assert!(server.loading());
    // Meanwhile the failure policy answers: Redis turns the call away
    // (`LOADING`), or, on a machine so loaded that the loading server's
    // answers missed the connect timeout, the store has no connection yet.
    match early.check(&key, &policy, 1).await {
        Err(tollgate::StoreError::Unavailable(reason)) => {
            let reason = reason.to_string();
            assert!(
                reason.contains("LOADING") || reason.contains("connect"),
                "{reason}"
            );
        }
        other => panic!("expected Redis to be unavailable while loading, got {other:?}"),
    }
    server.finish_loading();
    until_ready(&early, "loading").await;
    let late = store(&url, &prefix).await;
    assert_eq!(alternately(&early, &late).await, 50);
}

/// Redis running another client's script past `busy-reply-threshold`
/// turns every call away with `BUSY`, unrun, as a loading one does with
/// `LOADING`: a store built meanwhile starts (the failure policy answers,
/// the breaker counting Redis unavailable), and decides through Redis once
/// the script is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_built_while_redis_runs_a_long_script_decides_through_it_once_free() {
    let server = RedisServer::spawn_with(&["--busy-reply-threshold", "50"]);
    let url = server.url();
    // A script that runs until killed, on a thread of its own.
    let mut busy = server.connection();
    let runner = std::thread::spawn(move || {
        let ran: redis::RedisResult<()> = redis::cmd("EVAL")
            .arg("local i = 0 while true do i = i + 1 end")
            .arg(0)
            .query(&mut busy);
        ran.is_err()
    });
    // Until Redis turns calls away.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut probe = server.connection();
    while redis::cmd("PING").query::<String>(&mut probe).is_ok() {
        assert!(Instant::now() < deadline, "Redis never said BUSY");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let policy = Policy::new("boot-busy", Algorithm::Gcra, "50/h").unwrap();
    let store = store(&url, &unique_prefix("boot-busy")).await;
    match store.check(&Key::user("ada"), &policy, 1).await {
        Err(tollgate::StoreError::Unavailable(reason)) => {
            let reason = reason.to_string();
            assert!(
                reason.contains("BUSY") || reason.contains("connect"),
                "{reason}"
            );
        }
        other => panic!("expected Redis to be unavailable while busy, got {other:?}"),
    }
    let _: String = redis::cmd("SCRIPT").arg("KILL").query(&mut probe).unwrap();
    assert!(runner.join().unwrap(), "the script was killed");
    until_ready(&store, "busy").await;
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
    let policy = Policy::new("boot-topologies", Algorithm::Gcra, "5/h").unwrap();
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

/// A store on a bb8 pool is built while Redis is down too (building it
/// failed: the pool's checkout timed out, which was not taken for Redis
/// being unreachable), follows the failure policy meanwhile, and decides
/// through Redis once it answers, sharing one count with a store built
/// after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_store_built_while_redis_is_down_decides_through_it_once_it_answers() {
    let mut server = RedisServer::spawn();
    let url = server.url();
    server.kill();
    let prefix = unique_prefix("boot-later");
    let early = RedisStore::builder()
        .prefix(&prefix)
        .deadline(Duration::from_secs(2))
        .connect_timeout(Duration::from_millis(200))
        .circuit_breaker(1_000, Duration::from_millis(50))
        .connect_pool(url.as_str())
        .await
        .unwrap();
    assert_eq!(five_of_eight(early.clone()).await, 5);
    server.restart();
    until_ready(&early, "pool").await;
    let late = store(&url, &prefix).await;
    assert_eq!(alternately(&early, &late).await, 50);
}

/// 8 requests through `store` behind a local fallback of its own: how
/// many were admitted.
async fn five_of_eight<C: tollgate_redis::RedisConnection>(store: RedisStore<C>) -> u64 {
    let policy = Policy::new("boot-topologies", Algorithm::Gcra, "5/h").unwrap();
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

/// Waits (up to 30 s) until `store`, built while nothing answered, is
/// ready: its readiness probe reaches Redis.
async fn until_ready<C: RedisConnection>(store: &RedisStore<C>, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(error) = store.health_check().await {
        assert!(
            Instant::now() < deadline,
            "{name}: never connected: {error}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// 100 checks of one key of a 50/h policy, alternately through `early`
/// and `late`: how many were admitted.
async fn alternately<C: RedisConnection, D: RedisConnection>(
    early: &RedisStore<C>,
    late: &RedisStore<D>,
) -> u64 {
    let policy = Policy::new("boot-later", Algorithm::Gcra, "50/h").unwrap();
    let key = Key::user("ada");
    let mut admitted = 0;
    for i in 0..100 {
        let decision = if i % 2 == 0 {
            early.check(&key, &policy, 1).await
        } else {
            late.check(&key, &policy, 1).await
        };
        admitted += u64::from(decision.unwrap().is_allowed());
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_store_built_before_its_sentinel_and_master_decides_through_them_once_up() {
    let port = closed_port();
    let prefix = unique_prefix("boot-sentinel");
    let builder = || {
        RedisStore::builder()
            .prefix(prefix.clone())
            .deadline(Duration::from_secs(2))
            .connect_timeout(Duration::from_millis(200))
            .circuit_breaker(1_000, Duration::from_millis(50))
    };
    let url = format!("redis+sentinel://127.0.0.1:{port}/boot");
    let early = builder().connect_sentinel_url(&url).await.unwrap();
    assert!(early.health_check().await.is_err(), "nothing answers yet");
    // The master, then its sentinel on the port the store was given.
    let master = RedisServer::spawn();
    let _sentinel = RedisSentinel::spawn_on(port, &master, "boot", 1);
    until_ready(&early, "sentinel").await;
    let late = builder().connect_sentinel_url(&url).await.unwrap();
    assert_eq!(
        alternately(&early, &late).await,
        50,
        "one count on the master, shared by both"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_store_built_before_its_cluster_decides_through_it_once_up() {
    let port = closed_port();
    let prefix = unique_prefix("boot-cluster");
    let builder = || {
        RedisStore::builder()
            .prefix(prefix.clone())
            .deadline(Duration::from_secs(2))
            .connect_timeout(Duration::from_millis(200))
            .circuit_breaker(1_000, Duration::from_millis(50))
    };
    let seed = format!("redis://127.0.0.1:{port}");
    let early = builder().connect_cluster([seed.clone()]).await.unwrap();
    assert!(early.health_check().await.is_err(), "nothing answers yet");
    // The cluster, its first node on the seed's port.
    let cluster = RedisCluster::spawn_seeded_on(port);
    until_ready(&early, "cluster").await;
    let late = builder().connect_cluster(cluster.urls()).await.unwrap();
    assert_eq!(
        alternately(&early, &late).await,
        50,
        "one count in the cluster, shared by both"
    );
}

/// A store's first call after Redis came back goes through Redis. While
/// Redis was down, the connection manager's last attempt to connect again
/// was refused, and it kept that refusal for the next call: the first
/// call after Redis came back failed with it, whenever it came (here 2 s
/// later), and only the one after connected. Likewise a connection that
/// died while the store was idle (Redis restarted in between) failed the
/// first call on it. Now a store whose calls did not go through for a
/// second pings Redis in the background, and connects again within about
/// a second of Redis answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_call_after_redis_came_back_goes_through() {
    let mut server = RedisServer::spawn();
    let url = server.url();
    let policy = Policy::new("back", Algorithm::Gcra, "50/h").unwrap();
    let key = Key::user("ada");
    let store = store(&url, &unique_prefix("back")).await;
    assert!(store.check(&key, &policy, 1).await.unwrap().is_allowed());
    // Down for a while: calls fail, and the attempts they set off to
    // connect again are refused.
    server.kill();
    for _ in 0..3 {
        assert!(store.check(&key, &policy, 1).await.is_err());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.restart();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let first = store.check(&key, &policy, 1).await;
    assert!(first.is_ok(), "after Redis came back: {first:?}");
    // Restarted while the store is idle.
    server.restart();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let first = store.check(&key, &policy, 1).await;
    assert!(first.is_ok(), "after a restart while idle: {first:?}");
}
