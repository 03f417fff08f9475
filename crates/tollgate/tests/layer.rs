//! The layer through `oneshot`, without TCP.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::connect_info::MockConnectInfo;
use axum::middleware::{self, Next};
use axum::routing::get;
use http::{HeaderName, Request, Response, StatusCode};
use tollgate::{
    Algorithm, ExtensionKey, FailureMode, FakeClock, GlobalKey, HeaderKey, HeaderStyle, Key,
    KeyExtractor, MemoryStore, MissingCause, MissingKey, PeerIp, Policy, RateLimitLayer, Timestamp,
    TokioClock,
};
use tower::{Service, ServiceExt, service_fn};

/// 10:00:40 UTC on 2023-11-14; a whole minute.
const T0: u64 = 1_700_000_040;

fn clock_and_store() -> (FakeClock, MemoryStore) {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    (clock, store)
}

fn app(layer: RateLimitLayer<GlobalKey, MemoryStore>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

fn get_root() -> Request<Body> {
    Request::get("/").body(Body::empty()).unwrap()
}

fn header<'a>(res: &'a Response<impl Sized>, name: &str) -> Option<&'a str> {
    res.headers().get(name).map(|v| v.to_str().unwrap())
}

async fn body_json(
    res: Response<impl http_body::Body<Error = impl std::fmt::Debug>>,
) -> serde_json::Value {
    let bytes = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn exact_headers_on_200_and_429() {
    let (clock, store) = clock_and_store();
    clock.advance(Duration::from_millis(12_500)); // 12.5 s into the minute
    let policy = Policy::new("core", Algorithm::FixedWindow, "3/min").unwrap();
    let app = app(RateLimitLayer::new(policy, GlobalKey).store(store));

    for remaining in ["2", "1", "0"] {
        let res = app.clone().oneshot(get_root()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, "x-ratelimit-limit"), Some("3"));
        assert_eq!(header(&res, "x-ratelimit-remaining"), Some(remaining));
        // `used` is limit - remaining: only `HeaderStyle::GitHubFull` sends it.
        assert_eq!(header(&res, "x-ratelimit-used"), None);
        assert_eq!(header(&res, "x-ratelimit-reset"), Some("1700000100"));
        assert_eq!(header(&res, "x-ratelimit-resource"), Some("core"));
        assert_eq!(header(&res, "retry-after"), None);
    }

    let res = app.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "x-ratelimit-limit"), Some("3"));
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(header(&res, "x-ratelimit-used"), None);
    assert_eq!(header(&res, "x-ratelimit-reset"), Some("1700000100"));
    assert_eq!(header(&res, "x-ratelimit-resource"), Some("core"));
    // 47.5 s left, rounded up.
    assert_eq!(header(&res, "retry-after"), Some("48"));
    assert_eq!(
        header(&res, "content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        body_json(res).await,
        serde_json::json!({
            "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
            "title": "Too Many Requests",
            "status": 429,
            "detail": "limit 'core' exceeded, retry in 48 s",
            "violated-policies": ["core"],
        })
    );
}

#[tokio::test]
async fn github_full_adds_used_on_200_and_429() {
    let (clock, store) = clock_and_store();
    clock.advance(Duration::from_millis(12_500));
    let policy = Policy::new("core", Algorithm::FixedWindow, "3/min").unwrap();
    let layer = RateLimitLayer::new(policy, GlobalKey)
        .store(store)
        .headers(HeaderStyle::GitHubFull);
    let app = app(layer);
    for (remaining, used) in [("2", "1"), ("1", "2"), ("0", "3")] {
        let res = app.clone().oneshot(get_root()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, "x-ratelimit-remaining"), Some(remaining));
        assert_eq!(header(&res, "x-ratelimit-used"), Some(used));
        assert_eq!(header(&res, "x-ratelimit-resource"), Some("core"));
    }
    let res = app.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "x-ratelimit-used"), Some("3"));
    assert_eq!(header(&res, "x-ratelimit-limit"), Some("3"));
}

