//! Every route of the bundled policy file, for a free and a pro user, on
//! memory and on Redis alike; and the client IP over real TCP.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::connect_info::MockConnectInfo;
use axum_app::app;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::{BoxStore, FakeClock, MemoryStore, Timestamp};
use tollgate_redis::RedisStore;
use tollgate_tests::{require_redis, unique_prefix};

use super::{Seen, T0, burst, config, send};

/// Drives every route; returns everything seen, in order.
async fn scenario(store: BoxStore, clock: &FakeClock) -> Vec<Seen> {
    clock.set(Timestamp::from_secs(T0) + Duration::from_millis(12_500));
    let app =
        app(&config(), store).layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 7], 5555))));
    let mut seen = Vec::new();

    // /health is not limited.
    let health = send(&app, "GET", "/health", None).await;
    assert_eq!((health.status, health.headers.len()), (200, 0));
    seen.push(health);

    // POST /login: 5 failed logins per minute per IP, fixed window. A
    // login without the password fails, and counts.
    for i in 0..5u64 {
        let s = send(&app, "POST", "/login", None).await;
        assert_eq!(s.status, 401);
        assert_eq!(s.get("x-ratelimit-limit"), Some("5"));
        assert_eq!(s.get("x-ratelimit-remaining").unwrap(), (4 - i).to_string());
        assert_eq!(s.get("x-ratelimit-used").unwrap(), (i + 1).to_string());
        assert_eq!(s.get("x-ratelimit-reset"), Some("1700000100"));
        assert_eq!(s.get("x-ratelimit-resource"), Some("login-failures"));
        seen.push(s);
    }
    let s = send(&app, "POST", "/login", None).await;
    assert_eq!(s.status, 429);
    assert_eq!(s.get("retry-after"), Some("48"), "47.5 s rounded up");
    seen.push(s);

    // /api/* without a valid token: 401 after the per-IP limit, before any
    // per-user one.
    for token in [None, Some("")] {
        let s = send(&app, "GET", "/api/items", token).await;
        assert_eq!(s.status, 401);
        assert_eq!(s.get("x-ratelimit-resource"), Some("api-ip"));
        seen.push(s);
    }

    // GET /api/items: GCRA 5/s with bursts of 10, per user.
    for i in 0..10u64 {
        let s = send(&app, "GET", "/api/items", Some("ada")).await;
        assert_eq!(s.status, 200);
        assert_eq!(s.get("x-ratelimit-resource"), Some("items-read"));
        assert_eq!(s.get("x-ratelimit-remaining").unwrap(), (9 - i).to_string());
        seen.push(s);
    }
    let s = send(&app, "GET", "/api/items", Some("ada")).await;
    assert_eq!(
        (s.status, s.get("retry-after")),
        (429, Some("1")),
        "200 ms rounded up"
    );
    assert_eq!(s.get("x-ratelimit-resource"), Some("items-read"));
    seen.push(s);
    // Another user is not affected.
    let s = send(&app, "GET", "/api/items", Some("bob")).await;
    assert_eq!((s.status, s.get("x-ratelimit-remaining")), (200, Some("9")));
    seen.push(s);

    // POST /api/items: sliding window, 20 per minute per user.
    for _ in 0..20 {
        let s = send(&app, "POST", "/api/items", Some("ada")).await;
        assert_eq!(s.status, 201);
        seen.push(s);
    }
    let s = send(&app, "POST", "/api/items", Some("ada")).await;
    assert_eq!(
        (s.status, s.get("x-ratelimit-resource")),
        (429, Some("items-write"))
    );
    // The 20 still weigh 20 * (60 - e) / 60 in the next window; a 21st fits
    // once that is at most 19: 3 s into it, 50.5 s from now.
    assert_eq!(s.get("retry-after"), Some("51"));
    seen.push(s);

    // GET /api/search: 2 per second and 100 per hour, per user.
    for _ in 0..2 {
        assert_eq!(
            send(&app, "GET", "/api/search?q=x", Some("cyd"))
                .await
                .status,
            200
        );
    }
    let s = send(&app, "GET", "/api/search?q=x", Some("cyd")).await;
    assert_eq!(
        (s.status, s.get("retry-after"), s.get("x-ratelimit-limit")),
        (429, Some("1"), Some("2"))
    );
    seen.push(s);
    clock.advance(Duration::from_secs(1));
    let s = send(&app, "GET", "/api/search?q=x", Some("cyd")).await;
    assert_eq!((s.status, s.get("x-ratelimit-remaining")), (200, Some("1")));
    seen.push(s);

    // GET /api/export: token bucket of 50 per hour, each export costs 10.
    for remaining in ["40", "30", "20", "10", "0"] {
        let s = send(&app, "GET", "/api/export", Some("dee")).await;
        assert_eq!(
            (s.status, s.get("x-ratelimit-remaining")),
            (200, Some(remaining))
        );
        seen.push(s);
    }
    let s = send(&app, "GET", "/api/export", Some("dee")).await;
    // 10 tokens at one per 72 s.
    assert_eq!((s.status, s.get("retry-after")), (429, Some("720")));
    seen.push(s);
    seen
}

