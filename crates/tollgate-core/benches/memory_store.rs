//! The memory store's check, per algorithm, on 1 key and on 100,000 keys,
//! on 1 and 2 threads, next to `governor`'s keyed GCRA limiter in the same
//! run; and an in-flight slot taken and given back on a key whose other
//! slots are held by 0, 100 or 10,000 requests.
//!
//! Run with: `cargo bench -p tollgate-core --bench memory_store`
//! (`-- slots` for the slots alone).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::spread;

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use tollgate_core::{Algorithm, InFlightLimit, Key, MemoryStore, Policy, SlotStore};

const KEYS: u64 = 100_000;

/// Every check is admitted and every key's state stays live for the whole
/// run, for governor and for tollgate alike: 10/s with a burst of four
/// billion for the rate-based algorithms (each check pushes the key's state
/// 100 ms into the future, and keys are revisited within milliseconds),
/// a billion an hour for the windowed counters (below half the hour's
/// 3.6 billion µs, so that a fixed window is one word, as any limit short
/// of half a million a second is; see `Shape::WindowWord`). The
/// sliding log would
/// keep an entry per check at that limit, so it gets a billion a second,
/// and its keys expire and are re-created during the run.
fn policy(algorithm: Algorithm) -> Policy {
    let builder = Policy::builder("bench").algorithm(algorithm);
    match algorithm {
        Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra => {
            builder.limit("10/s").burst(BURST)
        }
        Algorithm::SlidingLog => builder.limit("1000000000/s"),
        Algorithm::FixedWindow | Algorithm::SlidingWindow => builder.limit("1000000000/h"),
    }
    .build()
    .unwrap()
}

const BURST: u64 = 4_000_000_000;

fn bench(c: &mut Criterion) {
    let quota = Quota::per_second(NonZeroU32::new(10).unwrap())
        .allow_burst(NonZeroU32::new(BURST as u32).unwrap());
    let mut group = c.benchmark_group("check");
    for threads in [1u64, 2] {
        for keys in [1u64, KEYS] {
            let label = |name: &str| format!("{name}/{keys}-keys/{threads}-threads");
            let governor = Arc::new(RateLimiter::<u64, _, _>::dashmap(quota));
            group.bench_function(label("governor-gcra"), |b| {
                b.iter_custom(|iters| {
                    spread(0..iters, threads, |i| {
                        assert!(black_box(governor.check_key(&(i % keys))).is_ok())
                    })
                })
            });
            for algorithm in Algorithm::ALL {
                let store = MemoryStore::builder().max_keys(1_000_000).build().unwrap();
                let policy = policy(algorithm);
                group.bench_function(label(algorithm.as_str()), |b| {
                    b.iter_custom(|iters| {
                        spread(0..iters, threads, |i| {
                            // Built per check, as governor's key is.
                            let key = Key::user((i % keys).to_be_bytes());
                            let decision = store.check_sync(&key, &policy, 1).unwrap();
                            assert!(black_box(decision).is_allowed());
                        })
                    })
                });
            }
        }
    }
    group.finish();
}

/// One request's slot, taken and given back, on one key whose other slots
/// `others` requests hold all along (a route's limit in flight, one key).
fn slots(c: &mut Criterion) {
    let mut group = c.benchmark_group("slots");
    for others in [0u64, 100, 10_000] {
        let store = MemoryStore::new();
        let limit = InFlightLimit::new("bench", others + 1).unwrap();
        let key = Key::user("route");
        for holder in 0..others {
            assert!(store.acquire_slot_sync(&key, &limit, holder).acquired);
        }
        let mut holder = others;
        group.bench_function(format!("acquire-release/{others}-held"), |b| {
            b.iter(|| {
                holder += 1;
                let slots = store.acquire_slot_sync(&key, &limit, holder);
                assert!(black_box(slots).acquired);
                store.release_now(&key, &limit, holder);
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1)).sample_size(20);
    targets = bench, slots
}
criterion_main!(benches);
