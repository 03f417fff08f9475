//! The layout of a word script's value: what this version writes, byte
//! for byte, and that values of the earlier layout ("<time in decimal>|
//! <descriptor>") still read as the same state, so that a deploy of this
//! version hands no key a fresh quota.

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tollgate_core::{Algorithm, FakeClock, Key, Policy, Store, Timestamp};
use tollgate_redis::RedisStore;
use tollgate_tests::{require_redis, unique_prefix};

use super::{store, stored_time};

/// The start of an hour, so that every window is whole.
const T0: u64 = 1_700_002_800_000_000;

/// A store under a prefix of `test`'s on a clock at [`T0`], and a
/// connection to its Redis to read the values it writes.
async fn at_t0(test: &str) -> (FakeClock, RedisStore, MultiplexedConnection) {
    let url = require_redis().await;
    let clock = FakeClock::new(Timestamp::from_micros(T0));
    let store = store(&url, &unique_prefix(test), Some(clock.clone())).await;
    let con = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    (clock, store, con)
}

#[tokio::test]
async fn a_word_value_is_its_time_in_hexadecimal_then_its_descriptor() {
    let (_, store, mut con) = at_t0("layout").await;
    let key = Key::user("golden");
    for (algorithm, expected) in [
        // Now plus one interval of 100 ms.
        (Algorithm::Gcra, "0x0060a24bf0462a0|gcra 1000000/100000/10"),
        (
            Algorithm::LeakyBucket,
            "0x0060a24bf0462a0|leaky_bucket 1000000/100000/10",
        ),
        // Full again one interval from now.
        (
            Algorithm::TokenBucket,
            "0x0060a24bf0462a0|token_bucket 1000000/100000/10",
        ),
        // The window's start plus a count of 1.
        (
            Algorithm::FixedWindow,
            "0x0060a24bf02dc01|fixed_window 1000000/100000/10",
        ),
    ] {
        let policy = Policy::new(format!("layout-{algorithm}"), algorithm, "10/s").unwrap();
        assert!(store.check(&key, &policy, 1).await.unwrap().is_allowed());
        let value: String = con.get(store.state_key(&policy, &key)).await.unwrap();
        assert_eq!(value, expected, "{algorithm}");
    }
}

#[tokio::test]
async fn values_of_the_decimal_layout_read_as_the_same_state() {
    let (clock, store, mut con) = at_t0("layout-old").await;
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
    ] {
        let policy = Policy::new(format!("layout-old-{algorithm}"), algorithm, "10/s").unwrap();
        let (kept, rewritten) = (Key::user("kept"), Key::user("rewritten"));
        // Both keys used alike, then one of them rewritten as an earlier
        // version of the scripts would have written the same state.
        for _ in 0..6 {
            for key in [&kept, &rewritten] {
                assert!(store.check(key, &policy, 1).await.unwrap().is_allowed());
            }
        }
        let state_key = store.state_key(&policy, &rewritten);
        let value: String = con.get(&state_key).await.unwrap();
        let (_, descriptor) = value.split_once('|').unwrap();
        let old = format!("{}|{descriptor}", stored_time(&value));
        let _: () = redis::cmd("SET")
            .arg(&state_key)
            .arg(&old)
            .arg("KEEPTTL")
            .query_async(&mut con)
            .await
            .unwrap();
        // Every later decision is the same on both keys: the old value's
        // use counts, and nothing starts afresh.
        for step in 0..8 {
            let a = store.check(&kept, &policy, 1).await.unwrap();
            let b = store.check(&rewritten, &policy, 1).await.unwrap();
            assert_eq!(a, b, "{algorithm}, request {step}");
            clock.advance(std::time::Duration::from_millis(30));
        }
        // Written back in this version's layout.
        let value: String = con.get(&state_key).await.unwrap();
        assert!(value.starts_with("0x"), "{algorithm}: {value}");
    }
}

/// A refund of a request reserved in a window past writes nothing: the
/// key keeps the word of that window, as the memory store keeps its
/// state (it wrote a stray word before the new window's start).
#[tokio::test]
async fn a_refund_in_a_new_window_leaves_the_word_as_it_was() {
    let (clock, store, mut con) = at_t0("layout-refund").await;
    let key = Key::user("late");
    let policy = Policy::new("layout-refund", Algorithm::FixedWindow, "10/s").unwrap();
    let reserved = store.check(&key, &policy, 3).await.unwrap();
    let state_key = store.state_key(&policy, &key);
    let before: String = con.get(&state_key).await.unwrap();
    clock.advance(std::time::Duration::from_secs(1));
    let settled = store
        .settle(
            &key,
            &policy,
            tollgate_core::Settlement::of(&reserved, 3, 0),
        )
        .await
        .unwrap();
    assert_eq!(settled.remaining(), 10, "the new window is whole");
    let after: String = con.get(&state_key).await.unwrap();
    assert_eq!(after, before);
}
