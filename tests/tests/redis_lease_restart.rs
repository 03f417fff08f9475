//! Leases when Redis restarts: the instances subscribe again and take
//! leases again, and an operator's reset or block after the restart still
//! reaches every instance, at once. (Each instance publishes on a
//! connection it keeps, which the restart left dead.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use tollgate::{Algorithm, FakeClock, Key, Policy, Store, Timestamp};
use tollgate_redis::{LeasedStore, RedisStore};
use tollgate_tests::{RedisServer, unique_prefix};

const START: Timestamp = Timestamp::from_secs(1_700_000_000);

/// Longer than any test here waits: a reset that waited for it was not
/// acknowledged.
const ACK_TIMEOUT: Duration = Duration::from_secs(20);

async fn instance(url: &str, prefix: &str, clock: &FakeClock) -> LeasedStore<RedisStore> {
    let redis = RedisStore::builder()
        .prefix(prefix)
        .test_clock(clock.clone())
        .deny_cache(0)
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("Redis at {url}: {e}"));
    LeasedStore::builder()
        .interval(Duration::from_millis(8))
        .share(4)
        .ack_timeout(ACK_TIMEOUT)
        .channel(format!("{prefix}:leases"))
        .test_clock(clock.clone())
        .connect(redis, url)
        .await
        .unwrap_or_else(|e| panic!("subscribing at {url}: {e}"))
}

async fn wait_listening(store: &LeasedStore<RedisStore>, want: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.is_listening() != want {
        assert!(Instant::now() < deadline, "listening never became {want}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Restarts `server` and waits until every instance has subscribed again
/// and its store answers.
async fn restart(server: &mut RedisServer, instances: &[&LeasedStore<RedisStore>]) {
    let (key, policy) = (
        Key::user("probe"),
        Policy::new("probe", Algorithm::Gcra, "9/s").unwrap(),
    );
    server.restart();
    for s in instances {
        wait_listening(s, false).await;
    }
    for s in instances {
        wait_listening(s, true).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.get_ref().check(&key, &policy, 1).await.is_err() {
            assert!(Instant::now() < deadline, "the store never answered again");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// 10 requests a (fake) millisecond for 10 ms: the key's rate is known
/// and a lease is taken.
async fn warm(store: &LeasedStore<RedisStore>, clock: &FakeClock, key: &Key, policy: &Policy) {
    for _ in 0..10 {
        for _ in 0..10 {
            store.check(key, policy, 1).await.unwrap();
        }
        clock.advance(Duration::from_millis(1));
    }
    store.wait_for_grants().await;
}

/// A block after the restart returns `Ok`, and the other instance, which
/// took a lease after the restart, admits nothing more from it once the
/// block has returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_after_redis_restarted_reaches_every_instance() {
    let mut server = RedisServer::spawn();
    let (url, clock) = (server.url(), FakeClock::new(START));
    let prefix = unique_prefix("lease-restart-block");
    let a = instance(&url, &prefix, &clock).await;
    let b = instance(&url, &prefix, &clock).await;
    let policy = Policy::new("restart", Algorithm::Gcra, "6000/s").unwrap();
    let (key, other) = (Key::user("ada"), Key::user("bob"));
    // Both instances publish once (a reset, and the acknowledgements).
    a.reset(&other, &policy).await.unwrap();
    b.reset(&other, &policy).await.unwrap();

    restart(&mut server, &[&a, &b]).await;
    warm(&b, &clock, &key, &policy).await;
    assert!(b.outstanding().1 > 0, "b holds a lease after the restart");

    a.block(&key, &policy, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(b.outstanding(), (0, 0), "b dropped its lease");
    assert!(!b.check(&key, &policy, 1).await.unwrap().is_allowed());
}

/// The first reset after the restart returns `Ok`, acknowledged by every
/// instance, not after the acknowledgements' timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_reset_after_redis_restarted_is_acknowledged() {
    let mut server = RedisServer::spawn();
    let (url, clock) = (server.url(), FakeClock::new(START));
    let prefix = unique_prefix("lease-restart-reset");
    let a = instance(&url, &prefix, &clock).await;
    let b = instance(&url, &prefix, &clock).await;
    let policy = Policy::new("restart", Algorithm::Gcra, "6000/s").unwrap();
    let key = Key::user("ada");
    a.reset(&key, &policy).await.unwrap();

    restart(&mut server, &[&a, &b]).await;
    let started = Instant::now();
    a.reset(&key, &policy).await.unwrap();
    let took = started.elapsed();
    assert!(
        took < ACK_TIMEOUT / 2,
        "the reset waited {took:?} for acknowledgements"
    );
}
