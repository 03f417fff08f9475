//! A lease's unused part that is still on its way back when an operator
//! resets the key lands behind the reset's fence: it gives nothing to the
//! fresh state, which admits exactly one fresh allowance.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tollgate::{
    Algorithm, Decision, FakeClock, Key, Policy, Settlement, Store, StoreError, Timestamp,
};
use tollgate_redis::{LeasedStore, RedisStore};
use tollgate_tests::{require_redis, unique_prefix};

/// What a [`Gated`] store holds at its gate.
#[derive(Clone)]
enum Gate {
    /// Every settlement, until the gate opens; it keeps what they answered.
    Settlements(Arc<Mutex<Vec<Result<Decision, String>>>>),
    /// The checks of one key, while the gate is shut.
    ChecksOf(Key),
}

/// A Redis store that holds some requests at a gate, and counts those
/// that waited there.
#[derive(Clone)]
struct Gated {
    inner: RedisStore,
    gate: Gate,
    open: watch::Receiver<bool>,
    waiting: Arc<AtomicUsize>,
}

impl Gated {
    async fn wait_for_the_gate(&self) {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.clone();
        open.wait_for(|open| *open).await.unwrap();
    }
}

impl Store for Gated {
    async fn check(&self, key: &Key, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        match &self.gate {
            Gate::ChecksOf(gated) if gated == key && !*self.open.borrow() => {
                self.wait_for_the_gate().await;
            }
            Gate::ChecksOf(_) | Gate::Settlements(_) => {}
        }
        self.inner.check(key, policy, cost).await
    }

    async fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: Settlement,
    ) -> Result<Decision, StoreError> {
        match &self.gate {
            Gate::Settlements(answers) => {
                self.wait_for_the_gate().await;
                let settled = self.inner.settle(key, policy, settlement).await;
                let kept = settled
                    .as_ref()
                    .map(Clone::clone)
                    .map_err(ToString::to_string);
                answers.lock().unwrap().push(kept);
                settled
            }
            Gate::ChecksOf(_) => self.inner.settle(key, policy, settlement).await,
        }
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
}