#[tokio::test]
async fn retry_after_rounds_up_and_is_at_least_one() {
    let (clock, store) = clock_and_store();
    // GCRA 2 per 3 s: one unit every 1.5 s.
    let policy = Policy::new("g", Algorithm::Gcra, "2/3s").unwrap();
    let app = app(RateLimitLayer::new(policy, GlobalKey).store(store));
    for _ in 0..2 {
        assert_eq!(
            app.clone().oneshot(get_root()).await.unwrap().status(),
            StatusCode::OK
        );
    }
    let res = app.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(
        header(&res, "retry-after"),
        Some("2"),
        "1.5 s rounds up to 2"
    );
    // The reset is 3 s away: epoch seconds rounded up.
    assert_eq!(header(&res, "x-ratelimit-reset"), Some("1700000043"));

    clock.advance(Duration::from_millis(1_499));
    let res = app.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&res, "retry-after"),
        Some("1"),
        "1 ms rounds up to 1 s"
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        app.oneshot(get_root()).await.unwrap().status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn clones_and_separate_layer_calls_share_one_limit() {
    let (_, store) = clock_and_store();
    let policy = Policy::new("shared", Algorithm::SlidingLog, "5/min").unwrap();
    let layer = RateLimitLayer::new(policy, GlobalKey).store(store);
    let inner =
        service_fn(|_: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) });
    let a = tower::Layer::layer(&layer, inner);
    let b = tower::Layer::layer(&layer, inner);
    let mut services = [a.clone(), a, b.clone(), b];
    let mut allowed = 0;
    for i in 0..20 {
        let svc = &mut services[i % 4];
        let res = svc.ready().await.unwrap().call(get_root()).await.unwrap();
        allowed += usize::from(res.status() == StatusCode::OK);
    }
    assert_eq!(allowed, 5);
}

#[tokio::test]
async fn a_request_without_a_key_is_answered_by_whose_mistake_it_is() {
    let (_, store) = clock_and_store();
    let policy = Policy::new("users", Algorithm::Gcra, "5/min").unwrap();
    let answer = |extractor| {
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(RateLimitLayer::new(policy.clone(), extractor).store(store.clone()))
    };
    // No authenticated user: 401.
    let res = answer(AnyKey::User(ExtensionKey::new()))
        .oneshot(get_root())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(header(&res, "x-ratelimit-limit"), None);
    assert_eq!(body_json(res).await["detail"], "authentication required");
    // No API key header: 400, naming the header.
    let res = answer(AnyKey::Header(HeaderKey::new(HeaderName::from_static(
        "x-api-key",
    ))))
    .oneshot(get_root())
    .await
    .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        header(&res, "content-type"),
        Some("application/problem+json")
    );
    assert_eq!(body_json(res).await["detail"], "send the x-api-key header");
    // No connect info for a peer-IP key: the server's wiring, 500.
    let res = answer(AnyKey::Peer(PeerIp::new()))
        .oneshot(get_root())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        body_json(res).await["detail"],
        "no rate-limit key for this request"
    );
    assert_eq!(store.len(), 0, "no shared fallback bucket was used");

    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(policy.clone(), ExtensionKey::<String>::new())
            .store(store.clone())
            .on_missing_key(MissingKey::Error),
    );
    assert_eq!(
        app.oneshot(get_root()).await.unwrap().status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );

    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(policy.clone(), ExtensionKey::<String>::new())
            .store(store.clone())
            .on_missing_key(MissingKey::Reject(StatusCode::FORBIDDEN)),
    );
    assert_eq!(
        app.oneshot(get_root()).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );

    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(policy, ExtensionKey::<String>::new())
            .store(store.clone())
            .on_missing_key(MissingKey::Allow),
    );
    for _ in 0..10 {
        let res = app.clone().oneshot(get_root()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, "x-ratelimit-limit"), None);
    }
    assert_eq!(store.len(), 0);
}

/// One extractor type for the cases of the missing-key test.
enum AnyKey {
    User(ExtensionKey<String>),
    Header(HeaderKey),
    Peer(PeerIp),
}

