//! Requests per second and latency of one Axum route, bare and behind each
//! rate limiter, with `wrk` on loopback as the load generator.
//!
//! Run with: `cargo bench -p tollgate-tests --bench http_layer`
//! (needs `wrk`: `apt-get install wrk`).
//!
//! Variants, measured in seven interleaved rounds (each round runs every
//! variant once, starting one variant later than the round before; the
//! table reports medians, and ratios are medians of per-round ratios):
//! - `bare`: the route alone;
//! - `bare, five fixed headers`: the route with five fixed headers of the
//!   lengths of tollgate's, added by a `MapResponseLayer`: what the headers
//!   themselves cost, without a limiter;
//! - `tollgate, 1 hot key`: `RateLimitLayer` on the memory store, every
//!   request with the same key;
//! - `tollgate, 10k keys`: the same with 10,000 rotating keys;
//! - `tollgate, 10k keys, keep_body_type`: the same with
//!   `keep_body_type()`, which spares axum re-boxing the body;
//! - `tollgate, 10k keys, no headers`: the same with `HeaderStyle::None`;
//! - `tower_governor, 10k keys`: `tower_governor` 0.8 with the same keys,
//!   once as it comes (no headers) and once with `use_headers()` (on an
//!   admitted request, `x-ratelimit-limit` and `x-ratelimit-remaining`);
//! - `tollgate on Redis, 10k keys`: `RateLimitLayer` on `RedisStore` (a
//!   private `redis-server` on loopback), once as it comes and once with
//!   batching off (`batch_size(1)`).
//!
//! Every limiter is keyed by the `x-api-key` header and configured so that
//! every request is admitted; the bench fails if any response is not 2xx.
//! tollgate writes its default GitHub-style headers on every response;
//! `tower_governor` writes none by default.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use axum::Router;
use tollgate::{HeaderStyle, RateLimitLayer};
use tollgate_core::{Algorithm, Policy};
use tollgate_redis::RedisStore;
use tollgate_tests::{RedisServer, command_calls, command_stat};
use tower::util::MapResponseLayer;

mod common;
use common::{header_key, per_key, route, tower_governor_app};

const ROUNDS: usize = 7;
const SECONDS: u64 = 3;
const CONNECTIONS: usize = 32;

/// Rotating keys: `k0` to `k9999`, one per request in turn.
const ROTATING: &str = r#"
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/", { ["x-api-key"] = "k" .. (n % 10000) })
end
"#;
const HOT: &str = r#"
request = function()
  return wrk.format("GET", "/", { ["x-api-key"] = "hot" })
end
"#;

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

struct Run {
    per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    /// CPU time per request of this process (the server) and of
    /// redis-server, in µs.
    server_cpu_us: f64,
    redis_cpu_us: f64,
    /// CPU time per request of wrk itself, in µs.
    wrk_cpu_us: f64,
    /// Share of the machine's CPU time that no process used.
    idle: f64,
    /// Requests per `EVALSHA` Redis received (0 without Redis).
    per_call: f64,
    /// Redis's µs running `EVALSHA` per request.
    script_us: f64,
}

/// The fields of `/proc/{pid}/stat` after the command name (which is in
/// parentheses): the state first, then the parent's pid, and so on.
fn stat_fields(pid: u32) -> Vec<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// User plus system CPU time of process `pid`, in µs.
fn cpu_us(pid: u32) -> f64 {
    cpu_of(&stat_fields(pid))
}

/// User plus system CPU time in µs, from a process's [`stat_fields`].
fn cpu_of(fields: &[String]) -> f64 {
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, in ticks of 1/100 s.
    (ticks(11) + ticks(12)) * 10_000.0
}

/// The machine's idle and total CPU time so far, in ticks, from the first
/// line of `/proc/stat` (idle and iowait count as idle).
fn machine_ticks() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let idle = ticks.iter().skip(3).take(2).sum();
    (idle, ticks.iter().sum())
}

fn micros(text: &str) -> f64 {
    let (number, unit) = text
        .find(|c: char| c.is_ascii_alphabetic())
        .map(|i| text.split_at(i))
        .unwrap();
    let n: f64 = number.parse().unwrap();
    match unit {
        "us" => n,
        "ms" => n * 1_000.0,
        "s" => n * 1_000_000.0,
        other => panic!("unknown unit {other} in {text}"),
    }
}

