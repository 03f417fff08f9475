//! The example app end to end: every route of the bundled policy file, on
//! the in-memory store and on Redis, and over real TCP.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum_app::{AppConfig, app};
use http::{Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::{BoxStore, FakeClock, MemoryStore, Timestamp};
use tollgate_redis::RedisStore;
use tollgate_tests::{require_redis, unique_prefix};
use tower::ServiceExt;

/// A whole minute, so windows are easy to read.
const T0: u64 = 1_700_000_040;

fn config() -> AppConfig {
    AppConfig::parse(include_str!("../../examples/axum-app/policies.toml")).unwrap()
}

/// One response, reduced to what a client sees of the limiter.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    status: u16,
    headers: Vec<(String, String)>,
}

impl Seen {
    fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

async fn send(app: &Router, method: &str, path: &str, user: Option<&str>) -> Seen {
    let mut builder = Request::builder().method(method).uri(path);
    if let Some(user) = user {
        builder = builder.header("authorization", format!("Bearer demo-{user}"));
    }
    let res: Response<Body> = app
        .clone()
        .oneshot(builder.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let mut headers: Vec<(String, String)> = res
        .headers()
        .iter()
        .filter(|(n, _)| n.as_str().starts_with("x-ratelimit") || n.as_str() == "retry-after")
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
        .collect();
    headers.sort();
    Seen {
        status: res.status().as_u16(),
        headers,
    }
}

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
        assert_eq!(s.get("x-ratelimit-used"), None, "not sent by default");
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

/// Statuses of `n` requests at one instant, and the last one's limiter
/// headers.
async fn burst(app: &Router, path: &str, token: &str, n: usize) -> (usize, Seen) {
    let mut admitted = 0;
    let mut last = None;
    for _ in 0..n {
        let seen = send(app, "GET", path, Some(token)).await;
        admitted += usize::from(seen.status == 200);
        last = Some(seen);
    }
    (admitted, last.unwrap())
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

async fn json(app: &Router, request: Request<Body>) -> (u16, serde_json::Value) {
    let res = app.clone().oneshot(request).await.unwrap();
    let status = res.status().as_u16();
    let body = axum::body::to_bytes(res.into_body(), 100_000)
        .await
        .unwrap();
    (status, serde_json::from_slice(&body).unwrap_or_default())
}

/// `GET /rate_limit` shows what the headers show, only user-keyed limits,
/// and changes nothing; an operator's reset lets a spent user in again,
/// with the admin token only.
async fn operators(store: BoxStore, clock: &FakeClock) -> Vec<serde_json::Value> {
    clock.set(Timestamp::from_secs(T0));
    let admin = axum_app::AdminToken::new("s3cret");
    let app = axum_app::app_with_admin(&config(), store, admin)
        .layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 9], 5555))));
    let (_, seen) = burst(&app, "/api/items", "ada", 3).await;
    assert_eq!(burst(&app, "/api/search", "ada", 1).await.0, 1);
    let shown = |user: &str| {
        Request::get("/rate_limit")
            .header("authorization", format!("Bearer demo-{user}"))
            .body(Body::empty())
            .unwrap()
    };
    let (status, first) = json(&app, shown("ada")).await;
    assert_eq!(status, 200);
    let items = &first["resources"]["items-read"];
    for field in ["limit", "remaining", "reset"] {
        let header = seen.get(&format!("x-ratelimit-{field}")).unwrap();
        assert_eq!(items[field].to_string(), header, "{field}");
    }
    // `used` is in the body, and limit - remaining as the headers say.
    let number = |name: &str| seen.get(name).unwrap().parse::<u64>().unwrap();
    assert_eq!(
        items["used"],
        number("x-ratelimit-limit") - number("x-ratelimit-remaining")
    );
    // Every limit of a policy with several: search's 2/s and 100/h, each
    // after the one search; the binding one (the 2/s) beside them.
    assert_eq!(
        first["resources"]["search"],
        serde_json::json!({
            "limit": 2,
            "remaining": 1,
            "used": 1,
            "reset": T0 + 1,
            "limits": [
                { "rate": "2/s", "limit": 2, "remaining": 1, "used": 1, "reset": T0 + 1 },
                { "rate": "100/h", "limit": 100, "remaining": 99, "used": 1, "reset": T0 + 3_600 },
            ],
        })
    );
    // Every user-keyed policy of the free plan, and nothing keyed by IP.
    let mut names: Vec<&String> = first["resources"].as_object().unwrap().keys().collect();
    names.sort();
    let expected = [
        "completion-tokens",
        "export",
        "items-read",
        "items-write",
        "search",
    ];
    assert_eq!(names, expected);
    // A pro user sees the pro plan's policies where a route has them.
    let (_, pro) = json(&app, shown("pro-bob")).await;
    assert_eq!(pro["resources"]["items-read-pro"]["limit"], 40);
    assert!(pro["resources"].get("items-read").is_none());
    for _ in 0..100 {
        assert_eq!(json(&app, shown("ada")).await, (200, first.clone()));
    }
    // Spent: 5 exports of 10 from a bucket of 50.
    assert_eq!(burst(&app, "/api/export", "ada", 6).await.0, 5);
    let reset = |path: &str, token: Option<&str>| {
        let mut request = Request::delete(path);
        if let Some(token) = token {
            request = request.header("authorization", token);
        }
        request.body(Body::empty()).unwrap()
    };
    let ada = "/admin/rate_limit/export/ada";
    assert_eq!(json(&app, reset(ada, None)).await.0, 401);
    assert_eq!(json(&app, reset(ada, Some("Bearer demo-ada"))).await.0, 403);
    assert_eq!(json(&app, reset(ada, Some("Bearer s3cre"))).await.0, 403);
    assert_eq!(json(&app, reset(ada, Some("s3cret"))).await.0, 401);
    let unknown = "/admin/rate_limit/api-ip/ada";
    assert_eq!(
        json(&app, reset(unknown, Some("Bearer s3cret"))).await.0,
        404
    );
    // Still spent after every refusal.
    assert_eq!(burst(&app, "/api/export", "ada", 1).await.0, 0);
    assert_eq!(json(&app, reset(ada, Some("Bearer s3cret"))).await.0, 204);
    assert_eq!(burst(&app, "/api/export", "ada", 6).await.0, 5);
    let (_, after) = json(&app, shown("ada")).await;

    // Blocked for 90 s: denied with the rest of the block as Retry-After,
    // shown spent until it ends; then a fresh bucket.
    let block = |path: &str, token: &str| {
        Request::post(path)
            .header("authorization", token)
            .body(Body::empty())
            .unwrap()
    };
    let blocking = "/admin/rate_limit/export/ada/block?seconds=90";
    assert_eq!(json(&app, block(blocking, "Bearer nope")).await.0, 403);
    assert_eq!(json(&app, block(blocking, "Bearer s3cret")).await.0, 204);
    let (admitted, denied) = burst(&app, "/api/export", "ada", 1).await;
    assert_eq!((admitted, denied.get("retry-after")), (0, Some("90")));
    clock.advance(Duration::from_secs(30));
    let (_, denied) = burst(&app, "/api/export", "ada", 1).await;
    assert_eq!(denied.get("retry-after"), Some("60"));
    let (_, blocked) = json(&app, shown("ada")).await;
    let export = &blocked["resources"]["export"];
    assert_eq!(export["remaining"], 0);
    assert_eq!(export["reset"], T0 + 90);
    clock.advance(Duration::from_secs(60));
    assert_eq!(burst(&app, "/api/export", "ada", 6).await.0, 5);
    vec![first, pro, after, blocked]
}