impl<B> KeyExtractor<B> for AnyKey {
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        match self {
            AnyKey::User(e) => e.extract(request),
            AnyKey::Header(e) => e.extract(request),
            AnyKey::Peer(e) => e.extract(request),
        }
    }

    fn missing(&self, request: &Request<B>) -> MissingCause {
        match self {
            AnyKey::User(e) => e.missing(request),
            AnyKey::Header(e) => e.missing(request),
            AnyKey::Peer(e) => e.missing(request),
        }
    }
}

#[tokio::test]
async fn a_custom_rejection_keeps_the_headers() {
    let (_, store) = clock_and_store();
    let policy = Policy::new("custom", Algorithm::TokenBucket, "1/s").unwrap();
    let layer = RateLimitLayer::new(policy, GlobalKey)
        .store(store)
        .rejection(|d| {
            Response::builder()
                .status(StatusCode::SERVICE_UNAVAILABLE)
                .body(format!("slow down, {} left", d.remaining()).into())
                .unwrap()
        });
    let app = app(layer);
    app.clone().oneshot(get_root()).await.unwrap();
    let res = app.oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&res, "retry-after"), Some("1"));
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("0"));
    let body = to_bytes(Body::new(res.into_body()), 1024).await.unwrap();
    assert_eq!(&body[..], b"slow down, 0 left");
}

#[tokio::test]
async fn forbidden_mode_and_no_headers_mode() {
    let (_, store) = clock_and_store();
    let policy = Policy::new("gh", Algorithm::FixedWindow, "1/min").unwrap();
    let app403 = app(RateLimitLayer::new(policy.clone(), GlobalKey)
        .store(store.clone())
        .rejection_status(StatusCode::FORBIDDEN));
    app403.clone().oneshot(get_root()).await.unwrap();
    let res = app403.oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("0"));
    let body = body_json(res).await;
    assert_eq!(
        (body["status"].as_u64(), body["title"].as_str()),
        (Some(403), Some("Forbidden"))
    );

    let quiet_policy = Policy::new("quiet", Algorithm::FixedWindow, "1/min").unwrap();
    let quiet = app(RateLimitLayer::new(quiet_policy, GlobalKey)
        .store(store)
        .headers(HeaderStyle::None));
    let ok = quiet.clone().oneshot(get_root()).await.unwrap();
    assert!(
        ok.headers()
            .keys()
            .all(|k| !k.as_str().starts_with("x-ratelimit"))
    );
    let res = quiet.oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        res.headers()
            .keys()
            .all(|k| !k.as_str().starts_with("x-ratelimit"))
    );
    assert_eq!(header(&res, "retry-after"), Some("60"));
}

#[tokio::test]
async fn a_cost_above_capacity_is_rejected_without_retry_after() {
    let (_, store) = clock_and_store();
    let policy = Policy::new("export", Algorithm::TokenBucket, "5/min").unwrap();
    let app = app(RateLimitLayer::new(policy, GlobalKey).store(store).cost(10));
    let res = app.oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), None);
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("5"));
    assert_eq!(
        body_json(res).await["detail"],
        "request cost 10 exceeds the capacity 5 of limit 'export'; it can never be admitted"
    );
}

