//! What the rate-limit layer costs per request in process, next to
//! `tower_governor`, without a network or a load generator in the way.
//!
//! `http_layer` measures the same variants over loopback with `wrk`, but
//! there the route is so cheap that the load generator, the kernel and the
//! machine's drift decide the figures: a layered route can come out faster
//! than the bare one. Here each variant is an Axum `Router` called directly
//! (one thread, polled once: every variant answers without waiting), and
//! the request, with its `Authorization` header from 10,000 rotating keys,
//! is built inside the timed loop, as a server would build it. The route
//! answers a short JSON body, and both limiters admit 1,000,000 a second
//! per key with a burst of 1,000,000 (the conditions of `common`).
//!
//! Each round times a block of requests per variant, in rotating order, and
//! the ratios are medians of the per-round ratios. The overhead of a layer
//! is its time per request minus the bare route's in the same round. Many
//! short rounds (111 of 20,000 requests, about 20 ms per block) pair the
//! variants more closely in time than a few long ones: on this shared
//! machine, three runs of 11 rounds of 200,000 gave one build's ratios
//! 1.00 to 1.06 apart, and three of 111 rounds of 20,000 within 0.01 to
//! 0.04.
//! `TOLLGATE_BENCH_ROUNDS` and `TOLLGATE_BENCH_BLOCK` change both, and
//! `TOLLGATE_BENCH_KEYS` the number of keys (1: one hot key).
//!
//! Instructions per request, whatever else the machine runs: run the
//! bench's binary under `valgrind --tool=callgrind` with one variant (see
//! `TOLLGATE_BENCH_ONLY` below) at two round counts, and once more with the
//! bare route alone; the difference of the differences, over the requests
//! it adds, is the variant's per request beyond the bare route
//! (`scripts/layer-instructions` does this).
//!
//! Run with: `cargo bench -p tollgate-tests --bench layer_paired`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use http::header::AUTHORIZATION;
use http::{HeaderValue, Request};
use tollgate::{HeaderStyle, RateLimitLayer};
use tollgate_tests::median;
use tower::Service;

mod common;
use common::{header_key, per_key, route, tower_governor_app};

const ROUNDS: usize = 111;
/// Requests per variant per round.
const BLOCK: usize = 20_000;
const KEYS: usize = 10_000;

/// Keys: `TOLLGATE_BENCH_KEYS`, or `KEYS`.
fn key_count() -> usize {
    std::env::var("TOLLGATE_BENCH_KEYS")
        .ok()
        .and_then(|k| k.parse().ok())
        .filter(|&k| k > 0)
        .unwrap_or(KEYS)
}

/// The route behind tollgate, at the same rate and burst as
/// `tower_governor`.
fn tollgate(headers: HeaderStyle, keep_body_type: bool) -> Router {
    let layer = RateLimitLayer::new(per_key(), header_key()).headers(headers);
    if keep_body_type {
        return route().layer(layer.keep_body_type());
    }
    route().layer(layer)
}

/// Polls a future that must not wait.
fn now<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the request waited"),
    }
}

/// Calls `app` `block_len()` times, the keys starting at `offset`; returns the
/// time per request in nanoseconds. Fails if any response is not 200.
fn block(app: &mut Router<()>, keys: &[HeaderValue], offset: usize) -> f64 {
    let block = block_len();
    let start = Instant::now();
    for i in offset..offset + block {
        let request = Request::get("/")
            .header(AUTHORIZATION, keys[i % keys.len()].clone())
            .body(Body::empty())
            .unwrap();
        let response = now(app.call(request)).unwrap();
        assert_eq!(response.status(), 200);
        black_box(response);
    }
    start.elapsed().as_secs_f64() * 1e9 / block as f64
}

/// Requests per variant per round: `TOLLGATE_BENCH_BLOCK`, or `BLOCK`.
fn block_len() -> usize {
    std::env::var("TOLLGATE_BENCH_BLOCK")
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or(BLOCK)
}

