//! Hostile keys, and time: the default clock is Redis `TIME`, and a busy
//! key is decided exactly by it.

use redis::AsyncCommands;
use tollgate_core::{Algorithm, Clock, FakeClock, Key, Policy, Store, SystemClock};
use tollgate_tests::{require_redis, unique_prefix};

use super::{redis_time, script_store, store, stored_time};

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
            let stored = stored_time(&stored);
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
