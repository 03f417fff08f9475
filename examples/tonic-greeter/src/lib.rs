//! Tollgate's gRPC demo: the standard `helloworld.Greeter` service behind
//! [`RateLimitLayer`], keyed by the peer's IP address or by a metadata
//! value. A rejected call ends with `RESOURCE_EXHAUSTED` (code 8), with the
//! rate-limit values and `retry-after` as metadata.
//!
//! Run with: `cargo run -p tonic-greeter -- [--listen ADDR] [--key-metadata NAME] [--redis-url URL]`

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tollgate::{
    Algorithm, ConfigError, HeaderKey, Key, KeyExtractor, MissingCause, PeerIp, Policy,
    RateLimitLayer, Store,
};
use tonic::{Request, Response, Status};

/// `helloworld.HelloRequest`.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct HelloRequest {
    /// Who to greet.
    #[prost(string, tag = "1")]
    pub name: String,
}

/// `helloworld.HelloReply`.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct HelloReply {
    /// The greeting.
    #[prost(string, tag = "1")]
    pub message: String,
}

/// The generated `helloworld.Greeter` server and client.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::unwrap_used)]
pub mod greeter {
    include!(concat!(env!("OUT_DIR"), "/helloworld.Greeter.rs"));
}

pub use greeter::greeter_client::GreeterClient;
use greeter::greeter_server::{Greeter, GreeterServer};

/// The greeter itself.
#[derive(Debug, Default, Clone, Copy)]
pub struct MyGreeter;

#[tonic::async_trait]
impl Greeter for MyGreeter {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        let name = request.into_inner().name;
        Ok(Response::new(HelloReply {
            message: format!("Hello {name}!"),
        }))
    }
}

/// The built-in limit: 10 calls per minute per key.
///
/// # Errors
///
/// Never in practice; the policy is a constant checked at start-up.
pub fn default_policy() -> Result<Policy, ConfigError> {
    Policy::new("greeter", Algorithm::SlidingWindow, "10/min")
}

/// What calls are keyed by.
#[derive(Debug, Clone)]
pub enum GreeterKey {
    /// The peer's IP address (IPv6 grouped by /56).
    Peer(PeerIp),
    /// A metadata value, such as an API key.
    Metadata(HeaderKey),
}

impl<B> KeyExtractor<B> for GreeterKey {
    fn extract(&self, request: &http::Request<B>) -> Option<Key> {
        match self {
            GreeterKey::Peer(e) => e.extract(request),
            GreeterKey::Metadata(e) => e.extract(request),
        }
    }

    // The inner extractor's reason: a call without the metadata is the
    // client's mistake (`INVALID_ARGUMENT`), not the server's (`INTERNAL`).
    fn missing(&self, request: &http::Request<B>) -> MissingCause {
        match self {
            GreeterKey::Peer(e) => e.missing(request),
            GreeterKey::Metadata(e) => e.missing(request),
        }
    }
}

/// Serves the limited greeter on `listener` until the process ends.
///
/// # Errors
///
/// When the server fails.
pub async fn serve<St: Store + Clone>(
    listener: TcpListener,
    policy: Policy,
    key: GreeterKey,
    store: St,
) -> Result<(), tonic::transport::Error> {
    let layer = RateLimitLayer::new(policy, key).store(store).grpc();
    tonic::transport::Server::builder()
        .layer(layer)
        .add_service(GreeterServer::new(MyGreeter))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
        .await
}

/// The address a listener is bound to, for printing.
pub fn bound(listener: &TcpListener) -> Option<SocketAddr> {
    listener.local_addr().ok()
}
