//! The direct `RateLimiter` API, on tokio's paused clock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::num::NonZeroU64;
use std::time::Duration;

use tokio::time::Instant;
use tollgate::{
    Algorithm, FakeClock, InstanceCount, Jitter, Key, MemoryStore, Policy, RateLimiter, Timestamp,
    TokioClock, WaitError,
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
async fn until_ready_on_gcra_waits_exactly_until_admission() {
    // GCRA frees one unit at a time: the default jitter adds nothing.
    let limiter = limiter(Policy::new("api", Algorithm::Gcra, "5/s").unwrap());
    assert_eq!(limiter.wait_jitter(), Jitter::BULK);
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

/// A wait of `Duration::MAX` means no bound: it does not overflow the
/// deadline's instant (which panicked), and the call waits its hour.
#[tokio::test(start_paused = true)]
async fn until_ready_without_a_bound_waits_as_long_as_it_takes() {
    let limiter = limiter(Policy::new("api", Algorithm::Gcra, "1/h").unwrap());
    let key = Key::custom("partner");
    let start = Instant::now();
    for expected in [0, 3_600] {
        limiter.until_ready(&key, Duration::MAX).await.unwrap();
        assert_eq!(start.elapsed().as_secs(), expected);
    }
}

/// With jitter of one interval each wait after a denial is its exact
/// retry time plus less than one emission interval (200 ms at 5/s):
/// admissions stay at least 200 ms apart, and each comes within 200 ms
/// of its exact time (the timer wakes on the millisecond at or after it).
#[tokio::test(start_paused = true)]
async fn until_ready_with_jitter_wakes_within_one_interval_of_the_retry_time() {
    let policy = Policy::builder("api")
        .limit("5/s")
        .burst(1)
        .build()
        .unwrap();
    let limiter = limiter(policy).jitter(Jitter::ONE_INTERVAL);
    assert_eq!(limiter.wait_jitter(), Jitter::ONE_INTERVAL);
    let key = Key::custom("partner");
    let interval = Duration::from_millis(200);
    let mut last = Instant::now();
    limiter
        .until_ready(&key, Duration::from_secs(1))
        .await
        .unwrap();
    for _ in 0..20 {
        limiter
            .until_ready(&key, Duration::from_secs(1))
            .await
            .unwrap();
        let since = last.elapsed();
        assert!(
            since >= interval && since <= 2 * interval,
            "{since:?} since the last admission"
        );
        last = Instant::now();
    }
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

/// The fallback's share follows the instance count while the limiter
/// runs: a store with room for one key fails every other, and each new
/// key is decided locally with the limit divided by the count of now.
#[tokio::test]
async fn a_changed_instance_count_changes_the_fallback_share() {
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_040));
    let full = MemoryStore::builder()
        .clock(clock.clone())
        .max_keys(1)
        .build()
        .unwrap();
    let local = MemoryStore::builder().clock(clock).build().unwrap();
    let instances = InstanceCount::new(NonZeroU64::new(4).unwrap());
    let policy = Policy::new("partner", Algorithm::FixedWindow, "100/min").unwrap();
    let limiter = RateLimiter::with_store(policy, full)
        .local_fallback(local)
        .local_instances(instances.clone());
    limiter.check(&Key::custom("occupant")).await.unwrap();
    let admitted = async |key: &str| {
        let key = Key::custom(key);
        let mut admitted = 0;
        while limiter.check(&key).await.unwrap().is_allowed() {
            admitted += 1;
        }
        admitted
    };
    assert_eq!(admitted("a").await, 25, "100 shared by 4");
    instances.set(NonZeroU64::new(10).unwrap());
    assert_eq!(admitted("b").await, 10, "100 shared by 10");
    instances.set(NonZeroU64::new(3).unwrap());
    assert_eq!(admitted("c").await, 33, "100 shared by 3, rounded down");
    instances.set(NonZeroU64::MIN);
    assert_eq!(admitted("d").await, 100, "alone, the whole limit");
    assert_eq!(instances.get(), NonZeroU64::MIN);
}

/// A refused reservation says how much it needed, beside what was left,
/// in its decision and in the answer the limiter makes of it.
#[tokio::test]
async fn a_refused_reservation_says_how_much_it_needed() {
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_040));
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    let policy = Policy::new("llm-tokens", Algorithm::TokenBucket, "1000/min").unwrap();
    let tokens = RateLimiter::with_store(policy, store);
    let tenant = Key::user("acme");
    let reserved = tokens.check_n(&tenant, 900).await.unwrap();
    assert_eq!((reserved.cost(), reserved.remaining()), (900, 100));
    let refused = tokens.check_n(&tenant, 300).await.unwrap();
    assert_eq!((refused.cost(), refused.remaining()), (300, 100));
    // 200 tokens more, at 1000 a minute.
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(12)));
    let response = tokens.rejection(&refused, tollgate::HeaderStyle::GitHub);
    let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
    assert_eq!(
        body["detail"],
        "limit 'llm-tokens' exceeded: the request needs 300, 100 remain; retry in 12 s"
    );
}

