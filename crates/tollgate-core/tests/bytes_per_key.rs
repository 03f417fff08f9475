//! Heap bytes per key: the memory store holding GCRA (and token-bucket and
//! fixed-window) state next to
//! `governor`'s keyed limiter holding the same keys, counted exactly by a
//! counting allocator (no timing). Run with `--nocapture` to see the table
//! recorded in BENCHMARKS.md.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;

use governor::{Quota, RateLimiter};
use tollgate_core::{Algorithm, FakeClock, Key, MemoryStore, Policy, Store, Timestamp};

/// Heap bytes held after `fill` builds and fills a structure, which it
/// hands back so that it is still alive when counting ends.
fn held<T>(fill: impl FnOnce() -> T) -> (i64, T) {
    let mut kept = None;
    let info = allocation_counter::measure(|| kept = Some(fill()));
    (info.bytes_current, kept.expect("filled"))
}

fn ip(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i))
}

fn tollgate(keys: u32, algorithm: Algorithm) -> i64 {
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
    let policy = Policy::new("per-ip", algorithm, "10/s").unwrap();
    let (bytes, store) = held(|| {
        let store = MemoryStore::builder()
            .max_keys(2 * keys as usize) // room for uneven shards; nothing is reserved
            .clock(clock)
            .build()
            .unwrap();
        for i in 0..keys {
            assert!(
                store
                    .check_sync(&Key::ip(ip(i)), &policy, 1)
                    .unwrap()
                    .is_allowed()
            );
        }
        store
    });
    assert_eq!(store.len(), keys as usize);
    bytes
}

/// Heap bytes `governor`'s keyed limiter holds for `keys` keys made by `key`.
fn governor<K: std::hash::Hash + Eq + Clone>(keys: u32, key: impl Fn(u32) -> K) -> i64 {
    let quota = Quota::per_second(NonZeroU32::new(10).unwrap());
    let (bytes, limiter) = held(|| {
        let limiter = RateLimiter::<K, _, _>::dashmap(quota);
        for i in 0..keys {
            assert!(limiter.check_key(&key(i)).is_ok());
        }
        limiter
    });
    assert_eq!(limiter.len(), keys as usize);
    bytes
}

#[test]
fn gcra_keys_cost_no_more_memory_than_in_governor() {
    println!(
        "| keys | tollgate GCRA | governor, IpAddr keys | governor, u64 keys | tollgate token bucket | tollgate fixed window |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for keys in [10_000u32, 100_000, 1_000_000] {
        let per_key = |bytes: i64| bytes as f64 / f64::from(keys);
        let ours = per_key(tollgate(keys, Algorithm::Gcra));
        let by_ip = per_key(governor(keys, ip));
        let by_u64 = per_key(governor(keys, u64::from));
        let token = per_key(tollgate(keys, Algorithm::TokenBucket));
        let window = per_key(tollgate(keys, Algorithm::FixedWindow));
        println!(
            "| {keys} | {ours:.1} B ({:.2}x) | {by_ip:.1} B | {by_u64:.1} B ({:.2}x) | {token:.1} B | {window:.1} B ({:.2}x) |",
            ours / by_ip,
            by_u64 / by_ip,
            window / by_ip,
        );
        // The same keys as governor's IP-keyed limiter (tower_governor's
        // default) hold at most as many bytes.
        assert!(
            ours <= by_ip,
            "{keys} keys: {ours:.1} B/key against governor's {by_ip:.1}"
        );
        // So does a single fixed window, whose state is one word too, with
        // the time it expires.
        assert!(
            window <= by_ip,
            "{keys} keys: fixed window {window:.1} B/key against governor's {by_ip:.1}"
        );
    }
}

/// Blocks and resets of ever new keys (an app that blocks each abusive
/// address) leave a block and a fence per key. Once they have ended they
/// are forgotten, also in a shard whose keys' state never fills it: twenty
/// waves of 10,000 keys, each wave ended before the next, grow the heap by
/// less than twice what the first wave held. (The hash tables reuse their
/// room; a table may grow once more, whether it does depends on the
/// store's random hash seed, to clear the marks that removed entries
/// leave, and then holds twice one wave's room.) The code before the fix
/// grew by the first wave's size, then twice that, four times and eight
/// times.
#[test]
fn ended_blocks_and_fences_are_forgotten() {
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
    let policy = Policy::new("per-ip", Algorithm::Gcra, "10/s").unwrap();
    let store = MemoryStore::builder()
        .shards(1)
        .clock(clock.clone())
        .build()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut wave = |w: u32| {
        let info = allocation_counter::measure(|| {
            runtime.block_on(async {
                for i in 0..10_000 {
                    let key = Key::ip(ip(w * 10_000 + i));
                    if i % 2 == 0 {
                        store
                            .block(&key, &policy, std::time::Duration::from_secs(1))
                            .await
                            .unwrap();
                    } else {
                        store.reset(&key, &policy).await.unwrap();
                    }
                }
            });
        });
        // Past the blocks' ends and the fences' (a minute for this policy).
        clock.advance(std::time::Duration::from_secs(120));
        info.bytes_current
    };
    let first = wave(0);
    assert!(first > 0, "the first wave holds its blocks and fences");
    let later: Vec<i64> = (1..20).map(&mut wave).collect();
    assert!(
        later.iter().sum::<i64>() < 2 * first,
        "the later waves grew the heap by {later:?} after the first's {first} B"
    );
    assert_eq!(store.len(), 0, "no key holds state");
}
