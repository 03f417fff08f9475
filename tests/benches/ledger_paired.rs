//! What the usage ledger adds to a decision, paired against the same path
//! without it in one run, as ratios.
//!
//! - Memory: `MemoryStore::try_check_now` against the same through a
//!   `MeteredStore` recording into a `MemoryLedger`, one thread, 10,000
//!   rotating keys, every request admitted (a denial records nothing).
//! - Redis: `RedisStore::check` against the same through a `MeteredStore`
//!   recording into a `RedisLedger` (flushed every second, in the
//!   background, during the timed blocks), 32 concurrent callers, 10,000
//!   rotating keys, on the Redis at 127.0.0.1:6379.
//!
//! Each round times a block per variant, in alternating order; the ratio
//! is the median of the per-round ratios. `TOLLGATE_BENCH_ROUNDS` changes
//! the rounds of both.
//!
//! Run with: `cargo bench -p tollgate-tests --bench ledger_paired`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_core::ledger::{Ledger, MemoryLedger, MeteredStore};
use tollgate_core::{Algorithm, Key, MemoryStore, Policy, Store};
use tollgate_redis::{RedisLedger, RedisStore};
use tollgate_tests::{bench_rounds, require_redis, unique_prefix};

const KEYS: usize = 10_000;
const MEMORY_BLOCK: usize = 100_000;
const REDIS_BLOCK: usize = 8_000;
const CALLERS: usize = 32;

fn policy() -> Policy {
    Policy::new("ledger-bench", Algorithm::Gcra, "1000000/s").unwrap()
}

fn keys() -> Arc<[Key]> {
    (0..KEYS).map(|i| Key::user(format!("user-{i}"))).collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time_memory<S: Store>(store: &S, policy: &Policy, keys: &[Key]) -> Duration {
    let start = Instant::now();
    for i in 0..MEMORY_BLOCK {
        let decision = store
            .try_check_now(&keys[i % KEYS], policy, 1)
            .unwrap()
            .unwrap();
        assert!(decision.is_allowed());
        black_box(decision);
    }
    start.elapsed()
}

async fn time_redis<S: Store>(store: Arc<S>, policy: &Policy, keys: &Arc<[Key]>) -> Duration {
    let start = Instant::now();
    let callers = (0..CALLERS).map(|c| {
        let (store, policy, keys) = (store.clone(), policy.clone(), keys.clone());
        tokio::spawn(async move {
            for i in (c..REDIS_BLOCK).step_by(CALLERS) {
                let decision = store
                    .check(&keys[(i * 7) % KEYS], &policy, 1)
                    .await
                    .unwrap();
                assert!(decision.is_allowed());
            }
        })
    });
    for caller in callers.collect::<Vec<_>>() {
        caller.await.unwrap();
    }
    start.elapsed()
}

fn main() {
    let policy = policy();
    let keys = keys();

    // Memory.
    let rounds = bench_rounds(51);
    let bare = MemoryStore::new();
    let ledger = MemoryLedger::new();
    let metered = MeteredStore::new(MemoryStore::new(), ledger.clone());
    let (mut ratios, mut ns_bare, mut ns_metered) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (b, m) = if round % 2 == 0 {
            let b = time_memory(&bare, &policy, &keys);
            (b, time_memory(&metered, &policy, &keys))
        } else {
            let m = time_memory(&metered, &policy, &keys);
            (time_memory(&bare, &policy, &keys), m)
        };
        ratios.push(m.as_secs_f64() / b.as_secs_f64());
        ns_bare.push(b.as_nanos() as f64 / MEMORY_BLOCK as f64);
        ns_metered.push(m.as_nanos() as f64 / MEMORY_BLOCK as f64);
    }
    println!(
        "memory: {rounds} rounds of {MEMORY_BLOCK}: without the ledger {:.0} ns, with it {:.0} ns per decision; ratio {:.2}",
        median(ns_bare),
        median(ns_metered),
        median(ratios)
    );

    // Redis.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let url = require_redis().await;
        let prefix = unique_prefix("ledger-bench");
        let connect = || async {
            RedisStore::builder()
                .prefix(prefix.as_str())
                .deadline(Duration::from_secs(5))
                .response_timeout(Duration::from_secs(5))
                .connect(url.as_str())
                .await
                .unwrap()
        };
        let bare = Arc::new(connect().await);
        let store = connect().await;
        let ledger = RedisLedger::builder(&store).build().unwrap();
        let metered = Arc::new(MeteredStore::new(store, ledger.clone()));
        // Warm up both: connections, scripts, keys.
        time_redis(bare.clone(), &policy, &keys).await;
        time_redis(metered.clone(), &policy, &keys).await;
        let rounds = bench_rounds(21);
        let (mut ratios, mut us_bare, mut us_metered) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let (b, m) = if round % 2 == 0 {
                let b = time_redis(bare.clone(), &policy, &keys).await;
                (b, time_redis(metered.clone(), &policy, &keys).await)
            } else {
                let m = time_redis(metered.clone(), &policy, &keys).await;
                (time_redis(bare.clone(), &policy, &keys).await, m)
            };
            ratios.push(m.as_secs_f64() / b.as_secs_f64());
            us_bare.push(b.as_micros() as f64 / REDIS_BLOCK as f64);
            us_metered.push(m.as_micros() as f64 / REDIS_BLOCK as f64);
        }
        ledger.flush().await.unwrap();
        println!(
            "redis: {rounds} rounds of {REDIS_BLOCK} by {CALLERS} callers: without the ledger {:.1} µs, with it {:.1} µs per decision (wall time / decisions); ratio {:.2}",
            median(us_bare),
            median(us_metered),
            median(ratios)
        );
    });
}
