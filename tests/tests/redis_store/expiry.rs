//! Every key expires once its state no longer matters: TTLs of every
//! algorithm, and one-word keys that expire at the millisecond their time
//! or window ends.

use std::time::Duration;

use redis::AsyncCommands;
use tollgate_core::state::PolicyState;
use tollgate_core::{Algorithm, Key, Policy, Shape, Store};
use tollgate_tests::{require_redis, unique_prefix};

use super::{admitted_at_once, redis_time, script_store, store, time_and_expiry};

#[tokio::test]
async fn every_key_has_a_ttl_no_longer_than_its_state_matters() {
    let url = require_redis().await;
    let prefix = unique_prefix("ttl");
    // Redis TIME, as in production.
    let store = store(&url, &prefix, None).await;
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let mut expected = Vec::new();
    // Every algorithm with two limits (the general scripts) and with one
    // (for GCRA, the token bucket and the leaky bucket, the one-time
    // script; for the fixed window, the window-word script).
    let policies = Algorithm::ALL.into_iter().flat_map(|algorithm| {
        let two = Policy::builder(format!("ttl-{algorithm}"))
            .algorithm(algorithm)
            .limit("5/7s")
            .limit("20/1h")
            .build()
            .unwrap();
        let one = Policy::new(format!("ttl-one-{algorithm}"), algorithm, "5/7s").unwrap();
        [two, one]
    });
    for policy in policies {
        let algorithm = policy.algorithm();
        for (user, requests) in [("a", 1u64), ("b", 3), ("c", 9)] {
            let key = Key::user(user);
            let mut reference: Option<(PolicyState, tollgate_core::Timestamp)> = None;
            for _ in 0..requests {
                let d = store.check(&key, &policy, 1).await.unwrap();
                // Replay on the reference model at the script's own time.
                let (state, _) =
                    reference.get_or_insert_with(|| (PolicyState::new(&policy, d.now()), d.now()));
                let replay = state.decide(&policy, d.now(), 1);
                assert_eq!(replay.is_allowed(), d.is_allowed(), "{algorithm}");
                reference.as_mut().unwrap().1 = d.now();
            }
            let (state, last) = reference.unwrap();
            let life_ms = state
                .expires_at(&policy)
                .as_micros()
                .saturating_sub(last.as_micros())
                .div_ceil(1_000);
            let state_key = store.state_key(&policy, &key);
            let written = std::time::Instant::now();
            expected.push((state_key.clone(), life_ms, written));
            if algorithm == Algorithm::SlidingLog {
                for limit in policy.limits() {
                    let period = limit.period_micros();
                    expected.push((format!("{state_key}:{period}"), life_ms, written));
                }
            }
        }
    }
    let mut found = Vec::new();
    let mut iter: redis::AsyncIter<'_, String> =
        con.scan_match(format!("{prefix}:*")).await.unwrap();
    while let Some(key) = iter.next_item().await {
        found.push(key.unwrap());
    }
    drop(iter);
    found.sort();
    // A fixed window's state can end a moment after it was written (at the
    // window's end), so a key whose life has run out by the scan may be
    // gone; every other expected key must be there, and nothing else.
    let scanned = std::time::Instant::now();
    let mut names: Vec<String> = expected.iter().map(|(k, _, _)| k.clone()).collect();
    names.sort();
    let mut live: Vec<String> = expected
        .iter()
        .filter(|(_, life_ms, written)| {
            Duration::from_millis(*life_ms)
                > scanned.duration_since(*written) + Duration::from_millis(100)
        })
        .map(|(k, _, _)| k.clone())
        .collect();
    live.sort();
    assert!(
        found.iter().all(|k| names.contains(k)),
        "only the expected keys exist: {found:?}"
    );
    assert!(
        live.iter().all(|k| found.contains(k)),
        "every key whose state still matters exists: {live:?}, found {found:?}"
    );
    // On a busy machine more time passes between the writes and the scan:
    // at least half the keys must still matter, or the test checks little.
    assert!(
        live.len() * 2 >= names.len(),
        "{} of {} keys expired",
        names.len() - live.len(),
        names.len()
    );
    for (key, life_ms, written) in expected {
        if !found.contains(&key) {
            continue;
        }
        let pttl: i64 = con.pttl(&key).await.unwrap();
        if pttl == -2 && !live.contains(&key) {
            // Expired since the scan, as its short life allowed.
            continue;
        }
        assert!(pttl > 0, "{key} has PTTL {pttl}");
        let pttl = pttl as u64;
        // Real time has passed since the write: as much as was measured
        // (a busy machine may take seconds), and a margin for rounding.
        let since = u64::try_from(written.elapsed().as_millis()).unwrap();
        assert!(
            pttl <= life_ms,
            "{key}: PTTL {pttl} ms > state life {life_ms} ms"
        );
        assert!(
            pttl + since + 1_000 >= life_ms,
            "{key}: PTTL {pttl} ms much shorter than {life_ms} ms, {since} ms after the write"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_word_key_expires_at_the_millisecond_its_time_ends() {
    let url = require_redis().await;
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    // Redis TIME, as in production, and no deny cache: every decision runs
    // the script, writing first and reading first.
    for write_first in [true, false] {
        let store = script_store(&url, "expiry", write_first).await;
        for algorithm in [
            Algorithm::Gcra,
            Algorithm::TokenBucket,
            Algorithm::LeakyBucket,
        ] {
            // 6,000,000 µs per request, 10 at most ahead: all of one test's
            // requests find the key's time ahead of now.
            let policy = Policy::new(format!("expiry-{algorithm}"), algorithm, "10/min").unwrap();
            let interval = policy.params()[0].interval_us;
            let key = Key::user("u");
            let state_key = store.state_key(&policy, &key);
            // The first request writes an absent key (SET), the next ones a
            // busy key (INCRBY, then PEXPIREAT): each moves the time by one
            // interval, and the key expires in the millisecond the time ends,
            // never before it and never a millisecond later.
            let mut previous = None;
            for n in 1..=10 {
                let d = store.check(&key, &policy, 1).await.unwrap();
                assert!(
                    d.is_allowed(),
                    "{algorithm}, request {n}, write first {write_first}"
                );
                let (time, expiry) = time_and_expiry(&mut con, &state_key).await;
                let expected = previous.unwrap_or(d.now().as_micros()) + interval;
                assert_eq!(time, expected, "{algorithm}, request {n}");
                assert_eq!(expiry, time.div_ceil(1_000), "{algorithm}, request {n}");
                previous = Some(time);
            }
            // A denial changes neither.
            let before = time_and_expiry(&mut con, &state_key).await;
            assert!(!store.check(&key, &policy, 1).await.unwrap().is_allowed());
            assert_eq!(
                time_and_expiry(&mut con, &state_key).await,
                before,
                "{algorithm}"
            );
            // Concurrent requests share calls (the same key several times in
            // one call) and leave the same invariant.
            let fresh = Key::user("concurrent");
            let state_key = store.state_key(&policy, &fresh);
            let admitted =
                admitted_at_once(std::slice::from_ref(&store), &policy, &fresh, 40).await;
            assert_eq!(admitted, 10, "{algorithm}");
            let (time, expiry) = time_and_expiry(&mut con, &state_key).await;
            assert_eq!(expiry, time.div_ceil(1_000), "{algorithm}, concurrent");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_window_key_is_one_counter_that_expires_when_its_window_ends() {
    let url = require_redis().await;
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    // Redis TIME, as in production, and no deny cache: every decision runs
    // the window-word script.
    let store = script_store(&url, "window-word", false).await;
    let policy = Policy::new("window-word", Algorithm::FixedWindow, "5/h").unwrap();
    assert_eq!(policy.shape(), Shape::WindowWord);
    let hour = 3_600_000_000;
    let key = Key::user("u");
    let state_key = store.state_key(&policy, &key);
    let mut reference: Option<PolicyState> = None;
    let (mut allowed, mut seen) = (0, Vec::new());
    for n in 1..=8 {
        let d = store.check(&key, &policy, 1).await.unwrap();
        allowed += usize::from(d.is_allowed());
        seen.push(d.now().as_micros());
        // Exactly the reference's decision at the script's own time (also
        // if an hour ends during the test).
        let state = reference.get_or_insert_with(|| PolicyState::new(&policy, d.now()));
        assert_eq!(state.decide(&policy, d.now(), 1), d, "request {n}");
        // The reference's window word: its window's start plus its count.
        let Some(reference_word) = state.window_word() else {
            panic!("{state:?}");
        };
        let start = reference_word - reference_word % hour;
        let count = reference_word - start;
        // The key holds the window's start plus its count (SET for the
        // window's first request, INCRBY after it; a denial writes
        // nothing), and expires in the millisecond the window ends.
        let (word, expiry) = time_and_expiry(&mut con, &state_key).await;
        assert_eq!(word, start + count, "request {n}");
        assert_eq!(start % hour, 0);
        assert_eq!(expiry, (start + hour).div_ceil(1_000), "request {n}");
    }
    // One window holds 5 (and the rest of 8 only if an hour ended during
    // the test, which the reference above followed).
    if seen.first().map(|t| t / hour) == seen.last().map(|t| t / hour) {
        assert_eq!(allowed, 5);
    }
    // A thousand concurrent requests on a fresh key of a daily limit:
    // exactly the count, unless a day ended meanwhile (by Redis's clock).
    let day = 86_400_000_000;
    let limit = Policy::new("window-word-100", Algorithm::FixedWindow, "100/d").unwrap();
    let fresh = Key::user("concurrent");
    let before = redis_time(&mut con).await;
    let admitted = admitted_at_once(std::slice::from_ref(&store), &limit, &fresh, 1_000).await;
    let after = redis_time(&mut con).await;
    if before / day == after / day {
        assert_eq!(admitted, 100);
    } else {
        assert!(admitted <= 200, "{admitted}");
    }
}
