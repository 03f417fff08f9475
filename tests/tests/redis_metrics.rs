//! The Redis store's metrics: deny-cache hits, the circuit-breaker gauge
//! and the latency of its calls.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tollgate::telemetry::{CIRCUITS_OPEN, DENY_CACHE_HITS, STORE_LATENCY};
use tollgate::{Algorithm, FakeClock, Key, Policy, Store, Timestamp};
use tollgate_redis::{BreakerState, RedisStore};
use tollgate_tests::{RedisServer, command_calls};

fn block_on<F: Future>(recorder: &DebuggingRecorder, test: impl FnOnce() -> F) -> F::Output {
    metrics::with_local_recorder(recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(test())
    })
}

/// The value of `name` with `labels` now (counters and gauges are drained
/// by a snapshot: this is the change since the last one).
fn change(snapshotter: &Snapshotter, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut found = 0.0;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let same_labels = key.labels().count() == labels.len()
            && key
                .labels()
                .zip(labels)
                .all(|(l, (k, v))| l.key() == *k && l.value() == *v);
        if key.name() == name && same_labels {
            found = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(_) => panic!("{name} is a histogram"),
            };
        }
    }
    found
}

#[test]
fn every_answer_from_the_deny_cache_is_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let server = RedisServer::spawn();
    let (evalsha, denied) = block_on(&recorder, || async {
        let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
        let store = RedisStore::builder()
            .deadline(Duration::from_secs(5))
            .test_clock(clock.clone())
            .connect(server.url())
            .await
            .unwrap();
        let policy = Policy::new("hammered", Algorithm::FixedWindow, "5/10s").unwrap();
        let mut denied = 0;
        for _ in 0..1_000 {
            clock.advance(Duration::from_millis(10));
            let decision = store.check(&Key::user("h"), &policy, 1).await.unwrap();
            denied += u64::from(!decision.is_allowed());
        }
        (command_calls(&mut server.connection(), "evalsha"), denied)
    });
    // Requests at 10 ms to 10 s into an aligned window: 5 allowed in the
    // first window, 1 at the start of the next. Nearly every denial is a
    // cache hit.
    assert_eq!(denied, 994);
    let hits = change(&snapshotter, DENY_CACHE_HITS, &[("policy", "hammered")]);
    assert_eq!(
        hits as u64 + evalsha,
        1_000,
        "every request is a hit or a call"
    );
    assert!(hits >= 900.0, "{hits} hits");
}

/// Past 1,024 policies, the deny cache's hits are counted under one
/// `policy` label, `other policies`: a policy per tenant cannot grow the
/// series without end.
#[test]
fn past_1024_policies_deny_cache_hits_are_counted_as_other_policies() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let server = RedisServer::spawn();
    let hits_each = block_on(&recorder, || async {
        let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
        let store = RedisStore::builder()
            .deadline(Duration::from_secs(5))
            .test_clock(clock.clone())
            .connect(server.url())
            .await
            .unwrap();
        let mut hits_each = Vec::new();
        for i in 0..1_100 {
            let policy =
                Policy::new(format!("tenant-{i}"), Algorithm::FixedWindow, "1/10s").unwrap();
            let before = command_calls(&mut server.connection(), "evalsha");
            for _ in 0..4 {
                store.check(&Key::user("t"), &policy, 1).await.unwrap();
            }
            let calls = command_calls(&mut server.connection(), "evalsha") - before;
            hits_each.push(4 - calls);
        }
        hits_each
    });
    // One admission, one denial from Redis that fills the cache, two hits.
    assert!(hits_each.iter().all(|&h| h == 2), "{hits_each:?}");
    let series: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == DENY_CACHE_HITS)
        .collect();
    assert_eq!(series.len(), 1_025, "1,024 policies and the others");
    assert!(series.iter().any(|(key, _, _, value)| {
        key.key().labels().any(|l| l.value() == "other policies")
            && *value == DebugValue::Counter(2 * 76)
    }));
}

