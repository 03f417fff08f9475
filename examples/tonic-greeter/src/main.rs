//! Run with: `cargo run -p tonic-greeter -- [--listen ADDR] [--key-metadata NAME] [--redis-url URL]`

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use tollgate::{HeaderKey, MemoryStore, PeerIp};
use tollgate_redis::RedisStore;
use tonic_greeter::{GreeterKey, bound, default_policy, serve};

/// helloworld.Greeter, limited to 10 calls per minute per peer (or per
/// metadata value).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "TOLLGATE_LISTEN", default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// Key calls by this metadata entry (such as `x-api-key`) instead of the peer IP.
    #[arg(long)]
    key_metadata: Option<String>,
    /// Redis to share the limit through; in memory when absent.
    #[arg(long, env = "REDIS_URL")]
    redis_url: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let policy = default_policy()?;
    let key = match &args.key_metadata {
        Some(name) => GreeterKey::Metadata(HeaderKey::new(
            http::HeaderName::try_from(name.as_str())
                .map_err(|_| format!("--key-metadata: invalid name {name:?}"))?,
        )),
        None => GreeterKey::Peer(PeerIp::new()),
    };
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!(
        "listening on {} (gRPC)",
        bound(&listener).map_or(args.listen, |a| a)
    );
    println!(
        "policy: {policy}, keyed by {}",
        args.key_metadata.as_deref().unwrap_or("peer IP")
    );
    match &args.redis_url {
        Some(url) => {
            println!("store: Redis");
            serve(
                listener,
                policy,
                key,
                RedisStore::connect(url.as_str()).await?,
            )
            .await?;
        }
        None => {
            println!("store: in-memory");
            serve(listener, policy, key, MemoryStore::new()).await?;
        }
    }
    Ok(())
}
