//! What a leased store costs at a steady request rate: its calls to Redis
//! (`EVALSHA` per request, from Redis's `INFO commandstats`) and the CPU
//! of the process and of `redis-server` per request.
//!
//! 32 tasks on a 2-worker Tokio runtime each send one request every
//! millisecond (32,000 a second, `TOLLGATE_BENCH_RATE` to change it) to a
//! `LeasedStore` over a `RedisStore` (lease interval 1 s), under a GCRA
//! quota of 1,000,000 a second with a burst of 1,000,000 (nothing is
//! refused), with keys drawn uniformly from 3,000 and from 10,000. Paced,
//! not as fast as possible: every variant of the code does the same work,
//! so calls and CPU per request compare, and each key sees a set rate
//! (about 10.7 and 3.2 requests a second: the first is what each of the
//! HTTP bench's 10,000 uniform keys sees at about 100,000 requests a
//! second). Each run warms its store for 3 s, then measures 5 s; rounds
//! (3, `TOLLGATE_BENCH_ROUNDS`) alternate the key counts; figures are
//! medians, with the per-round spread.
//!
//! Run with: `cargo bench -p tollgate-tests --bench lease_calls`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate_core::{Algorithm, Key, Policy, Store};
use tollgate_redis::{LeasedStore, RedisStore};
use tollgate_tests::{RedisServer, median, spread};

const TASKS: u64 = 32;

/// `EVALSHA` calls Redis has run so far.
fn evalsha(url: &str) -> u64 {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    tollgate_tests::command_calls(&mut con, "evalsha")
}

struct Run {
    per_sec: f64,
    evalsha: f64,
    grants: f64,
    direct: f64,
    app_us: f64,
    redis_us: f64,
}

/// Sends `rate` requests a second over `keys` keys for `seconds`.
async fn load(
    store: &Arc<LeasedStore<RedisStore>>,
    policy: &Policy,
    keys: u64,
    rate: u64,
    seconds: u64,
) -> u64 {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let per_tick = (rate / 1000 / TASKS).max(1);
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (store, policy, done) = (store.clone(), policy.clone(), done.clone());
            tokio::spawn(async move {
                let mut n = t * 7_919 + 1;
                let mut tick = tokio::time::interval(Duration::from_millis(1));
                while start.elapsed() < Duration::from_secs(seconds) {
                    tick.tick().await;
                    for _ in 0..per_tick {
                        n = n.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                        let key = Key::from(format!("k{}", (n >> 33) % keys));
                        let decision = store.check(&key, &policy, 1).await.unwrap();
                        assert!(decision.is_allowed());
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    done.load(Ordering::Relaxed)
}

fn measure(
    runtime: &tokio::runtime::Runtime,
    server: &RedisServer,
    keys: u64,
    rate: u64,
    round: usize,
) -> Run {
    let url = server.url();
    let policy = Policy::builder("bench")
        .algorithm(Algorithm::Gcra)
        .limit("1000000/s")
        .burst(1_000_000)
        .build()
        .unwrap();
    let store = runtime.block_on(async {
        let redis = RedisStore::builder()
            .prefix(format!("lease-calls-{keys}-{round}"))
            .connect(url.as_str())
            .await
            .unwrap();
        Arc::new(LeasedStore::builder().wrap(redis).await)
    });
    runtime.block_on(load(&store, &policy, keys, rate, 3));
    let (calls0, evalsha0) = (store.calls(), evalsha(&url));
    let (app0, redis0) = (
        tollgate_tests::process_cpu_us(std::process::id()),
        tollgate_tests::process_cpu_us(server.pid()),
    );
    let start = Instant::now();
    let n = runtime.block_on(load(&store, &policy, keys, rate, 5)) as f64;
    let elapsed = start.elapsed().as_secs_f64();
    let (calls1, evalsha1) = (store.calls(), evalsha(&url));
    let (app1, redis1) = (
        tollgate_tests::process_cpu_us(std::process::id()),
        tollgate_tests::process_cpu_us(server.pid()),
    );
    runtime.block_on(store.return_leases());
    Run {
        per_sec: n / elapsed,
        evalsha: (evalsha1 - evalsha0) as f64 / n,
        grants: (calls1.grants - calls0.grants) as f64 / n,
        direct: (calls1.direct - calls0.direct) as f64 / n,
        app_us: (app1 - app0) / n,
        redis_us: (redis1 - redis0) / n,
    }
}

fn summary(runs: &[Run], of: impl Fn(&Run) -> f64, digits: usize) -> String {
    let xs: Vec<f64> = runs.iter().map(&of).collect();
    let (lo, hi) = spread(&xs);
    format!(
        "{:.digits$} ({lo:.digits$}–{hi:.digits$})",
        median(xs.clone())
    )
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::spawn();
    let rounds = tollgate_tests::bench_rounds(3);
    let rate = std::env::var("TOLLGATE_BENCH_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32_000);
    let key_counts = [3_000u64, 10_000];
    let mut runs: Vec<Vec<Run>> = key_counts.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for (i, &keys) in key_counts.iter().enumerate() {
            let run = measure(&runtime, &server, keys, rate, round);
            println!(
                "round {}: {keys} keys: {:.0} requests/s, EVALSHA {:.4}, grants {:.4}, decided by Redis {:.4} per request; CPU per request: app {:.2} µs, redis-server {:.2} µs",
                round + 1,
                run.per_sec,
                run.evalsha,
                run.grants,
                run.direct,
                run.app_us,
                run.redis_us
            );
            runs[i].push(run);
        }
    }
    println!();
    println!(
        "| keys | EVALSHA per request | grants per request | decided by Redis per request | app CPU per request (µs) | redis-server CPU per request (µs) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for (keys, runs) in key_counts.iter().zip(&runs) {
        println!(
            "| {keys} | {} | {} | {} | {} | {} |",
            summary(runs, |r| r.evalsha, 4),
            summary(runs, |r| r.grants, 4),
            summary(runs, |r| r.direct, 4),
            summary(runs, |r| r.app_us, 2),
            summary(runs, |r| r.redis_us, 2)
        );
    }
}
