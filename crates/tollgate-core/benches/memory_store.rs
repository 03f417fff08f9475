//! The memory store's check, per algorithm, on 1 key and on 100,000 keys,
//! on 1 and 2 threads, next to `governor`'s keyed GCRA limiter in the same
//! run.
//!
//! Run with: `cargo bench -p tollgate-core --bench memory_store`
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use tollgate_core::{Algorithm, Key, MemoryStore, Policy};

const KEYS: u64 = 100_000;

/// Runs `check(i)` `iters` times spread over `threads` threads; the time per
/// check is the wall time divided by `iters`.
fn spread(iters: u64, threads: u64, check: impl Fn(u64) + Sync) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let check = &check;
            s.spawn(move || {
                for i in (t..iters).step_by(threads as usize) {
                    check(i);
                }
            });
        }
    });
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    // Limits high enough that every check is admitted.
    let quota = Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap());
    let mut group = c.benchmark_group("check");
    for threads in [1u64, 2] {
        for keys in [1u64, KEYS] {
            let label = |name: &str| format!("{name}/{keys}-keys/{threads}-threads");
            let governor = Arc::new(RateLimiter::<u64, _, _>::dashmap(quota));
            group.bench_function(label("governor-gcra"), |b| {
                b.iter_custom(|iters| {
                    spread(iters, threads, |i| {
                        drop(black_box(governor.check_key(&(i % keys))))
                    })
                })
            });
            for algorithm in Algorithm::ALL {
                let store = MemoryStore::builder().max_keys(1_000_000).build().unwrap();
                let policy = Policy::new("bench", algorithm, "1000000000/s").unwrap();
                let names: Vec<Key> = (0..keys).map(|k| Key::user(k.to_be_bytes())).collect();
                group.bench_function(label(algorithm.as_str()), |b| {
                    b.iter_custom(|iters| {
                        spread(iters, threads, |i| {
                            black_box(
                                store
                                    .check_sync(&names[(i % keys) as usize], &policy, 1)
                                    .unwrap(),
                            );
                        })
                    })
                });
            }
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1)).sample_size(20);
    targets = bench
}
criterion_main!(benches);
