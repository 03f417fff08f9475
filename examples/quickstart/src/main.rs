//! Run with: `cargo run -p quickstart`, then `curl -i localhost:3000/search`.
//!
//! The README's quick start, whole (`tests/readme.rs` checks that the
//! README shows this file, without these lines, and its dependencies).

use std::net::SocketAddr;

use axum::{Router, routing::get};
use tollgate::{PeerIp, Policy, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `Policy` (with its `Algorithm` and limits) deserializes from any
    // configuration format serde reads, checked as the builder checks
    // it: a mistake is an error that says what is wrong.
    let policy: Policy = toml::from_str(
        r#"
        name = "search"
        algorithm = "sliding_window"
        limits = ["25/5s", "300/min"]   # both must hold
        "#,
    )?;
    // The same in code:
    // Policy::builder("search").algorithm(Algorithm::SlidingWindow)
    //     .limit("25/5s").limit("300/min").build()?

    let app = Router::new()
        .route("/search", get(|| async { "results" }))
        // One limit per client IP address (IPv6 grouped by /56).
        .layer(RateLimitLayer::new(policy, PeerIp::new()).keep_body_type());

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    // `PeerIp` reads the address axum hands over as connect info.
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}
