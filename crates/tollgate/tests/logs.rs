//! Logs: one debug event per decision, throttled warnings for store
//! failures, and never a raw key.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

#[path = "support/down.rs"]
mod down;

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::Request;
use tollgate::{Algorithm, FailureMode, HeaderKey, MemoryStore, Policy, RateLimitLayer};
use tower::ServiceExt;

use down::Down;

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

fn logged(test: impl AsyncFnOnce()) -> String {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        // Paused time: the throttles see every request at one instant,
        // however slow the machine.
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(test());
    });
    String::from_utf8(captured.0.lock().unwrap().clone()).unwrap()
}

async fn send(app: &Router, client: &str) -> u16 {
    send_with(app, &[("x-client", client)]).await
}

/// The status of a request to `app` with `headers`.
async fn send_with(app: &Router, headers: &[(&str, &str)]) -> u16 {
    let request = (headers.iter())
        .fold(Request::get("/"), |request, (name, value)| {
            request.header(*name, *value)
        })
        .body(Body::empty())
        .unwrap();
    app.clone()
        .oneshot(request)
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn app(policy: &str, store: MemoryStore, failure: FailureMode) -> Router {
    let policy = Policy::new(policy, Algorithm::Gcra, "2/h").unwrap();
    Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(
            policy,
            HeaderKey::new(http::HeaderName::from_static("x-client")),
        )
        .store(store)
        .on_store_error(failure),
    )
}

#[test]
fn every_decision_is_a_debug_event_without_the_key() {
    let logs = logged(async || {
        let app = app("logged", MemoryStore::new(), FailureMode::Local);
        let statuses = [
            send(&app, "secret-user-42").await,
            send(&app, "secret-user-42").await,
            send(&app, "secret-user-42").await,
        ];
        assert_eq!(statuses, [200, 200, 429]);
    });
    let decisions: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("rate-limit decision"))
        .collect();
    assert_eq!(decisions.len(), 3, "{logs}");
    assert!(
        decisions
            .iter()
            .all(|l| l.contains("DEBUG") && l.contains("policy=\"logged\""))
    );
    assert!(decisions[0].contains("outcome=\"allowed\"") && decisions[0].contains("remaining=1"));
    // A refusal names the limit that fired.
    assert!(
        decisions[2].contains("outcome=\"limited\"")
            && decisions[2].contains("limit=2/h")
            && decisions[2].contains("limit_index=0"),
        "{}",
        decisions[2]
    );
    assert!(
        !logs.contains("secret-user-42"),
        "a raw key was logged: {logs}"
    );
}

#[test]
fn a_failing_store_logs_one_warning_per_second_not_one_per_request() {
    let logs = logged(async || {
        // Room for one key: every other client's request fails.
        let full = MemoryStore::builder().max_keys(1).build().unwrap();
        let app = app("flooded", full, FailureMode::Open);
        for i in 0..500 {
            assert_eq!(send(&app, &format!("client-{i}")).await, 200);
        }
    });
    let warnings: Vec<&str> = logs.lines().filter(|l| l.contains("WARN")).collect();
    // 499 failures within the throttle's second.
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("rate-limit store failed")
            && warnings[0].contains("policy=\"flooded\"")
    );
    assert!(!logs.contains("client-"), "a raw key was logged");
}

/// The warnings of the policies a chooser picks are throttled across
/// every service the layer makes: axum makes one per request for a router
/// called as a service (and one per connection under `axum::serve`). Each
/// made the chosen policies' throttles afresh, so every request logged a
/// warning: 200 of them here, where each of two tenants' policies logs one.
/// Past the policies the layer keeps throttles for (a policy per tenant),
/// the rest share one: 1,030 tenants, then 100 more requests of a new one,
/// log 1,024 warnings (the first tenant's request took the store's one
/// key; 1,023 tenants' own, and one for the rest), not one per request.
#[test]
fn a_chooser_s_policies_log_one_warning_per_second_across_the_layer_s_services() {
    let logs = logged(async || {
        let app = tenants_app();
        for i in 0..100 {
            for tenant in ["a", "b"] {
                let status = send_as(&app, tenant, &format!("client-{tenant}-{i}")).await;
                assert_eq!(status, 200);
            }
        }
    });
    let warnings: Vec<&str> = logs.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(
        warnings.len(),
        2,
        "{:?}",
        &warnings[..warnings.len().min(3)]
    );
    for tenant in ["a", "b"] {
        let theirs = warnings
            .iter()
            .filter(|l| l.contains(&format!("policy=\"tenant-{tenant}\"")));
        assert_eq!(theirs.count(), 1, "{warnings:?}");
    }

    let logs = logged(async || {
        let app = tenants_app();
        for tenant in 0..1_030 {
            let status = send_as(&app, &format!("{tenant}"), &format!("client-{tenant}")).await;
            assert_eq!(status, 200);
        }
        for i in 0..100 {
            assert_eq!(send_as(&app, "new", &format!("client-new-{i}")).await, 200);
        }
    });
    let warnings = logs.lines().filter(|l| l.contains("WARN")).count();
    assert_eq!(warnings, 1_024);
}

