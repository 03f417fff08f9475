//! Redis store throughput, side by side with `redis-benchmark` running the
//! same script via EVALSHA, against one private `redis-server`.
//!
//! Run with: `cargo bench -p tollgate-tests --bench redis_throughput`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::time::{Duration, Instant};

use tollgate_core::{Algorithm, Key, Policy, Store};
use tollgate_redis::{RedisConnection, RedisStore, script_source};
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
    let source = script_source(policy.algorithm()).unwrap();
    let mut con = server.connection();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(source)
        .query(&mut con)
        .unwrap();
    let p = policy.params()[0];
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
        .args(["EVALSHA", &sha, "1", "bench:gcra:{__rand_int__}", "0", "1"])
        .arg(policy.fingerprint().to_string())
        .args(["0", "1"])
        .args([p.limit.count(), p.period_us, p.interval_us, p.capacity].map(|n| n.to_string()))
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
    let pool = RedisStore::builder()
        .deadline(slow)
        .pool_size(64)
        .pool_checkout_timeout(slow)
        .connect_pool(url.as_str())
        .await
        .unwrap();

    println!(
        "| concurrency | redis-benchmark EVALSHA (req/s) | RedisStore, default connection | RedisStore, bb8 pool (64) | default connection, 3 limits |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for concurrency in [1, 16, 64] {
        let reference = redis_benchmark(&server, &gcra, concurrency);
        let m = measure(&manager, &gcra, concurrency).await;
        let p = measure(&pool, &gcra, concurrency).await;
        let m3 = measure(&manager, &three, concurrency).await;
        let cell = |r: &Result| {
            format!(
                "{:.0}/s ({:.2}x), p50 {} µs, p99 {} µs",
                r.per_sec,
                r.per_sec / reference,
                r.p50_us,
                r.p99_us
            )
        };
        println!(
            "| {concurrency} | {reference:.0} | {} | {} | {} |",
            cell(&m),
            cell(&p),
            cell(&m3)
        );
    }
}
