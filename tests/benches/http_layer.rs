//! Requests per second and latency of one Axum route, bare and behind each
//! rate limiter, with `wrk` on loopback as the load generator.
//!
//! Run with: `cargo bench -p tollgate-tests --bench http_layer`
//! (needs `wrk`: `apt-get install wrk`, and `redis-server`).
//!
//! The conditions of issue 31: `wrk -t1 -c32`, a route answering a short
//! JSON body, the key in the `Authorization` header (`Bearer <key>`),
//! three key distributions (one hot key, 10,000 uniform keys, Zipf with
//! s = 1.1 over 100,000 keys), and every limiter at 1,000,000 a second per
//! key with a burst of 1,000,000, so that nothing is refused (the bench
//! fails if any response is not 2xx).
//!
//! Variants, measured in three interleaved rounds by default (each round
//! runs every variant once, starting one variant later than the round
//! before; the table reports medians, and each ratio is the median of the
//! per-round ratios to the bare route with the same key distribution, with
//! their spread, the lowest and highest round):
//! - `bare`: the route alone, with no rate-limit headers;
//! - `bare, five fixed headers`: the route with five fixed headers of the
//!   lengths of tollgate's, added by a `MapResponseLayer`: what the headers
//!   themselves cost, without a limiter;
//! - `tollgate memory`: `RateLimitLayer` on the memory store, with its
//!   default GitHub headers (five on every response) and `keep_body_type()`;
//! - `tollgate memory + empty overrides` and `+ 1,000 overrides of other
//!   keys`: the same layer with a `MemoryOverrides` source, empty (the
//!   atomic check alone) or holding overrides of keys the bench never
//!   sends (every request pays the table lookup, none is overridden);
//! - `tollgate memory, decided on another task`: the same layer on a
//!   memory store whose checks one other task decides, in batches, each
//!   answered on a oneshot (`http_layer/hand_off.rs`): what a hand-off to
//!   another task costs in itself, without Redis, its socket or a script;
//! - `tower_governor, with headers`: `tower_governor` 0.8 with
//!   `use_headers()` (on an admitted request, `x-ratelimit-limit` and
//!   `x-ratelimit-remaining`), keyed by the header as an owned `String`;
//! - `plain Redis GCRA script`: a layer a user would write first, one
//!   `EVALSHA` of `straightforward_gcra.lua` per request on a redis-rs
//!   `MultiplexedConnection`, with no headers: the reference of the Redis
//!   variants (a private `redis-server` on loopback); `on raw sockets`:
//!   the same script, each request on a connection of its own, no client
//!   library (`http_layer/plain_gcra.rs`);
//! - `tollgate Redis`: `RateLimitLayer` on `RedisStore`;
//! - `tollgate Redis + leases`: the same over a `LeasedStore`;
//! - `tollgate memory, no headers` and `tower_governor, no headers`, with
//!   10,000 uniform keys.
//!
//! `TOLLGATE_BENCH_ONLY=memory,governor` keeps the variants whose names
//! contain one of the words (and the bare routes); `TOLLGATE_BENCH_ROUNDS`,
//! `TOLLGATE_BENCH_SECONDS`, `TOLLGATE_BENCH_CONNECTIONS` and
//! `TOLLGATE_BENCH_LEASE_MS` change the rounds, the seconds per run, wrk's
//! connections and the lease interval. `TOLLGATE_BENCH_WARMUP=<seconds>`
//! runs wrk that long, unmeasured, before each measured run of a leased
//! variant, so that it is measured with the leases a server serving that
//! traffic holds rather than from cold keys (each run ends by giving every
//! lease back); its store calls per request count the measured runs only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use tollgate::{HeaderStyle, MemoryOverrides, RateLimitLayer};
use tollgate_redis::{LeasedStore, RedisStore};
use tollgate_tests::{RedisServer, median, spread};
use tower::util::MapResponseLayer;

mod common;
use common::{header_key, per_key, route, tower_governor_app};
#[path = "http_layer/hand_off.rs"]
mod hand_off;
use hand_off::HandOffStore;
#[path = "http_layer/overrides.rs"]
mod overrides;
use overrides::other_keys_overridden;
#[path = "http_layer/plain_gcra.rs"]
mod plain_gcra;
use plain_gcra::PlainGcraLayer;
#[path = "http_layer/wrk.rs"]
mod wrk;
use wrk::{Run, connections, seconds, warm_up, wrk, wrk_for};

const ROUNDS: usize = 3;

/// 10,000 keys drawn uniformly at random.
const UNIFORM: &str = r#"
request = function()
  return wrk.format("GET", "/", { ["Authorization"] = "Bearer u" .. math.random(10000) })
