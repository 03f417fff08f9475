//! Leases over a store with a local fallback: a lease that the fallback
//! granted while the shared store failed is spent as the fallback's and
//! given back to it, never to the shared store, which never charged it
//! (a return there would be quota for free). The leases' invalidations go
//! through Redis.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

#[path = "../../crates/tollgate/tests/support/flaky.rs"]
mod flaky;

use std::sync::atomic::Ordering;
use std::time::Duration;

use tollgate::{
    Algorithm, DecidedBy, FakeClock, FallbackStore, Key, MemoryStore, Policy, Store, Timestamp,
};
use tollgate_redis::LeasedStore;
use tollgate_tests::{require_redis, unique_prefix};

use flaky::Flaky;

#[tokio::test]
async fn a_lease_the_local_fallback_granted_goes_back_to_it_not_to_the_shared_store() {
    let url = require_redis().await;
    let prefix = unique_prefix("lease-fallback");
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
    let memory = || MemoryStore::builder().clock(clock.clone()).build().unwrap();
    // The shared store remembers each key's last decision, as Redis's does.
    let shared = Flaky::remembering(memory());
    let policy = Policy::new("tokens", Algorithm::TokenBucket, "1000/s").unwrap();
    let key = Key::user("acme");
    // The shared store has charged 900 of the key's 1,000 before its
    // checks fail (its settlements still go through: one sent to it by
    // mistake lands).
    assert!(shared.check(&key, &policy, 900).await.unwrap().is_allowed());
    shared.fail_check.store(true, Ordering::SeqCst);
    let local = memory();
    let fallback = FallbackStore::new(shared.clone()).local_fallback(local.clone());
    let leased = LeasedStore::builder()
        .interval(Duration::from_secs(1))
        .channel(format!("{prefix}:leases"))
        .test_clock(clock.clone())
        .connect(fallback, url.as_str())
        .await
        .unwrap();
    assert!(leased.is_listening(), "subscribed to invalidations");

    // While the shared store fails, the fallback decides, and grants a
    // lease once the key is busy enough for one; what is spent from it is
    // the fallback's.
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

    let in_shared = || {
        shared
            .inner
            .check_sync(&key, &policy, 0)
            .unwrap()
            .remaining()
    };
    let in_fallback = || local.check_sync(&key, &policy, 0).unwrap().remaining();
    let (shared_before, fallback_before) = (in_shared(), in_fallback());
    assert_eq!(
        shared_before, 100,
        "the shared store saw none of the fallback's decisions"
    );

    // The shared store is back, and the lease ends: its unused units go
    // back to the fallback that granted them, and the shared store keeps
    // what it charged.
    shared.fail_check.store(false, Ordering::SeqCst);
    leased.return_leases().await;
    assert_eq!(leased.outstanding(), (0, 0));
    assert_eq!(leased.calls().returns, 1);
    assert_eq!(
        in_shared(),
        shared_before,
        "no refund of units it never charged"
    );
    assert_eq!(in_fallback(), fallback_before + held - 1);
}
