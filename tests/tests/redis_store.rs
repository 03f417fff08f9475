//! The Redis store against real Redis servers: exact across instances, one
//! round trip, NOSCRIPT recovery, TTLs, hostile keys.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use tokio::sync::Barrier;
use tollgate_core::state::PolicyState;
use tollgate_core::{Algorithm, Clock, FakeClock, Key, Policy, Shape, Store, SystemClock};
use tollgate_redis::RedisStore;
use tollgate_tests::{RedisServer, command_calls, require_redis, unique_prefix};

async fn store(url: &str, prefix: &str, clock: Option<FakeClock>) -> RedisStore {
    let builder = RedisStore::builder()
        .prefix(prefix)
        .deadline(Duration::from_secs(10))
        .response_timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(2));
    let builder = match clock {
        Some(clock) => builder.test_clock(clock),
        None => builder,
    };
    builder.connect(url).await.unwrap()
}

/// A store on Redis `TIME`, as in production, without a deny cache (every
/// decision runs the script), whose one-time script always writes first
/// or always reads first.
async fn script_store(url: &str, prefix: &str, write_first: bool) -> RedisStore {
    RedisStore::builder()
        .prefix(unique_prefix(prefix))
        .deadline(Duration::from_secs(10))
        .deny_cache(0)
        .test_write_first(write_first)
        .connect(url)
        .await
        .unwrap()
}

