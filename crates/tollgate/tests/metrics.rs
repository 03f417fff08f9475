//! Store failures are counted through the `metrics` facade, every one of
//! them, while the warning about them is throttled.
#![cfg(feature = "metrics")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::Request;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tollgate::{
    Algorithm, FailureMode, HeaderKey, MemoryStore, Policy, RateLimitLayer, STORE_FAILURES,
};
use tower::ServiceExt;

#[test]
fn every_store_failure_is_counted_by_policy_and_mode() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            // A store with room for one key: every other key fails.
            let full = MemoryStore::builder().max_keys(1).build().unwrap();
            let policy = Policy::new("counted", Algorithm::FixedWindow, "5/min").unwrap();
            let app = Router::new().route("/", get(|| async { "ok" })).layer(
                RateLimitLayer::new(
                    policy,
                    HeaderKey::new(http::HeaderName::from_static("x-client")),
                )
                .store(full)
                .on_store_error(FailureMode::Open),
            );
            for i in 0..8 {
                let req = Request::get("/")
                    .header("x-client", format!("c{i}"))
                    .body(Body::empty())
                    .unwrap();
                app.clone().oneshot(req).await.unwrap();
            }
        });
    });
    let counters: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == STORE_FAILURES)
        .collect();
    assert_eq!(counters.len(), 1);
    let (key, _, _, value) = &counters[0];
    let labels: Vec<(String, String)> = key
        .key()
        .labels()
        .map(|l| (l.key().to_owned(), l.value().to_owned()))
        .collect();
    assert_eq!(
        labels,
        [
            ("policy".to_owned(), "counted".to_owned()),
            ("failure_mode".to_owned(), "open".to_owned())
        ]
    );
    // The first client fits; the seven others fail.
    assert_eq!(value, &DebugValue::Counter(7));
}
