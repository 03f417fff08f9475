//! The limiter's counts: `until_ready`'s waits apart from refusals, and
//! the near-limit counter of each limit.
#![cfg(feature = "metrics")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

#[path = "support/flaky.rs"]
mod flaky;

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tollgate::telemetry::{DECISIONS, NEAR_LIMIT, WAITS};
use tollgate::{
    Algorithm, FakeClock, Jitter, Key, MemoryOverrides, MemoryStore, Override, OverrideStore,
    Policy, RateLimiter, Timestamp, TokioClock, WaitError,
};

/// Runs `test` on a current-thread runtime, its time paused, with
/// `recorder` installed.
fn with_recorder<F: Future>(recorder: &DebuggingRecorder, test: impl FnOnce() -> F) -> F::Output {
    metrics::with_local_recorder(recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(test())
    })
}

/// The counters of `policy` by outcome, since the last snapshot (a
/// snapshot drains them): `(decisions allowed, limited, waits admitted,
/// gave up)`.
fn counts(snapshotter: &Snapshotter, policy: &str) -> (u64, u64, u64, u64) {
    let mut found = (0, 0, 0, 0);
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let labels: Vec<_> = key.labels().map(|l| (l.key(), l.value())).collect();
        let (DebugValue::Counter(n), [("policy", p), ("outcome", outcome)]) = (value, &labels[..])
        else {
            continue;
        };
        if *p != policy {
            continue;
        }
        match (key.name(), *outcome) {
            (DECISIONS, "allowed") => found.0 = n,
            (DECISIONS, "limited") => found.1 = n,
            (WAITS, "admitted") => found.2 = n,
            (WAITS, "gave_up") => found.3 = n,
            _ => {}
        }
    }
    found
}

/// 30 jobs, one after the other, on 10 a second: the 11th and the 21st
/// wait for the next window and go out. Every job went out: 30 `allowed`,
/// 0 `limited` (though 2 checks were refused while waiting), and 2 waits,
/// both `admitted`. Then a job that cannot wait long enough gives up: one
/// `limited`, one wait `gave_up`.
#[test]
fn until_ready_counts_waits_apart_from_refusals() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    with_recorder(&recorder, || async {
        let clock = TokioClock::starting_at(Timestamp::from_secs(1_700_000_000));
        let store = MemoryStore::builder().clock(clock).build().unwrap();
        let policy = Policy::new("partner", Algorithm::FixedWindow, "10/s").unwrap();
        let limiter = RateLimiter::with_store(policy, store).jitter(Jitter::NONE);
        let partner = Key::custom("partner");
        let start = tokio::time::Instant::now();
        for _ in 0..30 {
            let admitted = limiter
                .until_ready(&partner, Duration::from_secs(5))
                .await
                .unwrap();
            assert!(admitted.is_allowed());
        }
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        // 30 allowed, 0 limited; 2 waits admitted, none given up.
        assert_eq!(counts(&snapshotter, "partner"), (30, 0, 2, 0));

        // The window of the last 10 jobs is full: the next would wait 1 s,
        // more than it may.
        let gave_up = limiter
            .until_ready(&partner, Duration::from_millis(10))
            .await
            .unwrap_err();
        assert!(matches!(gave_up, WaitError::TooLong { .. }), "{gave_up:?}");
        // Since the last snapshot: 1 limited, 1 wait given up.
        assert_eq!(counts(&snapshotter, "partner"), (0, 1, 0, 1));
    });
}

/// Two limits, 10/s and 50/min, and 10 requests in each of 5 seconds:
/// each second the 8th, 9th and 10th leave 10/s at least 80 % used (15
/// in all); the 40th to the 50th leave 50/min so (11). Refusals never
/// count. A key's own limits (an override of 3/h) count as `override`:
/// its 3rd request (3 of 3 used; the 2nd leaves 67 %).
#[test]
fn near_limit_counts_each_limit_at_80_percent() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    with_recorder(&recorder, || async {
        // The start of a minute.
        let clock = FakeClock::new(Timestamp::from_secs(1_700_000_040));
        let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        let policy = Policy::builder("api")
            .algorithm(Algorithm::FixedWindow)
            .limit("10/s")
            .limit("50/min")
            .build()
            .unwrap();
        let overrides = MemoryOverrides::new();
        let limiter = RateLimiter::with_store(policy.clone(), store).overrides(overrides.clone());
        let ada = Key::user("ada");
        for _ in 0..5 {
            for _ in 0..10 {
                assert!(limiter.check(&ada).await.unwrap().is_allowed());
            }
            assert!(!limiter.check(&ada).await.unwrap().is_allowed());
            clock.advance(Duration::from_secs(1));
        }
        assert!(
            !limiter.check(&ada).await.unwrap().is_allowed(),
            "50/min is used up"
        );

        let grace = Key::user("grace");
        overrides
            .set(&grace, &policy, Override::limit("3/h").unwrap(), None)
            .await
            .unwrap();
        for _ in 0..3 {
            assert!(limiter.check(&grace).await.unwrap().is_allowed());
        }
        assert!(!limiter.check(&grace).await.unwrap().is_allowed());

        let snapshot = snapshotter.snapshot().into_vec();
        let near = |limit: &str| {
            snapshot
                .iter()
                .find_map(|(key, _, _, value)| {
                    let key = key.key();
                    let labels: Vec<_> = key.labels().map(|l| (l.key(), l.value())).collect();
                    match value {
                        DebugValue::Counter(n)
                            if key.name() == NEAR_LIMIT
                                && labels == [("policy", "api"), ("limit", limit)] =>
                        {
                            Some(*n)
                        }
                        _ => None,
                    }
                })
                .unwrap_or_else(|| panic!("no {NEAR_LIMIT} of {limit}"))
        };
        assert_eq!(near("10/s"), 15);
        assert_eq!(near("50/min"), 11);
        assert_eq!(near("override"), 1);
    });
}

/// A wait refused once, then ended by the store's failure, counts once:
/// given up.
#[test]
fn a_wait_ended_by_a_store_failure_is_given_up() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    with_recorder(&recorder, || async {
        let clock = TokioClock::starting_at(Timestamp::from_secs(1_700_000_000));
        let store = flaky::Flaky::new(MemoryStore::builder().clock(clock).build().unwrap());
        let policy = Policy::new("failing", Algorithm::Gcra, "1/s").unwrap();
        let limiter = RateLimiter::with_store(policy, store.clone())
            .on_store_error(tollgate::FailureMode::Closed);
        let key = Key::custom("k");
        limiter.check(&key).await.unwrap();
        let waiting = {
            let (limiter, key) = (limiter.clone(), key.clone());
            tokio::spawn(async move { limiter.until_ready(&key, Duration::from_secs(5)).await })
        };
        // Refused once, and waiting.
        tokio::task::yield_now().await;
        store.fail(true);
        let ended = waiting.await.unwrap();
        assert!(matches!(ended, Err(WaitError::Store(_))), "{ended:?}");
    });
    // 1 allowed; the wait's refusal is not a decision of its own (1
    // limited would be the gave-up check's); the wait given up.
    let (_, _, admitted, gave_up) = counts(&snapshotter, "failing");
    assert_eq!((admitted, gave_up), (0, 1));
}