#[test]
fn the_circuit_gauge_follows_the_breaker() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let mut server = RedisServer::spawn();
    let url = server.url();
    block_on(&recorder, || async {
        let store = RedisStore::builder()
            .deadline(Duration::from_millis(200))
            .circuit_breaker(3, Duration::from_millis(300))
            .connect(url)
            .await
            .unwrap();
        let policy = Policy::new("gauge", Algorithm::Gcra, "10/s").unwrap();
        let key = Key::user("g");
        assert!(store.check(&key, &policy, 1).await.is_ok());
        assert_eq!(change(&snapshotter, CIRCUITS_OPEN, &[]), 0.0);

        server.kill();
        for _ in 0..3 {
            assert!(store.check(&key, &policy, 1).await.is_err());
        }
        assert_eq!(store.breaker_state(), BreakerState::Open);
        assert_eq!(change(&snapshotter, CIRCUITS_OPEN, &[]), 1.0);

        server.restart();
        // Probes after each cooldown until one succeeds (bounded: 5 s).
        let mut closed = false;
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if store.check(&key, &policy, 1).await.is_ok() {
                closed = true;
                break;
            }
        }
        assert!(closed, "Redis did not come back within 5 s");
        assert_eq!(store.breaker_state(), BreakerState::Closed);
        assert_eq!(change(&snapshotter, CIRCUITS_OPEN, &[]), -1.0);
    });
}

/// Only calls Redis answered are latency samples: once its server is gone,
/// a refused or broken connection is no reply (two such calls were
/// sampled, at 0.2 ms and 22 ms, found by an audit).
#[test]
fn calls_redis_never_answered_are_no_latency_samples() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let mut server = RedisServer::spawn();
    let samples = |snapshotter: &Snapshotter| -> usize {
        let values = snapshotter.snapshot().into_vec();
        let found = values
            .into_iter()
            .filter(|(key, ..)| key.key().name() == STORE_LATENCY);
        found
            .map(|(.., value)| match value {
                DebugValue::Histogram(samples) => samples.len(),
                DebugValue::Counter(_) | DebugValue::Gauge(_) => 0,
            })
            .sum()
    };
    block_on(&recorder, || async {
        let store = soon_given_up(&server).await;
        let policy = Policy::new("latency", Algorithm::Gcra, "10/s").unwrap();
        store.check(&Key::user("x"), &policy, 1).await.unwrap();
        assert_eq!(samples(&snapshotter), 1, "a reply");
        server.kill();
        for i in 0..4 {
            let key = Key::user(format!("k{i}"));
            assert!(store.check(&key, &policy, 1).await.is_err());
        }
    });
    assert_eq!(samples(&snapshotter), 0, "no reply came");
}

/// During an outage, a key the deny cache still denies is answered from
/// it, and counted as a deny-cache hit: those answers were counted
/// nowhere, neither as hits nor as store errors (found by an audit).
#[test]
fn denials_answered_from_the_deny_cache_in_an_outage_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let mut server = RedisServer::spawn();
    let policy = Policy::new("cutoff", Algorithm::Gcra, "1/h").unwrap();
    block_on(&recorder, || async {
        let store = soon_given_up(&server).await;
        let key = Key::user("bad");
        assert!(store.check(&key, &policy, 1).await.unwrap().is_allowed());
        assert!(!store.check(&key, &policy, 1).await.unwrap().is_allowed());
        change(&snapshotter, DENY_CACHE_HITS, &[("policy", "cutoff")]);
        server.kill();
        // Past the second in which the cache answers for a live Redis.
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        for _ in 0..10 {
            let denied = store.check(&key, &policy, 1).await.unwrap();
            assert!(!denied.is_allowed());
        }
    });
    let hits = change(&snapshotter, DENY_CACHE_HITS, &[("policy", "cutoff")]);
    assert_eq!(hits, 10.0);
}

/// A store on `server` whose calls give up after 100 ms.
async fn soon_given_up(server: &RedisServer) -> RedisStore {
    RedisStore::builder()
        .deadline(Duration::from_millis(100))
        .connect(server.url())
        .await
        .unwrap()
}
