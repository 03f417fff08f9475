//! Redis store throughput, side by side with `redis-benchmark` running the
//! same script via EVALSHA, against one private `redis-server`.
//!
//! Run with: `cargo bench -p tollgate-tests --bench redis_throughput`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::time::{Duration, Instant};

use tollgate_core::{Algorithm, Key, Policy, Store};
use tollgate_redis::testing::{script_args, script_source};
use tollgate_redis::{RedisConnection, RedisStore};
use tollgate_tests::RedisServer;

const RUN: Duration = Duration::from_secs(2);
const KEYS: u64 = 10_000;

struct Result {
    per_sec: f64,
    p50_us: u128,
    p99_us: u128,
}

async fn measure<C: RedisConnection>(
    store: &RedisStore<C>,
    policy: &Policy,
    concurrency: usize,
) -> Result {
    // Warm up connections and keys.
    for i in 0..200 {
        store
            .check(&Key::user(format!("w{i}")), policy, 1)
            .await
            .unwrap();
    }
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut n = t as u64 * 7_919;
                while start.elapsed() < RUN {
                    n = n.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    let key = Key::user(((n >> 33) % KEYS).to_be_bytes());
                    let t0 = Instant::now();
                    store.check(&key, &policy, 1).await.unwrap();
                    latencies.push(t0.elapsed().as_micros());
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    Result {
        per_sec: all.len() as f64 / elapsed,
        p50_us: all[all.len() / 2],
        p99_us: all[all.len() * 99 / 100],
    }
}

/// `redis-benchmark` running the GCRA decision script via EVALSHA.
fn redis_benchmark(server: &RedisServer, policy: &Policy, concurrency: usize) -> f64 {
    let source = script_source(policy);
    let mut con = server.connection();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(source)
        .query(&mut con)
        .unwrap();
    let requests = 200_000.to_string();
    let output = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &server.port().to_string()])
        .args([
            "-c",
            &concurrency.to_string(),
            "-n",
            &requests,
            "-r",
            &KEYS.to_string(),
            "-q",
            "--csv",
        ])
        .args(["EVALSHA", &sha, "1", "bench:gcra:{__rand_int__}"])
        .args(script_args(policy, 1))
        .output()
        .expect("redis-benchmark is installed with redis-tools");
    let text = String::from_utf8_lossy(&output.stdout);
    // CSV: "test","rps",...
    text.lines()
        .filter_map(|l| l.split(',').nth(1))
        .filter_map(|v| v.trim_matches('"').parse().ok())
        .next()
        .unwrap_or_else(|| panic!("unexpected redis-benchmark output: {text}"))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let server = RedisServer::spawn();
    let url = server.url();
    let gcra = Policy::new("bench", Algorithm::Gcra, "1000000/s").unwrap();
    let three = Policy::builder("bench3")
        .algorithm(Algorithm::Gcra)
        .limit("1000000/s")
        .limit("100000000/min")
        .limit("1000000000/h")
        .build()
        .unwrap();
    let slow = Duration::from_secs(5);
    let manager = RedisStore::builder()
        .deadline(slow)
        .response_timeout(slow)
        .connect(url.as_str())
        .await
        .unwrap();
    let unbatched = RedisStore::builder()
        .deadline(slow)
        .response_timeout(slow)
        .batch_size(1)
        .connect(url.as_str())
        .await
        .unwrap();
    let pool = RedisStore::builder()
        .deadline(slow)
        .pool_size(64)
        .pool_checkout_timeout(slow)
        .connect_pool(url.as_str())
        .await
        .unwrap();

    const ROUNDS: usize = 3;
    let levels = [1, 16, 64];
    // rounds[level] = one (reference, manager, pool, three limits, manager
    // without batching) per round.
    let mut rounds: Vec<Vec<[Result; 5]>> = levels.iter().map(|_| Vec::new()).collect();
    for round in 1..=ROUNDS {
        for (i, &concurrency) in levels.iter().enumerate() {
            let reference = Result {
                per_sec: redis_benchmark(&server, &gcra, concurrency),
                p50_us: 0,
                p99_us: 0,
            };
            let m = measure(&manager, &gcra, concurrency).await;
            let p = measure(&pool, &gcra, concurrency).await;
            let m3 = measure(&manager, &three, concurrency).await;
            let u = measure(&unbatched, &gcra, concurrency).await;
            eprintln!(
                "round {round}, concurrency {concurrency}: redis-benchmark {:.0}/s, default {:.0}/s, pool {:.0}/s, 3 limits {:.0}/s, batching off {:.0}/s",
                reference.per_sec, m.per_sec, p.per_sec, m3.per_sec, u.per_sec
            );
            rounds[i].push([reference, m, p, m3, u]);
        }
    }

    println!(
        "\nMedians of {ROUNDS} interleaved rounds; ratios are medians of each round's ratio to redis-benchmark\n"
    );
    println!(
        "| concurrency | redis-benchmark EVALSHA (req/s) | RedisStore, default connection | RedisStore, bb8 pool (64) | default connection, 3 limits | default connection, batching off |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for (concurrency, runs) in levels.iter().zip(&rounds) {
        let column = |c: usize| -> Vec<&Result> { runs.iter().map(|r| &r[c]).collect() };
        let reference = median_f(column(0).iter().map(|r| r.per_sec).collect());
        let cell = |c: usize| {
            let results = column(c);
            let ratio = median_f(runs.iter().map(|r| r[c].per_sec / r[0].per_sec).collect());
            format!(
                "{:.0}/s ({ratio:.2}x), p50 {} µs, p99 {} µs",
                median_f(results.iter().map(|r| r.per_sec).collect()),
                median_u(results.iter().map(|r| r.p50_us).collect()),
                median_u(results.iter().map(|r| r.p99_us).collect()),
            )
        };
        println!(
            "| {concurrency} | {reference:.0} | {} | {} | {} | {} |",
            cell(1),
            cell(2),
            cell(3),
            cell(4)
        );
    }
}

fn median_f(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn median_u(mut v: Vec<u128>) -> u128 {
    v.sort_unstable();
    v[v.len() / 2]
}
