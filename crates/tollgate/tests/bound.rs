//! `max_keys` bounds the process: layers whose stores are full all fall
//! back to one shared store, and a full store answers as its failure mode
//! says. (A test binary of its own: it counts the process-wide fallback.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{HeaderName, Request, StatusCode};
use tollgate::{
    Algorithm, FailureMode, HeaderKey, MemoryStore, Policy, RateLimitLayer, shared_fallback,
};
use tower::ServiceExt;

const MAX_KEYS: usize = 1_000;

fn full_store() -> MemoryStore {
    // One shard: exactly MAX_KEYS keys fit.
    MemoryStore::builder()
        .max_keys(MAX_KEYS)
        .shards(1)
        .build()
        .unwrap()
}

fn app(name: &str, store: MemoryStore, failure: FailureMode) -> Router {
    let policy = Policy::new(name, Algorithm::Gcra, "1/h").unwrap();
    let key = HeaderKey::new(HeaderName::from_static("x-client"));
    Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(policy, key)
            .store(store)
            .on_store_error(failure),
    )
}

async fn send(app: &Router, client: usize) -> (StatusCode, bool) {
    let request = Request::get("/")
        .header("x-client", format!("client-{client}"))
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let headers = response.headers().contains_key("x-ratelimit-limit");
    (response.status(), headers)
}

#[tokio::test]
async fn twice_max_keys_through_full_stores_stay_within_the_documented_bound() {
    let fallback = shared_fallback();
    assert_eq!(fallback.len(), 0);
    let stores: Vec<MemoryStore> = (0..3).map(|_| full_store()).collect();
    for (i, store) in stores.iter().enumerate() {
        let app = app(&format!("bound-{i}"), store.clone(), FailureMode::Local);
        // Twice as many clients as the store holds, each once: all admitted,
        // the second half by the shared fallback.
        for client in 0..2 * MAX_KEYS {
            assert_eq!(send(&app, client).await, (StatusCode::OK, true));
        }
        // Clients decided by the fallback are still limited there.
        for client in [MAX_KEYS, 2 * MAX_KEYS - 1] {
            assert_eq!(send(&app, client).await.0, StatusCode::TOO_MANY_REQUESTS);
        }
        assert_eq!(store.len(), MAX_KEYS);
    }
    // One fallback for every layer, holding the overflow of all three.
    assert_eq!(fallback.len(), 3 * MAX_KEYS);
    let held: usize = stores.iter().map(MemoryStore::len).sum::<usize>() + fallback.len();
    let bound: usize =
        stores.iter().map(MemoryStore::max_keys).sum::<usize>() + fallback.max_keys();
    assert_eq!(held, 6 * MAX_KEYS);
    assert!(held <= bound, "{held} keys held, bound {bound}");

    // A full store under the other failure modes.
    let store = full_store();
    let closed = app("bound-closed", store.clone(), FailureMode::Closed);
    let open = app("bound-open", store.clone(), FailureMode::Open);
    for client in 0..MAX_KEYS {
        assert_eq!(send(&closed, client).await.0, StatusCode::OK);
    }
    for client in MAX_KEYS..2 * MAX_KEYS {
        // Closed: refused; open: let through without limit or headers.
        assert_eq!(
            send(&closed, client).await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(send(&open, client).await, (StatusCode::OK, false));
    }
    assert_eq!(store.len(), MAX_KEYS);
    assert_eq!(fallback.len(), 3 * MAX_KEYS, "only local falls back");
}
