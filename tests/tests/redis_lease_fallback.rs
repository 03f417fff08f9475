//! Leases over a store with a local fallback: a lease that the fallback
//! granted while Redis failed is spent as the fallback's and given back
//! to it, never to Redis, which never charged it (a return there would
//! be quota for free).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tollgate::{
    Algorithm, DecidedBy, Decision, FakeClock, FallbackStore, Key, MemoryStore, Policy, Settlement,
    Store, StoreError, Timestamp,
};
use tollgate_redis::{LeasedStore, RedisStore};
use tollgate_tests::{require_redis, unique_prefix};

/// A Redis store whose checks fail while `down` is set, as if Redis could
/// not be reached; its settlements always go through, so that one sent
/// to it by mistake lands.
#[derive(Clone)]
struct ChecksDown {
    inner: RedisStore,
    down: Arc<AtomicBool>,
}

impl Store for ChecksDown {
    async fn check(&self, key: &Key, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        match self.down.load(Ordering::SeqCst) {
            true => Err(StoreError::unavailable(std::io::Error::from(
                std::io::ErrorKind::ConnectionRefused,
            ))),
            false => self.inner.check(key, policy, cost).await,
        }
    }

    async fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: Settlement,
    ) -> Result<Decision, StoreError> {
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
        self.inner.last_known(key, policy)
    }
}

#[tokio::test]
async fn a_lease_the_local_fallback_granted_goes_back_to_it_not_to_redis() {
    let url = require_redis().await;
    let prefix = unique_prefix("lease-fallback");
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
    let redis = RedisStore::builder()
        .prefix(&prefix)
        .test_clock(clock.clone())
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect(url.as_str())
        .await
        .unwrap();
    let policy = Policy::new("tokens", Algorithm::TokenBucket, "1000/s").unwrap();
    let key = Key::user("acme");
    // Redis has charged 900 of the key's 1,000 before it fails.
    assert!(redis.check(&key, &policy, 900).await.unwrap().is_allowed());
    let down = Arc::new(AtomicBool::new(true));
    let local = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let fallback = FallbackStore::new(ChecksDown {
        inner: redis.clone(),
        down: Arc::clone(&down),
    })
    .local_fallback(local.clone());
    let leased = LeasedStore::builder()
        .interval(Duration::from_secs(1))
        .channel(format!("{prefix}:leases"))
        .test_clock(clock.clone())
        .connect(fallback, url.as_str())
        .await
        .unwrap();
    assert!(leased.is_listening(), "subscribed to invalidations");

    // While Redis fails, the fallback decides, and grants a lease once the
    // key is busy enough for one; what is spent from it is the fallback's.
    let mut spent_from_a_lease = None;
    for _ in 0..40 {
        let decision = leased.check(&key, &policy, 1).await.unwrap();
        assert!(decision.is_allowed());
        assert_eq!(decision.decided_by(), DecidedBy::LocalFallback);
        if leased.outstanding().1 > 0 {
            spent_from_a_lease = Some(decision);
            break;
        }
    }
    let spent_from_a_lease = spent_from_a_lease.expect("a lease granted within 40 requests");
    let (leases, held) = leased.outstanding();
    assert_eq!(leases, 1);
    assert!(held > 0);
    assert_eq!(spent_from_a_lease.decided_by(), DecidedBy::LocalFallback);
    let one_more = leased.check(&key, &policy, 1).await.unwrap();
    assert_eq!(leased.outstanding(), (1, held - 1), "spent from the lease");
    assert_eq!(one_more.decided_by(), DecidedBy::LocalFallback);

    let in_redis = || async { redis.status(&key, &policy).await.unwrap().remaining() };
    let in_fallback = || local.check_sync(&key, &policy, 0).unwrap().remaining();
    let (redis_before, fallback_before) = (in_redis().await, in_fallback());
    assert_eq!(
        redis_before, 100,
        "Redis saw none of the fallback's decisions"
    );

    // Redis is back, and the lease ends: its unused units go back to the
    // fallback that granted them, and Redis keeps what it charged.
    down.store(false, Ordering::SeqCst);
    leased.return_leases().await;
    assert_eq!(leased.outstanding(), (0, 0));
    assert_eq!(leased.calls().returns, 1);
    assert_eq!(
        in_redis().await,
        redis_before,
        "no refund of units Redis never charged"
    );
    assert_eq!(in_fallback(), fallback_before + held - 1);
}
