//! What a request is answered when it is denied or has no key: problem
//! details, custom rejections, gRPC statuses, and the same answer built
//! by hand over a `RateLimiter`.

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::routing::get;
use http::{HeaderName, Request, Response, StatusCode};
use tollgate::{
    Algorithm, ExtensionKey, GlobalKey, HeaderKey, HeaderStyle, Key, KeyExtractor, MissingCause,
    MissingKey, PeerIp, Policy, RateLimitLayer, Store,
};
use tower::ServiceExt;

use super::{app, body_json, clock_and_store, get_root, header};

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
            .on_missing_key(MissingKey::Error)
            .unwrap(),
    );
    assert_eq!(
        app.oneshot(get_root()).await.unwrap().status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );

    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(policy.clone(), ExtensionKey::<String>::new())
            .store(store.clone())
            .on_missing_key(MissingKey::Reject(StatusCode::FORBIDDEN))
            .unwrap(),
    );
    assert_eq!(
        app.oneshot(get_root()).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );

    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(policy, ExtensionKey::<String>::new())
            .store(store.clone())
            .on_missing_key(MissingKey::Allow)
            .unwrap(),
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

/// A refusal's status that a client would take for its answer (a
/// success, a redirect) is a configuration error that names the setting,
/// not a layer that answers 200 to a denied request.
#[test]
fn a_refusal_status_that_is_no_error_is_a_configuration_error() {
    let policy = Policy::new("users", Algorithm::Gcra, "5/min").unwrap();
    let layer = || RateLimitLayer::new(policy.clone(), GlobalKey);
    let error = layer().rejection_status(StatusCode::OK).err().unwrap();
    assert_eq!(
        error.to_string(),
        "invalid rejection_status \"200\": a refusal's status must be a client or server error (4xx or 5xx)"
    );
    let redirect = MissingKey::Reject(StatusCode::TEMPORARY_REDIRECT);
    let error = layer().on_missing_key(redirect).err().unwrap();
    assert_eq!(
        error.to_string(),
        "invalid on_missing_key \"307\": a refusal's status must be a client or server error (4xx or 5xx)"
    );
    for status in [StatusCode::BAD_REQUEST, StatusCode::SERVICE_UNAVAILABLE] {
        assert!(layer().rejection_status(status).is_ok());
        assert!(layer().on_missing_key(MissingKey::Reject(status)).is_ok());
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
    // The details name the limit (a QuotaFailure), and hold no RetryInfo.
    let has = grpc_details(&res);
    assert!(has(b"google.rpc.QuotaFailure") && has(b"limit 5/min exceeded"));
    assert!(!has(b"google.rpc.RetryInfo"));
    assert_eq!(
        header(&res, "tollgate-exceeded"),
        Some("greeter; limit=5/min")
    );
}

/// Whether the gRPC status details of `res` (`grpc-status-details-bin`,
/// base64) hold a given run of bytes.
fn grpc_details(res: &Response<impl Sized>) -> impl Fn(&[u8]) -> bool {
    use base64::Engine as _;
    let details = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(header(res, "grpc-status-details-bin").unwrap())
        .unwrap();
    move |needle: &[u8]| details.windows(needle.len()).any(|w| w == needle)
}

/// A nearer gRPC layer's refusal of a call an outer layer admitted and
/// left empty tells the outer layer's wait, in each form a gRPC client
/// reads it: `retry-after`, the pushback, `RetryInfo` and the message's
/// closing words, in `grpc-message` and in the status (they told the
/// nearer layer's 10 s, where the client would meet the outer layer's
/// refusal until the minute's end). The rest of the details stay.
#[tokio::test]
async fn a_grpc_refusal_waits_for_an_outer_layer_left_empty() {
    let (_, store) = clock_and_store();
    let layer = |name: &str, limit: &str| {
        let policy = Policy::new(name, Algorithm::FixedWindow, limit).unwrap();
        RateLimitLayer::new(policy, GlobalKey)
            .store(store.clone())
            .grpc()
    };
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer("user-1", "1/10s"))
        .layer(layer("ip-2", "2/min"));
    assert_eq!(super::T0 % 60, 0);
    app.clone().oneshot(get_root()).await.unwrap();
    let res = app.oneshot(get_root()).await.unwrap();
    assert_eq!(header(&res, "grpc-status"), Some("8"));
    assert_eq!(header(&res, "retry-after"), Some("60"));
    assert_eq!(header(&res, "grpc-retry-pushback-ms"), Some("60000"));
    let has = grpc_details(&res);
    // Any { value: RetryInfo { retry_delay: Duration { seconds: 60 } } }
    assert!(has(&[0x12, 4, 0x0a, 2, 0x08, 60]));
    assert!(!has(&[0x12, 4, 0x0a, 2, 0x08, 10]));
    assert!(has(b"google.rpc.QuotaFailure") && has(b"limit 1/10s exceeded"));
    let message = "limit 'user-1' exceeded, retry in 60 s";
    assert_eq!(header(&res, "grpc-message"), Some(message));
    // Status { message (field 2) }: its length, then the text.
    let status_message = [&[0x12, 38][..], message.as_bytes()].concat();
    assert_eq!(message.len(), 38);
    assert!(has(&status_message) && !has(b"retry in 10 s"));
}

