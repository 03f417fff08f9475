//! The local fallback across failures of the shared store: what the
//! shared store counted between two failures carries into the second,
//! and a limiter's settlement goes where its reservation was made.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

#[path = "support/flaky.rs"]
mod flaky;

use std::num::NonZeroU64;
use std::time::Duration;

use tollgate::{
    Algorithm, DecidedBy, FailureMode, FakeClock, FallbackStore, InstanceCount, Key,
    MemoryOverrides, MemoryStore, Outcome, Override, OverrideStore, Policy, Settlement, Store,
    StoreError, Timestamp,
};

use flaky::Flaky;

/// A fallback store over a shared store that fails on demand and
/// remembers its last decisions, with a local fallback; both memory stores
/// on one fake clock.
fn local_fallback() -> (FakeClock, Flaky, FallbackStore<Flaky>) {
    let clock = FakeClock::new(Timestamp::from_secs(1_700_006_400));
    let memory = || MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let shared = Flaky::remembering(memory());
    let fallback = FallbackStore::new(shared.clone())
        .on_store_error(FailureMode::Local)
        .local_fallback(memory());
    (clock, shared, fallback)
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
    let (clock, shared, fallback) = local_fallback();
    let policy = Policy::new("daily", Algorithm::FixedWindow, "1000/day").unwrap();
    let key = Key::user("ada");

    // 09:00: one request while the shared store fails.
    shared.fail(true);
    assert!(fallback.check(&key, &policy, 1).await.unwrap().is_allowed());
    // Until 17:00 the shared store counts 990.
    shared.fail(false);
    clock.advance(Duration::from_secs(8 * 3_600));
    let counted = fallback.check(&key, &policy, 990).await.unwrap();
    assert_eq!(counted.remaining(), 10);
    // 17:00: it fails again. 20 requests: the 10 left are admitted.
    shared.fail(true);
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
    let shared = Flaky::remembering(memory());
    let local = memory();
    let policy = Policy::new("tokens", Algorithm::TokenBucket, "1000/min").unwrap();
    let limiter = tollgate::RateLimiter::with_store(policy.clone(), shared.clone())
        .on_store_error(FailureMode::Local)
        .local_fallback(local.clone());
    let key = Key::user("acme");
    let reservation = limiter.check_n(&key, 300).await.unwrap();
    shared.fail(true);
    let settled = limiter.settle(&key, &reservation, 300, 900).await;
    assert!(
        matches!(settled, Err(StoreError::Timeout(_))),
        "{settled:?}"
    );
    assert!(local.is_empty(), "the local fallback took no charge");
    let status = shared.inner.check_sync(&key, &policy, 0).unwrap();
    assert_eq!(status.remaining(), 700, "the reservation stands");
}

/// A limiter's settlement goes where its reservation was made
/// (`Decision::decided_by`): one the local fallback made while the shared
/// store failed is settled in the fallback, one no one counted (let
/// through under `Open`, or a key exempt by an override) nowhere. Each was
/// refunded in the shared store, which never charged it: 300 tokens free
/// for a key that had used 500 there.
#[tokio::test]
async fn a_limiters_settlement_goes_where_the_reservation_was_made() {
    let clock = FakeClock::new(Timestamp::from_secs(1_700_006_400));
    let memory = || MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let policy = Policy::new("tokens", Algorithm::TokenBucket, "1000/min").unwrap();
    let key = Key::user("acme");
    let shared_remaining = |shared: &Flaky| {
        shared
            .inner
            .check_sync(&key, &policy, 0)
            .unwrap()
            .remaining()
    };

    // Reserved by the local fallback while the shared store failed.
    let shared = Flaky::new(memory());
    let local = memory();
    let limiter = tollgate::RateLimiter::with_store(policy.clone(), shared.clone())
        .on_store_error(FailureMode::Local)
        .local_fallback(local.clone());
    assert!(limiter.check_n(&key, 500).await.unwrap().is_allowed());
    shared.fail(true);
    let reservation = limiter.check_n(&key, 300).await.unwrap();
    assert_eq!(reservation.decided_by(), DecidedBy::LocalFallback);
    shared.fail(false);
    let settled = limiter.settle(&key, &reservation, 300, 0).await.unwrap();
    assert_eq!(settled.decided_by(), DecidedBy::LocalFallback);
    assert_eq!(
        shared_remaining(&shared),
        500,
        "the shared store's count stands"
    );
    assert!(
        local.check_sync(&key, &policy, 0).unwrap().remaining() > 700,
        "refunded in the fallback"
    );

    // Let through under `Open` while the shared store failed.
    let shared = Flaky::new(memory());
    let limiter = tollgate::RateLimiter::with_store(policy.clone(), shared.clone())
        .on_store_error(FailureMode::Open);
    assert!(limiter.check_n(&key, 500).await.unwrap().is_allowed());
    shared.fail(true);
    let reservation = limiter.check_n(&key, 300).await.unwrap();
    assert_eq!(reservation.decided_by(), DecidedBy::NoOne);
    shared.fail(false);
    let settled = limiter.settle(&key, &reservation, 300, 0).await.unwrap();
    assert_eq!(settled, reservation);
    assert_eq!(shared_remaining(&shared), 500);

    // Exempt by an override.
    let shared = Flaky::new(memory());
    let overrides = MemoryOverrides::new();
    let limiter = tollgate::RateLimiter::with_store(policy.clone(), shared.clone())
        .overrides(overrides.clone());
    assert!(limiter.check_n(&key, 500).await.unwrap().is_allowed());
    overrides
        .set(&key, &policy, Override::Exempt, None)
        .await
        .unwrap();
    let reservation = limiter.check_n(&key, 300).await.unwrap();
    assert_eq!(reservation.decided_by(), DecidedBy::NoOne);
    let settled = limiter.settle(&key, &reservation, 300, 0).await.unwrap();
    assert_eq!(settled, reservation);
    assert_eq!(shared_remaining(&shared), 500);
}