#[test]
fn a_store_failure_says_why() {
    let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
    let error = WaitError::from(tollgate::StoreError::backend(reset));
    assert_eq!(
        error.to_string(),
        "rate-limit store failed: store backend failed: reset"
    );
}

/// A denied reservation reserved nothing: settling it refunds nothing,
/// whatever the caller says it reserved (an app that settles every call
/// would let a client mint quota by being denied), and charges what the
/// work cost if it ran anyway.
#[tokio::test(start_paused = true)]
async fn settling_a_denial_refunds_nothing() {
    let limiter = limiter(Policy::new("settled", Algorithm::Gcra, "1/min").unwrap());
    let key = Key::user("denied");
    assert!(limiter.check(&key).await.unwrap().is_allowed());
    let denied = limiter.check(&key).await.unwrap();
    assert!(!denied.is_allowed());
    let after = limiter.settle(&key, &denied, 1, 0).await.unwrap();
    assert_eq!(after.remaining(), 0);
    assert!(!limiter.check(&key).await.unwrap().is_allowed());
    // Work that ran anyway is charged: one more minute to wait.
    let charged = limiter.settle(&key, &denied, 1, 1).await.unwrap();
    assert_eq!(charged.reset(), Duration::from_secs(120));
}

/// A reset of a key whose override gives it a daily limit under a
/// per-second plan fences the refunds of its earlier requests for the
/// day, not for the plan's minute: one that comes two minutes after the
/// reset gives the fresh state nothing.
#[tokio::test]
async fn a_reset_fences_refunds_for_as_long_as_the_keys_own_limits_reach() {
    // The start of a UTC day.
    let clock = FakeClock::new(Timestamp::from_secs(1_700_006_400));
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let plan = Policy::new("api", Algorithm::FixedWindow, "10/s").unwrap();
    let overrides = tollgate::MemoryOverrides::with_clock(clock.clone());
    let key = Key::user("acme");
    let daily: tollgate::Override = "1000/day".parse().unwrap();
    tollgate::OverrideStore::set(&overrides, &key, &plan, daily, None)
        .await
        .unwrap();
    let limiter = RateLimiter::with_store(plan, store).overrides(overrides);
    let reserved = limiter.check_n(&key, 500).await.unwrap();
    assert!(reserved.is_allowed());
    clock.advance(Duration::from_secs(1));
    limiter.reset(&key).await.unwrap();
    clock.advance(Duration::from_secs(1));
    assert!(limiter.check_n(&key, 1000).await.unwrap().is_allowed());
    clock.advance(Duration::from_secs(120));
    let settled = limiter.settle(&key, &reserved, 500, 0).await.unwrap();
    assert_eq!(
        settled.remaining(),
        0,
        "the reservation before the reset is fenced"
    );
    assert!(!limiter.check(&key).await.unwrap().is_allowed());
}

