//! Redis Sentinel, end to end: a master, a replica and three sentinels of
//! the test's own on loopback ports. Traffic runs through a store connected
//! through the sentinels while the master is SIGKILLed: every request is
//! answered within its deadline under the failure policy, decisions resume
//! on the promoted replica, and the limit is exact again.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use tollgate::{Algorithm, FailureMode, Key, Policy, RateLimiter};
use tollgate_redis::RedisStore;
use tollgate_tests::{RedisSentinel, RedisServer};

const SERVICE: &str = "tollgate";

/// Waits up to `limit` for `done`, checking every 50 ms.
async fn wait_for(what: &str, limit: Duration, done: impl Fn() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A master, its replica in sync, and three sentinels of `service` that
/// know both and each other.
async fn deployment(service: &str) -> (RedisServer, RedisServer, Vec<RedisSentinel>) {
    let master = RedisServer::spawn();
    let master_port = master.port().to_string();
    let replica = RedisServer::spawn_with(&["--replicaof", "127.0.0.1", &master_port]);
    wait_for("the replica syncs", Duration::from_secs(20), || {
        replica.in_sync()
    })
    .await;
    let sentinels: Vec<RedisSentinel> = (0..3)
        .map(|_| RedisSentinel::spawn(&master, service, 2))
        .collect();
    wait_for(
        "the sentinels know the replica and each other",
        Duration::from_secs(30),
        || sentinels.iter().all(|s| s.sees(service, 1, 2)),
    )
    .await;
    (master, replica, sentinels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_follows_a_sentinel_failover_and_is_exact_after_it() {
    let (mut master, replica, sentinels) = deployment(SERVICE).await;

    let store = RedisStore::builder()
        .prefix("sentinel")
        .connect_sentinel(SERVICE, sentinels.iter().map(RedisSentinel::url))
        .await
        .unwrap();
    let deadline = Duration::from_millis(50);
    // The default failure policy: decided locally while Redis cannot.
    let traffic = Policy::new("sentinel-traffic", Algorithm::Gcra, "100000/s").unwrap();
    let limiter = RateLimiter::with_store(traffic.clone(), store.clone());
    let key = Key::user("ada");
    for _ in 0..20 {
        assert!(store.decide(&key, &traffic, 1).await.unwrap().is_allowed());
    }

    master.kill();
    let killed = Instant::now();
    let (mut answered, mut slowest, mut recovered) = (0, Duration::ZERO, None);
    while killed.elapsed() < Duration::from_secs(60) {
        let asked = Instant::now();
        let decision = limiter.check(&key).await;
        slowest = slowest.max(asked.elapsed());
        assert!(decision.unwrap().is_allowed(), "the local fallback decides");
        answered += 1;
        // Redis itself, without the fallback: back once the replica is
        // promoted and the connection has followed it.
        if store.decide(&key, &traffic, 1).await.is_ok() {
            recovered = Some(killed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let recovered = recovered.expect("decisions resumed on the new master within 60 s");
    println!(
        "failover: decisions resumed {recovered:?} after the master was killed; {answered} \
         requests answered meanwhile, the slowest in {slowest:?}"
    );
    // Every request answered within its deadline, with room for the
    // scheduler of a loaded CI machine.
    assert!(
        slowest < deadline + Duration::from_millis(200),
        "{slowest:?}"
    );
    assert_eq!(sentinels[0].master_port(SERVICE), Some(replica.port()));
    assert_eq!(replica.role().as_deref(), Some("master"));

    // Exact again: 200 concurrent requests against a limit of 50, with
    // failures not papered over. GCRA: on Redis's real clock, an hour
    // ending among the requests would admit 50 more.
    let exact = Policy::new("sentinel-exact", Algorithm::Gcra, "50/h").unwrap();
    let limiter = RateLimiter::with_store(exact, store.clone()).on_store_error(FailureMode::Closed);
    let limiter = std::sync::Arc::new(limiter);
    let calls: Vec<_> = (0..200)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.check(&Key::user("exact")).await })
        })
        .collect();
    let mut admitted = 0;
    for call in calls {
        admitted += usize::from(call.await.unwrap().unwrap().is_allowed());
    }
    assert_eq!(admitted, 50);
}

/// The master hangs (SIGSTOP: a host that lost power, or a network cut
/// with no reset), and Sentinel promotes the replica. Its calls end at the
/// store's deadline with no error of the connection's own, and the store
/// asks the sentinels again then: decisions resume on the new master (it
/// called the hung one until the test's 20 s were out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_follows_a_failover_away_from_a_hung_master() {
    const HUNG: &str = "tollgate-hung";
    let (master, replica, sentinels) = deployment(HUNG).await;
    let store = RedisStore::builder()
        .prefix("sentinel-hung")
        .connect_sentinel(HUNG, sentinels.iter().map(RedisSentinel::url))
        .await
        .unwrap();
    let policy = Policy::new("hung", Algorithm::Gcra, "100000/s").unwrap();
    let key = Key::user("hung");
    assert!(store.decide(&key, &policy, 1).await.is_ok());

    let signal = |sig: &str| {
        std::process::Command::new("kill")
            .args([sig, &master.pid().to_string()])
            .status()
            .unwrap();
    };
    signal("-STOP");
    let stopped = Instant::now();
    let mut promoted = None;
    let mut recovered = None;
    while stopped.elapsed() < Duration::from_secs(20) && recovered.is_none() {
        let decided = store.decide(&key, &policy, 1).await.is_ok();
        if promoted.is_none()
            && sentinels[0].master_port(HUNG) == Some(replica.port())
            && replica.role().as_deref() == Some("master")
        {
            promoted = Some(stopped.elapsed());
        }
        if decided && promoted.is_some() {
            recovered = Some(stopped.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal("-CONT");
    let promoted = promoted.expect("Sentinel promoted the replica");
    let recovered = recovered.expect("the store followed the failover");
    assert!(recovered >= promoted, "{recovered:?} {promoted:?}");
}