fn main() {
    // `cargo test --benches` runs bench targets with `--test`: one small
    // round is enough there.
    let smoke = std::env::args().any(|a| a == "--test");
    let rounds = if smoke {
        1
    } else {
        tollgate_tests::bench_rounds(ROUNDS)
    };
    let keys: Vec<HeaderValue> = (0..key_count())
        .map(|i| HeaderValue::try_from(format!("Bearer k{i}")).unwrap())
        .collect();
    let mut variants: Vec<(&str, Router<()>)> = vec![
        ("bare", route()),
        (
            "tollgate, GitHub headers",
            tollgate(HeaderStyle::GitHub, false),
        ),
        ("tollgate, no headers", tollgate(HeaderStyle::None, false)),
        (
            "tollgate, GitHub headers, keep_body_type",
            tollgate(HeaderStyle::GitHub, true),
        ),
        (
            "tollgate, no headers, keep_body_type",
            tollgate(HeaderStyle::None, true),
        ),
        ("tower_governor, with headers", tower_governor_app(true)),
        ("tower_governor, no headers", tower_governor_app(false)),
    ]
    .into_iter()
    // `TOLLGATE_BENCH_ONLY='tollgate, no|governor, no'` keeps the variants
    // whose names contain one of the `|`-separated texts, and the bare
    // route (to count one variant's instructions under callgrind, say); a
    // text that starts with `=` keeps the variant of exactly that name.
    .filter(|(name, _)| match std::env::var("TOLLGATE_BENCH_ONLY") {
        Ok(only) => {
            *name == "bare"
                || only.split('|').any(|w| match w.strip_prefix('=') {
                    Some(exact) => *name == exact,
                    None => name.contains(w),
                })
        }
        Err(_) => true,
    })
    .map(|(name, app)| (name, app.with_state(())))
    .collect();
    // Warm up: every key's state exists on every side before timing.
    for (_, app) in &mut variants {
        block(app, &keys, 0);
    }
    // Each variant writes the headers its name says, and only those.
    for (name, app) in &mut variants {
        let request = Request::get("/")
            .header(AUTHORIZATION, "Bearer k1")
            .body(Body::empty())
            .unwrap();
        let response = now(app.call(request)).unwrap();
        let has = response.headers().contains_key("x-ratelimit-remaining");
        assert_eq!(
            has,
            name.contains("with headers") || name.contains("GitHub"),
            "{name}"
        );
    }
    let mut times = vec![Vec::new(); variants.len()];
    for round in 0..rounds {
        let offset = (round + 1) * block_len();
        for turn in 0..variants.len() {
            let v = (round + turn) % variants.len();
            times[v].push(block(&mut variants[v].1, &keys, offset));
        }
    }
    let bare = times[0].clone();
    let per_round = |v: usize, f: &dyn Fn(f64, f64) -> f64| -> Vec<f64> {
        times[v].iter().zip(&bare).map(|(&t, &b)| f(t, b)).collect()
    };
    println!(
        "In-process Axum route, ns per request: medians of {rounds} interleaved rounds of {} requests, {} rotating keys\n",
        block_len(),
        keys.len()
    );
    println!("| variant | ns/request | overhead beyond bare, ns | ratio of bare's requests/s |");
    println!("|---|---:|---:|---:|");
    for (v, (name, _)) in variants.iter().enumerate() {
        println!(
            "| {name} | {:.0} | {:.0} | {:.2} |",
            median(times[v].clone()),
            median(per_round(v, &|t, b| t - b)),
            median(per_round(v, &|t, b| b / t)),
        );
    }
    let paired = |ours: usize, theirs: usize| {
        let ratio = |f: &dyn Fn(usize, usize) -> f64| {
            median((0..rounds).map(|r| f(r, ours) / f(r, theirs)).collect())
        };
        (
            ratio(&|r, v| times[v][r]),
            ratio(&|r, v| times[v][r] - bare[r]),
        )
    };
    let index = |name: &str| variants.iter().position(|(n, _)| *n == name);
    let pairs = [
        ("tollgate, GitHub headers", "tower_governor, with headers"),
        ("tollgate, no headers", "tower_governor, no headers"),
        (
            "tollgate, GitHub headers, keep_body_type",
            "tower_governor, with headers",
        ),
        (
            "tollgate, no headers, keep_body_type",
            "tower_governor, no headers",
        ),
    ];
    for (ours, theirs) in pairs {
        let (Some(ours), Some(theirs)) = (index(ours), index(theirs)) else {
            continue;
        };
        let (time, overhead) = paired(ours, theirs);
        println!(
            "\n{} / {}: time per request {time:.2}, overhead beyond bare {overhead:.2} (medians of per-round ratios; below 1 is faster)",
            variants[ours].0, variants[theirs].0
        );
    }
}