/// A family status of a key whose override gives it a daily limit under
/// a per-second plan reads the key under its own limits: its day's use
/// stays, where read under the plan's limits the daily limit would be
/// carried away and the next request would find a fresh day.
#[tokio::test]
async fn a_family_status_reads_a_key_under_its_own_limits_and_keeps_its_use() {
    let clock = FakeClock::new(Timestamp::from_secs(1_700_006_400));
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let plan = Policy::new("api", Algorithm::FixedWindow, "10/s").unwrap();
    let overrides = tollgate::MemoryOverrides::with_clock(clock.clone());
    let key = Key::user("acme");
    let daily: tollgate::Override = "1000/day".parse().unwrap();
    tollgate::OverrideStore::set(&overrides, &key, &plan, daily, None)
        .await
        .unwrap();
    let limiter = RateLimiter::with_store(plan, store).overrides(overrides);
    assert!(limiter.check_n(&key, 1000).await.unwrap().is_allowed());
    clock.advance(Duration::from_secs(1));
    let status = limiter.family_status(&key).await.unwrap();
    assert_eq!(status.len(), 1);
    let (policy, decision) = &status[0];
    assert_eq!(policy.name(), "api");
    assert_eq!(policy.limits().len(), 1);
    assert_eq!((decision.limit(), decision.remaining()), (1000, 0));
    clock.advance(Duration::from_secs(1));
    assert!(!limiter.check(&key).await.unwrap().is_allowed());
    assert_eq!(limiter.status(&key).await.unwrap().remaining(), 0);
}

/// A key an operator denies for an hour is told, by a limiter's decision
/// and its rejection, to come back when the deny ends: the decision's
/// reset an hour on, as its `retry_after`. It said the quota was back at
/// once. Its rejection is the layer's answer to a deny: 403, with
/// `Retry-After` the rest of the deny (it was a 429 naming the plan's
/// limit, which never refused the key).
#[tokio::test]
async fn a_deny_for_an_hour_resets_when_it_ends() {
    let plan = Policy::new("api", Algorithm::Gcra, "10/s").unwrap();
    let overrides = tollgate::MemoryOverrides::new();
    let key = Key::user("mallory");
    let deny: tollgate::Override = "deny".parse().unwrap();
    let hour = Duration::from_secs(3_600);
    tollgate::OverrideStore::set(&overrides, &key, &plan, deny, Some(hour))
        .await
        .unwrap();
    let limiter = RateLimiter::new(plan).overrides(overrides);
    let denied = limiter.check(&key).await.unwrap();
    assert!(!denied.is_allowed());
    let retry = denied.retry_after().unwrap();
    assert!(
        retry > hour - Duration::from_secs(5) && retry <= hour,
        "{retry:?}"
    );
    assert_eq!(denied.reset(), retry);
    let response = limiter.rejection(&denied, tollgate::HeaderStyle::GitHub);
    assert_eq!(response.status(), http::StatusCode::FORBIDDEN);
    let secs = retry.as_secs() + u64::from(retry.subsec_nanos() > 0);
    assert_eq!(response.headers()["retry-after"], secs.to_string().as_str());
    assert!(!response.headers().contains_key("x-ratelimit-remaining"));
}

