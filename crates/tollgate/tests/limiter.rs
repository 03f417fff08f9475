//! The direct `RateLimiter` API, on tokio's paused clock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use tokio::time::Instant;
use tollgate::{
    Algorithm, Key, MemoryStore, Policy, RateLimiter, Timestamp, TokioClock, WaitError,
};

fn limiter(policy: Policy) -> RateLimiter {
    let clock = TokioClock::starting_at(Timestamp::from_secs(1_700_000_040));
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    RateLimiter::with_store(policy, store)
}

#[tokio::test(start_paused = true)]
async fn check_and_check_n() {
    let limiter = limiter(Policy::new("jobs", Algorithm::TokenBucket, "10/s").unwrap());
    let key = Key::custom("jobs");
    assert_eq!(limiter.check(&key).await.unwrap().remaining(), 9);
    assert_eq!(limiter.check_n(&key, 4).await.unwrap().remaining(), 5);
    let denied = limiter.check_n(&key, 6).await.unwrap();
    assert_eq!(denied.retry_after(), Some(Duration::from_millis(100)));
    assert_eq!(limiter.check_n(&key, 0).await.unwrap().remaining(), 5);
}

#[tokio::test(start_paused = true)]
async fn until_ready_waits_exactly_until_admission() {
    let limiter = limiter(Policy::new("api", Algorithm::Gcra, "5/s").unwrap());
    let key = Key::custom("partner");
    let start = Instant::now();
    let mut admitted_at = Vec::new();
    for _ in 0..8 {
        limiter
            .until_ready(&key, Duration::from_secs(1))
            .await
            .unwrap();
        admitted_at.push(start.elapsed().as_millis());
    }
    assert_eq!(admitted_at, [0, 0, 0, 0, 0, 200, 400, 600]);
}

#[tokio::test(start_paused = true)]
async fn until_ready_gives_up_at_once_when_the_wait_is_too_long() {
    let limiter = limiter(Policy::new("daily", Algorithm::FixedWindow, "1/day").unwrap());
    let key = Key::custom("report");
    limiter.check(&key).await.unwrap();
    let start = Instant::now();
    let err = limiter
        .until_ready(&key, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(err, WaitError::TooLong { max_wait, .. } if max_wait == Duration::from_secs(5)),
        "{err}"
    );
    assert_eq!(start.elapsed(), Duration::ZERO, "no pointless sleep");

    let err = limiter
        .until_n_ready(&key, 2, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "cost 2 exceeds the capacity 1 of policy daily; it can never be admitted"
    );
}

#[tokio::test(start_paused = true)]
async fn until_ready_includes_the_shaping_delay() {
    let limiter = limiter(Policy::new("shape", Algorithm::LeakyBucket, "2/s").unwrap());
    let key = Key::custom("q");
    let start = Instant::now();
    limiter
        .until_ready(&key, Duration::from_secs(1))
        .await
        .unwrap();
    limiter
        .until_ready(&key, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(500));
}

#[test]
fn a_store_failure_says_why() {
    let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
    let error = WaitError::from(tollgate::StoreError::backend(refused));
    assert_eq!(
        error.to_string(),
        "rate-limit store failed: store backend failed: refused"
    );
}
