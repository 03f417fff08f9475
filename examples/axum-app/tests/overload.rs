//! The demo's `[overload]` section and `GET /work`: the stand-in backend
//! behind the adaptive limit sheds by `x-priority` at its reserved
//! ceilings, the admin routes show its state and resize the backend, and
//! a bad section is refused naming the field. On Tokio's paused clock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use axum::Router;
use axum::body::Body;
use axum_app::{AdminToken, AppConfig, Overload};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

const ROUTE: &str = "[[route]]\nmethod = \"GET\"\npath = \"/api/items\"\nname = \"items\"\n\
                     key = \"user\"\nalgorithm = \"gcra\"\nlimits = [\"5/s\"]\n";

/// One worker taking a second per request, and a limit fixed at 5, one
/// slot kept for critical requests and one more for default ones.
fn config() -> AppConfig {
    AppConfig::parse(&format!(
        "{ROUTE}[overload]\nworkers = 1\nservice_ms = 1000\nmin = 5\nmax = 5\ninitial = 5\n\
         reserve_critical = 0.2\nreserve_default = 0.2\n"
    ))
    .unwrap()
}

fn work(class: &str) -> Request<Body> {
    Request::get("/work")
        .header("x-priority", class)
        .body(Body::empty())
        .unwrap()
}

fn admin(method: &str, path: &str, token: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap()
}

async fn json(app: &Router, request: Request<Body>) -> serde_json::Value {
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

/// Sends `count` requests of `class`; returns the tasks still running and
/// how many were shed at once.
async fn send(
    app: &Router,
    class: &'static str,
    count: usize,
) -> (Vec<tokio::task::JoinHandle<StatusCode>>, usize) {
    let mut tasks = Vec::new();
    for _ in 0..count {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            app.oneshot(work(class)).await.unwrap().status()
        }));
    }
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    let (mut running, mut shed) = (Vec::new(), 0);
    for task in tasks {
        if task.is_finished() {
            assert_eq!(task.await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
            shed += 1;
        } else {
            running.push(task);
        }
    }
    (running, shed)
}

#[tokio::test(start_paused = true)]
async fn work_is_shed_by_priority_and_the_admin_routes_show_and_resize_it() {
    let config = config();
    let overload = Overload::new(&config.overload).unwrap();
    let app = overload.routes(AdminToken::new("secret"));

    let (sheddable, shed) = send(&app, "sheddable", 5).await;
    assert_eq!((sheddable.len(), shed), (3, 2));
    let (default, shed) = send(&app, "anything-else", 2).await; // taken as default
    assert_eq!((default.len(), shed), (1, 1));
    let (critical, shed) = send(&app, "CRITICAL", 2).await;
    assert_eq!((critical.len(), shed), (1, 1));

    let state = json(&app, admin("GET", "/admin/overload", "secret")).await;
    assert_eq!(state["limit"], 5);
    assert_eq!(state["in_flight"], 5);
    assert_eq!(state["workers"], 1);
    assert_eq!(state["shed"]["sheddable"], 2);
    assert_eq!(state["shed"]["default"], 1);
    assert_eq!(state["shed"]["critical"], 1);

    // The token is checked before the query: no token, no hint.
    let anonymous = Request::post("/admin/backend").body(Body::empty()).unwrap();
    let anonymous = app.clone().oneshot(anonymous).await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let wrong = app
        .clone()
        .oneshot(admin("POST", "/admin/backend?workers=5", "guess"))
        .await;
    assert_eq!(wrong.unwrap().status(), StatusCode::FORBIDDEN);
    let zero = app
        .clone()
        .oneshot(admin("POST", "/admin/backend?workers=0", "secret"))
        .await;
    assert_eq!(zero.unwrap().status(), StatusCode::BAD_REQUEST);
    let resized = app
        .clone()
        .oneshot(admin("POST", "/admin/backend?workers=5", "secret"))
        .await;
    assert_eq!(resized.unwrap().status(), StatusCode::NO_CONTENT);
    assert_eq!(
        json(&app, admin("GET", "/admin/overload", "secret")).await["workers"],
        5
    );

    // Five workers serve the five in a second.
    let start = tokio::time::Instant::now();
    for task in sheddable.into_iter().chain(default).chain(critical) {
        assert_eq!(task.await.unwrap(), StatusCode::OK);
    }
    assert!(start.elapsed() <= std::time::Duration::from_millis(1_200));
}

#[tokio::test]
async fn an_unprotected_backend_admits_everything_and_says_so() {
    let config = AppConfig::parse(&format!("{ROUTE}[overload]\nprotect = false\n")).unwrap();
    let overload = Overload::new(&config.overload).unwrap();
    assert!(overload.handle().is_none());
    let app = overload.routes(AdminToken::new("secret"));
    let state = json(&app, admin("GET", "/admin/overload", "secret")).await;
    assert_eq!(state["protected"], false);
    assert_eq!(state["workers"], 40);
}

#[test]
fn a_bad_overload_section_is_refused_naming_the_field() {
    for (section, field) in [
        ("workers = 0", "workers"),
        ("service_ms = -1.0", "service_ms"),
        ("algorithm = \"fast\"", "algorithm"),
        ("min = 10\nmax = 5", "minimum is above the maximum"),
        (
            "reserve_critical = 0.7\nreserve_default = 0.4",
            "add up to less than 1",
        ),
        ("queue = 10", "queue and queue_wait_ms"),
        ("warm_up_from = 10", "warm_up_from and warm_up_secs"),
        ("speed = 1", "unknown field"),
    ] {
        let error = AppConfig::parse(&format!("{ROUTE}[overload]\n{section}\n")).unwrap_err();
        assert!(error.to_string().contains(field), "{section}: {error}");
    }
}