/// A key an operator denies until lifted gets the layer's answer to it
/// from a limiter too (403, no `Retry-After`), and a wait for it says so:
/// it was a 429, and a wait's error, for a cost above a capacity of 0
/// that the key never asked for.
#[tokio::test]
async fn a_deny_until_lifted_is_told_as_the_layer_tells_it() {
    let plan = Policy::new("api", Algorithm::Gcra, "10/s").unwrap();
    let overrides = tollgate::MemoryOverrides::new();
    let key = Key::user("mallory");
    let deny: tollgate::Override = "deny".parse().unwrap();
    tollgate::OverrideStore::set(&overrides, &key, &plan, deny, None)
        .await
        .unwrap();
    let limiter = RateLimiter::new(plan).overrides(overrides);
    let denied = limiter.check(&key).await.unwrap();
    let response = limiter.rejection(&denied, tollgate::HeaderStyle::GitHub);
    assert_eq!(response.status(), http::StatusCode::FORBIDDEN);
    assert!(!response.headers().contains_key("retry-after"));
    let waited = limiter.until_ready(&key, Duration::from_secs(60)).await;
    assert!(
        matches!(&waited, Err(WaitError::DeniedByOperator { policy }) if policy == "api"),
        "{waited:?}"
    );
    // A refusal of the store's is told as before.
    let other = Key::user("ada");
    assert!(limiter.check_n(&other, 10).await.unwrap().is_allowed());
    let refused = limiter.check(&other).await.unwrap();
    assert!(!refused.is_allowed());
    let response = limiter.rejection(&refused, tollgate::HeaderStyle::GitHub);
    assert_eq!(response.status(), http::StatusCode::TOO_MANY_REQUESTS);
}

/// A settlement refunds no more than its reservation took, whatever the
/// caller says it reserved: a reservation of 1 settled as one of 1,000
/// minted 999 units.
#[tokio::test(start_paused = true)]
async fn a_settlement_refunds_no_more_than_its_reservation_took() {
    let limiter = limiter(Policy::new("tokens", Algorithm::TokenBucket, "1000/min").unwrap());
    let key = Key::user("acme");
    let small = limiter.check_n(&key, 1).await.unwrap();
    assert!(limiter.check_n(&key, 999).await.unwrap().is_allowed());
    let after = limiter.settle(&key, &small, 1_000, 0).await.unwrap();
    assert_eq!(after.remaining(), 1);
}

/// A memory store that counts the checks it is asked for and, with
/// `no_cost`, answers them as a store that reports no cost would (built
/// with `Decision::new` alone).
#[derive(Clone)]
struct Wrapped {
    store: MemoryStore,
    checks: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    no_cost: bool,
}

impl Wrapped {
    fn new(store: MemoryStore, no_cost: bool) -> Self {
        let checks = Default::default();
        Self {
            store,
            checks,
            no_cost,
        }
    }
}

impl tollgate::Store for Wrapped {
    async fn check(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> Result<tollgate::Decision, tollgate::StoreError> {
        (self.checks).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = self.store.check(key, policy, cost).await?;
        if !self.no_cost {
            return Ok(d);
        }
        let limits = d.limits().to_vec();
        Ok(tollgate::Decision::new(
            policy,
            d.outcome(),
            d.now(),
            d.delay(),
            limits,
        ))
    }

    async fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: tollgate::Settlement,
    ) -> Result<tollgate::Decision, tollgate::StoreError> {
        self.store.settle(key, policy, settlement).await
    }

    async fn reset(&self, key: &Key, policy: &Policy) -> Result<(), tollgate::StoreError> {
        self.store.reset(key, policy).await
    }