#[tokio::test]
async fn every_route_on_memory_and_the_same_on_redis() {
    let clock = FakeClock::default();
    let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let on_memory = scenario(BoxStore::with_slots(memory), &clock).await;

    let url = require_redis().await;
    let redis = RedisStore::builder()
        .prefix(unique_prefix("app"))
        .deadline(Duration::from_secs(5))
        .test_clock(clock.clone())
        .connect(url.as_str())
        .await
        .unwrap();
    let on_redis = scenario(BoxStore::with_slots(redis), &clock).await;
    assert_eq!(on_memory, on_redis);
}

async fn raw_http(addr: SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    raw
}

#[tokio::test]
async fn connect_info_over_real_tcp() {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = app(&config(), BoxStore::with_slots(store));
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    let login = "POST /login HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    for remaining in ["4", "3", "2", "1", "0"] {
        let raw = raw_http(addr, login).await;
        assert!(raw.starts_with("HTTP/1.1 401"), "{raw}");
        assert!(
            raw.contains(&format!("x-ratelimit-remaining: {remaining}\r\n")),
            "{raw}"
        );
    }
    let raw = raw_http(addr, login).await;
    assert!(raw.starts_with("HTTP/1.1 429"), "{raw}");
    assert!(raw.contains("retry-after: 60\r\n"), "{raw}");
    assert!(
        raw.contains(r#""violated-policies":["login-failures"]"#),
        "{raw}"
    );
}

/// A free and a pro user on the same routes: each plan's limits, costs and
/// policy names, as the bundled file sets them.
async fn plans(store: BoxStore, clock: &FakeClock) -> Vec<(usize, Seen)> {
    clock.set(Timestamp::from_secs(T0));
    let app =
        app(&config(), store).layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 8], 5555))));
    let seen = vec![
        // Items: bursts of 10 on free, 40 on pro.
        burst(&app, "/api/items", "ada", 15).await,
        burst(&app, "/api/items", "pro-bob", 45).await,
        // Exports: 10 of 50 on free, 5 of 200 on pro.
        burst(&app, "/api/export", "ada", 7).await,
        burst(&app, "/api/export", "pro-bob", 42).await,
    ];
    let counts: Vec<usize> = seen.iter().map(|(n, _)| *n).collect();
    assert_eq!(counts, [10, 40, 5, 40]);
    let names: Vec<_> = seen
        .iter()
        .map(|(_, s)| s.get("x-ratelimit-resource").unwrap().to_owned())
        .collect();
    assert_eq!(
        names,
        ["items-read", "items-read-pro", "export", "export-pro"]
    );
    assert_eq!(seen[1].1.get("x-ratelimit-limit"), Some("40"));
    assert_eq!(seen[3].1.get("x-ratelimit-limit"), Some("200"));
    seen
}

#[tokio::test]
async fn plans_on_memory_and_the_same_on_redis() {
    let clock = FakeClock::default();
    let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let on_memory = plans(BoxStore::with_slots(memory), &clock).await;

    let url = require_redis().await;
    let redis = RedisStore::builder()
        .prefix(unique_prefix("app-plans"))
        .deadline(Duration::from_secs(5))
        .test_clock(clock.clone())
        .connect(url.as_str())
        .await
        .unwrap();
    let on_redis = plans(BoxStore::with_slots(redis), &clock).await;
    assert_eq!(on_memory, on_redis);
}
