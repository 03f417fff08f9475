//! Key extraction through the layer: spoofing, proxies, IPv6 grouping,
//! composite keys.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::net::{IpAddr, SocketAddr};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::{any, get};
use http::{Request, StatusCode};
use tollgate::{
    Algorithm, ClientIp, ExtensionKey, FakeClock, HeaderKey, Key, KeyExtractor, MemoryStore,
    PeerIp, Policy, RateLimitLayer, RouteKey,
};
use tower::ServiceExt;

fn store() -> MemoryStore {
    MemoryStore::builder()
        .clock(FakeClock::default())
        .build()
        .unwrap()
}

fn from(peer: &str, xff: Option<&str>) -> Request<Body> {
    let mut builder = Request::get("/");
    if let Some(xff) = xff {
        builder = builder.header("x-forwarded-for", xff);
    }
    let mut req = builder.body(Body::empty()).unwrap();
    let ip: IpAddr = peer.parse().unwrap();
    req.extensions_mut()
        .insert(ConnectInfo(SocketAddr::new(ip, 40_000)));
    req
}

async fn allowed(app: &Router, requests: impl IntoIterator<Item = Request<Body>>) -> usize {
    let mut n = 0;
    for req in requests {
        n += usize::from(app.clone().oneshot(req).await.unwrap().status() == StatusCode::OK);
    }
    n
}

fn app(extractor: ClientIp, limit: &str) -> Router {
    let policy = Policy::new("ip", Algorithm::FixedWindow, limit).unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(policy, extractor).store(store()))
}

#[tokio::test]
async fn an_untrusted_peer_cannot_spoof_its_bucket() {
    let app = app(
        ClientIp::new().trusted_proxies(["10.0.0.0/8"]).unwrap(),
        "5/min",
    );
    let spoofed = (0..1_000).map(|i| {
        from(
            "203.0.113.9",
            Some(&format!("198.51.{}.{}", i / 256, i % 256)),
        )
    });
    assert_eq!(
        allowed(&app, spoofed).await,
        5,
        "1,000 forged headers share one bucket"
    );
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_rightmost_untrusted_hop_is_the_key() {
    let app = app(
        ClientIp::new().trusted_proxies(["10.0.0.0/8"]).unwrap(),
        "2/min",
    );
    // The client forges the left end; the proxy appends the real client.
    let requests = (0..10).map(|i| from("10.0.0.1", Some(&format!("6.6.6.{i}, 198.51.100.7"))));
    assert_eq!(
        allowed(&app, requests).await,
        2,
        "all counted against 198.51.100.7"
    );
    // Another real client behind the same proxy has its own bucket.
    assert_eq!(
        allowed(&app, [from("10.0.0.1", Some("198.51.100.8"))]).await,
        1
    );
    // Two trusted hops are skipped.
    let requests = (0..3).map(|_| from("10.0.0.1", Some("198.51.100.9, 10.2.2.2, 10.3.3.3")));
    assert_eq!(allowed(&app, requests).await, 2);
}

#[tokio::test]
async fn garbage_is_a_400_and_padding_never_moves_a_client_into_the_proxys_bucket() {
    let app = app(
        ClientIp::new().trusted_proxies(["10.0.0.0/8"]).unwrap(),
        "1000/min",
    );
    for g in ["", ",,,", "unknown", "999.999.1.1", "[::1"] {
        let res = app
            .clone()
            .oneshot(from("10.0.0.1", Some(g)))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{g:?}");
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains("X-Forwarded-For"), "{body}");
    }
    // A giant header is read from the right: its last entry is the client.
    let giant = vec!["1.2.3.4"; 10_000].join(", ");
    let res = app
        .clone()
        .oneshot(from("10.0.0.1", Some(&giant)))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-ratelimit-remaining"], "999");
    // Bytes that are not UTF-8, left of the client, are never read.
    let mut req = from("10.0.0.1", None);
    req.headers_mut().insert(
        "x-forwarded-for",
        http::HeaderValue::from_bytes(b"\xff\xfe, 1.2.3.4").unwrap(),
    );
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-ratelimit-remaining"], "998");
    // None of them was counted against the proxy itself.
    let res = app.clone().oneshot(from("10.0.0.1", None)).await.unwrap();
    assert_eq!(res.headers()["x-ratelimit-remaining"], "999");
}

#[tokio::test]
async fn a_spent_client_that_pads_x_forwarded_for_stays_limited() {
    let app = app(
        ClientIp::new().trusted_proxies(["10.0.0.0/8"]).unwrap(),
        "5/min",
    );
    let plain = (0..5).map(|_| from("10.0.0.1", Some("203.0.113.7")));
    assert_eq!(allowed(&app, plain).await, 5);
    // 9 KB, then 90 KB, of padding before the address the proxy appended.
    for repeat in [1_200, 12_000] {
        let padded = format!("{}203.0.113.7", "1.1.1.1,".repeat(repeat));
        let res = app
            .clone()
            .oneshot(from("10.0.0.1", Some(&padded)))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{repeat}");
    }
}

