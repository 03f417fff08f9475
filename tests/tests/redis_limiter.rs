//! `RateLimiter` on a Redis store that goes down follows its failure
//! policy, like the layer: local (the default) decides in memory, carrying
//! over what Redis last said of the key; closed returns the error; open
//! admits. A server of the test's own, killed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use tollgate::{
    Algorithm, FailureMode, FakeClock, Key, MemoryStore, Policy, RateLimiter, StoreError,
    Timestamp, WaitError,
};
use tollgate_redis::RedisStore;
use tollgate_tests::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_on_a_redis_that_is_down_follows_its_failure_policy() {
    let mut server = RedisServer::spawn();
    let store = RedisStore::builder()
        .prefix("limiter-down")
        .deadline(Duration::from_millis(50))
        .connect(server.url())
        .await
        .unwrap();
    // GCRA, not a fixed window: a window on Redis's clock may end between
    // the decisions Redis made and the fallback's, and a new one admits 5.
    let policy = Policy::new("jobs", Algorithm::Gcra, "5/h").unwrap();
    let key = Key::custom("nightly-export");
    let local =
        RateLimiter::with_store(policy.clone(), store.clone()).local_fallback(MemoryStore::new());
    let closed =
        RateLimiter::with_store(policy.clone(), store.clone()).on_store_error(FailureMode::Closed);
    let open =
        RateLimiter::with_store(policy.clone(), store.clone()).on_store_error(FailureMode::Open);
    assert_eq!(local.failure_mode(), FailureMode::Local, "the default");

    // Redis decides while it is up: 3 of the 5 used.
    for _ in 0..3 {
        assert!(local.check(&key).await.unwrap().is_allowed());
    }

    server.kill();

    // Closed: the store's error, every time, never a hang.
    for _ in 0..3 {
        let error = closed.check(&key).await.unwrap_err();
        assert!(
            matches!(
                error,
                StoreError::Backend(_)
                    | StoreError::Unavailable(_)
                    | StoreError::Timeout(_)
                    | StoreError::CircuitOpen
            ),
            "{error:?}"
        );
    }
    // Open: admitted, whatever the count.
    for _ in 0..10 {
        assert!(open.check(&key).await.unwrap().is_allowed());
    }
    // Local: exactly the 2 Redis had left, then denied; no fresh quota.
    let admitted = {
        let mut admitted = 0;
        for _ in 0..10 {
            admitted += usize::from(local.check(&key).await.unwrap().is_allowed());
        }
        admitted
    };
    assert_eq!(admitted, 2);
    // Waiting on the local decision gives up at once: the window is long.
    let wait = local.until_ready(&key, Duration::from_secs(1)).await;
    assert!(matches!(wait, Err(WaitError::TooLong { .. })), "{wait:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_reset_lets_a_spent_key_in_at_once_and_status_changes_nothing() {
    let url = tollgate_tests::require_redis().await;
    let store = RedisStore::builder()
        .prefix(tollgate_tests::unique_prefix("limiter-reset"))
        .deadline(Duration::from_secs(2))
        .connect(url.as_str())
        .await
        .unwrap();
    let policy = Policy::new("exports", Algorithm::SlidingLog, "5/h").unwrap();
    spend_look_reset(&RateLimiter::new(policy.clone()), || None).await;
    let denials = || Some(store.deny_cache_len());
    spend_look_reset(&RateLimiter::with_store(policy, store.clone()), denials).await;
}

/// Spends a key, looks at it 100 times, resets it and spends it again;
/// `denials` counts the denials a deny cache holds, if there is one.
async fn spend_look_reset<S: tollgate::Store>(
    limiter: &RateLimiter<S>,
    denials: impl Fn() -> Option<usize>,
) {
    let key = Key::user("ada");
    let admitted = |n: usize| async move {
        let mut admitted = 0;
        for _ in 0..n {
            admitted += usize::from(limiter.check(&Key::user("ada")).await.unwrap().is_allowed());
        }
        admitted
    };
    assert_eq!(admitted(8).await, 5);
    // Looking changes nothing, however often.
    for _ in 0..100 {
        let status = limiter.status(&key).await.unwrap();
        assert_eq!((status.remaining(), status.used()), (0, 5));
    }
    assert_eq!(admitted(1).await, 0);
    let held = denials();
    limiter.reset(&key).await.unwrap();
    // A deny cache held the key's denial; the reset dropped it.
    if let Some(held) = held {
        assert_eq!((held, denials()), (1, Some(0)));
    }
    assert_eq!(limiter.status(&key).await.unwrap().remaining(), 5);
    assert_eq!(admitted(8).await, 5);
}

/// Settle and block through `RateLimiter`, on memory and on Redis, with
/// the same exact figures: a refund, a charge into debt with its exact
/// wait, a block whose `Retry-After` is the rest of it to the microsecond,
/// lifted by a reset, and a key that starts afresh when a block ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_and_block_give_the_same_exact_answers_on_memory_and_redis() {
    use tollgate::{FakeClock, Timestamp};
    let url = tollgate_tests::require_redis().await;
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_040));
    let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let redis = RedisStore::builder()
        .prefix(tollgate_tests::unique_prefix("limiter-ops"))
        .deadline(Duration::from_secs(2))
        .test_clock(clock.clone())
        .connect(url.as_str())
        .await
        .unwrap();
    for algorithm in Algorithm::ALL {
        let policy = Policy::new("ops", algorithm, "10/min").unwrap();
        let on_memory = RateLimiter::with_store(policy.clone(), memory.clone());
        let on_redis = RateLimiter::with_store(policy.clone(), redis.clone());
        let mut seen = Vec::new();
        for limiter in [&on_memory as &dyn Ops, &on_redis] {
            clock.set(Timestamp::from_secs(1_700_000_040));
            let key = Key::custom(format!("ops-{algorithm}"));
            seen.push(limiter.run(&key, &clock).await);
        }
        assert_eq!(seen[0], seen[1], "{algorithm}");
        let (refunded, charged, wait, blocked, after_reset, after_block) = seen[0];
        assert_eq!((refunded, charged), (7, 0), "{algorithm}");
        assert!(wait >= Duration::from_secs(36), "{algorithm}: {wait:?}");
        assert_eq!(blocked, Duration::from_micros(90_000_000 - 250_000));
        assert!(after_reset && after_block, "{algorithm}");
    }
}