#[tokio::test]
async fn store_failures_follow_the_failure_mode() {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    // One key fits; a second key finds the store full.
    let store = MemoryStore::builder()
        .max_keys(1)
        .clock(clock)
        .build()
        .unwrap();
    let policy = Policy::new("full", Algorithm::FixedWindow, "5/min").unwrap();
    let by_header = HeaderKey::new(http::HeaderName::from_static("x-client"));
    let request = |client: &str| {
        Request::get("/")
            .header("x-client", client)
            .body(Body::empty())
            .unwrap()
    };
    let open = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(policy.clone(), by_header.clone())
            .store(store.clone())
            .on_store_error(FailureMode::Open),
    );
    assert_eq!(
        header(
            &open.clone().oneshot(request("a")).await.unwrap(),
            "x-ratelimit-remaining"
        ),
        Some("4")
    );
    let res = open.oneshot(request("b")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-ratelimit-remaining"), None);

    let closed = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(policy.clone(), by_header.clone())
            .store(store.clone())
            .on_store_error(FailureMode::Closed),
    );
    let res = closed.oneshot(request("b")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&res, "retry-after"), Some("1"));

    // Closed, as a gRPC server: UNAVAILABLE, to be retried in a second.
    let grpc = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(policy, by_header)
            .store(store)
            .on_store_error(FailureMode::Closed)
            .grpc(),
    );
    let res = grpc.oneshot(request("b")).await.unwrap();
    assert_eq!(header(&res, "grpc-status"), Some("14"));
    assert_eq!(header(&res, "retry-after"), Some("1"));
    assert_eq!(header(&res, "grpc-retry-pushback-ms"), Some("1000"));

    // Local: the same policy goes on in memory.
    let fallback = MemoryStore::builder()
        .clock(FakeClock::new(Timestamp::from_secs(T0)))
        .build()
        .unwrap();
    let policy = Policy::new("full", Algorithm::FixedWindow, "5/min").unwrap();
    let local = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(
            policy,
            HeaderKey::new(http::HeaderName::from_static("x-client")),
        )
        .store(MemoryStore::builder().max_keys(1).build().unwrap())
        .on_store_error(FailureMode::Local)
        .local_fallback(fallback.clone()),
    );
    local.clone().oneshot(request("a")).await.unwrap();
    let statuses: Vec<u16> = {
        let mut v = Vec::new();
        for _ in 0..6 {
            v.push(
                local
                    .clone()
                    .oneshot(request("b"))
                    .await
                    .unwrap()
                    .status()
                    .as_u16(),
            );
        }
        v
    };
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    assert_eq!(fallback.len(), 1, "b lives in the fallback store");
}

#[tokio::test]
async fn users_from_an_auth_layer_and_peers_by_ip() {
    #[derive(Clone)]
    struct UserId(String);
    impl tollgate::ToKey for UserId {
        fn to_key(&self) -> Key {
            Key::user(&self.0)
        }
    }
    async fn auth(mut req: Request<Body>, next: Next) -> Response<Body> {
        if let Some(user) = req
            .headers()
            .get("x-demo-user")
            .and_then(|v| v.to_str().ok())
        {
            let user = UserId(user.to_owned());
            req.extensions_mut().insert(user);
        }
        next.run(req).await
    }
    let (_, store) = clock_and_store();
    let per_user = Policy::new("per-user", Algorithm::FixedWindow, "2/min").unwrap();
    let per_ip = Policy::new("per-ip", Algorithm::FixedWindow, "3/min").unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(per_user, ExtensionKey::<UserId>::new()).store(store.clone()))
        .layer(middleware::from_fn(auth))
        .layer(RateLimitLayer::new(per_ip, PeerIp::new()).store(store))
        .layer(MockConnectInfo(SocketAddr::from(([203, 0, 113, 9], 5000))));
    let as_user = |user: &str| {
        Request::get("/")
            .header("x-demo-user", user)
            .body(Body::empty())
            .unwrap()
    };
    let statuses: Vec<u16> = {
        let mut v = Vec::new();
        for user in ["ada", "ada", "ada", "bob"] {
            v.push(
                app.clone()
                    .oneshot(as_user(user))
                    .await
                    .unwrap()
                    .status()
                    .as_u16(),
            );
        }
        v
    };
    // ada's third request is over her own limit; bob's is the IP's fourth.
    assert_eq!(statuses, [200, 200, 429, 429]);
    let res = app.oneshot(as_user("bob")).await.unwrap();
    assert_eq!(header(&res, "x-ratelimit-resource"), Some("per-ip"));
}

