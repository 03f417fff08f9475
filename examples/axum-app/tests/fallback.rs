//! `instances` in the policy file: while the store fails, under `failure =
//! "local"`, each app server enforces its share of every limit, rate and
//! in-flight alike, the limit divided by the number of servers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum_app::{AppConfig, app};
use http::Request;
use tollgate::{BoxStore, Decision, Key, Policy, Settlement, Store, StoreError};
use tower::ServiceExt;

/// A store that is down: every call fails, as Redis's do while it is
/// unreachable.
struct Down;

fn down() -> StoreError {
    StoreError::unavailable(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "connection refused",
    ))
}

impl Store for Down {
    async fn check(&self, _: &Key, _: &Policy, _: u64) -> Result<Decision, StoreError> {
        Err(down())
    }

    async fn reset(&self, _: &Key, _: &Policy) -> Result<(), StoreError> {
        Err(down())
    }

    async fn settle(&self, _: &Key, _: &Policy, _: Settlement) -> Result<Decision, StoreError> {
        Err(down())
    }

    async fn block(&self, _: &Key, _: &Policy, _: Duration) -> Result<(), StoreError> {
        Err(down())
    }
}

/// One route, 10 an hour per user (a token bucket: none comes back within
/// the test), on `instances` servers.
fn config(instances: u64) -> AppConfig {
    AppConfig::parse(&format!(
        "failure = \"local\"\ninstances = {instances}\n\
         [[route]]\nmethod = \"GET\"\npath = \"/api/items\"\nname = \"fallback-share\"\n\
         key = \"user\"\nalgorithm = \"token_bucket\"\nlimits = [\"10/h\"]\n"
    ))
    .unwrap()
}

/// How many of 20 requests of `user` the app admits on a store that is
/// down, and the `x-ratelimit-limit` of the first.
async fn admitted(config: &AppConfig, user: &str) -> (usize, String) {
    let app = app(config, BoxStore::new(Down)).layer(MockConnectInfo(SocketAddr::from((
        [198, 51, 100, 20],
        5555,
    ))));
    let mut admitted = 0;
    let mut limit = None;
    for _ in 0..20 {
        let request = Request::get("/api/items")
            .header("authorization", format!("Bearer demo-{user}"))
            .body(Body::empty())
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        assert!(status == 200 || status == 429, "{status}");
        admitted += usize::from(status == 200);
        limit.get_or_insert_with(|| {
            response.headers()["x-ratelimit-limit"]
                .to_str()
                .unwrap()
                .to_owned()
        });
    }
    (admitted, limit.unwrap())
}

#[tokio::test]
async fn with_two_instances_each_enforces_half_while_the_store_is_down() {
    // The local fallback is one store for the process: a user per case.
    assert_eq!(admitted(&config(1), "alone").await, (10, "10".to_owned()));
    assert_eq!(
        admitted(&config(2), "one-of-two").await,
        (5, "5".to_owned())
    );
    assert_eq!(
        admitted(&config(3), "one-of-three").await,
        (3, "3".to_owned())
    );
}

#[tokio::test]
async fn the_in_flight_limit_follows_the_failure_settings_while_the_store_is_down() {
    // At most 2 exports of a user at once, on 2 servers: 1 here.
    let config = AppConfig::parse(
        "failure = \"local\"\ninstances = 2\n\
         [[route]]\nmethod = \"GET\"\npath = \"/api/export\"\nname = \"fallback-export\"\n\
         key = \"user\"\nalgorithm = \"token_bucket\"\nlimits = [\"100/h\"]\nin_flight = 2\n",
    )
    .unwrap();
    let app = app(&config, BoxStore::new(Down)).layer(MockConnectInfo(SocketAddr::from((
        [198, 51, 100, 21],
        5555,
    ))));
    let mut running = Vec::new();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let request = Request::get("/api/export?rows=50")
            .header("authorization", "Bearer demo-exporter")
            .body(Body::empty())
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        statuses.push(response.status().as_u16());
        // The export streams on while its body is held: so is its slot.
        running.push(response);
    }
    assert_eq!(statuses, [200, 429, 429]);
    // The refusal tells the limit that refused: this server's share.
    assert_eq!(running[1].headers()["x-concurrency-limit"], "1");
}
