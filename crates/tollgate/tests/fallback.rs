//! The local fallback across failures of the shared store: what the
//! shared store counted between two failures carries into the second.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tollgate::{
    Algorithm, Decision, FailureMode, FakeClock, FallbackStore, Key, MemoryStore, Policy,
    Settlement, Store, StoreError, Timestamp,
};

/// A shared store (in memory) that fails while told to, and remembers
/// each key's last decision as the Redis store does.
#[derive(Clone)]
struct Flaky {
    inner: MemoryStore,
    failing: Arc<AtomicBool>,
}

impl Flaky {
    fn fails(&self) -> Result<(), StoreError> {
        match self.failing.load(Ordering::SeqCst) {
            true => Err(StoreError::Timeout(Duration::from_millis(50))),
            false => Ok(()),
        }
    }
}

impl Store for Flaky {
    async fn check(&self, key: &Key, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        self.fails()?;
        self.inner.check(key, policy, cost).await
    }

    async fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: Settlement,
    ) -> Result<Decision, StoreError> {
        self.fails()?;
        self.inner.settle(key, policy, settlement).await
    }

    async fn reset(&self, key: &Key, policy: &Policy) -> Result<(), StoreError> {
        self.inner.reset(key, policy).await
    }

    async fn block(
        &self,
        key: &Key,
        policy: &Policy,
        duration: Duration,
    ) -> Result<(), StoreError> {
        self.inner.block(key, policy, duration).await
    }

    fn last_known(&self, key: &Key, policy: &Policy) -> Option<Decision> {
        self.inner.check_sync(key, policy, 0).ok()
    }
}

/// A key the fallback decided in a first failure keeps its local state
/// until it expires; in a second failure later in the window it is
/// seeded again with what the shared store counted meanwhile, and each
/// limit keeps the more used of the two. It kept the first failure's
/// state alone (1 used where the shared store had counted 990), and
/// admitted all 20 of the second failure's requests under a limit of
/// 1,000 a day.
#[tokio::test]
async fn a_second_failure_carries_what_the_store_counted_since_the_first() {
    let clock = FakeClock::new(Timestamp::from_secs(1_700_006_400));
    let memory = || MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let shared = Flaky {
        inner: memory(),
        failing: Arc::default(),
    };
    let fallback = FallbackStore::new(shared.clone())
        .on_store_error(FailureMode::Local)
        .local_fallback(memory());
    let policy = Policy::new("daily", Algorithm::FixedWindow, "1000/day").unwrap();
    let key = Key::user("ada");

    // 09:00: one request while the shared store fails.
    shared.failing.store(true, Ordering::SeqCst);
    assert!(fallback.check(&key, &policy, 1).await.unwrap().is_allowed());
    // Until 17:00 the shared store counts 990.
    shared.failing.store(false, Ordering::SeqCst);
    clock.advance(Duration::from_secs(8 * 3_600));
    let counted = fallback.check(&key, &policy, 990).await.unwrap();
    assert_eq!(counted.remaining(), 10);
    // 17:00: it fails again. 20 requests: the 10 left are admitted.
    shared.failing.store(true, Ordering::SeqCst);
    let mut admitted = 0;
    for _ in 0..20 {
        admitted += u32::from(fallback.check(&key, &policy, 1).await.unwrap().is_allowed());
    }
    assert_eq!(admitted, 10);
}

/// `RateLimiter::settle` returns a failed settlement as its error, as
/// documented, and leaves the reservation: it was charged to the local
/// fallback and returned as a decision, and the shared store never saw
/// the charge.
#[tokio::test]
async fn a_limiters_failed_settlement_is_its_error() {
    let clock = FakeClock::new(Timestamp::from_secs(1_700_006_400));
    let memory = || MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let shared = Flaky {
        inner: memory(),
        failing: Arc::default(),
    };
    let local = memory();
    let policy = Policy::new("tokens", Algorithm::TokenBucket, "1000/min").unwrap();
    let limiter = tollgate::RateLimiter::with_store(policy.clone(), shared.clone())
        .on_store_error(FailureMode::Local)
        .local_fallback(local.clone());
    let key = Key::user("acme");
    let reservation = limiter.check_n(&key, 300).await.unwrap();
    shared.failing.store(true, Ordering::SeqCst);
    let settled = limiter.settle(&key, &reservation, 300, 900).await;
    assert!(
        matches!(settled, Err(StoreError::Timeout(_))),
        "{settled:?}"
    );
    assert!(local.is_empty(), "the local fallback took no charge");
    let status = shared.inner.check_sync(&key, &policy, 0).unwrap();
    assert_eq!(status.remaining(), 700, "the reservation stands");
}
