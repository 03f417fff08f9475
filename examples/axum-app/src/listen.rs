//! The demo's server: the router served by hyper over HTTP/1.1, with a
//! bound on how long a client may take to send a request's headers
//! ([`serve`]).

use std::future::Future;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper::server::conn::http1::Builder;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::ServiceExt;

/// How long, in milliseconds, a client may take by default to send a
/// request's headers (HTTP/1).
pub const HEADER_TIMEOUT_MS: u64 = 10_000;

/// Serves `app` on `listener` until `shutdown` completes, then waits for
/// the open connections to finish their requests. Each request carries
/// its client's [`ConnectInfo<SocketAddr>`], as `axum::serve` with
/// `into_make_service_with_connect_info` gives it.
///
/// HTTP/1.1 only: a connection whose client takes longer than
/// `header_timeout` to send a request's headers, or its first byte, is
/// closed. `axum::serve` sets no timer, and hyper bounds nothing without
/// one (nor does it bound the sniffing of HTTP/2's preface, or an HTTP/2
/// connection's headers): a client could hold any number of
/// connections open by sending a byte of its headers now and then, and
/// no rate limit sees a request that never arrives. A failure to accept a
/// connection (too many open files) waits a second before the next.
///
/// ```no_run
/// use axum::{Router, routing::get};
/// use std::time::Duration;
/// use axum_app::listen::{HEADER_TIMEOUT_MS, serve};
///
/// # #[tokio::main] async fn main() -> std::io::Result<()> {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// let app = Router::new().route("/", get(|| async { "ok" }));
/// let header_timeout = Duration::from_millis(HEADER_TIMEOUT_MS);
/// serve(listener, app, header_timeout, std::future::pending()).await;
/// # Ok(()) }
/// ```
pub async fn serve(
    listener: TcpListener,
    app: Router,
    header_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) {
    let mut builder = Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let (stream, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(error) if is_connection_error(&error) => continue,
            Err(error) => {
                tracing::error!(%error, "cannot accept a connection");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    () = &mut shutdown => break,
                }
            }
        };
        let (builder, watcher, app) = (builder.clone(), graceful.watcher(), app.clone());
        tokio::spawn(async move {
            // Until a client's first byte, hyper reads with no timer: a
            // client that sends nothing is bounded here.
            let mut first = [0u8; 1];
            match tokio::time::timeout(header_timeout, stream.peek(&mut first)).await {
                Ok(Ok(1..)) => {}
                Ok(Ok(0) | Err(_)) | Err(_) => return,
            }
            let service = app.map_request(move |mut request: http::Request<Incoming>| {
                request.extensions_mut().insert(ConnectInfo(remote));
                request
            });
            let service = TowerToHyperService::new(service);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            // A client's broken connection or timeout: nothing to tell.
            let _ = watcher.watch(connection).await;
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Whether `error` is about the connection being accepted (the client
/// gave up), not the listener: accept the next at once.
fn is_connection_error(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        error.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    )
}