/// Within one second, the pushback is raised to the outer layer's wait to
/// the millisecond, though `retry-after` (whole seconds) tells 1 s for
/// both: the nearer layer's refusal would have its client back after
/// 300 ms, while the outer layer, left empty, admits again after 500 ms.
#[tokio::test]
async fn a_grpc_refusal_waits_for_an_outer_layer_to_the_millisecond() {
    let (clock, store) = clock_and_store();
    let layer = |name: &str, algorithm, limit: &str| {
        let policy = Policy::new(name, algorithm, limit).unwrap();
        RateLimitLayer::new(policy, GlobalKey)
            .store(store.clone())
            .grpc()
    };
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer("user-1", Algorithm::FixedWindow, "1/s"))
        .layer(layer("ip-2", Algorithm::Gcra, "2/s"));
    clock.advance(std::time::Duration::from_millis(700));
    app.clone().oneshot(get_root()).await.unwrap();
    let res = app.oneshot(get_root()).await.unwrap();
    assert_eq!(header(&res, "grpc-status"), Some("8"));
    assert_eq!(header(&res, "retry-after"), Some("1"));
    assert_eq!(header(&res, "grpc-retry-pushback-ms"), Some("500"));
    let has = grpc_details(&res);
    // Any { value: RetryInfo { retry_delay: Duration { nanos: 500,000,000 } } }
    assert!(has(&[0x12, 8, 0x0a, 6, 0x10, 0x80, 0xca, 0xb5, 0xee, 0x01]));
}

