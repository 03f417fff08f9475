//! The example app over real TCP on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::net::SocketAddr;

use axum_app::{Policies, app};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::{FakeClock, MemoryStore, Timestamp};

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

async fn start() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Limiter time is fake, so no run can straddle a window boundary.
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_040));
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    let app = app(&Policies::demo().unwrap(), store);
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

async fn send(addr: SocketAddr, method: &str, path: &str, auth: Option<&str>) -> Reply {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let auth = auth
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

#[tokio::test]
async fn login_is_limited_per_ip_and_the_api_per_user() {
    let addr = start().await;

    let health = send(addr, "GET", "/health", None).await;
    assert_eq!(health.status, 200);
    assert_eq!(health.header("x-ratelimit-limit"), None);

    for remaining in ["4", "3", "2", "1", "0"] {
        let r = send(addr, "POST", "/login", None).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-ratelimit-remaining"), Some(remaining));
        assert_eq!(r.header("x-ratelimit-resource"), Some("login"));
    }
    let r = send(addr, "POST", "/login", None).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("60"));
    assert_eq!(r.header("x-ratelimit-reset"), Some("1700000100"));
    assert!(
        r.body.contains("\"violated-policies\":[\"login\"]"),
        "{}",
        r.body
    );

    assert_eq!(send(addr, "GET", "/api/hello", None).await.status, 401);
    // GCRA with a burst of 5: five at once per user, then denied.
    for _ in 0..5 {
        let r = send(addr, "GET", "/api/hello", Some("Bearer demo-ada")).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "hello, ada\n");
    }
    let r = send(addr, "GET", "/api/hello", Some("Bearer demo-ada")).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("6"), "10/min: one every 6 s");
    assert_eq!(
        r.header("x-ratelimit-reset"),
        Some("1700000070"),
        "full again in 30 s"
    );
    // Another user has a bucket of their own.
    let r = send(addr, "GET", "/api/hello", Some("Bearer demo-bob")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("4"));
}
