//! The example app on Redis, over real TCP, against hostile clients: a key
//! header left out is a 400 with a throttled log, and padding
//! `X-Forwarded-For` never moves a spent client into the proxy's bucket.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum_app::{AppConfig, app};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::BoxStore;
use tollgate_redis::RedisStore;
use tollgate_tests::{require_redis, unique_prefix};

/// The demo behind a proxy on 127.0.0.1: logins by client IP, health
/// checks by API key. GCRA, not a fixed window: the store runs on Redis's
/// real clock, and a minute ending within a test would admit a spent
/// client again.
const CONFIG: &str = r#"
trusted_proxies = ["127.0.0.1"]

[[route]]
method = "POST"
path = "/login"
name = "login"
key = "ip"
algorithm = "gcra"
limits = ["5/min"]

[[route]]
method = "GET"
path = "/health"
name = "health"
key = "header:x-api-key"
algorithm = "gcra"
limits = ["1000/min"]
"#;

/// Serves the demo on Redis on a free loopback port.
/// Held by each test for its whole run: the log test's subscriber is the
/// default of its thread only, and tracing's per-callsite interest, which
/// every thread shares, may be settled meanwhile by the other test's
/// thread, which has none; run one at a time, the log test sees its lines.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn serve() -> SocketAddr {
    let url = require_redis().await;
    let store = RedisStore::builder()
        .prefix(unique_prefix("hostile"))
        .deadline(Duration::from_secs(2))
        .connect(url.as_str())
        .await
        .unwrap();
    let config = AppConfig::parse(CONFIG).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = app(&config, BoxStore::with_slots(store));
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// One request over a new connection; the status and the body.
async fn send(addr: SocketAddr, method: &str, path: &str, headers: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: t\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let status = raw[9..12].parse().unwrap();
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

/// Collects everything a subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn five_hundred_requests_without_the_key_header_are_400s_with_a_handful_of_log_lines() {
    let _alone = ONE_AT_A_TIME.blocking_lock();
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let mut statuses = std::collections::BTreeMap::new();
    tracing::subscriber::with_default(subscriber, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let addr = serve().await;
                for i in 0..500 {
                    let (status, body) = send(addr, "GET", "/health", "").await;
                    *statuses.entry(status).or_insert(0) += 1;
                    if i == 0 {
                        assert!(body.contains(r#""status":400"#), "{body}");
                        assert!(body.contains("send the x-api-key header"), "{body}");
                    }
                }
                // The header present: limited as usual.
                let (status, _) = send(addr, "GET", "/health", "x-api-key: k1\r\n").await;
                assert_eq!(status, 200);
            });
    });
    assert_eq!(statuses, [(400, 500)].into(), "only 400s");
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines = logs
        .lines()
        .filter(|l| l.contains("rate-limit key"))
        .count();
    // 500 requests in well under a second on loopback; a slow machine may
    // cross into a second or third second.
    assert!((1..=3).contains(&lines), "{lines} lines:\n{logs}");
    assert!(!logs.contains("ERROR"), "{logs}");
}

#[tokio::test]
async fn a_spent_client_padding_x_forwarded_for_past_8_kib_stays_limited() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let addr = serve().await;
    // A client address no other run of this test uses within the minute.
    let nanos = std::time::SystemTime::UNIX_EPOCH
        .elapsed()
        .unwrap()
        .subsec_nanos();
    let client = format!("198.18.{}.{}", (nanos >> 8) % 256, nanos % 256);
    // The proxy on 127.0.0.1 appends the client's address.
    let forwarded = |padding: &str| format!("X-Forwarded-For: {padding}{client}\r\n");
    for _ in 0..5 {
        let (status, _) = send(addr, "POST", "/login", &forwarded("")).await;
        assert_eq!(status, 401, "no password: a failed login");
    }
    let padding = "1.1.1.1,".repeat(1_200); // 9,600 bytes
    for padding in [padding.as_str(), ""] {
        let (status, body) = send(addr, "POST", "/login", &forwarded(padding)).await;
        assert_eq!(status, 429, "padding of {} bytes: {body}", padding.len());
    }
    // The proxy's own bucket was never touched: all five logins are there.
    for _ in 0..5 {
        let (status, _) = send(addr, "POST", "/login", "").await;
        assert_eq!(status, 401, "no password: a failed login");
    }
    // A forwarded hop that does not parse is the client's mistake.
    let (status, body) = send(addr, "POST", "/login", "X-Forwarded-For: bogus\r\n").await;
    assert_eq!(status, 400, "{body}");
}
