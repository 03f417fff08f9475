//! `RateLimiter::until_ready` where an operator's reset or block meets
//! it, and when its future is dropped: on tokio's paused clock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tollgate::{
    Algorithm, Key, MemoryOverrides, MemoryStore, Override, OverrideStore, Policy, RateLimiter,
    Timestamp, TokioClock, WaitError,
};

const T0: Timestamp = Timestamp::from_secs(1_700_000_040);

fn memory() -> MemoryStore {
    MemoryStore::builder()
        .clock(TokioClock::starting_at(T0))
        .build()
        .unwrap()
}

/// A partner's pace: GCRA, 10 a second, with a burst of 1.
fn partner() -> Policy {
    Policy::builder("partner")
        .algorithm(Algorithm::Gcra)
        .limit("10/s")
        .burst(1)
        .build()
        .unwrap()
}

/// The head of a key's line waits out an hour's block; the operator resets
/// the key. The head checks again at once, and a caller that comes after,
/// ready to wait 5 s, is admitted in its turn: not turned away for the
/// head's old expectation of an hour.
#[tokio::test(start_paused = true)]
async fn a_reset_renews_the_line_of_its_key() {
    let limiter = RateLimiter::with_store(partner(), memory());
    let key = Key::custom("partner");
    limiter
        .block(&key, Duration::from_secs(3600))
        .await
        .unwrap();
    let start = Instant::now();
    let head = {
        let (limiter, key) = (limiter.clone(), key.clone());
        tokio::spawn(async move {
            let admitted = limiter.until_ready(&key, Duration::from_secs(7200)).await;
            (admitted.is_ok(), start.elapsed())
        })
    };
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    limiter.reset(&key).await.unwrap();
    // The unit there is, taken: the next caller is refused, and waits in
    // line behind the head.
    assert!(limiter.check(&key).await.unwrap().is_allowed());
    let next = limiter.until_ready(&key, Duration::from_secs(5)).await;
    assert!(next.is_ok(), "{next:?}");
    // The head a unit after the reset, the next caller a unit later.
    assert_eq!(head.await.unwrap(), (true, Duration::from_millis(100)));
    assert_eq!(start.elapsed(), Duration::from_millis(200));
}

/// A cost no limit can hold is refused at once, also on a key blocked for
/// a while: not once the block is over.
#[tokio::test(start_paused = true)]
async fn a_cost_above_capacity_is_refused_at_once_on_a_blocked_key() {
    let policy = Policy::new("cap", Algorithm::Gcra, "10/s").unwrap();
    let limiter = RateLimiter::with_store(policy.clone(), memory());
    let key = Key::custom("blocked");
    limiter.block(&key, Duration::from_secs(3)).await.unwrap();
    let start = Instant::now();
    let refused = limiter
        .until_n_ready(&key, 11, Duration::from_secs(10))
        .await;
    assert!(
        matches!(
            refused,
            Err(WaitError::CostExceedsCapacity {
                cost: 11,
                capacity: 10,
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(start.elapsed(), Duration::ZERO);

    // An operator's deny for a while: the same.
    let overrides = MemoryOverrides::with_clock(TokioClock::starting_at(T0));
    let denied = Key::custom("denied");
    let deny = Some(Duration::from_secs(3));
    overrides
        .set(&denied, &policy, Override::Deny, deny)
        .await
        .unwrap();
    let limiter = RateLimiter::with_store(policy, memory()).overrides(overrides);
    let refused = limiter
        .until_n_ready(&denied, 11, Duration::from_secs(10))
        .await;
    assert!(
        matches!(refused, Err(WaitError::CostExceedsCapacity { .. })),
        "{refused:?}"
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
}

/// A wait admitted at once returns on its first poll, with the task's
/// budget spent (as after draining a busy channel): a future dropped
/// there (the losing branch of a `select!`) never took a unit unknown to
/// its caller.
#[tokio::test(start_paused = true)]
async fn a_wait_admitted_at_once_is_ready_on_its_first_poll() {
    let policy = Policy::new("hourly", Algorithm::FixedWindow, "1/h").unwrap();
    let limiter = RateLimiter::with_store(policy, memory());
    let key = Key::custom("job");
    let ready = std::future::poll_fn(|cx| {
        while pin!(tokio::task::consume_budget()).poll(cx).is_ready() {}
        let mut wait = pin!(limiter.until_ready(&key, Duration::from_secs(1)));
        Poll::Ready(wait.as_mut().poll(cx).is_ready())
    })
    .await;
    assert!(ready);
    assert_eq!(limiter.status(&key).await.unwrap().remaining(), 0);
}

/// On a fixed window (which frees in bulk: no line), a caller waiting out
/// an hour's block checks again at once when the key is reset.
#[tokio::test(start_paused = true)]
async fn a_reset_wakes_a_caller_waiting_outside_any_line() {
    let policy = Policy::new("window", Algorithm::FixedWindow, "100/min").unwrap();
    let limiter = RateLimiter::with_store(policy, memory());
    let key = Key::custom("window");
    limiter
        .block(&key, Duration::from_secs(3600))
        .await
        .unwrap();
    let start = Instant::now();
    let waiting = {
        let (limiter, key) = (limiter.clone(), key.clone());
        tokio::spawn(async move { limiter.until_ready(&key, Duration::from_secs(7200)).await })
    };
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    limiter.reset(&key).await.unwrap();
    assert!(waiting.await.unwrap().is_ok());
    assert_eq!(start.elapsed(), Duration::ZERO);
}