end
"#;
/// One key for every request.
const HOT: &str = r#"
request = function()
  return wrk.format("GET", "/", { ["Authorization"] = "Bearer hot" })
end
"#;
/// 100,000 keys drawn from a Zipf distribution with s = 1.1: key k with
/// weight 1 / k^1.1 (the first key takes about 13% of the requests, the
/// first hundred about half).
const ZIPF: &str = r#"
local n, s = 100000, 1.1
local cdf, total = {}, 0
for k = 1, n do
  total = total + 1 / (k ^ s)
  cdf[k] = total
end
for k = 1, n do
  cdf[k] = cdf[k] / total
end
request = function()
  local u = math.random()
  local lo, hi = 1, n
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if cdf[mid] < u then lo = mid + 1 else hi = mid end
  end
  return wrk.format("GET", "/", { ["Authorization"] = "Bearer z" .. lo })
end
"#;

/// The key distributions, with the name each variant carries.
const DISTRIBUTIONS: [(&str, &str); 3] = [
    ("1 hot key", HOT),
    ("10k uniform", UNIFORM),
    ("Zipf 1.1 over 100k", ZIPF),
];

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// The lease interval of the leased variants: `TOLLGATE_BENCH_LEASE_MS`,
/// or the store's default of 1 s.
fn lease_interval() -> Duration {
    std::env::var("TOLLGATE_BENCH_LEASE_MS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(1), Duration::from_millis)
}

/// The route's response with five fixed headers of the lengths tollgate's
/// GitHub-style headers have in this bench, inserted the same way: what
/// the headers cost (the server inserting and writing them, wrk reading
/// them), without a limiter.
fn five_headers(mut response: axum::response::Response) -> axum::response::Response {
    let headers = response.headers_mut();
    for (name, value) in [
        ("x-ratelimit-limit", "1000000"),
        ("x-ratelimit-remaining", "999999"),
        ("x-ratelimit-used", "1"),
        ("x-ratelimit-reset", "1795000000"),
        ("x-ratelimit-resource", "bench"),
    ] {
        headers.insert(
            http::HeaderName::from_static(name),
            http::HeaderValue::from_static(value),
        );
    }
    response
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let redis = RedisServer::spawn();
    let mut leased_stores = Vec::new();
    let variants: Vec<(String, SocketAddr, &str)> = runtime.block_on(async {
        let url = redis.url();
        let mut variants = Vec::new();
        for (dist, script) in DISTRIBUTIONS {
            variants.push((format!("bare, {dist}"), serve(route()).await, script));
        }
        variants.push((
            "bare, five fixed headers, 10k uniform".to_owned(),
            serve(route().layer(MapResponseLayer::new(five_headers))).await,
            UNIFORM,
        ));
        for (i, (dist, script)) in DISTRIBUTIONS.into_iter().enumerate() {
            let store = RedisStore::builder()
                .prefix(format!("bench-plain-{i}"))
                .connect(url.as_str())
                .await
                .unwrap();
            let leased = LeasedStore::builder()
                .interval(lease_interval())
                .channel(format!("bench-leases-{i}"))
                .connect(
                    RedisStore::builder()
                        .prefix(format!("bench-leased-{i}"))
                        .connect(url.as_str())
                        .await
                        .unwrap(),
                    url.as_str(),
                )
                .await
                .unwrap();
            leased_stores.push((format!("tollgate Redis + leases, {dist}"), leased.clone()));
            let layer = || RateLimitLayer::new(per_key(), header_key()).keep_body_type();
            let plain = PlainGcraLayer::connect(&url, &format!("bench-script-{i}:")).await;
            let raw = PlainGcraLayer::connect_raw(&url, &format!("bench-raw-{i}:")).await;
            variants.extend([
                (
                    format!("tollgate memory, {dist}"),
                    serve(route().layer(layer())).await,
                    script,
                ),
                (
                    format!("tollgate memory + empty overrides, {dist}"),
                    serve(route().layer(layer().overrides(MemoryOverrides::new()))).await,
                    script,
                ),
                (
                    format!("tollgate memory + 1,000 overrides of other keys, {dist}"),
                    serve(route().layer(layer().overrides(other_keys_overridden().await))).await,
                    script,
                ),
                (
                    format!("tollgate memory, decided on another task, {dist}"),
                    serve(route().layer(layer().store(HandOffStore::spawn()))).await,
                    script,
                ),
                (
                    format!("tower_governor, with headers, {dist}"),
                    serve(tower_governor_app(true)).await,
                    script,
                ),
                (
                    format!("plain Redis GCRA script, {dist}"),
                    serve(route().layer(plain)).await,
                    script,
                ),
                (
                    format!("plain Redis GCRA script on raw sockets, {dist}"),
                    serve(route().layer(raw)).await,
                    script,
                ),
                (
                    format!("tollgate Redis, {dist}"),
                    serve(route().layer(layer().store(store))).await,
                    script,
                ),
                (
                    format!("tollgate Redis + leases, {dist}"),
                    serve(route().layer(layer().store(leased.clone()))).await,
                    script,
                ),
            ]);
        }
        variants.extend([
            (
                "tollgate memory, no headers, 10k uniform".to_owned(),
                serve(
                    route().layer(
                        RateLimitLayer::new(per_key(), header_key())
                            .keep_body_type()
                            .headers(HeaderStyle::None),
                    ),
                )
                .await,
                UNIFORM,
            ),
            (
                "tower_governor, no headers, 10k uniform".to_owned(),
                serve(tower_governor_app(false)).await,
                UNIFORM,
            ),
        ]);
        variants
    });

    // `TOLLGATE_BENCH_ONLY=bare,Redis` keeps the variants whose names
    // contain one of the words (the bare route is always kept: every ratio
    // is taken against it); `TOLLGATE_BENCH_ROUNDS` sets the rounds.
    let variants: Vec<_> = match std::env::var("TOLLGATE_BENCH_ONLY") {
        Ok(only) => variants
            .into_iter()
            .filter(|(name, _, _)| {
                name.starts_with("bare, ") || only.split(',').any(|w| name.contains(w.trim()))
            })
            .collect(),
        Err(_) => variants,
    };
    // `TOLLGATE_BENCH_PROFILE=<variant>=<file>` records this process with
    // `perf` (call graphs by frame pointer) while wrk loads that variant,
    // and runs only it beside the bare routes (see `scripts/profile-http`).
    let profile = std::env::var("TOLLGATE_BENCH_PROFILE").ok().and_then(|p| {
        let (variant, file) = p.rsplit_once('=')?;
        Some((variant.to_owned(), file.to_owned()))
    });
    let variants: Vec<_> = match &profile {
        Some((wanted, _)) => variants
            .into_iter()
            .filter(|(name, _, _)| name.starts_with("bare, ") || name == wanted)
            .collect(),
        None => variants,
    };
    let rounds = tollgate_tests::bench_rounds(ROUNDS);
    let mut runs: Vec<Vec<Run>> = variants.iter().map(|_| Vec::new()).collect();
    // Calls each leased store made during the measured runs: grants,
    // decisions by Redis, returns.
    let mut measured_calls: std::collections::HashMap<String, [u64; 3]> = Default::default();
    for round in 1..=rounds {
        // Each round starts one variant later, so that no variant always
        // follows the same one.
        for k in 0..variants.len() {
            let i = (k + round - 1) % variants.len();
            let (name, addr, script) = &variants[i];
            let leased = leased_stores.iter().find(|(n, _)| n == name);
            if let Some((_, store)) = leased.filter(|_| warm_up() > 0) {
                // Leases size themselves to each key's rate: the measured
                // run starts from what a server that has been serving
                // this traffic holds.
                wrk_for(*addr, script, warm_up());
                runtime.block_on(store.wait_for_grants());
            }
            // Recorded after the warm-up: the profile is of the measured run.
            let perf = profile
                .as_ref()
                .filter(|(wanted, _)| wanted == name)
                .map(|(_, file)| {
                    std::process::Command::new("perf")
                        .args(["record", "--call-graph", "fp", "-F", "2999", "-o", file])
                        .args(["-p", &std::process::id().to_string()])
                        .args([
                            "--",
                            "sleep",
                            &seconds().saturating_sub(1).max(1).to_string(),
                        ])
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .spawn()
                        .expect("perf is installed (apt-get install linux-perf)")
                });
            let calls_before = leased.map(|(_, store)| store.calls());
            let run = wrk(*addr, script, &redis);
            if let (Some((_, store)), Some(before)) = (leased, calls_before) {
                let after = store.calls();
                let counted = measured_calls.entry(name.clone()).or_insert([0; 3]);
                counted[0] += after.grants - before.grants;
                counted[1] += after.direct - before.direct;
                counted[2] += after.returns - before.returns;
            }
            if let Some(mut perf) = perf {
                perf.wait().expect("perf record ran");
            }
            // A leased store gives back what it holds now, rather than
            // over the next two seconds, in the next variant's run.
            for (_, store) in leased_stores.iter().filter(|(n, _)| n == name) {
                runtime.block_on(store.return_leases());
            }
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

    // Ratios are paired: each run against the run of the plain bare route
    // with the same key distribution in its own round.
    let ratios = |of: &[Run], to: &[Run]| -> Vec<f64> {
        of.iter()
            .zip(to)
            .map(|(a, b)| a.per_sec / b.per_sec)
            .collect()
    };
    let find = |wanted: &str| variants.iter().position(|(n, _, _)| n == wanted);
    let bare_of = |script: &str| {
        variants
            .iter()
            .position(|(n, _, s)| n.starts_with("bare, ") && !n.contains("five") && *s == script)
            .unwrap()
    };
    println!(
        "\nwrk -t1 -c{} -d{}s, {rounds} interleaved rounds in rotating order; \
         medians, and the median of the per-round ratios to the plain bare route \
         (no headers) with the same key distribution\n",
        connections(),
        seconds()
    );
    println!(
        "| variant | requests/s | ratio to bare | spread (min–max) | p50 | p99 | CPU/request: server, redis-server, wrk | EVALSHA per request | ratio per round |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for ((name, _, script), of) in variants.iter().zip(&runs) {
        let paired = ratios(of, &runs[bare_of(script)]);
        let listed: Vec<String> = paired.iter().map(|r| format!("{r:.2}")).collect();
        let (low, high) = spread(&paired);
        println!(
            "| {name} | {:.0} | {:.2} | {low:.2}–{high:.2} | {:.0} µs | {:.0} µs | {:.1} µs, {:.1} µs, {:.1} µs | {:.3} | {} |",
            median(of.iter().map(|r| r.per_sec).collect()),
            median(paired.clone()),
            median(of.iter().map(|r| r.p50_us).collect()),
            median(of.iter().map(|r| r.p99_us).collect()),
            median(of.iter().map(|r| r.server_cpu_us).collect()),
            median(of.iter().map(|r| r.redis_cpu_us).collect()),
            median(of.iter().map(|r| r.wrk_cpu_us).collect()),
            median(
                of.iter()
                    .map(|r| if r.per_call > 0.0 {
                        1.0 / r.per_call
                    } else {
                        0.0
                    })
                    .collect()
            ),
            listed.join(" "),
        );
    }
    // The comparisons the targets name, paired the same way.
    let mut pairs = vec![(
        "tollgate memory, no headers, 10k uniform".to_owned(),
        "tower_governor, no headers, 10k uniform".to_owned(),
    )];
    for (dist, _) in DISTRIBUTIONS {
        pairs.push((
            format!("tollgate memory, {dist}"),
            format!("tower_governor, with headers, {dist}"),
        ));
        pairs.push((
            format!("tollgate Redis + leases, {dist}"),
            format!("tollgate memory, {dist}"),
        ));
        pairs.push((
            format!("tollgate Redis, {dist}"),
            format!("tollgate memory, {dist}"),
        ));
        pairs.push((
            format!("tollgate Redis, {dist}"),
            format!("plain Redis GCRA script, {dist}"),
        ));
    }
    println!();
    for (ours, theirs) in pairs {
        let (Some(ours_at), Some(theirs_at)) = (find(&ours), find(&theirs)) else {
            continue;
        };
        let paired = ratios(&runs[ours_at], &runs[theirs_at]);
        let (low, high) = spread(&paired);
        let cpu = |at: usize| median(runs[at].iter().map(|r| r.server_cpu_us).collect());
        println!(
            "{ours} / {theirs}: throughput {:.2} (median of per-round ratios; {low:.2}–{high:.2}), server CPU per request {:.2}",
            median(paired),
            cpu(ours_at) / cpu(theirs_at)
        );
    }
    // Calls to Redis per admitted request, counted by the leased stores.
    for (name, store) in &leased_stores {
        let Some(at) = find(name) else {
            continue;
        };
        let requests: f64 = runs[at].iter().map(|r| r.per_sec * seconds() as f64).sum();
        let [grants, direct, returns] = measured_calls.get(name).copied().unwrap_or_default();
        let calls = store.calls();
        println!(
            "{name}: {:.3} store calls per request in the measured runs ({grants} grants, \
             {direct} decided by Redis, {returns} returns); in all, with warm-ups and the \
             returns after each run: {} grants, {} decided by Redis, {} returns",
            (grants + direct + returns) as f64 / requests,
            calls.grants,
            calls.direct,
            calls.returns
        );
    }
    drop(redis);
    runtime.shutdown_timeout(Duration::from_secs(1));
}
