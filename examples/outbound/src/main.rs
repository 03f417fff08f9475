//! Run with: `cargo run -p outbound -- [--workers N] [--calls M] [--redis-url URL]`

use std::process::ExitCode;
use std::time::{Duration, Instant};

use axum::body::Body;
use clap::Parser;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use outbound::{QUOTA, busiest_windows, client_layer, client_policy, run_workers, third_party_api};
use tollgate::{MemoryStore, SystemClock};
use tollgate_redis::RedisStore;
use tower::ServiceBuilder;

/// Several workers share one third-party API quota (25 per 5 s, 300 per
/// minute) through a rate limiter that waits instead of failing.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Worker tasks, each with its own HTTP client (and Redis connection).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Calls per worker.
    #[arg(long, default_value_t = 20)]
    calls: usize,
    /// Redis to share the quota through; one in-memory store when absent.
    #[arg(long, env = "REDIS_URL")]
    redis_url: Option<String>,
    /// Added to each period on the client side to absorb network delay, in ms.
    #[arg(long, default_value_t = 50)]
    margin_ms: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<bool, Box<dyn std::error::Error>> {
    let (api, log) = third_party_api(SystemClock, &QUOTA)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, api).await });
    let policy = client_policy(&QUOTA, Duration::from_millis(args.margin_ms))?;
    let max_wait = Duration::from_secs(120);
    println!("API at {base}: 25 calls per 5 s and 300 per minute");
    println!("client limit: {policy}, shared by {} workers", args.workers);

    let mut redis_stores = Vec::new();
    if let Some(url) = &args.redis_url {
        for _ in 0..args.workers {
            redis_stores.push(RedisStore::connect(url.as_str()).await?);
        }
        println!("store: Redis, one connection per worker");
    } else {
        println!("store: one in-memory store for all workers");
    }
    let memory = MemoryStore::new();
    let started = Instant::now();
    let client = |worker: usize| {
        let http = Client::builder(TokioExecutor::new()).build_http::<Body>();
        let base = base.clone();
        let http = ServiceBuilder::new()
            .map_request(move |mut req: http::Request<Body>| {
                if let Ok(uri) = format!("{base}{}", req.uri()).parse() {
                    *req.uri_mut() = uri;
                }
                req
            })
            .service(http);
        match redis_stores.get(worker) {
            Some(store) => tower::util::Either::Left(
                ServiceBuilder::new()
                    .layer(client_layer(policy.clone(), store.clone(), max_wait))
                    .service(http),
            ),
            None => tower::util::Either::Right(
                ServiceBuilder::new()
                    .layer(client_layer(policy.clone(), memory.clone(), max_wait))
                    .service(http),
            ),
        }
    };
    let outcome = run_workers(args.workers, args.calls, client).await;
    let log = log.lock().map_err(|_| "API log poisoned")?;
    println!(
        "{} calls in {:.1} s: {} ok, {} rejected by the API, {} given up, {} failed",
        args.workers * args.calls,
        started.elapsed().as_secs_f64(),
        outcome.ok,
        outcome.api_rejected,
        outcome.gave_up,
        outcome.failed
    );
    for (count, period, most) in busiest_windows(&log.accepted, &QUOTA) {
        println!("busiest {period:?} window at the API: {most} calls (limit {count})");
    }
    Ok(outcome.api_rejected == 0 && outcome.ok == args.workers * args.calls)
}
