//! Requests held until they are admitted: waiting mode, and the leaky
//! bucket's delays.

use std::time::Duration;

use http::StatusCode;
use tollgate::{
    Algorithm, GlobalKey, Key, MemoryStore, Policy, RateLimitLayer, Store, Timestamp, TokioClock,
};
use tower::ServiceExt;

use super::{T0, app, get_root};

#[tokio::test(start_paused = true)]
async fn a_leaky_bucket_holds_requests_for_their_delay() {
    let clock = TokioClock::starting_at(Timestamp::from_secs(T0));
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    let policy = Policy::new("shape", Algorithm::LeakyBucket, "4/s").unwrap();
    let app = app(RateLimitLayer::new(policy, GlobalKey).store(store));
    let start = tokio::time::Instant::now();
    let handles: Vec<_> = (0..5)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let res = app.oneshot(get_root()).await.unwrap();
                (res.status(), start.elapsed())
            })
        })
        .collect();
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await.unwrap());
    }
    results.sort_by_key(|r| (r.1, r.0.as_u16()));
    let ms = |n| Duration::from_millis(n);
    assert_eq!(
        results,
        vec![
            (StatusCode::OK, ms(0)),
            (StatusCode::TOO_MANY_REQUESTS, ms(0)),
            (StatusCode::OK, ms(250)),
            (StatusCode::OK, ms(500)),
            (StatusCode::OK, ms(750)),
        ]
    );
}

async fn six_at_once(max_wait: Duration) -> Vec<(u128, u16)> {
    let clock = TokioClock::starting_at(Timestamp::from_secs(T0));
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    let policy = Policy::new("outbound", Algorithm::SlidingLog, "2/s").unwrap();
    let app = app(RateLimitLayer::new(policy, GlobalKey)
        .store(store)
        .wait(max_wait));
    let start = tokio::time::Instant::now();
    let handles: Vec<_> = (0..6)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let res = app.oneshot(get_root()).await.unwrap();
                (start.elapsed().as_millis(), res.status().as_u16())
            })
        })
        .collect();
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await.unwrap());
    }
    results.sort_unstable();
    results
}

#[tokio::test(start_paused = true)]
async fn waiting_mode_holds_requests_until_admitted() {
    // Two pass at once. The other four could be admitted in 1 s, within
    // the 1.5 s allowed, so they wait; two of them then win, and the last
    // two, whose turn would come after 2 s, are rejected at 1 s.
    assert_eq!(
        six_at_once(Duration::from_millis(1_500)).await,
        [
            (0, 200),
            (0, 200),
            (1_000, 200),
            (1_000, 200),
            (1_000, 429),
            (1_000, 429)
        ]
    );
    // With 2.5 s, everyone gets through.
    assert_eq!(
        six_at_once(Duration::from_millis(2_500)).await,
        [
            (0, 200),
            (0, 200),
            (1_000, 200),
            (1_000, 200),
            (2_000, 200),
            (2_000, 200)
        ]
    );
    // With 0.5 s nobody waits in vain: the four are rejected at once.
    assert_eq!(
        six_at_once(Duration::from_millis(500)).await,
        [(0, 200), (0, 200), (0, 429), (0, 429), (0, 429), (0, 429)]
    );
}

/// A wait of `Duration::MAX` (no bound) and a retry time of centuries
/// are past what an instant can hold: the layer neither panics nor gives
/// up early. A request waits its hour, and one whose admission is past
/// any instant is rejected at once.
#[tokio::test(start_paused = true)]
async fn an_unbounded_wait_holds_requests_without_overflowing() {
    let clock = TokioClock::starting_at(Timestamp::from_secs(T0));
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    let hourly = Policy::new("hourly", Algorithm::Gcra, "1/h").unwrap();
    let layer = RateLimitLayer::new(hourly, GlobalKey).store(store.clone());
    let app = app(layer.wait(Duration::MAX));
    let start = tokio::time::Instant::now();
    for expected in [0, 3_600] {
        let res = app.clone().oneshot(get_root()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(start.elapsed().as_secs(), expected);
    }
    // Blocked for good: the block's end is past any instant.
    let hourly = Policy::new("hourly", Algorithm::Gcra, "1/h").unwrap();
    store
        .block(&Key::global(), &hourly, Duration::MAX)
        .await
        .unwrap();
    let start = tokio::time::Instant::now();
    let res = app.oneshot(get_root()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(start.elapsed(), Duration::ZERO);
}

/// A request with a gRPC deadline (`grpc-timeout`) shorter than the
/// layer's wait waits no longer than its deadline: one that would be
/// admitted after it is rejected at once, not held until its caller has
/// given up (with its unit taken); one whose deadline leaves time waits
/// as before. A malformed `grpc-timeout` leaves the layer's wait.
#[tokio::test(start_paused = true)]
async fn a_request_waits_no_longer_than_its_grpc_deadline() {
    let clock = TokioClock::starting_at(Timestamp::from_secs(T0));
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    let policy = Policy::new("rpc", Algorithm::Gcra, "1/s").unwrap();
    let app = app(RateLimitLayer::new(policy, GlobalKey)
        .store(store)
        .wait(Duration::from_secs(30)));
    let with_timeout = |timeout: &str| {
        let mut request = get_root();
        let value = http::HeaderValue::from_str(timeout).unwrap();
        request.headers_mut().insert("grpc-timeout", value);
        request
    };
    let start = tokio::time::Instant::now();
    let at = |start: tokio::time::Instant| start.elapsed().as_millis();
    let first = app.clone().oneshot(with_timeout("100m")).await.unwrap();
    assert_eq!((first.status(), at(start)), (StatusCode::OK, 0));
    // Its turn is in 1 s, past its 500 ms: refused now.
    let short = app.clone().oneshot(with_timeout("500m")).await.unwrap();
    assert_eq!(
        (short.status(), at(start)),
        (StatusCode::TOO_MANY_REQUESTS, 0)
    );
    // 2 s leaves time: it waits its second.
    let long = app.clone().oneshot(with_timeout("2S")).await.unwrap();
    assert_eq!((long.status(), at(start)), (StatusCode::OK, 1_000));
    // Not a deadline: the layer's 30 s hold.
    let odd = app.clone().oneshot(with_timeout("1.5S")).await.unwrap();
    assert_eq!((odd.status(), at(start)), (StatusCode::OK, 2_000));
}
