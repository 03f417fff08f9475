//! The application's CPU per decision made in Redis: what a decision costs
//! the process that asks, next to the straightforward approach (one
//! `EVALSHA` of `straightforward_gcra.lua` per decision on redis-rs's
//! multiplexed connection), against one private `redis-server`.
//!
//! Both run on a 2-worker Tokio runtime, as a server would, with 32 tasks
//! each deciding one request after another (as 32 connections of the HTTP
//! bench do), over 10,000 keys drawn uniformly, under a GCRA quota of
//! 1,000,000 per second with a burst of 1,000,000 (nothing is refused).
//! CPU is this process's user and system time from `/proc`, per decision;
//! `redis-server`'s is given beside it. Rounds are interleaved and
//! alternate which variant goes first; figures are medians, with the
//! per-round spread.
//!
//! Run with: `cargo bench -p tollgate-tests --bench redis_app_cpu`
//! (`TOLLGATE_BENCH_ROUNDS` sets the rounds, 3 by default;
//! `TOLLGATE_BENCH_SECONDS` each run's length, 2 by default;
//! `TOLLGATE_BENCH_CONCURRENCY` the tasks, 32 by default).
//!
//! For a profile of one variant, `TOLLGATE_BENCH_ONLY=tollgate` (or
//! `plain`) and `perf record -g -p <pid>` while it runs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate_core::{Algorithm, Key, Policy, Store};
use tollgate_redis::RedisStore;
use tollgate_tests::{RedisServer, median};

const STRAIGHTFORWARD_GCRA: &str = include_str!("straightforward_gcra.lua");
const KEYS: u64 = 10_000;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Run {
    per_sec: f64,
    app_us: f64,
    redis_us: f64,
}

/// Key `n`'s name, as both variants spell it.
fn key_of(n: u64) -> String {
    format!("k{}", n % KEYS)
}