/// A `FallbackStore` asked directly settles where the reservation was made,
/// as `Settlement::of` keeps it from the decision: one its local fallback
/// made while the shared store failed is refunded in the fallback, not in
/// the shared store, which never charged it (300 tokens free there for a
/// key that had used 500: it settled every settlement in the shared store
/// first); one the shared store made is settled there or not at all; one
/// no one counted, nowhere.
#[tokio::test]
async fn a_fallback_stores_settlement_goes_where_the_reservation_was_made() {
    let clock = FakeClock::new(Timestamp::from_secs(1_700_006_400));
    let memory = || MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let policy = Policy::new("tokens", Algorithm::TokenBucket, "1000/min").unwrap();
    let key = Key::user("acme");
    let shared = Flaky::new(memory());
    let local = memory();
    let store = FallbackStore::new(shared.clone())
        .on_store_error(FailureMode::Local)
        .local_fallback(local.clone());
    let shared_remaining = || {
        shared
            .inner
            .check_sync(&key, &policy, 0)
            .unwrap()
            .remaining()
    };

    let in_store = store.check(&key, &policy, 500).await.unwrap();
    assert_eq!(in_store.decided_by(), DecidedBy::Store);
    shared.fail(true);
    let locally = store.check(&key, &policy, 300).await.unwrap();
    assert_eq!(locally.decided_by(), DecidedBy::LocalFallback);
    shared.fail(false);
    let settled = store
        .settle(&key, &policy, Settlement::of(&locally, 300, 0))
        .await
        .unwrap();
    assert_eq!(settled.decided_by(), DecidedBy::LocalFallback);
    assert_eq!(shared_remaining(), 500, "the shared store's count stands");
    assert!(
        local.check_sync(&key, &policy, 0).unwrap().remaining() > 700,
        "refunded in the fallback"
    );

    // The shared store's reservation, while it fails: its failure, and the
    // fallback takes nothing.
    shared.fail(true);
    let local_before = local.check_sync(&key, &policy, 0).unwrap().remaining();
    let failed = store
        .settle(&key, &policy, Settlement::of(&in_store, 500, 900))
        .await;
    assert!(failed.is_err(), "{failed:?}");
    let local_after = local.check_sync(&key, &policy, 0).unwrap().remaining();
    assert_eq!(local_after, local_before, "the fallback took no charge");
    shared.fail(false);
    let refunded = store
        .settle(&key, &policy, Settlement::of(&in_store, 500, 100))
        .await
        .unwrap();
    assert_eq!(refunded.decided_by(), DecidedBy::Store);
    assert_eq!(shared_remaining(), 900);

    // One no one counted (as a limiter's let through under `Open` while
    // the shared store failed): settled nowhere, and without asking the
    // store, which may still fail.
    let let_through = refunded.with_decided_by(DecidedBy::NoOne);
    shared.fail(true);
    let settled = store
        .settle(&key, &policy, Settlement::of(&let_through, 300, 0))
        .await
        .unwrap();
    assert_eq!(settled.decided_by(), DecidedBy::NoOne);
    shared.fail(false);
    assert_eq!(shared_remaining(), 900);
}

