//! Helpers for tollgate's end-to-end tests: the shared Redis on
//! 127.0.0.1:6379 (or `REDIS_URL`), and private `redis-server` processes
//! on free loopback ports for tests that need a server of their own.
//!
//! A test that needs Redis never passes without it: it fails with a message
//! that says what to install.
#![allow(clippy::panic)] // test helpers fail loudly, naming what is missing

mod cluster;
mod leases;
mod sentinel;
mod server;
mod stall;

use std::sync::atomic::{AtomicU64, Ordering};

pub use cluster::RedisCluster;
pub use leases::leased_store;
pub use sentinel::RedisSentinel;
pub use server::RedisServer;
pub use stall::{StallMeter, stalled};
pub use tollgate_core;

/// Where the shared test Redis listens: `REDIS_URL`, or
/// `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

pub(crate) const INSTALL: &str = "install Redis (`apt-get install redis-server redis-tools`) \
                       and run the suite with ./scripts/test, which starts it";

/// Fails the test, saying what to install, unless the shared Redis answers.
///
/// # Panics
///
/// When Redis does not answer a `PING`.
pub async fn require_redis() -> String {
    let url = redis_url();
    let pong: Result<String, String> = async {
        let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
        let mut con = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        redis::cmd("PING")
            .query_async(&mut con)
            .await
            .map_err(|e| e.to_string())
    }
    .await;
    match pong {
        Ok(_) => url,
        Err(e) => panic!("Redis is not reachable at {url} ({e}): {INSTALL}"),
    }
}

/// A prefix no other test run uses, so tests can share one Redis.
pub fn unique_prefix(test: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::UNIX_EPOCH
        .elapsed()
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "tgtest-{test}-{}-{nanos}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// Reads one counter of `INFO commandstats`, such as the calls of `evalsha`.
pub fn command_calls(con: &mut redis::Connection, command: &str) -> u64 {
    command_stat(con, command, "calls")
}

/// Reads one field of a command's line in `INFO commandstats`: `calls`,
/// or `usec`, the µs Redis spent running it.
pub fn command_stat(con: &mut redis::Connection, command: &str, field: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .unwrap_or_else(|e| panic!("INFO commandstats: {e}"));
    let prefix = format!("cmdstat_{command}:");
    let wanted = format!("{field}=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').find_map(|kv| kv.strip_prefix(&wanted)))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// User plus system CPU time of process `pid` so far, in µs
/// (`/proc/<pid>/stat` fields 14 and 15, in clock ticks of 10 ms); 0 if
/// it cannot be read.
pub fn process_cpu_us(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // After the name: state is field 3, so utime (14) is at 11, stime at 12.
    (ticks(11) + ticks(12)) * 10_000.0
}

/// The median of a bench's figures: the upper one of an even count.
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The lowest and the highest of a bench's figures.
pub fn spread(xs: &[f64]) -> (f64, f64) {
    let low = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let high = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (low, high)
}

/// The rounds a bench runs: `TOLLGATE_BENCH_ROUNDS` if it is set to a
/// number, otherwise `default`.
pub fn bench_rounds(default: usize) -> usize {
    std::env::var("TOLLGATE_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(default)
}

/// A runtime of one worker thread: a store's home, in tests of a store
/// used from several runtimes.
///
/// # Panics
///
/// When the runtime cannot be built.
pub fn one_worker_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("a runtime: {e}"))
}

/// A runtime of the calling thread only, as a job worker's: it runs tasks
/// only while that thread blocks on a future.
///
/// # Panics
///
/// When the runtime cannot be built.
pub fn thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("a runtime: {e}"))
}