/// Runs `decide` from `concurrency` tasks for `seconds`, and measures.
fn measure<F, Fut>(
    runtime: &tokio::runtime::Runtime,
    redis_pid: u32,
    concurrency: usize,
    seconds: u64,
    decide: F,
) -> Run
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let decide = Arc::new(decide);
    let done = Arc::new(AtomicU64::new(0));
    let run = Duration::from_secs(seconds);
    let (app0, redis0) = (
        tollgate_tests::process_cpu_us(std::process::id()),
        tollgate_tests::process_cpu_us(redis_pid),
    );
    let start = Instant::now();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..concurrency)
            .map(|t| {
                let (decide, done) = (decide.clone(), done.clone());
                tokio::spawn(async move {
                    let mut n = t as u64 * 7_919 + 1;
                    while start.elapsed() < run {
                        n = n.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                        decide(n >> 33).await;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
    let elapsed = start.elapsed().as_secs_f64();
    let (app1, redis1) = (
        tollgate_tests::process_cpu_us(std::process::id()),
        tollgate_tests::process_cpu_us(redis_pid),
    );
    let n = done.load(Ordering::Relaxed) as f64;
    Run {
        per_sec: n / elapsed,
        app_us: (app1 - app0) / n,
        redis_us: (redis1 - redis0) / n,
    }
}

fn spread(xs: &[f64]) -> String {
    let (lo, hi) = tollgate_tests::spread(xs);
    format!("{lo:.2}–{hi:.2}")
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::spawn();
    let url = server.url();
    let rounds = tollgate_tests::bench_rounds(3);
    let seconds = env_or("TOLLGATE_BENCH_SECONDS", 2);
    let concurrency = env_or("TOLLGATE_BENCH_CONCURRENCY", 32) as usize;
    let policy = Policy::builder("bench")
        .algorithm(Algorithm::Gcra)
        .limit("1000000/s")
        .burst(1_000_000)
        .build()
        .unwrap();

    let (store, plain, sha) = runtime.block_on(async {
        // A deadline far beyond any wait here: the bench measures CPU, and
        // a shared machine may stall a run for longer than the default.
        let slow = Duration::from_secs(5);
        let store = RedisStore::builder()
            .prefix("app-cpu")
            .deadline(slow)
            .response_timeout(slow)
            .connect(url.as_str())
            .await
            .unwrap();
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut plain = client.get_multiplexed_async_connection().await.unwrap();
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(STRAIGHTFORWARD_GCRA)
            .query_async(&mut plain)
            .await
            .unwrap();
        (store, plain, Arc::<str>::from(sha))
    });
    let only = std::env::var("TOLLGATE_BENCH_ONLY").unwrap_or_default();
    let wanted = |name: &str| only.is_empty() || only.split(',').any(|w| name.contains(w.trim()));

    type Variant = (
        &'static str,
        Box<dyn Fn(&tokio::runtime::Runtime, u32, usize, u64) -> Run>,
    );
    let mut variants: Vec<Variant> = Vec::new();
    if wanted("plain script") {
        let (plain, sha) = (plain.clone(), sha.clone());
        variants.push((
            "plain script, one EVALSHA per decision",
            Box::new(move |rt, pid, c, s| {
                let (plain, sha) = (plain.clone(), sha.clone());
                measure(rt, pid, c, s, move |n| {
                    let (mut con, sha) = (plain.clone(), sha.clone());
                    async move {
                        // interval 1 µs, burst 1,000,000, cost 1.
                        let reply: Vec<i64> = redis::cmd("EVALSHA")
                            .arg(&*sha)
                            .arg(1)
                            .arg(format!("plain:{}", key_of(n)))
                            .arg(1)
                            .arg(1_000_000)
                            .arg(1)
                            .query_async(&mut con)
                            .await
                            .unwrap();
                        assert_eq!(reply[0], 1, "the plain script refused");
                    }
                })
            }),
        ));
    }
    if wanted("tollgate") {
        let (store, policy) = (store.clone(), policy.clone());
        variants.push((
            "tollgate RedisStore",
            Box::new(move |rt, pid, c, s| {
                let (store, policy) = (store.clone(), policy.clone());
                measure(rt, pid, c, s, move |n| {
                    let (store, policy) = (store.clone(), policy.clone());
                    async move {
                        let key = Key::user(key_of(n));
                        let decision = store.check(&key, &policy, 1).await.unwrap();
                        assert!(decision.is_allowed(), "tollgate refused");
                    }
                })
            }),
        ));
    }

    let mut runs: Vec<Vec<Run>> = variants.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for k in 0..variants.len() {
            let i = (k + round) % variants.len();
            let (name, run) = &variants[i];
            let r = run(&runtime, server.pid(), concurrency, seconds);
            eprintln!(
                "round {}: {name}: {:.0}/s, app CPU {:.2} µs, redis-server CPU {:.2} µs per decision",
                round + 1,
                r.per_sec,
                r.app_us,
                r.redis_us
            );
            runs[i].push(r);
        }
    }
    println!(
        "\n{concurrency} tasks on 2 workers, {seconds} s runs, {rounds} interleaved rounds; medians (per-round min–max)\n"
    );
    println!(
        "| variant | decisions/s | app CPU per decision (µs) | redis-server CPU per decision (µs) |"
    );
    println!("|---|---:|---:|---:|");
    for ((name, _), of) in variants.iter().zip(&runs) {
        let col = |f: fn(&Run) -> f64| -> (f64, String) {
            let xs: Vec<f64> = of.iter().map(f).collect();
            (median(xs.clone()), spread(&xs))
        };
        let (rate, rate_s) = col(|r| r.per_sec);
        let (app, app_s) = col(|r| r.app_us);
        let (redis, redis_s) = col(|r| r.redis_us);
        println!("| {name} | {rate:.0} ({rate_s}) | {app:.2} ({app_s}) | {redis:.2} ({redis_s}) |");
    }
    if runs.len() == 2 {
        let ratio: Vec<f64> = runs[1]
            .iter()
            .zip(&runs[0])
            .map(|(t, p)| t.app_us / p.app_us)
            .collect();
        println!(
            "\ntollgate / plain script, app CPU per decision: {:.2} (per round {})",
            median(ratio.clone()),
            spread(&ratio)
        );
    }
    drop(store);
    drop(server);
    runtime.shutdown_timeout(Duration::from_secs(1));
}