/// A key the shared store answered blocked (an operator blocked it from
/// another instance) stays blocked in the local fallback while the store
/// fails, whatever the cost. The fallback seeded the key from the blocked
/// decision instead, which held a fixed window's key back only until its
/// minute turned: with eight minutes of the block to run, the key was
/// admitted from local quota. Once the store answers the key lifted, a
/// later failure decides it as any other.
#[tokio::test]
async fn a_key_blocked_in_the_shared_store_stays_blocked_in_the_local_fallback() {
    let (clock, shared, fallback) = local_fallback();
    let policy = Policy::new("minute", Algorithm::FixedWindow, "10/min").unwrap();
    let key = Key::user("ada");

    shared
        .block(&key, &policy, Duration::from_secs(600))
        .await
        .unwrap();
    let blocked = fallback.check(&key, &policy, 1).await.unwrap();
    assert!(blocked.is_blocked(), "{blocked:?}");
    // Two minutes on, the shared store fails.
    shared.fail(true);
    clock.advance(Duration::from_secs(120));
    for cost in [1, 3] {
        let local = fallback.check(&key, &policy, cost).await.unwrap();
        assert!(local.is_blocked(), "{local:?}");
        assert_eq!(local.cost(), cost);
        assert_eq!(local.decided_by(), DecidedBy::LocalFallback);
        assert_eq!(local.retry_after(), Some(Duration::from_secs(480)));
    }
    // The store is back, and an operator lifts the block (a reset from
    // another instance); the next failure admits the key from its share.
    shared.fail(false);
    shared.reset(&key, &policy).await.unwrap();
    assert!(fallback.check(&key, &policy, 1).await.unwrap().is_allowed());
    shared.fail(true);
    let after = fallback.check(&key, &policy, 1).await.unwrap();
    assert!(after.is_allowed(), "{after:?}");
    assert_eq!(after.decided_by(), DecidedBy::LocalFallback);
}

/// A request that costs more than this instance's share of a limit, but
/// no more than the limit, is refused for now in an outage, with a retry
/// of the time the limit makes its cost at its rate: the store admits it
/// once it is back. It was refused for good (`CostExceedsCapacity`: a 429
/// with no `Retry-After`, and gRPC told never to retry). Still never
/// admitted locally, and a cost beyond the limit itself is still refused
/// for good.
#[tokio::test]
async fn a_request_costing_more_than_the_local_share_is_refused_for_now_not_for_good() {
    let (_, shared, fallback) = local_fallback();
    let fallback = fallback.local_divisor(NonZeroU64::new(6).unwrap());
    // A share of 8 an hour on each of 6 instances.
    let policy = Policy::new("exports", Algorithm::TokenBucket, "50/h").unwrap();
    shared.fail(true);
    let costly = fallback
        .check(&Key::user("ada"), &policy, 10)
        .await
        .unwrap();
    assert_eq!(
        costly.outcome(),
        Outcome::Limited {
            retry_after: Duration::from_secs(720)
        }
    );
    assert_eq!(costly.retry_after(), Some(Duration::from_secs(720)));
    assert_eq!(costly.decided_by(), DecidedBy::LocalFallback);
    assert_eq!((costly.limit(), costly.remaining()), (8, 8));
    // The share itself is admitted, once.
    assert!(
        fallback
            .check(&Key::user("ada"), &policy, 8)
            .await
            .unwrap()
            .is_allowed()
    );
    assert!(
        !fallback
            .check(&Key::user("ada"), &policy, 1)
            .await
            .unwrap()
            .is_allowed()
    );
    let never = fallback
        .check(&Key::user("bob"), &policy, 51)
        .await
        .unwrap();
    assert!(
        matches!(
            never.outcome(),
            Outcome::CostExceedsCapacity { cost: 51, .. }
        ),
        "{:?}",
        never.outcome()
    );
}