/// An in-flight layer's warnings are throttled across the services it
/// makes: each service made its throttles afresh, so a router called as
/// a service logged every request's store failure (50 here), and one
/// under `axum::serve` every connection's first.
#[test]
fn an_in_flight_limit_logs_one_warning_per_second_across_its_services() {
    let logs = logged(async || {
        let limit = tollgate::InFlightLimit::new("exports", 2).unwrap();
        let layer = tollgate::InFlightLayer::new(limit, tollgate::GlobalKey)
            .store(Down)
            .local_fallback(MemoryStore::new());
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .route_layer(layer);
        for i in 0..50 {
            assert_eq!(send(&app, &format!("client-{i}")).await, 200);
        }
    });
    let warnings = logs.lines().filter(|l| l.contains("WARN")).count();
    assert_eq!(warnings, 1);
}

/// An app whose layer limits each tenant (header `x-tenant`) by a policy
/// of its own, made per request, on a store with room for one key, failing
/// open.
fn tenants_app() -> Router {
    let full = MemoryStore::builder().max_keys(1).build().unwrap();
    let own = Policy::new("own", Algorithm::Gcra, "2/h").unwrap();
    let layer = RateLimitLayer::new(
        own,
        HeaderKey::new(http::HeaderName::from_static("x-client")),
    )
    .store(full)
    .on_store_error(FailureMode::Open)
    .choose_policy(|req: &Request<Body>| {
        let tenant = req.headers().get("x-tenant")?.to_str().ok()?;
        Policy::new(format!("tenant-{tenant}"), Algorithm::Gcra, "2/h").ok()
    });
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

async fn send_as(app: &Router, tenant: &str, client: &str) -> u16 {
    send_with(app, &[("x-tenant", tenant), ("x-client", client)]).await
}

#[test]
fn requests_without_their_key_are_400s_logged_at_most_once_a_second() {
    let logs = logged(async || {
        let app = app("keyless", MemoryStore::new(), FailureMode::Local);
        for _ in 0..500 {
            let request = Request::get("/").body(Body::empty()).unwrap();
            let status = app.clone().oneshot(request).await.unwrap().status();
            assert_eq!(status, 400);
        }
    });
    let lines: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("without its rate-limit key"))
        .collect();
    // 500 requests within the throttle's second; none of them is an
    // error line.
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("policy=\"keyless\"") && lines[0].contains("x-client"));
    assert!(!logs.contains("ERROR"), "{logs}");
}

#[test]
fn a_span_records_the_fields_it_declared_and_only_those() {
    use tracing::Instrument;
    use tracing::field::Empty;
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(async {
                let app = app("spans", MemoryStore::new(), FailureMode::Local);
                // One of tollgate's fields only, among others.
                let some =
                    tracing::info_span!("some", method = "GET", { tollgate::trace::STORE } = Empty);
                send(&app, "a").instrument(some).await;
                // None of them.
                let none = tracing::info_span!("none", method = "GET");
                send(&app, "a").instrument(none).await;
                // The fields on an outer span only: the current span is
                // the inner one, which records nothing.
                let outer = tracing::info_span!("outer", { tollgate::trace::OUTCOME } = Empty);
                let inner = tracing::info_span!(parent: &outer, "inner", path = "/");
                send(&app, "a").instrument(inner).instrument(outer).await;
            });
    });
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let closed: Vec<&str> = logs.lines().filter(|l| l.contains("close")).collect();
    assert_eq!(closed.len(), 4, "{logs}");
    assert!(
        closed[0].contains(r#"some{method="GET" tollgate.store="memory"}"#),
        "{logs}"
    );
    assert!(closed[1].contains(r#"none{method="GET"}"#), "{logs}");
    assert!(closed[2].contains(r#"inner{path="/"}"#), "{logs}");
    assert!(closed[3].contains(" outer: "), "{logs}");
    assert!(!logs.contains("tollgate.outcome"), "{logs}");
}

/// A blocked key's refusal fired no limit: its debug event and its span
/// say `blocked`, as its `tollgate-exceeded` header does, not the
/// policy's limit.
#[test]
fn a_blocked_keys_refusal_is_logged_and_traced_as_a_block() {
    use tollgate::Store;
    use tracing::Instrument;
    use tracing::field::Empty;
    let logs = logged(async || {
        let store = MemoryStore::new();
        let policy = Policy::new("blocks", Algorithm::Gcra, "2/h").unwrap();
        let key = tollgate::Key::header("abuser");
        store
            .block(&key, &policy, std::time::Duration::from_secs(600))
            .await
            .unwrap();
        let app = app("blocks", store, FailureMode::Local);
        let span = tracing::info_span!(
            "request",
            { tollgate::trace::OUTCOME } = Empty,
            { tollgate::trace::LIMIT } = Empty,
        );
        let status = send(&app, "abuser").instrument(span.clone()).await;
        assert_eq!(status, 429);
        drop(span);
    });
    let decision = logs.lines().find(|l| l.contains("rate-limit decision"));
    let decision = decision.unwrap_or_else(|| panic!("{logs}"));
    assert!(
        decision.contains("outcome=\"limited\"")
            && decision.contains("limit=blocked")
            && !decision.contains("limit_index"),
        "{decision}"
    );
    assert!(
        logs.contains(r#"tollgate.outcome="limited" tollgate.limit=blocked"#),
        "{logs}"
    );
}
