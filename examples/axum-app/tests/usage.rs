//! `GET /usage` shows what the caller's requests used, to the unit, per
//! policy (refused requests not counted, settled ones at their actual
//! cost), and `GET /admin/usage/{user}` shows the same to an operator.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum_app::{AdminToken, AppConfig, AppLedger, app};
use http::Request;
use tollgate::ledger::{MemoryLedger, MeteredStore};
use tollgate::{BoxStore, FakeClock, MemoryStore, Timestamp};
use tower::ServiceExt;

/// The shipped policy file's app on a memory store at 2026-01-15 12:00 UTC,
/// with its usage routes.
fn demo() -> Router {
    demo_and_ledger().0
}

/// [`demo`], and the ledger its store records in.
fn demo_and_ledger() -> (Router, MemoryLedger) {
    let config = AppConfig::parse(include_str!("../policies.toml")).unwrap();
    let clock = FakeClock::new(Timestamp::from_secs(1_768_478_400));
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    let memory = MemoryLedger::new();
    let ledger = AppLedger::Memory(memory.clone());
    let store = BoxStore::with_slots(MeteredStore::new(store, ledger.clone()));
    let admin = AdminToken::new("operator");
    let app = app(&config, store)
        .merge(axum_app::usage::routes(&config, &ledger, admin))
        .layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 7], 4000))));
    (app, memory)
}

/// Only users are billed: every `/api` request is admitted under the
/// per-IP `api-ip` too, and a login under `login-failures` (per IP), and
/// neither is usage. The ledger held the address's pairs beside the
/// users', and a flood of made-up addresses filled its bound, after which
/// new customers' records were dropped.
#[tokio::test]
async fn only_users_are_billed() {
    let (app, ledger) = demo_and_ledger();
    assert_eq!(send(&app, "GET", "/api/items", "demo-ada").await.0, 200);
    assert_eq!(send(&app, "GET", "/api/items", "demo-bob").await.0, 200);
    send(&app, "POST", "/login", "demo-ada").await;
    // Ada's and Bob's `items-read`.
    assert_eq!(ledger.len(), 2);
}

async fn send(app: &Router, method: &str, uri: &str, bearer: &str) -> (u16, String) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {bearer}"))
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

const JANUARY: &str = "granularity=month&from=2026-01-01&to=2026-02-01";

#[tokio::test]
async fn usage_matches_the_requests_made() {
    let app = demo();
    let mut read = 0;
    for _ in 0..4 {
        let (status, _) = send(&app, "GET", "/api/items", "demo-ada").await;
        read += u64::from(status == 200);
    }
    // 20 a minute: the last two are refused, and not billed.
    let mut written = 0;
    for _ in 0..22 {
        let (status, _) = send(&app, "POST", "/api/items", "demo-ada").await;
        written += u64::from(status == 201);
    }
    assert_eq!((read, written), (4, 20));
    // Reserves 200 tokens each, settled to what the call used.
    let mut tokens = 0;
    for used in [150, 420, 0] {
        let uri = format!("/api/complete?tokens={used}");
        let (status, _) = send(&app, "POST", &uri, "demo-ada").await;
        assert_eq!(status, 200);
        tokens += used;
    }
    // Someone else's use is not ada's.
    send(&app, "GET", "/api/items", "demo-bob").await;

    let (status, body) = send(&app, "GET", &format!("/usage?{JANUARY}"), "demo-ada").await;
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let total = |policy: &str| json["usage"][policy]["total"].as_u64();
    assert_eq!(total("items-read"), Some(read));
    assert_eq!(total("items-write"), Some(written));
    assert_eq!(total("completion-tokens"), Some(tokens));
    assert_eq!(
        total("completion-tokens-pro"),
        Some(0),
        "every plan's policy is shown"
    );
    let january = &json["usage"]["items-write"]["buckets"][0];
    assert_eq!(
        (&january["start"], &january["end"]),
        (&1_767_225_600.into(), &1_769_904_000.into())
    );
    assert_eq!(
        (&json["granularity"], &json["time_zone"]),
        (&"month".into(), &"UTC".into())
    );

    // By hour: all of it at noon.
    let hours = "granularity=hour&from=2026-01-15T00:00:00Z&to=2026-01-16T00:00:00Z";
    let (_, body) = send(&app, "GET", &format!("/usage?{hours}"), "demo-ada").await;
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let buckets = json["usage"]["completion-tokens"]["buckets"]
        .as_array()
        .unwrap();
    assert_eq!(buckets.len(), 1);
    assert_eq!(
        (&buckets[0]["start"], &buckets[0]["units"]),
        (&1_768_478_400.into(), &tokens.into())
    );

    // An operator sees the same; nobody else does.
    let uri = format!("/admin/usage/ada?{JANUARY}");
    let (status, admin_body) = send(&app, "GET", &uri, "operator").await;
    assert_eq!(status, 200);
    let admin: serde_json::Value = serde_json::from_str(&admin_body).unwrap();
    assert_eq!(
        admin["usage"]["items-write"]["total"].as_u64(),
        Some(written)
    );
    assert_eq!(
        admin["usage"]["completion-tokens"]["total"].as_u64(),
        Some(tokens)
    );
    assert_eq!(send(&app, "GET", &uri, "wrong").await.0, 403);
}