/// Of a policy of two limits, the retry of a request too costly for one
/// share comes from that limit alone, which binds: 20 units of "60/min"
/// take 20 s. (It was the longest over every limit, "1000/h"'s 72 s, on
/// the per-minute limit's headers.)
#[tokio::test]
async fn the_retry_of_a_request_too_costly_for_a_share_comes_from_the_limits_it_exceeds() {
    let (_, shared, fallback) = local_fallback();
    let fallback = fallback.local_divisor(NonZeroU64::new(6).unwrap());
    // Shares of 10 a minute and 166 an hour.
    let policy = Policy::builder("exports")
        .algorithm(Algorithm::SlidingWindow)
        .limit("60/min")
        .limit("1000/h")
        .build()
        .unwrap();
    shared.fail(true);
    let costly = fallback
        .check(&Key::user("ada"), &policy, 20)
        .await
        .unwrap();
    let twenty = Duration::from_secs(20);
    assert_eq!(
        costly.outcome(),
        Outcome::Limited {
            retry_after: twenty
        }
    );
    assert_eq!(costly.limit(), 10);
    let retries: Vec<_> = costly.limits().iter().map(|s| s.retry_after()).collect();
    assert_eq!(retries, [Some(twenty), None]);
}

/// Of a fixed window, that retry is at most the time to the window's end,
/// where the limit admits the cost again: 200 units of "1000/day" on 10
/// instances, at 22:00, wait the 2 h left of the day, not 4.8 h.
#[tokio::test]
async fn the_retry_of_a_request_too_costly_for_a_fixed_windows_share_ends_with_the_window() {
    let (clock, shared, fallback) = local_fallback();
    let fallback = fallback.local_divisor(NonZeroU64::new(10).unwrap());
    let policy = Policy::new("exports", Algorithm::FixedWindow, "1000/day").unwrap();
    clock.advance(Duration::from_secs(22 * 3_600));
    shared.fail(true);
    let costly = fallback
        .check(&Key::user("ada"), &policy, 200)
        .await
        .unwrap();
    let two_hours = Duration::from_secs(2 * 3_600);
    assert_eq!(
        costly.outcome(),
        Outcome::Limited {
            retry_after: two_hours
        }
    );
}

/// What this instance admitted in an outage counts under its new share
/// when the instance count changes during it. Each failure seeds the key
/// with the shared store's last decision, and the seed of the new share
/// started afresh, forgetting the old share's admissions: with 2
/// instances then 4, this instance admitted 30 of its share of 50, then
/// 15 more of a share of 25. Now the key's state under the old share
/// carries over to the new one, as a changed configuration does, and each
/// limit keeps the more used of it and the seed: nothing more once this
/// instance admitted more than its new share.
///
/// When the share grows, the carried state holds the old share's seed as
/// units, smaller than the new share's: what this instance admits is
/// bounded by the new share, less what it admitted, plus the two seeds'
/// difference (asserted), where it was the whole new share less the seed.
#[tokio::test]
async fn a_changed_instance_count_in_an_outage_keeps_what_was_admitted_under_the_old_share() {
    for algorithm in Algorithm::ALL {
        for (before, after) in [(2, 4), (4, 2)] {
            let (_, shared, fallback) = local_fallback();
            let instances = InstanceCount::new(NonZeroU64::new(before).unwrap());
            let fallback = fallback.local_instances(instances.clone());
            let policy = Policy::new("partner", algorithm, "100/min").unwrap();
            let key = Key::user("ada");
            // The shared store counted 40 of 100: 40% of each share seeded.
            let counted = fallback.check(&key, &policy, 40).await.unwrap();
            assert_eq!(counted.remaining(), 60, "{algorithm}");
            shared.fail(true);
            let seed = |count: u64| 100 / count * 40 / 100;
            let first = admitted(&fallback, &policy, &key).await;
            assert_eq!(first, 100 / before - seed(before), "{algorithm}, {before}");
            instances.set(NonZeroU64::new(after).unwrap());
            let second = admitted(&fallback, &policy, &key).await;
            // The old share, used up, carries over whole.
            let (old_share, share) = (100 / before, 100 / after);
            let expected = share.saturating_sub(old_share.max(seed(after)));
            assert_eq!(
                second, expected,
                "{algorithm}, {before} then {after} instances"
            );
            // What an instance of the new share admits from the seed, less
            // what this one admitted: exact, but for the seeds' difference.
            let exact = (share - seed(after)).saturating_sub(first);
            let over = seed(after).saturating_sub(seed(before));
            assert!(second <= exact + over, "{algorithm}, {before} then {after}");
        }
    }
}

/// How many requests of cost 1 `fallback` admits of `key` in a row (at
/// most 1,000).
async fn admitted(fallback: &FallbackStore<Flaky>, policy: &Policy, key: &Key) -> u64 {
    let mut admitted = 0;
    while admitted < 1_000 && fallback.check(key, policy, 1).await.unwrap().is_allowed() {
        admitted += 1;
    }
    admitted
}