/// An app's own gRPC refusal under a layer left empty (10 s to go): each
/// wait it tells that is shorter is raised to the layer's, and each that is
/// longer stays, whatever the others tell. A pushback of a minute and a
/// `RetryInfo` of 20 s were lowered to 10 s.
#[tokio::test]
async fn an_apps_longer_grpc_waits_stay_under_a_layer_left_empty() {
    use base64::Engine as _;
    for (app_delay, told_delay) in [(20, 20), (2, 10)] {
        // google.rpc.Status { code: 8, details: [Any { RetryInfo { retry_delay } }] }
        let url = b"type.googleapis.com/google.rpc.RetryInfo";
        let mut any = vec![0x0a, 40];
        any.extend_from_slice(url);
        any.extend_from_slice(&[0x12, 4, 0x0a, 2, 0x08, app_delay]);
        let mut status = vec![0x08, 8, 0x1a, any.len() as u8];
        status.extend_from_slice(&any);
        let details = base64::engine::general_purpose::STANDARD_NO_PAD.encode(status);
        let refusal = move || {
            let details = details.clone();
            async move {
                Response::builder()
                    .header("content-type", "application/grpc")
                    .header("grpc-status", "8")
                    .header("retry-after", "1")
                    .header("grpc-retry-pushback-ms", "60000")
                    .header("grpc-status-details-bin", details)
                    .body(Body::empty())
                    .unwrap()
            }
        };
        let (_, store) = clock_and_store();
        let policy = Policy::new("ip-2", Algorithm::FixedWindow, "2/10s").unwrap();
        let layer = RateLimitLayer::new(policy, GlobalKey).store(store).grpc();
        let app = Router::new().route("/", get(refusal)).layer(layer);
        app.clone().oneshot(get_root()).await.unwrap();
        let res = app.oneshot(get_root()).await.unwrap();
        assert_eq!(header(&res, "retry-after"), Some("10"));
        assert_eq!(header(&res, "grpc-retry-pushback-ms"), Some("60000"));
        let has = grpc_details(&res);
        assert!(has(&[0x12, 4, 0x0a, 2, 0x08, told_delay]), "{app_delay} s");
    }
}

/// A gRPC client of a key an operator blocked is pushed back for the rest
/// of the block, and told it is a block rather than which limit fired.
#[tokio::test]
async fn a_grpc_client_of_a_blocked_key_is_told_so_and_when_to_return() {
    let (_, store) = clock_and_store();
    let policy = Policy::new("greeter", Algorithm::FixedWindow, "5/min").unwrap();
    store
        .block(
            &tollgate::Key::global(),
            &policy,
            std::time::Duration::from_secs(90),
        )
        .await
        .unwrap();
    let app = app(RateLimitLayer::new(policy, GlobalKey).store(store).grpc());
    let res = app.oneshot(get_root()).await.unwrap();
    assert_eq!(header(&res, "grpc-status"), Some("8"));
    assert_eq!(header(&res, "grpc-retry-pushback-ms"), Some("90000"));
    assert_eq!(header(&res, "tollgate-exceeded"), Some("greeter; blocked"));
    let has = grpc_details(&res);
    assert!(has(b"google.rpc.RetryInfo") && has(b"key blocked by an operator"));
    assert!(!has(b"exceeded"));
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
async fn shadow_mode_waives_the_limit_but_not_an_operators_block() {
    let (clock, store) = clock_and_store();
    let policy = Policy::new("trial", Algorithm::FixedWindow, "2/min").unwrap();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(
            policy.clone(),
            HeaderKey::new(HeaderName::from_static("x-client")),
        )
        .store(store.clone())
        .shadow(),
    );
    let from = |client: &str| {
        Request::get("/")
            .header("x-client", client)
            .body(Body::empty())
            .unwrap()
    };
    // Over the limit: let through, as a dry run does.
    for _ in 0..5 {
        let res = app.clone().oneshot(from("ada")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    // Blocked by an operator: rejected until the block ends, with the
    // rest of the block to wait.
    let bob = Key::header("bob");
    store
        .block(&bob, &policy, std::time::Duration::from_secs(600))
        .await
        .unwrap();
    clock.advance(std::time::Duration::from_secs(120));
    let res = app.clone().oneshot(from("bob")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), Some("480"));
    // The client is told it is a block, not which limit fired.
    assert_eq!(header(&res, "tollgate-exceeded"), Some("trial; blocked"));
    let body = body_json(res).await;
    assert_eq!(
        body["detail"],
        "this key is blocked under 'trial' by an operator, retry in 480 s"
    );
    assert_eq!(body["limit"], "blocked");
    // Ada's key is over its limit again in this window, and let through.
    for _ in 0..3 {
        let res = app.clone().oneshot(from("ada")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    // The block ends: Bob is in again.
    clock.advance(std::time::Duration::from_secs(480));
    let res = app.oneshot(from("bob")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}
