//! Beyond single decisions: the same responses and headers through the
//! layer, and `tollgate-core`'s conformance suite on the Redis store.

use std::time::Duration;

use tollgate_core::{Algorithm, Key, MemoryStore, Policy, Store, Timestamp};

use super::harness::{Harness, RT};

#[test]
fn identical_responses_and_headers_through_the_layer() {
    use axum::Router;
    use axum::body::Body;
    use axum::routing::get;
    use tollgate::{GlobalKey, RateLimitLayer};
    use tower::ServiceExt;

    let harness = Harness::new("headers");
    let mut statuses = Vec::new();
    harness
        .clock
        .set(Timestamp::from_micros(1_700_000_012_345_678));
    RT.block_on(async {
        for algorithm in Algorithm::ALL {
            let policy = Policy::builder(format!("hdr-{algorithm}"))
                .algorithm(algorithm)
                .limit("3/2s")
                .limit("5/min")
                .build()
                .unwrap();
            let memory = MemoryStore::builder()
                .clock(harness.clock.clone())
                .build()
                .unwrap();
            let route = || Router::new().route("/", get(|| async { "ok" }));
            let on_memory =
                route().layer(RateLimitLayer::new(policy.clone(), GlobalKey).store(memory));
            let on_redis = route()
                .layer(RateLimitLayer::new(policy.clone(), GlobalKey).store(harness.redis.clone()));
            for step in 0..12u64 {
                harness.clock.advance(Duration::from_millis(step * 137));
                let mut replies = Vec::new();
                for app in [&on_memory, &on_redis] {
                    let res = app
                        .clone()
                        .oneshot(http::Request::new(Body::empty()))
                        .await
                        .unwrap();
                    let status = res.status().as_u16();
                    let headers: Vec<(String, String)> = res
                        .headers()
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
                        .collect();
                    let body = axum::body::to_bytes(Body::new(res.into_body()), 4096)
                        .await
                        .unwrap();
                    replies.push((status, headers, body));
                }
                assert_eq!(replies[0], replies[1], "{algorithm}, step {step}");
                statuses.push(replies[0].0);
            }
        }
    });
    // The scenario exercises both outcomes.
    assert!(
        statuses.contains(&200) && statuses.contains(&429),
        "{statuses:?}"
    );
}

/// The conformance suite of `tollgate-core`'s `testing` feature, as any
/// third-party store would run it: on both script orders.
#[test]
fn the_redis_store_passes_the_conformance_suite() {
    let harness = Harness::new("suite");
    for store in [&harness.redis, &harness.reading_first] {
        let report = RT
            .block_on(tollgate_core::testing::check_store(store, &harness.clock))
            .unwrap();
        // Thirty cases of the algorithms, eight of calendar periods (the
        // fixed window across month ends, the leap day of 2028 and
        // daylight-saving changes), and nine boundaries checked exactly.
        assert_eq!((report.cases, report.decisions), (41, 41 * 240));
        assert_eq!(report.boundaries, 9);
        // As many settlements and blocks as the memory store's run.
        assert_eq!((report.settlements, report.blocks), (827, 41));
    }
    // Boxed, as a service that picks its store at run time holds it; what
    // the store last knew of a key passes through too.
    let boxed = tollgate_core::BoxStore::new(harness.redis.clone());
    let report = RT
        .block_on(tollgate_core::testing::check_store(&boxed, &harness.clock))
        .unwrap();
    assert_eq!(report.decisions, 41 * 240);
    let policy = Policy::new("boxed", Algorithm::FixedWindow, "5/h").unwrap();
    let key = Key::user("boxed");
    let decided = RT.block_on(boxed.check(&key, &policy, 2)).unwrap();
    assert_eq!(boxed.last_known(&key, &policy), Some(decided));
}