#[tokio::test]
async fn bad_parameters_are_400() {
    let app = demo();
    for query in [
        "granularity=week",
        "from=yesterday",
        "to=2026-13-01",
        "from=2026-02-01&to=2026-01-01",
        "granularity=hour&from=2020-01-01&to=2026-01-01",
        "from=%ZZ",
    ] {
        let (status, body) = send(&app, "GET", &format!("/usage?{query}"), "demo-ada").await;
        assert_eq!(status, 400, "{query}: {body}");
        let (status, admin_body) = send(
            &app,
            "GET",
            &format!("/admin/usage/ada?{query}"),
            "operator",
        )
        .await;
        assert_eq!(status, 400, "{query}");
        // The operator is told as the caller is: the same problem.
        let json = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
        assert_eq!(json(&admin_body), json(&body), "{query}");
    }
    let (status, body) = send(&app, "GET", "/usage?granularity=week", "demo-ada").await;
    assert_eq!(status, 400);
    assert!(
        body.contains("invalid setting granularity: use hour, day or month"),
        "{body}"
    );
    // Without a user: 401, as every authenticated route.
    assert_eq!(send(&app, "GET", "/usage", "nobody").await.0, 401);
}

/// A client that says its completion used more tokens than any call of
/// the demo does, or a count that does not parse, gets a 400, and its
/// quota is not charged for them: a count of 2^64 - 1 was settled, and
/// locked the user out for decades.
#[tokio::test]
async fn a_completion_of_more_tokens_than_any_call_uses_is_a_400_and_charges_nothing() {
    let app = demo();
    let uri = format!("/api/complete?tokens={}", u64::MAX);
    let (status, body) = send(&app, "POST", &uri, "demo-ada").await;
    assert_eq!(
        (status, body.as_str()),
        (400, "tokens must be at most 100000\n")
    );
    let (status, body) = send(&app, "POST", "/api/complete?tokens=100001", "demo-ada").await;
    assert_eq!(status, 400, "{body}");
    // A count that does not parse, or past 2^64 - 1, likewise (each was
    // refused before the handler and kept its reservation of 200: ten of
    // them spent the 2,000 of the minute).
    for tokens in ["abc", "-1", "18446744073709551616"] {
        for _ in 0..10 {
            let uri = format!("/api/complete?tokens={tokens}");
            let (status, body) = send(&app, "POST", &uri, "demo-ada").await;
            assert_eq!(status, 400, "{tokens}: {body}");
        }
    }
    let (status, body) = send(&app, "POST", "/api/complete?tokens=1500", "demo-ada").await;
    assert_eq!(status, 200, "{body}");
    let (_, body) = send(&app, "GET", &format!("/usage?{JANUARY}"), "demo-ada").await;
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        json["usage"]["completion-tokens"]["total"].as_u64(),
        Some(1_500)
    );
}
