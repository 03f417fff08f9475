//! Run with: `cargo run -p axum-app -- [--listen ADDR] [--redis-url URL] [--config FILE]`

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use axum_app::{AppConfig, app, install_metrics, metrics_route, policy_table};
use clap::Parser;
use tollgate::{BoxStore, MemoryStore};
use tollgate_redis::RedisStore;

/// Tollgate's demo API: per-route rate limits from a policy file.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "TOLLGATE_LISTEN", default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Redis to share limits through; the in-memory store when absent.
    #[arg(long, env = "REDIS_URL")]
    redis_url: Option<String>,
    /// The policy file.
    #[arg(long, env = "TOLLGATE_CONFIG", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/policies.toml"))]
    config: PathBuf,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(&args.config)
        .map_err(|e| format!("cannot read the config file {}: {e}", args.config.display()))?;
    let config = AppConfig::parse(&text).map_err(|e| format!("{}: {e}", args.config.display()))?;
    // Before the layers are built: they register their counters with it.
    let metrics = install_metrics().map_err(|e| format!("cannot install metrics: {e}"))?;
    let store = match &args.redis_url {
        Some(url) => {
            let store = RedisStore::connect(url.as_str())
                .await
                .map_err(|e| format!("cannot use Redis at {}: {e}", redact(url)))?;
            println!("store: Redis at {}", redact(url));
            BoxStore::new(store)
        }
        None => {
            let store = MemoryStore::new();
            println!("store: in-memory (max {} keys)", store.max_keys());
            BoxStore::new(store)
        }
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    println!("listening on http://{}", listener.local_addr()?);
    println!("config: {}", args.config.display());
    println!("metrics: http://{}/metrics", listener.local_addr()?);
    print!("{}", policy_table(&config));
    axum::serve(
        listener,
        app(&config, store)
            .merge(metrics_route(metrics))
            .into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}

/// The URL without credentials.
fn redact(url: &str) -> String {
    match (url.split_once("://"), url.rsplit_once('@')) {
        (Some((scheme, _)), Some((_, host))) => format!("{scheme}://***@{host}"),
        _ => url.to_owned(),
    }
}
