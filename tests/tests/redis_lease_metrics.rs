//! A leased store's metrics equal its own counts: grants, direct
//! decisions and returns by policy against `calls()`, the gauges of
//! leases held against `outstanding()`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tollgate::telemetry::{LEASE_DIRECT, LEASE_GRANTS, LEASE_RETURNS, LEASE_UNITS, LEASES_HELD};
use tollgate::{Algorithm, FakeClock, Key, Policy, Store, Timestamp};
use tollgate_redis::{LeaseCalls, LeasedStore, RedisStore};
use tollgate_tests::{require_redis, unique_prefix};

/// A leased store of its own prefix on `url`, on `clock`: leases of 16 ms
/// of the clock, a sweep every 8 ms.
async fn leased(url: &str, name: &str, clock: &FakeClock) -> LeasedStore<RedisStore> {
    let prefix = unique_prefix(name);
    let redis = RedisStore::builder()
        .prefix(prefix.clone())
        .test_clock(clock.clone())
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .unwrap();
    LeasedStore::builder()
        .interval(Duration::from_millis(8))
        .share(4)
        .channel(format!("{prefix}:leases"))
        .test_clock(clock.clone())
        .connect(redis, url)
        .await
        .unwrap()
}

#[test]
fn lease_metrics_equal_the_calls_and_the_leases_held() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (calls, held_before, held_after) = metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let url = require_redis().await;
                let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
                let store = leased(&url, "lease-metrics", &clock).await;
                // 10,000 a second: a lease's units take 100 µs each to drain
                // from the key's backlog, so those left are still in it when
                // they go back (a lease gives back no more than that).
                let policy = Policy::new("hot", Algorithm::Gcra, "10000/s").unwrap();
                let key = Key::user("ada");
                // 10 requests a millisecond for 10 ms: the key is measured,
                // then leased (a lease lives 16 ms of the test's clock).
                for _ in 0..10 {
                    for _ in 0..10 {
                        assert!(store.check(&key, &policy, 1).await.unwrap().is_allowed());
                    }
                    clock.advance(Duration::from_millis(1));
                }
                store.wait_for_grants().await;
                let held_before = store.outstanding();
                store.return_leases().await;
                (store.calls(), held_before, store.outstanding())
            })
    });
    assert!(calls.grants > 0 && calls.direct > 0, "{calls:?}");
    assert!(held_before.0 > 0, "leases were held: {held_before:?}");
    assert_eq!(held_after, (0, 0));

    let mut seen = LeaseCalls::default();
    let mut gauges = (f64::NAN, f64::NAN);
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let labels: Vec<_> = key.labels().map(|l| (l.key(), l.value())).collect();
        match (key.name(), &labels[..], value) {
            (LEASE_GRANTS, [("policy", "hot")], DebugValue::Counter(n)) => seen.grants = n,
            (LEASE_DIRECT, [("policy", "hot")], DebugValue::Counter(n)) => seen.direct = n,
            (LEASE_RETURNS, [("policy", "hot")], DebugValue::Counter(n)) => seen.returns = n,
            (LEASES_HELD, [], DebugValue::Gauge(g)) => gauges.0 = g.into_inner(),
            (LEASE_UNITS, [], DebugValue::Gauge(g)) => gauges.1 = g.into_inner(),
            _ => {}
        }
    }
    assert_eq!(seen, calls);
    assert!(calls.returns > 0, "the leases went back: {calls:?}");
    assert_eq!(gauges, (0.0, 0.0));
}

/// Two leased stores in one process: the gauges hold what both hold. Each
/// set them to its own, so one that held no lease reported 0 for the
/// process while the other held leases (found by an audit); a store
/// dropped takes its own off.
#[test]
fn the_lease_gauges_add_up_every_store_of_the_process() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // A snapshot drains: the gauges are the sum of every change seen.
    let seen = std::cell::Cell::new((0.0, 0.0));
    let gauges = || {
        let (mut leases, mut units) = seen.get();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            match (key.key().name(), value) {
                (LEASES_HELD, DebugValue::Gauge(g)) => leases += g.into_inner(),
                (LEASE_UNITS, DebugValue::Gauge(g)) => units += g.into_inner(),
                _ => {}
            }
        }
        seen.set((leases, units));
        (leases, units)
    };
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let url = require_redis().await;
                let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
                let mut stores = Vec::new();
                for name in ["lease-gauges-holding", "lease-gauges-idle"] {
                    stores.push(leased(&url, name, &clock).await);
                }
                let policy = Policy::new("hot", Algorithm::Gcra, "10000/s").unwrap();
                let key = Key::user("ada");
                for _ in 0..10 {
                    for _ in 0..10 {
                        assert!(
                            stores[0]
                                .check(&key, &policy, 1)
                                .await
                                .unwrap()
                                .is_allowed()
                        );
                    }
                    clock.advance(Duration::from_millis(1));
                }
                stores[0].wait_for_grants().await;
                // A sweep of each reports what it holds (the fake clock
                // stands still: no lease ends).
                tokio::time::sleep(Duration::from_millis(50)).await;
                stores[1].return_leases().await;
                let (leases, units) = stores[0].outstanding();
                assert!(leases > 0);
                #[allow(clippy::cast_precision_loss)]
                let held = (leases as f64, units as f64);
                assert_eq!(gauges(), held);
                drop(stores.remove(1));
                assert_eq!(gauges(), held);
                drop(stores.remove(0));
                assert_eq!(gauges(), (0.0, 0.0));
            });
    });
}