type Seen = (u64, u64, Duration, Duration, bool, bool);

/// The same steps on a limiter of either store.
trait Ops: Sync {
    fn run<'a>(
        &'a self,
        key: &'a Key,
        clock: &'a tollgate::FakeClock,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Seen> + Send + 'a>>;
}

impl<St: tollgate::Store> Ops for RateLimiter<St> {
    fn run<'a>(
        &'a self,
        key: &'a Key,
        clock: &'a tollgate::FakeClock,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Seen> + Send + 'a>> {
        Box::pin(async move {
            // Reserve 10, use 3: 7 back.
            let reservation = self.check_n(key, 10).await.unwrap();
            let refunded = self.settle(key, &reservation, 10, 3).await.unwrap();
            // Reserve the 7, use 13: 6 in debt.
            let reservation = self.check_n(key, 7).await.unwrap();
            assert!(reservation.is_allowed());
            let charged = self.settle(key, &reservation, 7, 13).await.unwrap();
            let denied = self.check(key).await.unwrap();
            // Blocked for 90 s; asked 250 ms later.
            self.block(key, Duration::from_secs(90)).await.unwrap();
            clock.advance(Duration::from_millis(250));
            let blocked = self.check(key).await.unwrap();
            assert!(!self.check_n(key, 0).await.unwrap().is_allowed());
            self.reset(key).await.unwrap();
            let after_reset = self.check(key).await.unwrap().is_allowed();
            // A block that ends leaves a fresh key: all 10 at once.
            self.block(key, Duration::from_secs(5)).await.unwrap();
            clock.advance(Duration::from_secs(5));
            let after_block = self.check_n(key, 10).await.unwrap().is_allowed();
            (
                refunded.remaining(),
                charged.remaining(),
                denied.retry_after().unwrap(),
                blocked.retry_after().unwrap(),
                after_reset,
                after_block,
            )
        })
    }
}

/// An operator's block made through one instance and lifted by a reset
/// through another. Once Redis has answered the first instance that the
/// key is no longer blocked, an outage there decides the key by what it
/// has left. The first instance's local fallback kept the block (made so
/// that an outage right after a block still refuses the key) and refused
/// the key through the outage until the block's end. A key blocked and not
/// reset stays refused, and so does one Redis answered unblocked within a
/// second of the block (the margin for the clocks' skew, and for a decision
/// on its way when the block was made).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_lifted_through_another_instance_is_lifted_in_the_fallback_too() {
    let mut server = RedisServer::spawn();
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
    let instance = async || {
        let store = RedisStore::builder()
            .prefix("limiter-lift")
            .test_clock(clock.clone())
            // Long enough for a loaded machine: Redis must decide the key
            // while it is up (a late answer would be decided locally).
            .deadline(Duration::from_millis(500))
            .connect(server.url())
            .await
            .unwrap();
        let policy = Policy::new("jobs", Algorithm::Gcra, "5/h").unwrap();
        let local = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        RateLimiter::with_store(policy, store).local_fallback(local)
    };
    let (a, b) = (instance().await, instance().await);
    let (lifted, blocked) = (Key::custom("lifted"), Key::custom("blocked"));
    let soon = Key::custom("reset-at-once");
    for key in [&lifted, &blocked] {
        a.block(key, Duration::from_secs(3_600)).await.unwrap();
        assert!(!a.check(key).await.unwrap().is_allowed());
    }
    // Reset at once, and answered unblocked within the second after the
    // block: within the margin for the clocks' skew, not trusted to lift it.
    a.block(&soon, Duration::from_secs(3_600)).await.unwrap();
    clock.advance(Duration::from_millis(500));
    b.reset(&soon).await.unwrap();
    assert!(a.check(&soon).await.unwrap().is_allowed());
    clock.advance(Duration::from_millis(500));
    b.reset(&lifted).await.unwrap();
    // Past the second for which the first instance's deny cache answers.
    clock.advance(Duration::from_secs(1));
    assert!(a.check(&lifted).await.unwrap().is_allowed(), "1 of 5 used");

    server.kill();
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += usize::from(a.check(&lifted).await.unwrap().is_allowed());
    }
    assert_eq!(admitted, 4, "the 4 left, and no more");
    for key in [&blocked, &soon] {
        let decision = a.check(key).await.unwrap();
        assert!(decision.is_blocked(), "{key:?}: {decision:?}");
    }
}