/// Seconds per run: `TOLLGATE_BENCH_SECONDS`, or [`SECONDS`].
fn seconds() -> u64 {
    std::env::var("TOLLGATE_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SECONDS)
}

/// Connections wrk keeps open: `TOLLGATE_BENCH_CONNECTIONS`, or
/// [`CONNECTIONS`].
fn connections() -> usize {
    std::env::var("TOLLGATE_BENCH_CONNECTIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(CONNECTIONS)
}

fn wrk(addr: SocketAddr, script: &str, redis: &RedisServer) -> Run {
    let redis_pid = redis.pid();
    let mut con = redis.connection();
    let calls_before = command_calls(&mut con, "evalsha");
    let usec_before = command_stat(&mut con, "evalsha", "usec");
    let path = std::env::temp_dir().join(format!("tollgate-bench-{}.lua", std::process::id()));
    std::fs::File::create(&path)
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let cpu_before = (cpu_us(std::process::id()), cpu_us(redis_pid));
    let machine_before = machine_ticks();
    let mut child = Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{}", connections()),
            &format!("-d{}s", seconds()),
            "--latency",
            "-s",
        ])
        .arg(&path)
        .arg(format!("http://{addr}/"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("wrk is needed: apt-get install wrk");
    let mut text = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    let cpu_after = (cpu_us(std::process::id()), cpu_us(redis_pid));
    let machine_after = machine_ticks();
    // wrk has closed its output; once it has exited, and until it is
    // reaped, /proc still holds its final CPU times.
    let mut wrk_cpu = 0.0;
    for _ in 0..1_000 {
        let fields = stat_fields(child.id());
        wrk_cpu = cpu_of(&fields);
        if fields.first().is_none_or(|state| state == "Z") {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let status = child.wait().unwrap();
    let calls = command_calls(&mut con, "evalsha") - calls_before;
    let usec = command_stat(&mut con, "evalsha", "usec") - usec_before;
    assert!(status.success(), "wrk failed: {text}");
    assert!(
        !text.contains("Non-2xx"),
        "some requests were not admitted:\n{text}"
    );
    let field = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix).map(|v| v.trim().to_owned()))
            .unwrap_or_else(|| panic!("no '{prefix}' in:\n{text}"))
    };
    let per_sec: f64 = field("Requests/sec:").parse().unwrap();
    let requests = per_sec * seconds() as f64;
    Run {
        per_sec,
        p50_us: micros(&field("50%")),
        p99_us: micros(&field("99%")),
        server_cpu_us: (cpu_after.0 - cpu_before.0) / requests,
        redis_cpu_us: (cpu_after.1 - cpu_before.1) / requests,
        wrk_cpu_us: wrk_cpu / requests,
        idle: (machine_after.0 - machine_before.0) / (machine_after.1 - machine_before.1),
        per_call: if calls == 0 {
            0.0
        } else {
            requests / calls as f64
        },
        script_us: usec as f64 / requests,
    }
}

/// The route's response with five fixed headers of the lengths tollgate's
/// GitHub-style headers have in this bench, inserted the same way: what
/// the headers cost (the server inserting and writing them, wrk reading
/// them), without a limiter.
fn five_headers(mut response: axum::response::Response) -> axum::response::Response {
    let headers = response.headers_mut();
    for (name, value) in [
        ("x-ratelimit-limit", "1000"),
        ("x-ratelimit-remaining", "999"),
        ("x-ratelimit-reset", "1795000000"),
        ("x-ratelimit-used", "1"),
        ("x-ratelimit-resource", "bench"),
    ] {
        headers.insert(
            http::HeaderName::from_static(name),
            http::HeaderValue::from_static(value),
        );
    }
    response
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let redis = RedisServer::spawn();
    let variants: Vec<(&str, SocketAddr, &str)> = runtime.block_on(async {
        let store = RedisStore::connect(&redis.url()).await.unwrap();
        let unbatched = RedisStore::builder()
            .batch_size(1)
            .connect(redis.url().as_str())
            .await
            .unwrap();
        let hot = Policy::new("hot", Algorithm::Gcra, "1000000/s").unwrap();
        vec![
            ("bare", serve(route()).await, ROTATING),
            (
                "bare, five fixed headers",
                serve(route().layer(MapResponseLayer::new(five_headers))).await,
                ROTATING,
            ),
            (
                "tollgate, 1 hot key",
                serve(route().layer(RateLimitLayer::new(hot, header_key()))).await,
                HOT,
            ),
            (
                "tollgate, 10k keys",
                serve(route().layer(RateLimitLayer::new(per_key(), header_key()))).await,
                ROTATING,
            ),
            (
                "tollgate, 10k keys, keep_body_type",
                serve(route().layer(RateLimitLayer::new(per_key(), header_key()).keep_body_type()))
                    .await,
                ROTATING,
            ),
            (
                "tollgate, 10k keys, no headers",
                serve(route().layer(
                    RateLimitLayer::new(per_key(), header_key()).headers(HeaderStyle::None),
                ))
                .await,
                ROTATING,
            ),
            (
                "tower_governor, 10k keys",
                serve(tower_governor_app(false)).await,
                ROTATING,
            ),
            (
                "tower_governor, 10k keys, with headers",
                serve(tower_governor_app(true)).await,
                ROTATING,
            ),
            (
                "tollgate on Redis, 10k keys",
                serve(route().layer(RateLimitLayer::new(per_key(), header_key()).store(store)))
                    .await,
                ROTATING,
            ),
            (
                "tollgate on Redis, 10k keys, batching off",
                serve(route().layer(RateLimitLayer::new(per_key(), header_key()).store(unbatched)))
                    .await,
                ROTATING,
            ),
        ]
    });

    // `TOLLGATE_BENCH_ONLY=bare,Redis` keeps the variants whose names
    // contain one of the words (the bare route is always kept: every ratio
    // is taken against it); `TOLLGATE_BENCH_ROUNDS` sets the rounds.
    let variants: Vec<_> = match std::env::var("TOLLGATE_BENCH_ONLY") {
        Ok(only) => variants
            .into_iter()
            .filter(|(name, _, _)| {
                *name == "bare" || only.split(',').any(|w| name.contains(w.trim()))
            })
            .collect(),
        Err(_) => variants,
    };
    let rounds = tollgate_tests::bench_rounds(ROUNDS);
    let mut runs: Vec<Vec<Run>> = variants.iter().map(|_| Vec::new()).collect();
    for round in 1..=rounds {
        // Each round starts one variant later, so that no variant always
        // follows the same one.
        for k in 0..variants.len() {
            let i = (k + round - 1) % variants.len();
            let (name, addr, script) = &variants[i];
            let run = wrk(*addr, script, &redis);
            eprintln!(
                "round {round}: {name}: {:.0} req/s, p50 {:.0} µs, p99 {:.0} µs, \
                 CPU per request: server {:.1} µs, redis-server {:.1} µs ({:.1} µs in scripts), \
                 wrk {:.1} µs, {:.0}% idle, {:.1} requests per EVALSHA",
                run.per_sec,
                run.p50_us,
                run.p99_us,
                run.server_cpu_us,
                run.redis_cpu_us,
                run.script_us,
                run.wrk_cpu_us,
                run.idle * 100.0,
                run.per_call
            );
            runs[i].push(run);
        }
    }

    // Ratios are paired: each run against the bare run of its own round.
    let ratios = |of: &[Run], to: &[Run]| -> Vec<f64> {
        of.iter()
            .zip(to)
            .map(|(a, b)| a.per_sec / b.per_sec)
            .collect()
    };
    println!(
        "\nwrk -t1 -c{} -d{}s, {rounds} interleaved rounds in rotating order; \
         medians, and the median of the per-round ratios to bare\n",
        connections(),
        seconds()
    );
    println!(
        "| variant | requests/s | ratio to bare | p50 | p99 | CPU/request: server, redis-server, wrk | machine idle | ratio per round |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    for ((name, _, _), of) in variants.iter().zip(&runs) {
        let paired = ratios(of, &runs[0]);
        let listed: Vec<String> = paired.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "| {name} | {:.0} | {:.2} | {:.0} µs | {:.0} µs | {:.1} µs, {:.1} µs, {:.1} µs | {:.0}% | {} |",
            median(of.iter().map(|r| r.per_sec).collect()),
            median(paired),
            median(of.iter().map(|r| r.p50_us).collect()),
            median(of.iter().map(|r| r.p99_us).collect()),
            median(of.iter().map(|r| r.server_cpu_us).collect()),
            median(of.iter().map(|r| r.redis_cpu_us).collect()),
            median(of.iter().map(|r| r.wrk_cpu_us).collect()),
            median(of.iter().map(|r| r.idle * 100.0).collect()),
            listed.join(" "),
        );
    }
    // The comparison the target names, paired the same way.
    let find = |wanted: &str| variants.iter().position(|(n, _, _)| *n == wanted);
    let pairs = [
        (
            "tollgate, 10k keys",
            "tower_governor, 10k keys, with headers",
        ),
        ("tollgate, 10k keys, no headers", "tower_governor, 10k keys"),
    ];
    for (ours, theirs) in pairs {
        let (Some(ours_at), Some(theirs_at)) = (find(ours), find(theirs)) else {
            continue;
        };
        let paired = ratios(&runs[ours_at], &runs[theirs_at]);
        println!(
            "\n{ours} / {theirs}: median of per-round ratios {:.2}",
            median(paired)
        );
    }
    drop(redis);
    runtime.shutdown_timeout(Duration::from_secs(1));
}