/// An operator's block, reset and status of a user on a route cover every
/// plan's policy of the route (its `PolicyFamily`): blocked as `export/bob`,
/// bob is blocked on the pro plan too; a plan's policy named directly is
/// that policy alone.
async fn families(store: BoxStore, clock: &FakeClock) -> Vec<serde_json::Value> {
    clock.set(Timestamp::from_secs(T0));
    let admin = axum_app::AdminToken::new("s3cret");
    let app = axum_app::app_with_admin(&config(), store, admin).layer(MockConnectInfo(
        SocketAddr::from(([198, 51, 100, 11], 5555)),
    ));
    let admin = |method: &str, path: &str| {
        Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", "Bearer s3cret")
            .body(Body::empty())
            .unwrap()
    };
    let shown = |user: &str| {
        Request::get("/rate_limit")
            .header("authorization", format!("Bearer demo-{user}"))
            .body(Body::empty())
            .unwrap()
    };
    let remaining =
        |v: &serde_json::Value, policy: &str| v["resources"][policy]["remaining"].clone();
    let mut out = Vec::new();

    // Bob spends on both plans: 1 export of 10 on free (40 of 50 left),
    // 2 of 5 on pro (190 of 200 left). (The responses' headers show the
    // per-IP limit, the tightest; the admin status shows each policy.)
    assert_eq!(burst(&app, "/api/export", "bob", 1).await.0, 1);
    assert_eq!(burst(&app, "/api/export", "pro-bob", 2).await.0, 2);
    let (status, before) = json(&app, admin("GET", "/admin/rate_limit/export/bob")).await;
    assert_eq!(status, 200);
    let names: Vec<&String> = before["resources"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["export", "export-pro"]);
    assert_eq!(remaining(&before, "export"), 40);
    assert_eq!(remaining(&before, "export-pro"), 190);
    out.push(before);

    // Reset `export/bob`: both plans' state is forgotten.
    assert_eq!(
        json(&app, admin("DELETE", "/admin/rate_limit/export/bob"))
            .await
            .0,
        204
    );
    let (_, reset) = json(&app, admin("GET", "/admin/rate_limit/export/bob")).await;
    assert_eq!(remaining(&reset, "export"), 50);
    assert_eq!(remaining(&reset, "export-pro"), 200);
    out.push(reset);

    // Block `export/bob` for 90 s: on the pro plan too, with the rest of
    // the block as Retry-After.
    let blocking = "/admin/rate_limit/export/bob/block?seconds=90";
    assert_eq!(json(&app, admin("POST", blocking)).await.0, 204);
    let (admitted, denied) = burst(&app, "/api/export", "pro-bob", 1).await;
    assert_eq!((admitted, denied.status), (0, 429));
    assert_eq!(denied.get("retry-after"), Some("90"));
    assert_eq!(denied.get("x-ratelimit-resource"), Some("export-pro"));
    let (admitted, denied) = burst(&app, "/api/export", "bob", 1).await;
    assert_eq!((admitted, denied.get("retry-after")), (0, Some("90")));
    clock.advance(Duration::from_secs(30));
    let (_, denied) = burst(&app, "/api/export", "pro-bob", 1).await;
    assert_eq!(denied.get("retry-after"), Some("60"));
    // `/rate_limit` shows a pro user the pro policy's limits, blocked.
    let (_, pro) = json(&app, shown("pro-bob")).await;
    let export = &pro["resources"]["export-pro"];
    assert_eq!(
        (&export["limit"], &export["remaining"], &export["reset"]),
        (&200.into(), &0.into(), &(T0 + 90).into())
    );
    assert_eq!(export["limits"][0]["rate"], "200/h");
    assert!(pro["resources"].get("export").is_none());
    let (_, blocked) = json(&app, admin("GET", "/admin/rate_limit/export/bob")).await;
    for policy in ["export", "export-pro"] {
        assert_eq!(remaining(&blocked, policy), 0, "{policy}");
        assert_eq!(blocked["resources"][policy]["reset"], T0 + 90, "{policy}");
    }
    out.push(pro);
    out.push(blocked);
    // A reset of the route lifts the block on every plan.
    assert_eq!(
        json(&app, admin("DELETE", "/admin/rate_limit/export/bob"))
            .await
            .0,
        204
    );
    assert_eq!(burst(&app, "/api/export", "pro-bob", 1).await.0, 1);
    let (_, after) = json(&app, admin("GET", "/admin/rate_limit/export/bob")).await;
    assert_eq!(remaining(&after, "export"), 50);
    assert_eq!(remaining(&after, "export-pro"), 195);
    assert_eq!(burst(&app, "/api/export", "bob", 6).await.0, 5);

    // A plan's policy named directly is that policy alone, as before.
    let blocking = "/admin/rate_limit/export-pro/cleo/block?seconds=60";
    assert_eq!(json(&app, admin("POST", blocking)).await.0, 204);
    let (_, denied) = burst(&app, "/api/export", "pro-cleo", 1).await;
    assert_eq!(
        (denied.status, denied.get("retry-after")),
        (429, Some("60"))
    );
    assert_eq!(burst(&app, "/api/export", "cleo", 1).await.0, 1);
    let (_, cleo) = json(&app, admin("GET", "/admin/rate_limit/export-pro/cleo")).await;
    let names: Vec<&String> = cleo["resources"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["export-pro"]);
    // Status is for operators only, and for user-keyed policies of the file.
    let unauthenticated = Request::get("/admin/rate_limit/export/bob")
        .body(Body::empty())
        .unwrap();
    assert_eq!(json(&app, unauthenticated).await.0, 401);
    assert_eq!(
        json(&app, admin("GET", "/admin/rate_limit/api-ip/bob"))
            .await
            .0,
        404
    );
    out.push(cleo);
    out
}

