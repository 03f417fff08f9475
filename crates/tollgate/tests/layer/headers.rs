//! The rate-limit headers: each style, on admitted and rejected requests,
//! rounding, and the layer whose headers win when layers are stacked.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Response, StatusCode};
use tollgate::{Algorithm, GlobalKey, HeaderStyle, Policy, RateLimitLayer};
use tower::ServiceExt;

use super::{app, body_json, clock_and_store, get_root, header};

#[tokio::test]
async fn exact_headers_on_200_and_429() {
    let (clock, store) = clock_and_store();
    clock.advance(Duration::from_millis(12_500)); // 12.5 s into the minute
    let policy = Policy::new("core", Algorithm::FixedWindow, "3/min").unwrap();
    let app = app(RateLimitLayer::new(policy, GlobalKey).store(store));

    for (remaining, used) in [("2", "1"), ("1", "2"), ("0", "3")] {
        let res = app.clone().oneshot(get_root()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, "x-ratelimit-limit"), Some("3"));
        assert_eq!(header(&res, "x-ratelimit-remaining"), Some(remaining));
        assert_eq!(header(&res, "x-ratelimit-used"), Some(used));
        assert_eq!(header(&res, "x-ratelimit-reset"), Some("1700000100"));
        assert_eq!(header(&res, "x-ratelimit-resource"), Some("core"));
        assert_eq!(header(&res, "retry-after"), None);
        // GitHub's five, in GitHub's order, and no other.
        assert_eq!(rate_limit_headers(&res), FIVE);
    }

    let res = app.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "x-ratelimit-limit"), Some("3"));
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(header(&res, "x-ratelimit-used"), Some("3"));
    assert_eq!(rate_limit_headers(&res), FIVE);
    assert_eq!(header(&res, "x-ratelimit-reset"), Some("1700000100"));
    assert_eq!(header(&res, "x-ratelimit-resource"), Some("core"));
    // 47.5 s left, rounded up.
    assert_eq!(header(&res, "retry-after"), Some("48"));
    // The limit that fired, named in every style.
    assert_eq!(header(&res, "tollgate-exceeded"), Some("core; limit=3/min"));
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
            "limit": "3/min",
        })
    );
}

/// GitHub's five rate-limit headers, in the order GitHub sends them.
const FIVE: [&str; 5] = [
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-used",
    "x-ratelimit-reset",
    "x-ratelimit-resource",
];

/// The `x-ratelimit-*` headers of `res`, in the order they are sent.
fn rate_limit_headers(res: &Response<Body>) -> Vec<&str> {
    res.headers()
        .keys()
        .map(|name| name.as_str())
        .filter(|name| name.starts_with("x-ratelimit-"))
        .collect()
}

#[tokio::test]
#[allow(deprecated)] // what the deprecated style still does
async fn github_full_is_github() {
    let (clock, store) = clock_and_store();
    clock.advance(Duration::from_millis(12_500));
    let policy = |name| Policy::new(name, Algorithm::FixedWindow, "3/min").unwrap();
    let full = app(RateLimitLayer::new(policy("core"), GlobalKey)
        .store(store.clone())
        .headers(HeaderStyle::GitHubFull));
    let github = app(RateLimitLayer::new(policy("core-2"), GlobalKey).store(store));
    for _ in 0..4 {
        let full = full.clone().oneshot(get_root()).await.unwrap();
        let github = github.clone().oneshot(get_root()).await.unwrap();
        assert_eq!(full.status(), github.status());
        assert_eq!(rate_limit_headers(&full), FIVE);
        for name in &FIVE[..4] {
            assert_eq!(header(&full, name), header(&github, name), "{name}");
        }
    }
}