#[tokio::test]
async fn stacked_layers_report_the_one_with_fewest_requests_left() {
    let (_, store) = clock_and_store();
    let layer = |name: &str, limit: &str| {
        let policy = Policy::new(name, Algorithm::FixedWindow, limit).unwrap();
        RateLimitLayer::new(policy, GlobalKey)
            .store(store.clone())
            .headers(HeaderStyle::GitHubFull)
    };
    // The nearer layer (inner) writes first; the outer one replaces its
    // headers only when it has fewer requests left.
    let stacked = |inner, outer| {
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(inner)
            .layer(outer)
    };
    let headers = |res: &Response<Body>| {
        [
            "x-ratelimit-resource",
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-used",
        ]
        .map(|name| header(res, name).unwrap().to_owned())
    };
    // Outer tighter: 3/min leaves 2, the inner 5/min leaves 4.
    let app = stacked(layer("user-5", "5/min"), layer("ip-3", "3/min"));
    let res = app.oneshot(get_root()).await.unwrap();
    assert_eq!(headers(&res), ["ip-3", "3", "2", "1"]);
    assert_eq!(
        res.headers()
            .get_all("x-ratelimit-remaining")
            .iter()
            .count(),
        1
    );
    // Inner tighter: 2/min leaves 1, the outer 10/min leaves 9.
    let app = stacked(layer("user-2", "2/min"), layer("ip-10", "10/min"));
    let res = app.oneshot(get_root()).await.unwrap();
    assert_eq!(headers(&res), ["user-2", "2", "1", "1"]);
    // A tie keeps the nearer layer's.
    let app = stacked(layer("user-4", "4/min"), layer("ip-4", "4/min"));
    let res = app.oneshot(get_root()).await.unwrap();
    assert_eq!(headers(&res), ["user-4", "4", "3", "1"]);
}

#[tokio::test]
async fn keeping_the_body_type_changes_no_response() {
    // Each response as a client sees it: status, headers and body.
    async fn responses(app: Router) -> Vec<(u16, Vec<(String, String)>, Vec<u8>)> {
        let mut out = Vec::new();
        for _ in 0..4 {
            let res = app.clone().oneshot(get_root()).await.unwrap();
            let headers = res
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
                .collect();
            let status = res.status().as_u16();
            let body = to_bytes(res.into_body(), usize::MAX).await.unwrap();
            out.push((status, headers, body.to_vec()));
        }
        out
    }
    let layer = || {
        let (_, store) = clock_and_store();
        let policy = Policy::new("core", Algorithm::FixedWindow, "3/min").unwrap();
        RateLimitLayer::new(policy, GlobalKey).store(store)
    };
    let route = || Router::new().route("/", get(|| async { "ok" }));
    let wrapped = responses(route().layer(layer())).await;
    let kept = responses(route().layer(layer().keep_body_type())).await;
    assert_eq!(kept, wrapped);
    let statuses: Vec<u16> = kept.iter().map(|(status, _, _)| *status).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    assert_eq!(kept[0].2, b"ok");
    let rejection: serde_json::Value = serde_json::from_slice(&kept[3].2).unwrap();
    assert_eq!(rejection["violated-policies"][0], "core");
}

#[tokio::test]
async fn works_with_any_body_type_outside_axum() {
    let (_, store) = clock_and_store();
    let policy = Policy::new("plain", Algorithm::SlidingWindow, "1/min").unwrap();
    let svc = tower::ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(policy, |_: &Request<String>| Some(Key::custom("k"))).store(store),
        )
        .service(service_fn(|req: Request<String>| async move {
            Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                bytes::Bytes::from(req.into_body()),
            )))
        }));
    let res = svc
        .clone()
        .oneshot(Request::new("hi".to_owned()))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(&body[..], b"hi");
    let res = svc.oneshot(Request::new("again".to_owned())).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(start_paused = true)]
async fn a_leaky_bucket_holds_requests_for_their_delay() {
    let clock = TokioClock::starting_at(Timestamp::from_secs(T0));
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    let policy = Policy::new("shape", Algorithm::LeakyBucket, "4/s").unwrap();
    let app = app(RateLimitLayer::new(policy, GlobalKey).store(store));
    let start = tokio::time::Instant::now();
    let handles: Vec<_> = (0..5)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let res = app.oneshot(get_root()).await.unwrap();
                (res.status(), start.elapsed())
            })
        })
        .collect();
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await.unwrap());
    }
    results.sort_by_key(|r| (r.1, r.0.as_u16()));
    let ms = |n| Duration::from_millis(n);
    assert_eq!(
        results,
        vec![
            (StatusCode::OK, ms(0)),
            (StatusCode::TOO_MANY_REQUESTS, ms(0)),
            (StatusCode::OK, ms(250)),
            (StatusCode::OK, ms(500)),
            (StatusCode::OK, ms(750)),
        ]
    );
}