#[tokio::test]
async fn operators_cover_every_plan_on_memory_and_the_same_on_redis() {
    let clock = FakeClock::default();
    let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let on_memory = families(BoxStore::with_slots(memory), &clock).await;

    let url = require_redis().await;
    let redis = RedisStore::builder()
        .prefix(unique_prefix("app-family"))
        .deadline(Duration::from_secs(5))
        .test_clock(clock.clone())
        .connect(url.as_str())
        .await
        .unwrap();
    let on_redis = families(BoxStore::with_slots(redis), &clock).await;
    assert_eq!(on_memory, on_redis);
}

#[tokio::test]
async fn without_an_admin_token_the_admin_routes_do_not_exist() {
    let app = app(&config(), BoxStore::with_slots(MemoryStore::new()));
    let request = Request::delete("/admin/rate_limit/export/ada")
        .header("authorization", "Bearer anything")
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.oneshot(request).await.unwrap().status(), 404);
}

/// `POST /api/complete?tokens=N`: a reservation of 200 settled to the N
/// tokens used, the headers after settling, debt past the allowance; and
/// `/login`, where only failures count.
async fn settled(store: BoxStore, clock: &FakeClock) -> Vec<Seen> {
    clock.set(Timestamp::from_secs(T0));
    let app = app(&config(), store).layer(MockConnectInfo(SocketAddr::from((
        [198, 51, 100, 10],
        5555,
    ))));
    let mut seen = Vec::new();
    let complete = |tokens: u64| format!("/api/complete?tokens={tokens}");
    // What `GET /rate_limit` shows of a user's tokens. (The response's own
    // headers show the tightest of the route's limits, here the per-IP
    // one; the layer's tests check a settled response's headers.)
    let tokens_left = |user: &'static str, policy: &'static str| {
        let app = app.clone();
        async move {
            let request = Request::get("/rate_limit")
                .header("authorization", format!("Bearer demo-{user}"))
                .body(Body::empty())
                .unwrap();
            json(&app, request).await.1["resources"][policy]["remaining"]
                .as_u64()
                .unwrap()
        }
    };
    // 2,000 tokens a minute. Used 150 of the 200 reserved: 1,850 left.
    let s = send(&app, "POST", &complete(150), Some("cleo")).await;
    assert_eq!(s.status, 200);
    assert_eq!(tokens_left("cleo", "completion-tokens").await, 1_850);
    seen.push(s);
    // Used 1,900: 50 in debt. At 2,000 a minute (one per 30 ms), the next
    // reservation of 200 waits for 250 tokens: 7.5 s.
    let s = send(&app, "POST", &complete(1_900), Some("cleo")).await;
    assert_eq!(s.status, 200);
    assert_eq!(tokens_left("cleo", "completion-tokens").await, 0);
    seen.push(s);
    let s = send(&app, "POST", &complete(10), Some("cleo")).await;
    assert_eq!((s.status, s.get("retry-after")), (429, Some("8")));
    assert_eq!(s.get("x-ratelimit-resource"), Some("completion-tokens"));
    seen.push(s);
    clock.advance(Duration::from_millis(7_500));
    let s = send(&app, "POST", &complete(10), Some("cleo")).await;
    assert_eq!(s.status, 200);
    assert_eq!(tokens_left("cleo", "completion-tokens").await, 190);
    seen.push(s);
    // The pro plan: 20,000 a minute, reserving 1,000.
    let s = send(&app, "POST", &complete(300), Some("pro-cleo")).await;
    assert_eq!(s.status, 200);
    assert_eq!(
        tokens_left("pro-cleo", "completion-tokens-pro").await,
        19_700
    );
    seen.push(s);

    // Only `POST /login` is a login: six `GET /login` are answered 405,
    // limited by nothing and counted nowhere, and the right password then
    // logs in with the whole allowance left.
    for _ in 0..6 {
        let s = send(&app, "GET", "/login", None).await;
        assert_eq!((s.status, s.headers.len()), (405, 0));
        seen.push(s);
    }
    // Logins: successes are refunded, so any number pass; 5 failures lock
    // the client out, right password or not.
    let login = |password: &str| {
        Request::post("/login")
            .header("content-type", "application/json")
            .body(Body::from(format!(r#"{{"password": "{password}"}}"#)))
            .unwrap()
    };
    for _ in 0..8 {
        let res = app.clone().oneshot(login("demo")).await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.headers()["x-ratelimit-remaining"], "5");
    }
    for remaining in ["4", "3", "2", "1", "0"] {
        let res = app.clone().oneshot(login("hunter2")).await.unwrap();
        assert_eq!(res.status(), 401);
        assert_eq!(res.headers()["x-ratelimit-remaining"], remaining);
    }
    let res = app.clone().oneshot(login("demo")).await.unwrap();
    assert_eq!(res.status(), 429);
    seen
}

#[tokio::test]
async fn costs_settled_after_the_response_on_memory_and_the_same_on_redis() {
    let clock = FakeClock::default();
    let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let on_memory = settled(BoxStore::with_slots(memory), &clock).await;

    let url = require_redis().await;
    let redis = RedisStore::builder()
        .prefix(unique_prefix("app-settle"))
        .deadline(Duration::from_secs(5))
        .test_clock(clock.clone())
        .connect(url.as_str())
        .await
        .unwrap();
    let on_redis = settled(BoxStore::with_slots(redis), &clock).await;
    assert_eq!(on_memory, on_redis);
}

#[tokio::test]
async fn rate_limit_and_operator_reset_on_memory_and_the_same_on_redis() {
    let clock = FakeClock::default();
    let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let on_memory = operators(BoxStore::with_slots(memory), &clock).await;

    let url = require_redis().await;
    let redis = RedisStore::builder()
        .prefix(unique_prefix("app-ops"))
        .deadline(Duration::from_secs(5))
        .test_clock(clock.clone())
        .connect(url.as_str())
        .await
        .unwrap();
    let on_redis = operators(BoxStore::with_slots(redis), &clock).await;
    assert_eq!(on_memory, on_redis);
}