#[tokio::test]
async fn ipv6_is_grouped_by_56_and_mapped_ipv4_is_ipv4() {
    let policy = Policy::new("v6", Algorithm::FixedWindow, "3/min").unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(policy, PeerIp::new()).store(store()));
    // 1,000 addresses in one /64 share a bucket.
    let one_64 = (0..1_000u32).map(|i| {
        from(
            &format!("2001:db8:1:2:{:x}:{:x}::1", i >> 8, i & 0xff),
            None,
        )
    });
    assert_eq!(allowed(&app, one_64).await, 3);
    // Another /56 does not.
    assert_eq!(allowed(&app, [from("2001:db8:1:300::1", None)]).await, 1);
    // ::ffff:1.2.3.4 is 1.2.3.4, and no other IPv4 client.
    assert_eq!(
        allowed(&app, [from("1.2.3.4", None), from("::ffff:1.2.3.4", None)]).await,
        2
    );
    assert_eq!(
        allowed(&app, [from("::ffff:1.2.3.4", None), from("1.2.3.4", None)]).await,
        1
    );
    assert_eq!(allowed(&app, [from("1.2.3.5", None)]).await, 1);
}

#[tokio::test]
async fn route_and_user_compose_without_collisions() {
    let policy = Policy::new("route-user", Algorithm::FixedWindow, "1/min").unwrap();
    let app = Router::new()
        .route("/a/{id}", get(|| async { "a" }))
        .route("/b/{id}", get(|| async { "b" }))
        .route_layer(
            RateLimitLayer::new(policy, (RouteKey, ExtensionKey::<String>::new())).store(store()),
        );
    let req = |path: &str, user: &str| {
        let mut r = Request::get(path).body(Body::empty()).unwrap();
        r.extensions_mut().insert(user.to_owned());
        r
    };
    let statuses = {
        let mut v = Vec::new();
        for (path, user) in [
            ("/a/1", "ada"),
            ("/a/2", "ada"),
            ("/b/1", "ada"),
            ("/a/1", "bob"),
        ] {
            v.push(
                app.clone()
                    .oneshot(req(path, user))
                    .await
                    .unwrap()
                    .status()
                    .as_u16(),
            );
        }
        v
    };
    // /a/{id} is one route whatever the id; /b/{id} and bob have their own buckets.
    assert_eq!(statuses, [200, 429, 200, 200]);
}

/// A client cannot mint route keys with methods: `HEAD`, which axum
/// answers with the `GET` handler, counts against `GET`'s limit, and
/// invented methods share one key (each had a key of its own).
#[tokio::test]
async fn route_keys_cannot_be_minted_with_methods() {
    let policy = Policy::new("per-route", Algorithm::FixedWindow, "1/h").unwrap();
    let layer = || RateLimitLayer::new(policy.clone(), RouteKey).store(store());
    let app = Router::new()
        .route("/items", get(|| async { "items" }))
        .route_layer(layer());
    let req = |method: &str| {
        Request::builder()
            .method(method)
            .uri("/items")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(allowed(&app, [req("GET"), req("HEAD")]).await, 1);
    assert_eq!(allowed(&app, [req("HEAD")]).await, 0);

    let app = Router::new()
        .route("/any", any(|| async { "any" }))
        .route_layer(layer());
    let req = |method: &str| {
        Request::builder()
            .method(method)
            .uri("/any")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(
        allowed(&app, [req("FOO1"), req("FOO2"), req("BAR")]).await,
        1
    );
    // The standard methods keep a key each.
    assert_eq!(
        allowed(&app, [req("POST"), req("PUT"), req("POST")]).await,
        2
    );
}

/// A header value of 100 KiB is keyed by its 32-byte digest, not kept
/// whole by every table keyed by it; each long value still has a bucket
/// of its own: exactly 2 of 5 requests admitted for each of two values
/// that differ in their last byte.
#[tokio::test]
async fn a_long_header_is_keyed_by_its_digest_and_keeps_its_own_bucket() {
    let name = http::HeaderName::from_static("x-api-key");
    let values = ["a", "b"].map(|last| format!("{}{last}", "k".repeat(100 * 1024)));
    let request = |value: &str| {
        Request::get("/")
            .header(&name, value)
            .body(Body::empty())
            .unwrap()
    };
    let key = HeaderKey::new(name.clone()).extract(&request(&values[0]));
    assert_eq!(key.as_ref().map(|k| k.as_bytes().len()), Some(32));
    assert_eq!(key, Some(Key::header(&values[0])));
    let policy = Policy::new("keys", Algorithm::FixedWindow, "2/min").unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(policy, HeaderKey::new(name.clone())).store(store()));
    for value in &values {
        assert_eq!(allowed(&app, (0..5).map(|_| request(value))).await, 2);
    }
}