#[tokio::test]
async fn ietf_draft_headers_list_every_limit() {
    let (clock, store) = clock_and_store();
    clock.advance(Duration::from_millis(500));
    let policy = Policy::builder("search")
        .algorithm(Algorithm::FixedWindow)
        .limit("2/5s")
        .limit("300/min")
        .build()
        .unwrap();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(policy, GlobalKey)
            .store(store)
            .headers(HeaderStyle::Both),
    );
    let res = app.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some(r#""search-0";q=2;w=5, "search-1";q=300;w=60"#)
    );
    assert_eq!(
        header(&res, "ratelimit"),
        Some(r#""search-0";r=1;t=0, "search-1";r=299;t=0"#)
    );
    assert_eq!(
        header(&res, "x-ratelimit-remaining"),
        Some("1"),
        "GitHub headers report the binding limit"
    );
    app.clone().oneshot(get_root()).await.unwrap();
    let res = app.oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // 4.5 s until the 5 s window ends: t = 5, as is Retry-After.
    assert_eq!(
        header(&res, "ratelimit"),
        Some(r#""search-0";r=0;t=5, "search-1";r=298;t=0"#)
    );
    assert_eq!(header(&res, "retry-after"), Some("5"));

    let (_, store) = clock_and_store();
    let single = Policy::new("one", Algorithm::Gcra, "10/s").unwrap();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(single, GlobalKey)
            .store(store)
            .headers(HeaderStyle::Ietf),
    );
    let res = app.oneshot(get_root()).await.unwrap();
    assert_eq!(header(&res, "ratelimit-policy"), Some(r#""one";q=10;w=1"#));
    assert_eq!(header(&res, "ratelimit"), Some(r#""one";r=9;t=0"#));
    assert_eq!(header(&res, "x-ratelimit-limit"), None);
}

#[tokio::test]
async fn grpc_rejections_are_resource_exhausted_with_metadata() {
    let (_, store) = clock_and_store();
    let policy = Policy::new("greeter", Algorithm::FixedWindow, "1/min").unwrap();
    let app = app(RateLimitLayer::new(policy, GlobalKey).store(store).grpc());
    assert_eq!(
        app.clone().oneshot(get_root()).await.unwrap().status(),
        StatusCode::OK
    );
    let res = app.oneshot(get_root()).await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "gRPC errors travel in grpc-status"
    );
    assert_eq!(header(&res, "content-type"), Some("application/grpc"));
    assert_eq!(header(&res, "grpc-status"), Some("8"));
    assert_eq!(
        header(&res, "grpc-message"),
        Some("limit 'greeter' exceeded, retry in 60 s")
    );
    assert_eq!(header(&res, "retry-after"), Some("60"));
    assert_eq!(header(&res, "grpc-retry-pushback-ms"), Some("60000"));
    assert!(header(&res, "grpc-status-details-bin").is_some());
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("0"));
}

#[tokio::test]
async fn a_grpc_request_that_can_never_fit_is_told_not_to_retry() {
    let (_, store) = clock_and_store();
    let policy = Policy::new("greeter", Algorithm::FixedWindow, "5/min").unwrap();
    let app = app(RateLimitLayer::new(policy, GlobalKey)
        .store(store)
        .cost(6)
        .grpc());
    let res = app.oneshot(get_root()).await.unwrap();
    assert_eq!(header(&res, "grpc-status"), Some("8"));
    // gRFC A6: a negative pushback means do not retry.
    assert_eq!(header(&res, "grpc-retry-pushback-ms"), Some("-1"));
    assert_eq!(header(&res, "grpc-status-details-bin"), None);
}

async fn six_at_once(max_wait: Duration) -> Vec<(u128, u16)> {
    let clock = TokioClock::starting_at(Timestamp::from_secs(T0));
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    let policy = Policy::new("outbound", Algorithm::SlidingLog, "2/s").unwrap();
    let app = app(RateLimitLayer::new(policy, GlobalKey)
        .store(store)
        .wait(max_wait));
    let start = tokio::time::Instant::now();
    let handles: Vec<_> = (0..6)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let res = app.oneshot(get_root()).await.unwrap();
                (start.elapsed().as_millis(), res.status().as_u16())
            })
        })
        .collect();
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await.unwrap());
    }
    results.sort_unstable();
    results
}

