//! `RateLimiter::until_ready`'s line per key, where features meet it:
//! callers that come later, callers whose maximum wait is shorter than
//! the head's, and the local fallback in an outage. On tokio's paused
//! clock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

#[path = "support/flaky.rs"]
mod flaky;

use std::num::NonZeroU64;
use std::time::Duration;

use tokio::time::Instant;
use tollgate::{
    Algorithm, FailureMode, Key, MemoryStore, Policy, RateLimiter, Timestamp, TokioClock, WaitError,
};

fn memory() -> MemoryStore {
    let clock = TokioClock::starting_at(Timestamp::from_secs(1_700_000_040));
    MemoryStore::builder().clock(clock).build().unwrap()
}

/// A partner's pace: GCRA, 10 a second, with a burst of `burst`.
fn partner(burst: u64) -> Policy {
    Policy::builder("partner")
        .algorithm(Algorithm::Gcra)
        .limit("10/s")
        .burst(burst)
        .build()
        .unwrap()
}

/// Waits for `cost` units of `key` in the background.
fn waiting<St: tollgate::Store + Clone>(
    limiter: &RateLimiter<St>,
    key: &Key,
    cost: u64,
    max_wait: Duration,
) -> tokio::task::JoinHandle<Result<tollgate::Decision, WaitError>> {
    let (limiter, key) = (limiter.clone(), key.clone());
    tokio::spawn(async move { limiter.until_n_ready(&key, cost, max_wait).await })
}

/// A caller behind a head that expects its admission after the caller's
/// maximum wait gives up at once, saying how long the head expects: it
/// slept its whole wait and then said `needed` was that wait (found by a
/// review).
#[tokio::test(start_paused = true)]
async fn a_caller_behind_a_head_due_after_its_wait_gives_up_at_once() {
    let limiter = RateLimiter::with_store(partner(10), memory());
    let key = Key::custom("partner");
    assert!(limiter.check_n(&key, 10).await.unwrap().is_allowed());
    let large = waiting(&limiter, &key, 10, Duration::from_secs(5));
    tokio::task::yield_now().await;
    let start = Instant::now();
    let small = limiter.until_ready(&key, Duration::from_millis(500)).await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    match small {
        Err(WaitError::TooLong { needed, max_wait }) => {
            assert_eq!(
                (needed, max_wait),
                (Duration::from_secs(1), Duration::from_millis(500))
            );
        }
        other => panic!("{other:?}"),
    }
    large.await.unwrap().unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
}

/// In an outage, a cost that only the store can hold (above this
/// instance's share, refused for now) waits outside the line: it held
/// the line for its whole wait, and a caller of one unit that the share
/// admits in 200 ms gave up after 2 s (found by a review).
#[tokio::test(start_paused = true)]
async fn a_cost_only_the_store_can_hold_waits_outside_the_line_in_an_outage() {
    let shared = flaky::Flaky::new(memory());
    shared.fail(true);
    let limiter = RateLimiter::with_store(partner(10), shared)
        .on_store_error(FailureMode::Local)
        .local_fallback(memory())
        .local_divisor(NonZeroU64::new(2).unwrap());
    let key = Key::custom("partner");
    assert!(limiter.check_n(&key, 5).await.unwrap().is_allowed());
    let large = waiting(&limiter, &key, 8, Duration::from_secs(10));
    tokio::task::yield_now().await;
    let start = Instant::now();
    limiter
        .until_ready(&key, Duration::from_secs(2))
        .await
        .unwrap();
    // This instance's share: 5 a second.
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    assert!(matches!(
        large.await.unwrap(),
        Err(WaitError::TooLong { .. })
    ));
}
