//! Workers share a third-party API quota and never exceed it, checked from
//! the API's own arrival times.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use outbound::{
    Outcome, QUOTA, Quota, busiest_windows, client_layer, client_policy, run_workers,
    third_party_api,
};
use tollgate::{MemoryStore, SystemClock, Timestamp, TokioClock};
use tollgate_redis::RedisStore;
use tollgate_tests::{require_redis, unique_prefix};
use tower::ServiceBuilder;

const MAX_WAIT: Duration = Duration::from_secs(600);

/// Every limit of `quota` reached and never exceeded.
fn assert_within_quota(accepted: &[u64], quota: &Quota) {
    for (limit, period, most) in busiest_windows(accepted, quota) {
        let reachable = (limit as usize).min(accepted.len());
        assert_eq!(
            most, reachable,
            "busiest {period:?} window: {most} calls, limit {limit}"
        );
    }
}

/// The real quota, 25 per 5 s and 300 per minute, on tokio's paused clock:
/// limiter and API read one clock, and no test time is spent.
#[tokio::test(start_paused = true)]
async fn eight_workers_share_one_quota_in_memory() {
    let clock = TokioClock::starting_at(Timestamp::from_secs(1_700_000_000));
    let (api, log) = third_party_api(clock, &QUOTA).unwrap();
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    let policy = client_policy(&QUOTA, Duration::ZERO).unwrap();
    let outcome = run_workers(8, 60, |_| {
        ServiceBuilder::new()
            .layer(client_layer(policy.clone(), store.clone(), MAX_WAIT))
            .service(api.clone())
    })
    .await;
    assert_eq!(
        outcome,
        Outcome {
            ok: 480,
            ..Outcome::default()
        }
    );
    let log = log.lock().unwrap();
    assert_eq!(log.rejected, 0, "the API never answered 429");
    assert_eq!(log.accepted.len(), 480);
    assert_within_quota(&log.accepted, &QUOTA);
}

/// Six workers, each with its own Redis connection as separate processes
/// would have. Redis decides by its own clock, so this runs in real time,
/// on a quota scaled down to keep it short (about 1.5 s): 10 per 250 ms and
/// 30 per second. The client adds 100 ms to each period for the time
/// between Redis's decision and the call's arrival at the API: a call
/// delayed 10 ms more than the one ten before it, which a busy 2-core CI
/// machine does produce, would otherwise arrive early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_workers_with_their_own_redis_connections_share_one_quota() {
    const SCALED: [(u64, Duration); 2] = [
        (10, Duration::from_millis(250)),
        (30, Duration::from_secs(1)),
    ];
    let url = require_redis().await;
    let (api, log) = third_party_api(SystemClock, &SCALED).unwrap();
    let prefix = unique_prefix("outbound");
    let mut stores = Vec::new();
    for _ in 0..6 {
        let store = RedisStore::builder()
            .prefix(&prefix)
            .deadline(Duration::from_secs(2))
            .connect(url.as_str())
            .await
            .unwrap();
        stores.push(store);
    }
    let policy = client_policy(&SCALED, Duration::from_millis(100)).unwrap();
    let outcome = run_workers(6, 8, |worker| {
        ServiceBuilder::new()
            .layer(client_layer(
                policy.clone(),
                stores[worker].clone(),
                MAX_WAIT,
            ))
            .service(api.clone())
    })
    .await;
    assert_eq!(
        outcome,
        Outcome {
            ok: 48,
            ..Outcome::default()
        }
    );
    let log = log.lock().unwrap();
    assert_eq!(log.rejected, 0, "the API never answered 429");
    assert_eq!(log.accepted.len(), 48);
    assert_within_quota(&log.accepted, &SCALED);
}
