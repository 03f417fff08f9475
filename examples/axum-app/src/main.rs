//! Run with: `cargo run -p axum-app -- [--listen ADDR]`

use std::net::SocketAddr;

use axum_app::{Policies, app};
use clap::Parser;
use tollgate::MemoryStore;

/// Tollgate's demo API.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "TOLLGATE_LISTEN", default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tollgate=debug".into()),
        )
        .init();
    let args = Args::parse();
    let policies = Policies::demo()?;
    let store = MemoryStore::new();

    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("store: in-memory (max {} keys)", store.max_keys());
    println!("listening on http://{}", listener.local_addr()?);
    println!("policies:");
    println!("  POST /login      per IP    {}", policies.login);
    println!("  GET  /api/hello  per user  {}", policies.api);
    println!("  GET  /health     not limited");

    let app = app(&policies, store);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