#[tokio::test]
async fn six_and_seven_digit_figures() {
    // A million a second with a burst of a million: `x-ratelimit-limit`
    // is the policy's own value, `remaining` is written per response.
    let (_, store) = clock_and_store();
    let policy = Policy::builder("big")
        .algorithm(Algorithm::Gcra)
        .limit("1000000/s")
        .burst(1_000_000)
        .build()
        .unwrap();
    let app = app(RateLimitLayer::new(policy, GlobalKey).store(store));
    for used in 1..=3_000u64 {
        let res = app.clone().oneshot(get_root()).await.unwrap();
        let (remaining, used) = ((1_000_000 - used).to_string(), used.to_string());
        assert_eq!(header(&res, "x-ratelimit-limit"), Some("1000000"));
        assert_eq!(header(&res, "x-ratelimit-remaining"), Some(&*remaining));
        assert_eq!(header(&res, "x-ratelimit-used"), Some(&*used));
    }
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
async fn forbidden_mode_and_no_headers_mode() {
    let (_, store) = clock_and_store();
    let policy = Policy::new("gh", Algorithm::FixedWindow, "1/min").unwrap();
    let app403 = app(RateLimitLayer::new(policy.clone(), GlobalKey)
        .store(store.clone())
        .rejection_status(StatusCode::FORBIDDEN)
        .unwrap());
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
async fn stacked_layers_report_the_one_with_fewest_requests_left() {
    let (_, store) = clock_and_store();
    let layer = |name: &str, limit: &str| {
        let policy = Policy::new(name, Algorithm::FixedWindow, limit).unwrap();
        RateLimitLayer::new(policy, GlobalKey).store(store.clone())
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

/// A refusal by the inner layer while the outer one is left empty tells
/// the client the outer layer's later time: the outer one (2 a minute,
/// per IP) would refuse it when the inner one (1 in 10 s, per user) is back.
/// It was told the inner layer's 10 s, and met the outer's refusal then.
#[tokio::test]
async fn a_refusal_waits_for_an_outer_layer_left_empty() {
    let (clock, store) = clock_and_store();
    let layer = |name: &str, limit: &str| {
        let policy = Policy::new(name, Algorithm::FixedWindow, limit).unwrap();
        RateLimitLayer::new(policy, GlobalKey).store(store.clone())
    };
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer("user-1", "1/10s"))
        .layer(layer("ip-2", "2/min"));
    // The clock starts a minute, and a 10 s window.
    let start = super::T0;
    assert_eq!(start % 60, 0);
    assert_eq!(app.clone().oneshot(get_root()).await.unwrap().status(), 200);
    let res = app.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let reset = (start + 60).to_string();
    assert_eq!(header(&res, "retry-after"), Some("60"));
    assert_eq!(header(&res, "x-ratelimit-resource"), Some("ip-2"));
    assert_eq!(header(&res, "x-ratelimit-reset"), Some(reset.as_str()));
    // Told the truth: refused at 10 s, as the header says, admitted at 60.
    clock.advance(Duration::from_secs(10));
    let res = app.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    clock.advance(Duration::from_secs(50));
    assert_eq!(app.oneshot(get_root()).await.unwrap().status(), 200);

    // The same in GitHub's 403 mode: a refusal in the layers' own status.
    let forbidding = |name: &str, limit: &str| {
        let status = StatusCode::FORBIDDEN;
        layer(name, limit).rejection_status(status).unwrap()
    };
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(forbidding("user-403", "1/10s"))
        .layer(forbidding("ip-403", "2/min"));
    assert_eq!(app.clone().oneshot(get_root()).await.unwrap().status(), 200);
    let res = app.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(header(&res, "retry-after"), Some("60"));
    clock.advance(Duration::from_secs(60));
    assert_eq!(app.oneshot(get_root()).await.unwrap().status(), 200);

    // An app's own 503 tells a client to come back after 5 s: it would
    // meet the layer's refusal until the minute's end, and is told so.
    // Under a layer in shadow mode, which refuses nothing, a wait stays.
    let busy = || async {
        let mut res = axum::response::Response::new(axum::body::Body::empty());
        *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        res.headers_mut()
            .insert("retry-after", http::HeaderValue::from_static("5"));
        res
    };
    let app = Router::new()
        .route("/", get(busy))
        .layer(layer("ip-1", "1/min"));
    let res = app.oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&res, "retry-after"), Some("60"));
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer("user-shadowed", "1/10s"))
        .layer(layer("ip-shadow", "2/min").shadow());
    clock.advance(Duration::from_secs(10));
    assert_eq!(app.clone().oneshot(get_root()).await.unwrap().status(), 200);
    // The shadow layer admits the second with none left, and denies the
    // third in shadow: neither raises the inner layer's wait.
    for retry in ["9", "8"] {
        clock.advance(Duration::from_secs(1));
        let res = app.clone().oneshot(get_root()).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&res, "retry-after"), Some(retry));
    }
}

