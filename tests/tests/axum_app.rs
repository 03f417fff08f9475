//! The example app end to end: every route of the bundled policy file, on
//! the in-memory store and on Redis, and over real TCP.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

#[path = "../../crates/tollgate/tests/support/flaky.rs"]
mod flaky;
#[path = "axum_app/operators.rs"]
mod operators;
#[path = "axum_app/routes.rs"]
mod routes;
#[path = "axum_app/settling.rs"]
mod settling;

use axum::Router;
use axum::body::Body;
use axum_app::AppConfig;
use http::{Request, Response};
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

async fn json(app: &Router, request: Request<Body>) -> (u16, serde_json::Value) {
    let res = app.clone().oneshot(request).await.unwrap();
    let status = res.status().as_u16();
    let body = axum::body::to_bytes(res.into_body(), 100_000)
        .await
        .unwrap();
    (status, serde_json::from_slice(&body).unwrap_or_default())
}