    async fn block(
        &self,
        key: &Key,
        policy: &Policy,
        duration: Duration,
    ) -> Result<(), tollgate::StoreError> {
        self.store.block(key, policy, duration).await
    }
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

/// Callers refused together on a key whose policy frees one unit at a
/// time wait in line: only the head checks again, so 50 callers cost at
/// most three checks each (the first, one on reaching the head, one when
/// the unit is due), where they woke together at each retry time and made
/// 1,275 checks (N²/2, found by an audit). Each is still admitted
/// exactly on the policy's pace, and one that gives up or is dropped
/// leaves the line.
#[tokio::test(start_paused = true)]
async fn callers_waiting_on_one_key_check_in_line() {
    let clock = TokioClock::starting_at(Timestamp::from_secs(1_700_000_040));
    let store = Wrapped::new(MemoryStore::builder().clock(clock).build().unwrap(), false);
    let limiter = RateLimiter::with_store(partner(1), store.clone());
    let key = Key::custom("partner");
    let start = Instant::now();
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (limiter, key) = (limiter.clone(), key.clone());
            tokio::spawn(async move {
                limiter
                    .until_ready(&key, Duration::from_secs(10))
                    .await
                    .unwrap();
                start.elapsed()
            })
        })
        .collect();
    let mut admitted = Vec::new();
    for task in tasks {
        admitted.push(task.await.unwrap());
    }
    admitted.sort();
    // One every 100 ms, from the start.
    let pace: Vec<_> = (0..50).map(|i| Duration::from_millis(100 * i)).collect();
    assert_eq!(admitted, pace);
    let checks = store.checks.load(std::sync::atomic::Ordering::Relaxed);
    assert!(checks <= 3 * 50, "{checks} checks");

    // A head of the line whose future is dropped leaves it: the next is
    // admitted on time.
    let wait = |max_wait| {
        let (limiter, key) = (limiter.clone(), key.clone());
        tokio::spawn(async move { limiter.until_ready(&key, max_wait).await })
    };
    let dropped = wait(Duration::from_secs(1));
    let next = wait(Duration::from_secs(1));
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    dropped.abort();
    let waited = Instant::now();
    next.await.unwrap().unwrap();
    assert_eq!(waited.elapsed(), Duration::from_millis(100));
}

/// A line is first come first served, whatever the costs: a caller of
/// 10 units is admitted when its burst is back, not starved by callers of
/// 1 unit taking each unit as it came back (it gave up after 4.6 s with
/// lines per cost, found by a review); they wait behind it.
#[tokio::test(start_paused = true)]
async fn a_large_caller_is_not_starved_by_small_ones_behind_it() {
    let limiter = limiter(partner(10));
    let key = Key::custom("partner");
    assert!(limiter.check_n(&key, 10).await.unwrap().is_allowed());
    let start = Instant::now();
    let large = tokio::spawn({
        let (limiter, key) = (limiter.clone(), key.clone());
        async move {
            limiter
                .until_n_ready(&key, 10, Duration::from_secs(5))
                .await
        }
    });
    tokio::task::yield_now().await;
    let small: Vec<_> = (0..4)
        .map(|_| {
            let (limiter, key) = (limiter.clone(), key.clone());
            tokio::spawn(async move {
                for _ in 0..5 {
                    limiter
                        .until_ready(&key, Duration::from_secs(10))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    large.await.unwrap().unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    for task in small {
        task.await.unwrap();
    }
}

/// A reservation of cost 0 refunds nothing: a peek settled as a
/// reservation of 10 minted 10 units (found by a review). Of a store whose
/// decisions carry no cost (built with `Decision::new` alone), no refund
/// becomes a charge, and a use beyond the caller's figure is charged.
#[tokio::test]
async fn a_reservation_of_cost_0_refunds_nothing_and_charges_only_the_excess() {
    let exhausted = limiter(Policy::new("peeked", Algorithm::Gcra, "10/min").unwrap());
    let key = Key::user("minter");
    assert!(exhausted.check_n(&key, 10).await.unwrap().is_allowed());
    let peek = exhausted.check_n(&key, 0).await.unwrap();
    assert_eq!((peek.is_allowed(), peek.cost()), (true, 0));
    for _ in 0..5 {
        exhausted.settle(&key, &peek, 10, 0).await.unwrap();
    }
    assert!(!exhausted.check(&key).await.unwrap().is_allowed());

    let policy = Policy::new("tokens", Algorithm::TokenBucket, "1000/min").unwrap();
    let limiter = RateLimiter::with_store(policy, Wrapped::new(MemoryStore::new(), true));
    let key = Key::user("acme");
    let reservation = limiter.check_n(&key, 300).await.unwrap();
    assert_eq!(reservation.cost(), 0);
    let after = limiter.settle(&key, &reservation, 300, 120).await.unwrap();
    assert_eq!(after.remaining(), 700);
    let after = limiter.settle(&key, &reservation, 300, 350).await.unwrap();
    assert_eq!(after.remaining(), 650);
}
