//! The demo's server ([`axum_app::listen::serve`]): requests carry their
//! client's address, a client slow to send its headers is cut off, and a
//! shutdown ends the server. Real time: bounded waits of a few seconds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const HEADER_TIMEOUT: Duration = Duration::from_millis(300);

/// Serves a route answering with its client's address; returns the
/// server's address, the sender that shuts it down, and its task.
async fn start() -> (
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route(
        "/",
        get(|ConnectInfo(client): ConnectInfo<SocketAddr>| async move { client.to_string() }),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(axum_app::listen::serve(
        listener,
        app,
        HEADER_TIMEOUT,
        async move {
            let _ = stopped.await;
        },
    ));
    (addr, stop, server)
}

/// What the server sends on `stream` until it closes it, or `None` if it
/// is still open after `within`.
async fn until_closed(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 1024];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(within, read).await.ok()?;
    Some(got)
}

#[tokio::test]
async fn a_request_carries_its_clients_address() {
    let (addr, _stop, _server) = start().await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let client = stream.local_addr().unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let response = until_closed(&mut stream, Duration::from_secs(5))
        .await
        .unwrap();
    let response = String::from_utf8(response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(
        response.ends_with(&format!("\r\n\r\n{client}")),
        "{response}"
    );
}

/// A client that sends a byte of its headers every 100 ms would hold its
/// connection for ever: it is closed once the header timeout has passed
/// since its first byte, unanswered by the route.
#[tokio::test]
async fn a_client_slow_to_send_its_headers_is_cut_off() {
    let (addr, _stop, _server) = start().await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    stream.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if writer.write_all(b"x").await.is_err() {
                return;
            }
        }
    });
    let mut buf = [0u8; 1024];
    let mut got = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    trickle.abort();
    assert!(closed.is_ok(), "the connection is still open after 5 s");
    assert!(
        started.elapsed() >= HEADER_TIMEOUT,
        "{:?}",
        started.elapsed()
    );
    let got = String::from_utf8_lossy(&got);
    assert!(!got.contains("200 OK"), "{got}");
}

/// A client that connects and sends nothing, one that sends a byte and
/// then nothing, and one that keeps its connection open after a
/// response, are cut off after the header timeout.
#[tokio::test]
async fn a_silent_or_idle_client_is_cut_off() {
    let (addr, _stop, _server) = start().await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let closed = until_closed(&mut silent, Duration::from_secs(5)).await;
    assert_eq!(closed, Some(Vec::new()), "a silent client's connection");
    // One byte, then nothing (HTTP/2's preface begins so).
    let mut one_byte = TcpStream::connect(addr).await.unwrap();
    one_byte.write_all(b"P").await.unwrap();
    assert!(
        until_closed(&mut one_byte, Duration::from_secs(5))
            .await
            .is_some(),
        "one byte"
    );
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let response = until_closed(&mut idle, Duration::from_secs(5)).await;
    let response = String::from_utf8(response.expect("an idle connection closed")).unwrap();
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
}

/// Once its shutdown completes, the server stops accepting and ends (no
/// connection is open).
#[tokio::test]
async fn a_shutdown_ends_the_server() {
    let (addr, stop, server) = start().await;
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the server ended")
        .unwrap();
    assert!(TcpStream::connect(addr).await.is_err(), "still accepting");
}