/// An outer layer of cost 2 left with 1 refuses the next request until
/// its window ends: a nearer layer's refusal says so (it told its own
/// 40 s, and the client met the outer layer's refusal then).
#[tokio::test]
async fn a_refusal_waits_for_an_outer_layer_left_short_of_its_cost() {
    let (clock, store) = clock_and_store();
    clock.advance(Duration::from_secs(20));
    let layer = |name: &str, limit: &str| {
        let policy = Policy::new(name, Algorithm::FixedWindow, limit).unwrap();
        RateLimitLayer::new(policy, GlobalKey).store(store.clone())
    };
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer("user-1", "1/min"))
        .layer(layer("ip-5", "5/h").cost(2));
    assert_eq!(app.clone().oneshot(get_root()).await.unwrap().status(), 200);
    let res = app.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // The hour's window ends at the next whole hour.
    let to_hour = 3_600 - (super::T0 + 20) % 3_600;
    assert_eq!(
        header(&res, "retry-after"),
        Some(to_hour.to_string().as_str())
    );
    clock.advance(Duration::from_secs(to_hour - 1));
    let res = app.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(header(&res, "tollgate-exceeded"), Some("ip-5; limit=5/h"));
    clock.advance(Duration::from_secs(1));
    assert_eq!(app.oneshot(get_root()).await.unwrap().status(), 200);
}