/// A Redis store on a fresh prefix starting with `name`, on `clock`, with
/// no deny cache and deadlines no busy machine misses, and a leased store
/// over it that holds what `gate` names at a gate: the two stores, the
/// gate's sender (`true` opens it, as it starts) and how many requests
/// waited at it.
async fn gated_leases(
    name: &str,
    clock: &FakeClock,
    gate: Gate,
) -> (
    RedisStore,
    LeasedStore<Gated>,
    watch::Sender<bool>,
    Arc<AtomicUsize>,
) {
    let url = require_redis().await;
    let prefix = unique_prefix(name);
    let redis = RedisStore::builder()
        .prefix(&prefix)
        .test_clock(clock.clone())
        .deny_cache(0)
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect(url.as_str())
        .await
        .unwrap();
    let (sender, open) = watch::channel(true);
    let waiting = Arc::new(AtomicUsize::new(0));
    let gated = Gated {
        inner: redis.clone(),
        gate,
        open,
        waiting: waiting.clone(),
    };
    let leased = LeasedStore::builder()
        .interval(Duration::from_millis(8))
        .share(4)
        .channel(format!("{prefix}:leases"))
        .test_clock(clock.clone())
        .connect(gated, url.as_str())
        .await
        .unwrap();
    (redis, leased, sender, waiting)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_on_its_way_when_a_reset_lands_gives_the_fresh_state_nothing() {
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
    let settled = Arc::new(Mutex::new(Vec::new()));
    let gate = Gate::Settlements(settled.clone());
    let (redis, leased, gate, waiting) = gated_leases("lease-late-refund", &clock, gate).await;
    assert!(leased.is_listening());
    // 600 a minute, no refill while the fake clock stands still.
    let policy = Policy::new("late", Algorithm::TokenBucket, "600/min").unwrap();
    let key = Key::user("ada");

    // A hot key takes a lease, and spends part of it.
    for _ in 0..10 {
        for _ in 0..10 {
            assert!(leased.check(&key, &policy, 1).await.unwrap().is_allowed());
        }
        clock.advance(Duration::from_millis(1));
    }
    leased.wait_for_grants().await;
    let (leases, unspent) = leased.outstanding();
    assert!(
        leases >= 1 && unspent > 0,
        "{leases} leases, {unspent} units"
    );

    // Its unused part goes back, and is held on its way.
    gate.send(false).unwrap();
    let returning = tokio::spawn({
        let leased = leased.clone();
        async move { leased.return_leases().await }
    });
    tokio::time::timeout(Duration::from_secs(10), async {
        while waiting.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the give-back reaches the store");

    // Meanwhile the operator resets the key, and the fresh state spends.
    tokio::time::timeout(Duration::from_secs(10), leased.reset(&key, &policy))
        .await
        .expect("the reset returns while a give-back is held")
        .unwrap();
    let spent = redis.check(&key, &policy, 100).await.unwrap();
    assert_eq!(spent.remaining(), 500);

    // The give-back lands after the reset: it changes nothing.
    gate.send(true).unwrap();
    returning.await.unwrap();
    assert_eq!(leased.outstanding(), (0, 0));
    let status = redis.status(&key, &policy).await.unwrap();
    assert_eq!(status.remaining(), 500);
    // The store answered the give-back, with the key's status: it was
    // fenced, not lost to an error.
    let settled = std::mem::take(&mut *settled.lock().unwrap());
    assert_eq!(settled.len(), 1);
    let answer = settled[0].as_ref().expect("the give-back was answered");
    assert_eq!(answer.remaining(), 500);
    assert!(answer.is_allowed());
    let mut admitted = 0;
    while redis.check(&key, &policy, 1).await.unwrap().is_allowed() {
        admitted += 1;
    }
    assert_eq!(admitted, 500, "one fresh allowance, and no more");
}

/// A grant on its way when an operator resets another key is not kept
/// (every invalidation ends the grants in flight), but its units go back:
/// they were dropped, and the key kept them used until they aged out.
/// Every unit of the key stays counted exactly: what Redis counts is what
/// was admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_on_its_way_at_a_reset_of_another_key_gives_its_units_back() {
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
    let hot = Key::user("hot");
    let gate = Gate::ChecksOf(hot.clone());
    let (redis, leased, gate, waiting) = gated_leases("lease-grant-at-reset", &clock, gate).await;
    assert!(leased.is_listening());
    // 600 a minute, no refill while the fake clock stands still.
    let policy = Policy::new("grant-at-reset", Algorithm::TokenBucket, "600/min").unwrap();
    let mut admitted = 0;
    for _ in 0..10 {
        for _ in 0..10 {
            assert!(leased.check(&hot, &policy, 1).await.unwrap().is_allowed());
            admitted += 1;
        }
        clock.advance(Duration::from_millis(1));
    }
    leased.wait_for_grants().await;
    let (leases, unspent) = leased.outstanding();
    assert!(
        leases >= 1 && unspent > 0,
        "{leases} leases, {unspent} units"
    );

    // The key spends its lease until it asks for the next one ahead,
    // which the gate holds.
    gate.send(false).unwrap();
    let grants = leased.calls().grants;
    // A request that asks for the grant itself (its lease ran out before
    // the one asked for ahead) is held with it, and ends after the gate.
    let mut held = None;
    for _ in 0..1_000 {
        let request = tokio::spawn({
            let (leased, hot, policy) = (leased.clone(), hot.clone(), policy.clone());
            async move { leased.check(&hot, &policy, 1).await }
        });
        tokio::time::timeout(Duration::from_secs(10), async {
            while !request.is_finished() && waiting.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("each request ends, or reaches the gate");
        if request.is_finished() {
            assert!(request.await.unwrap().unwrap().is_allowed());
            admitted += 1;
        } else {
            held = Some(request);
        }
        if waiting.load(Ordering::SeqCst) > 0 {
            break;
        }
    }
    assert!(
        waiting.load(Ordering::SeqCst) > 0,
        "the grant reaches the store"
    );
    assert_eq!(leased.calls().grants, grants + 1, "a grant asked for ahead");
    // Meanwhile the operator resets another key.
    leased.reset(&Key::user("other"), &policy).await.unwrap();
    gate.send(true).unwrap();
    if let Some(request) = held {
        assert!(request.await.unwrap().unwrap().is_allowed());
        admitted += 1;
    }
    leased.wait_for_grants().await;
    leased.return_leases().await;
    let status = redis.status(&hot, &policy).await.unwrap();
    assert_eq!(
        600 - status.remaining(),
        admitted,
        "Redis counts what was admitted"
    );
}

/// A lease's unused part given back after it drained from the key's
/// backlog gives nothing twice. The lease's units drained (a GCRA frees a
/// unit each interval, spent or not); another instance then spent the
/// whole burst; the lease's late return handed its units out again, at
/// once, past the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_given_back_after_it_drained_gives_nothing_twice() {
    let url = require_redis().await;
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
    let prefix = unique_prefix("lease-drained");
    let redis = RedisStore::builder()
        .prefix(&prefix)
        .test_clock(clock.clone())
        .deny_cache(0)
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect(url.as_str())
        .await
        .unwrap();
    let leased = LeasedStore::builder()
        .interval(Duration::from_millis(8))
        .share(4)
        .channel(format!("{prefix}:leases"))
        .test_clock(clock.clone())
        .connect(redis.clone(), url.as_str())
        .await
        .unwrap();
    // A burst of 1,000, one unit back each millisecond.
    let policy = Policy::new("drained", Algorithm::Gcra, "1000/s").unwrap();
    let key = Key::user("ada");
    for _ in 0..10 {
        for _ in 0..10 {
            assert!(leased.check(&key, &policy, 1).await.unwrap().is_allowed());
        }
        clock.advance(Duration::from_millis(1));
    }
    leased.wait_for_grants().await;
    let (leases, unspent) = leased.outstanding();
    assert!(
        leases >= 1 && unspent > 0,
        "{leases} leases, {unspent} units"
    );
    // Two seconds on, everything this instance took has drained; another
    // instance spends the whole burst.
    clock.advance(Duration::from_secs(2));
    let mut spent = 0;
    while redis.check(&key, &policy, 1).await.unwrap().is_allowed() {
        spent += 1;
    }
    assert_eq!(spent, 1_000);
    leased.return_leases().await;
    assert_eq!(leased.outstanding(), (0, 0));
    let after = redis.check(&key, &policy, 1).await.unwrap();
    assert!(
        !after.is_allowed(),
        "{unspent} units handed out again: {after:?}"
    );
}