/// Sends `n` checks of `key` at once (released together by a barrier),
/// spread over `stores` in turn, and returns how many were admitted.
async fn admitted_at_once(stores: &[RedisStore], policy: &Policy, key: &Key, n: usize) -> usize {
    let barrier = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (store, policy, key, barrier) = (
                stores[i % stores.len()].clone(),
                policy.clone(),
                key.clone(),
                barrier.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                store.check(&key, &policy, 1).await.unwrap().is_allowed()
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await.unwrap());
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_instances_admit_exactly_the_limit() {
    let url = require_redis().await;
    let prefix = unique_prefix("exact");
    let clock = FakeClock::default();
    let mut stores = Vec::new();
    for _ in 0..8 {
        stores.push(store(&url, &prefix, Some(clock.clone())).await);
    }
    for algorithm in Algorithm::ALL {
        let policy = Policy::new("exact", algorithm, "100/min").unwrap();
        for round in 0..3 {
            let key = Key::user(format!("{algorithm}-{round}"));
            let allowed = admitted_at_once(&stores, &policy, &key, 1_000).await;
            assert_eq!(allowed, 100, "{algorithm}, round {round}");
        }
    }
}

async fn count_round_trips<C: tollgate_redis::RedisConnection>(
    server: &RedisServer,
    store: RedisStore<C>,
) {
    let mut con = server.connection();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    let mut decisions = 0;
    for algorithm in Algorithm::ALL {
        let three = Policy::builder("three")
            .algorithm(algorithm)
            .limit("10/s")
            .limit("100/min")
            .limit("1000/h")
            .build()
            .unwrap();
        for i in 0..20 {
            store
                .check(&Key::user(format!("u{}", i % 3)), &three, 1)
                .await
                .unwrap();
            decisions += 1;
        }
    }
    assert_eq!(command_calls(&mut con, "evalsha"), decisions);
    assert_eq!(command_calls(&mut con, "eval"), 0);
    assert_eq!(
        command_calls(&mut con, "script|load"),
        0,
        "scripts were loaded at start-up"
    );
}

#[tokio::test]
async fn one_evalsha_per_decision_even_with_three_limits() {
    let server = RedisServer::spawn();
    count_round_trips(&server, store(&server.url(), "rt", None).await).await;
    let pooled = RedisStore::builder()
        .prefix("rt-pool")
        .deadline(Duration::from_secs(10))
        .pool_checkout_timeout(Duration::from_secs(2))
        .connect_pool(server.url())
        .await
        .unwrap();
    count_round_trips(&server, pooled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_mid_run_surfaces_no_error() {
    let server = RedisServer::spawn();
    let store = store(&server.url(), "flush", None).await;
    let policy = Policy::new("flush", Algorithm::SlidingWindow, "1000000/min").unwrap();
    let flusher = {
        let url = server.url();
        tokio::spawn(async move {
            let client = redis::Client::open(url).unwrap();
            let mut con = client.get_multiplexed_async_connection().await.unwrap();
            for _ in 0..20 {
                let _: () = redis::cmd("SCRIPT")
                    .arg("FLUSH")
                    .query_async(&mut con)
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let mut ok = 0;
    while !flusher.is_finished() {
        let d = store
            .check(&Key::user("f"), &policy, 1)
            .await
            .expect("no error reaches the caller");
        assert!(d.is_allowed());
        ok += 1;
    }
    flusher.await.unwrap();
    let mut con = server.connection();
    assert_eq!(command_calls(&mut con, "script|flush"), 20);
    assert!(ok > 20, "{ok} decisions ran during the flushes");
    // Every NOSCRIPT was answered by one EVAL with the source.
    assert!(
        command_calls(&mut con, "eval") > 0,
        "the flushes were noticed"
    );
}

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

/// The time stored under `state_key` (µs) and its expiry (PEXPIRETIME, ms).
async fn time_and_expiry(
    con: &mut redis::aio::MultiplexedConnection,
    state_key: &str,
) -> (u64, u64) {
    // "<time>|<descriptor>"
    let value: String = con.get(state_key).await.unwrap();
    let time = value.split('|').next().unwrap().parse().unwrap();
    let expiry: u64 = redis::cmd("PEXPIRETIME")
        .arg(state_key)
        .query_async(con)
        .await
        .unwrap();
    (time, expiry)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_writes_first_while_keys_are_idle_and_reads_first_once_they_are_busy() {
    let server = RedisServer::spawn();
    let mut con = server.connection();
    let store = RedisStore::builder()
        .deadline(Duration::from_secs(10))
        .deny_cache(0)
        .connect(server.url())
        .await
        .unwrap();
    let policy = Policy::new("order", Algorithm::Gcra, "10/min").unwrap();
    let reset = |con: &mut redis::Connection| {
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(con).unwrap();
    };
    // 100 keys, once each: every key is absent, and one SET ... NX GET
    // decides it.
    reset(&mut con);
    for i in 0..100 {
        let d = store
            .check(&Key::user(format!("idle-{i}")), &policy, 1)
            .await;
        assert!(d.unwrap().is_allowed());
    }
    assert_eq!(command_calls(&mut con, "set"), 100);
    assert_eq!(command_calls(&mut con, "get"), 0);
    // One key, 100 times: the first request finds it absent, every later
    // one finds it holding a time. The share of such requests, a moving
    // average over about 32, first reaches a quarter with the tenth of
    // them (2,048 per 65,536 each, less 1/32 of the share): requests 1 to
    // 11 write first, 12 to 100 read first.
    reset(&mut con);
    let mut allowed = 0;
    for _ in 0..100 {
        allowed += usize::from(
            store
                .check(&Key::user("busy"), &policy, 1)
                .await
                .unwrap()
                .is_allowed(),
        );
    }
    assert_eq!(allowed, 10);
    // Eleven SET ... NX GET, then a SET for each of the nine admitted after
    // the first, which wrote the key; a denial writes nothing.
    assert_eq!(command_calls(&mut con, "set"), 11 + 9);
    assert_eq!(command_calls(&mut con, "get"), 89);
    assert_eq!(command_calls(&mut con, "incrby"), 0);
}

#[tokio::test]
async fn hostile_keys_are_distinct_fixed_length_and_never_raw() {
    let url = require_redis().await;
    let prefix = unique_prefix("hostile");
    let store = store(&url, &prefix, Some(FakeClock::default())).await;
    let policy = Policy::new("hostile", Algorithm::FixedWindow, "5/min").unwrap();
    let megabyte = vec![b'z'; 1 << 20];
    let values: Vec<Vec<u8>> = vec![
        b"{".to_vec(),
        b"}".to_vec(),
        b"{a}:{b}".to_vec(),
        b":".to_vec(),
        b"line\nbreak".to_vec(),
        b"nul\0byte".to_vec(),
        megabyte,
    ];
    let mut names = Vec::new();
    for value in &values {
        let d = store.check(&Key::custom(value), &policy, 1).await.unwrap();
        assert_eq!(d.remaining(), 4, "each value has its own bucket");
        names.push(store.state_key(&policy, &Key::custom(value)));
    }
    // ("a", "b:c") and ("a:b", "c") as policy name and value.
    let a = Policy::new("a", Algorithm::FixedWindow, "1/min").unwrap();
    let ab = Policy::new("a:b", Algorithm::FixedWindow, "1/min").unwrap();
    assert!(
        store
            .check(&Key::custom("b:c"), &a, 1)
            .await
            .unwrap()
            .is_allowed()
    );
    assert!(
        store
            .check(&Key::custom("c"), &ab, 1)
            .await
            .unwrap()
            .is_allowed()
    );
    names.push(store.state_key(&a, &Key::custom("b:c")));
    names.push(store.state_key(&ab, &Key::custom("c")));

    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    for name in &names {
        let exists: bool = con.exists(name).await.unwrap();
        assert!(exists, "{name}");
        let hash = name.rsplit_once('{').unwrap().1;
        assert_eq!(
            hash.len(),
            33,
            "{name}: 32 hex digits and the closing brace"
        );
        assert!(!name.contains('\n') && !name.contains('\0') && name.len() < 100);
    }
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len());
}

#[tokio::test]
async fn the_default_clock_is_redis_time() {
    let url = require_redis().await;
    let store = store(&url, &unique_prefix("time"), None).await;
    let policy = Policy::new("time", Algorithm::Gcra, "1/s").unwrap();
    let d = store.check(&Key::user("t"), &policy, 1).await.unwrap();
    let local = SystemClock.now();
    let skew = local.as_micros().abs_diff(d.now().as_micros());
    assert!(
        skew < 5_000_000,
        "Redis TIME {} vs local {}",
        d.now(),
        local
    );
}

/// Redis `TIME` in µs.
async fn redis_time(con: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (sec, usec): (u64, u64) = redis::cmd("TIME").query_async(con).await.unwrap();
    sec * 1_000_000 + usec
}

/// A single key that holds a time gets only the gap back from Redis. Its
/// decision is still exact by Redis's clock: the stored time less what the
/// decision says is left is a moment between a `TIME` read before and one
/// read after. Only `now()` is estimated, from the previous reply, and it
/// lies between that reply's time and the `TIME` read after.
#[tokio::test]
async fn a_busy_key_is_decided_exactly_by_redis_time_and_stamped_by_its_estimate() {
    let url = require_redis().await;
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    for write_first in [true, false] {
        let store = script_store(&url, "gap", write_first).await;
        // 2 at most, one each 30 s: the second request is admitted at a
        // busy key, the third denied.
        let policy = Policy::new("gap", Algorithm::Gcra, "2/min").unwrap();
        let interval = policy.params()[0].interval_us;
        let (key, mut last) = (Key::user("g"), None);
        let state_key = store.state_key(&policy, &key);
        for n in 1..=3 {
            let before = redis_time(&mut con).await;
            let d = store.check(&key, &policy, 1).await.unwrap();
            let after = redis_time(&mut con).await;
            let stored: String = con.get(&state_key).await.unwrap();
            let stored: u64 = stored.split('|').next().unwrap().parse().unwrap();
            // What Redis's clock read when it decided.
            let decided_at = match n {
                1 => d.now().as_micros(),
                2 => stored - d.reset().as_micros() as u64,
                _ => stored - interval - d.retry_after().unwrap().as_micros() as u64,
            };
            assert_eq!(
                d.is_allowed(),
                n < 3,
                "request {n}, write first {write_first}"
            );
            assert!(
                (before..=after).contains(&decided_at),
                "request {n}: decided at {decided_at}, not between {before} and {after}"
            );
            let now = d.now().as_micros();
            assert!(
                last.is_none_or(|last| last <= now) && now <= after,
                "request {n}: stamped {now}, after {last:?}, TIME after {after}"
            );
            last = Some(now);
        }
    }
}