/// Of an outer layer's limits left empty, the one back last sets the
/// wait, not the binding one: a leaky bucket of 100 in 10 s and 1 in 11 s
/// (one queue, both left empty at once; the first has a unit back after
/// 100 ms, the second after 11 s). It told 2 s, the nearer layer's wait.
#[tokio::test]
async fn a_refusal_waits_for_the_last_of_an_outer_layers_limits() {
    let (clock, store) = clock_and_store();
    let inner = Policy::new("user", Algorithm::Gcra, "1/2s").unwrap();
    let inner = RateLimitLayer::new(inner, GlobalKey).store(store.clone());
    let outer = Policy::builder("ip")
        .algorithm(Algorithm::LeakyBucket)
        .limit("100/10s")
        .limit("1/11s")
        .build()
        .unwrap();
    let outer = RateLimitLayer::new(outer, GlobalKey).store(store);
    let only_inner = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(inner.clone());
    let both = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(inner)
        .layer(outer);
    assert_eq!(only_inner.oneshot(get_root()).await.unwrap().status(), 200);
    let res = both.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), Some("11"));
    clock.advance(Duration::from_millis(10_999));
    let res = both.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(header(&res, "tollgate-exceeded"), Some("ip; limit=1/11s"));
    clock.advance(Duration::from_millis(1));
    assert_eq!(both.oneshot(get_root()).await.unwrap().status(), 200);
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
        Some(r#""search-0";r=1;t=5, "search-1";r=299;t=60"#)
    );
    assert_eq!(
        header(&res, "x-ratelimit-remaining"),
        Some("1"),
        "GitHub headers report the binding limit"
    );
    assert_eq!(header(&res, "x-ratelimit-limit"), Some("2"));
    assert_eq!(header(&res, "x-ratelimit-used"), Some("1"));
    assert_eq!(rate_limit_headers(&res), FIVE);
    app.clone().oneshot(get_root()).await.unwrap();
    let res = app.oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // 4.5 s until the 5 s window ends: t = 5, as is Retry-After.
    assert_eq!(
        header(&res, "ratelimit"),
        Some(r#""search-0";r=0;t=5, "search-1";r=298;t=60"#)
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
    assert_eq!(header(&res, "ratelimit"), Some(r#""one";r=9;t=1"#));
    assert_eq!(header(&res, "x-ratelimit-limit"), None);
}

/// The IETF `t` of a limit that an admitted request left empty: when a
/// unit comes back. A rate-based limit of 10 a minute gives one back every
/// 6 s, so `t` counts to the next (6, then 5 a second later), not to when
/// all ten are back (60); a fixed window's is its end; a sliding window's
/// is when it is fully back (the stores report nothing sooner). A denial's
/// is its `Retry-After`. (Paused: a leaky bucket delays what it admits.)
#[tokio::test(start_paused = true)]
async fn ietf_t_of_an_emptied_limit_counts_to_its_next_unit() {
    for (algorithm, first, later) in [
        (Algorithm::Gcra, 6, 5),
        (Algorithm::TokenBucket, 6, 5),
        (Algorithm::LeakyBucket, 6, 5),
        (Algorithm::FixedWindow, 60, 59),
        (Algorithm::SlidingWindow, 120, 65),
    ] {
        let (clock, store) = clock_and_store();
        let policy = Policy::new("one", algorithm, "10/min").unwrap();
        let app = Router::new().route("/", get(|| async { "ok" })).layer(
            RateLimitLayer::new(policy, GlobalKey)
                .store(store)
                .headers(HeaderStyle::Ietf),
        );
        for _ in 0..9 {
            app.clone().oneshot(get_root()).await.unwrap();
        }
        let res = app.clone().oneshot(get_root()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{algorithm}");
        let want = format!(r#""one";r=0;t={first}"#);
        assert_eq!(
            header(&res, "ratelimit"),
            Some(want.as_str()),
            "{algorithm}"
        );
        clock.advance(Duration::from_secs(1));
        let res = app.oneshot(get_root()).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{algorithm}");
        let want = format!(r#""one";r=0;t={later}"#);
        assert_eq!(
            header(&res, "ratelimit"),
            Some(want.as_str()),
            "{algorithm}"
        );
    }
}

/// The IETF `t` of a limit with quota left: when more of it comes back
/// (draft -10's "additional quota"), never 0 while some is used. A
/// rate-based limit of 10 a minute used 3 times gives its next unit back
/// in 6 s, and 4 s after a fourth request 2 s later; a fixed window's is
/// its end; a sliding window's when it is fully back.
#[tokio::test(start_paused = true)]
async fn ietf_t_of_a_limit_with_quota_left_counts_to_its_next_unit() {
    for (algorithm, first, later) in [
        (Algorithm::Gcra, 6, 4),
        (Algorithm::TokenBucket, 6, 4),
        (Algorithm::LeakyBucket, 6, 4),
        (Algorithm::FixedWindow, 60, 58),
        (Algorithm::SlidingWindow, 120, 118),
    ] {
        let (clock, store) = clock_and_store();
        let policy = Policy::new("one", algorithm, "10/min").unwrap();
        let app = Router::new().route("/", get(|| async { "ok" })).layer(
            RateLimitLayer::new(policy, GlobalKey)
                .store(store)
                .headers(HeaderStyle::Ietf),
        );
        for _ in 0..2 {
            app.clone().oneshot(get_root()).await.unwrap();
        }
        let res = app.clone().oneshot(get_root()).await.unwrap();
        let want = format!(r#""one";r=7;t={first}"#);
        let got = header(&res, "ratelimit");
        assert_eq!(got, Some(want.as_str()), "{algorithm}");
        clock.advance(Duration::from_secs(2));
        let res = app.oneshot(get_root()).await.unwrap();
        let got = header(&res, "ratelimit").unwrap_or_default();
        assert!(got.ends_with(&format!(";t={later}")), "{algorithm}: {got}");
    }
}

/// A monthly quota in Europe/Berlin: `x-ratelimit-reset` is the 1st of
/// next month at 00:00 Berlin time, and `Retry-After` counts to it; the
/// day after, a daily quota at 08:00 UTC resets at 08:00 UTC.
#[tokio::test]
async fn calendar_periods_reset_at_the_calendar_boundary() {
    let (clock, store) = clock_and_store();
    // 2028-02-29 12:00:00 UTC, 13:00 in Berlin (CET, UTC+1): March starts
    // at 2028-02-29 23:00:00 UTC, 1835478000.
    clock.set(tollgate::Timestamp::from_secs(1_835_438_400));
    let monthly = Policy::builder("reports")
        .algorithm(Algorithm::FixedWindow)
        .limit("2/month")
        .calendar(tollgate::Calendar::new("Europe/Berlin").unwrap())
        .build()
        .unwrap();
    let app = app(RateLimitLayer::new(monthly, GlobalKey).store(store.clone()));
    for remaining in ["1", "0"] {
        let res = app.clone().oneshot(get_root()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, "x-ratelimit-remaining"), Some(remaining));
        assert_eq!(header(&res, "x-ratelimit-reset"), Some("1835478000"));
    }
    let res = app.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "x-ratelimit-reset"), Some("1835478000"));
    // 11 hours to the boundary.
    assert_eq!(header(&res, "retry-after"), Some("39600"));
    // At the boundary, March's quota; it ends on 2028-04-01 00:00 CEST,
    // 2028-03-31 22:00:00 UTC (1838152800): 31 days less an hour later.
    clock.set(tollgate::Timestamp::from_secs(1_835_478_000));
    let res = app.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("1"));
    assert_eq!(header(&res, "x-ratelimit-reset"), Some("1838152800"));

    let daily = Policy::builder("exports")
        .algorithm(Algorithm::FixedWindow)
        .limit("1/day")
        .calendar(tollgate::Calendar::utc().with_offset(Duration::from_secs(8 * 3600)))
        .build()
        .unwrap();
    let app = super::app(RateLimitLayer::new(daily, GlobalKey).store(store));
    // 2028-03-01 07:59:00 UTC: the day ends in a minute.
    clock.set(tollgate::Timestamp::from_secs(1_835_510_340));
    assert_eq!(
        app.clone().oneshot(get_root()).await.unwrap().status(),
        StatusCode::OK
    );
    let res = app.clone().oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "x-ratelimit-reset"), Some("1835510400"));
    assert_eq!(header(&res, "retry-after"), Some("60"));
}