#[tokio::test(start_paused = true)]
async fn waiting_mode_holds_requests_until_admitted() {
    // Two pass at once. The other four could be admitted in 1 s, within
    // the 1.5 s allowed, so they wait; two of them then win, and the last
    // two, whose turn would come after 2 s, are rejected at 1 s.
    assert_eq!(
        six_at_once(Duration::from_millis(1_500)).await,
        [
            (0, 200),
            (0, 200),
            (1_000, 200),
            (1_000, 200),
            (1_000, 429),
            (1_000, 429)
        ]
    );
    // With 2.5 s, everyone gets through.
    assert_eq!(
        six_at_once(Duration::from_millis(2_500)).await,
        [
            (0, 200),
            (0, 200),
            (1_000, 200),
            (1_000, 200),
            (2_000, 200),
            (2_000, 200)
        ]
    );
    // With 0.5 s nobody waits in vain: the four are rejected at once.
    assert_eq!(
        six_at_once(Duration::from_millis(500)).await,
        [(0, 200), (0, 200), (0, 429), (0, 429), (0, 429), (0, 429)]
    );
}

#[tokio::test]
async fn separate_layer_calls_share_the_local_fallback() {
    // axum calls `Layer::layer` per request when a `Router<()>` is used as a
    // service directly: the fallback must not start empty each time.
    let full = MemoryStore::builder().max_keys(1).build().unwrap();
    full.check_sync(
        &tollgate::Key::custom("filler"),
        &Policy::new("x", Algorithm::FixedWindow, "1/h").unwrap(),
        1,
    )
    .unwrap();
    let policy = Policy::new("fallback", Algorithm::FixedWindow, "3/min").unwrap();
    let layer = RateLimitLayer::new(policy, GlobalKey)
        .store(full)
        .on_store_error(FailureMode::Local);
    let inner =
        service_fn(|_: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) });
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let svc = tower::Layer::layer(&layer, inner);
        statuses.push(svc.oneshot(get_root()).await.unwrap().status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
}

#[tokio::test]
async fn a_middleware_over_rate_limiter_answers_exactly_as_the_layer() {
    let policy = Policy::builder("export")
        .algorithm(Algorithm::SlidingWindow)
        .limit("2/min")
        .build()
        .unwrap();
    for style in [HeaderStyle::GitHub, HeaderStyle::Ietf, HeaderStyle::Both] {
        let (_, layer_store) = clock_and_store();
        let app = app(RateLimitLayer::new(policy.clone(), GlobalKey)
            .store(layer_store)
            .headers(style));
        let (_, limiter_store) = clock_and_store();
        let limiter = tollgate::RateLimiter::with_store(policy.clone(), limiter_store);
        for _ in 0..2 {
            app.clone().oneshot(get_root()).await.unwrap();
            limiter.check(&tollgate::Key::global()).await.unwrap();
        }
        let mut from_layer = app.oneshot(get_root()).await.unwrap();
        // Axum adds the length of the body; the rest is the layer's.
        from_layer.headers_mut().remove("content-length");
        let decision = limiter.check(&tollgate::Key::global()).await.unwrap();
        let by_hand = tollgate::rejection(&decision, policy.name(), style);
        assert_eq!(from_layer.status(), by_hand.status());
        assert_eq!(from_layer.headers(), by_hand.headers(), "{style:?}");
        let body = to_bytes(from_layer.into_body(), 10_000).await.unwrap();
        assert_eq!(body, by_hand.into_body(), "{style:?}");
    }
}

#[tokio::test]
async fn route_layer_counts_only_requests_a_handler_takes() {
    let policy = Policy::new("login", Algorithm::FixedWindow, "2/min").unwrap();
    let (_, store) = clock_and_store();
    let limited = RateLimitLayer::new(policy.clone(), GlobalKey).store(store.clone());
    let app = Router::new().route(
        "/",
        axum::routing::post(|| async { "welcome" }).route_layer(limited),
    );
    // Wrong method: 405, and nothing counted.
    for _ in 0..5 {
        let res = app.clone().oneshot(get_root()).await.unwrap();
        assert_eq!(res.status(), StatusCode::METHOD_NOT_ALLOWED);
    }
    let post = || Request::post("/").body(Body::empty()).unwrap();
    let res = app.clone().oneshot(post()).await.unwrap();
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("1"));
    // With `layer`, the 405s count.
    let counted = Router::new().route(
        "/",
        axum::routing::post(|| async { "welcome" })
            .layer(RateLimitLayer::new(policy, GlobalKey).store(store)),
    );
    let res = counted.oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("0"));
}

/// Plans chosen per request, as an auth layer would mark them: here the
/// `x-plan` header stands in for the extension it would insert.
fn plans_app(store: MemoryStore) -> Router {
    let free = Policy::new("api-free", Algorithm::FixedWindow, "2/min").unwrap();
    let pro = Policy::new("api-pro", Algorithm::FixedWindow, "5/min").unwrap();
    let by_user = HeaderKey::new(http::HeaderName::from_static("x-user"));
    let layer = RateLimitLayer::new(free, by_user)
        .store(store)
        .choose_policy(move |req: &Request<Body>| {
            (req.headers().get("x-plan")? == "pro").then(|| pro.clone())
        });
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

fn as_user(user: &str, plan: &str) -> Request<Body> {
    Request::get("/")
        .header("x-user", user)
        .header("x-plan", plan)
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn each_plan_has_its_own_limit_and_names_itself() {
    let (_, store) = clock_and_store();
    let app = plans_app(store);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let res = app.clone().oneshot(as_user("ada", "free")).await.unwrap();
        assert_eq!(header(&res, "x-ratelimit-resource"), Some("api-free"));
        assert_eq!(header(&res, "x-ratelimit-limit"), Some("2"));
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);
    let res = app.clone().oneshot(as_user("ada", "free")).await.unwrap();
    assert_eq!(body_json(res).await["violated-policies"][0], "api-free");

    let mut statuses = Vec::new();
    for _ in 0..6 {
        let res = app.clone().oneshot(as_user("bob", "pro")).await.unwrap();
        assert_eq!(header(&res, "x-ratelimit-resource"), Some("api-pro"));
        assert_eq!(header(&res, "x-ratelimit-limit"), Some("5"));
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    let res = app.clone().oneshot(as_user("bob", "pro")).await.unwrap();
    assert_eq!(body_json(res).await["violated-policies"][0], "api-pro");

    // Plans keep their state apart: ada, spent on free, starts on pro.
    let res = app.clone().oneshot(as_user("ada", "pro")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("4"));
}

#[tokio::test]
async fn a_chosen_plan_may_set_the_cost_of_its_requests() {
    let (_, store) = clock_and_store();
    let free = Policy::new("export-free", Algorithm::FixedWindow, "10/min").unwrap();
    let pro = Policy::new("export-pro", Algorithm::FixedWindow, "5/min").unwrap();
    let layer = RateLimitLayer::new(free, GlobalKey)
        .store(store)
        .cost(3)
        .choose_policy(move |req: &Request<Body>| {
            (req.headers().get("x-plan")? == "pro")
                .then(|| tollgate::Choice::new(pro.clone()).cost(2))
        });
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let statuses = |plan: &'static str| {
        let app = app.clone();
        async move {
            let mut statuses = Vec::new();
            for _ in 0..4 {
                let req = Request::get("/")
                    .header("x-plan", plan)
                    .body(Body::empty())
                    .unwrap();
                statuses.push(app.clone().oneshot(req).await.unwrap().status().as_u16());
            }
            statuses
        }
    };
    // Pro: 2 + 2 of 5, then 6 would not fit. Free: 3 + 3 + 3 of 10.
    assert_eq!(statuses("pro").await, [200, 200, 429, 429]);
    assert_eq!(statuses("free").await, [200, 200, 200, 429]);
}
