//! What a lease gives back, where it meets resets and refunds: a return
//! on its way when an operator resets the key gives the fresh state
//! nothing, and a return after the lease's units drained from the key's
//! backlog (with time, or sooner, by refunds) gives nothing twice.
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

/// A Redis store on a fresh prefix starting with `name`, on `clock`, with
/// no deny cache and deadlines no busy machine misses, and a leased store
/// over it.
async fn leases_on(name: &str, clock: &FakeClock) -> (RedisStore, LeasedStore<RedisStore>) {
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
    let leased = LeasedStore::builder()
        .interval(Duration::from_millis(8))
        .share(4)
        .channel(format!("{prefix}:leases"))
        .test_clock(clock.clone())
        .connect(redis.clone(), url.as_str())
        .await
        .unwrap();
    (redis, leased)
}

/// The algorithms whose keys leases serve.
const LEASED: [Algorithm; 4] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
];

/// A still clock, a Redis store and leases over it, and the key `ada`
/// under a policy named `name` of 1,000 a second by `algorithm`.
async fn a_leased_key(
    name: &str,
    algorithm: Algorithm,
) -> (FakeClock, RedisStore, LeasedStore<RedisStore>, Policy, Key) {
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
    let (redis, leased) = leases_on(&format!("lease-{name}"), &clock).await;
    let policy = Policy::new(name, algorithm, "1000/s").unwrap();
    (clock, redis, leased, policy, Key::user("ada"))
}

/// A hundred requests of `key` over 10 ms, through `leased`: the key is
/// hot, and holds a lease with units left, how many returned.
async fn take_a_lease(
    leased: &LeasedStore<RedisStore>,
    clock: &FakeClock,
    key: &Key,
    policy: &Policy,
) -> u64 {
    for _ in 0..10 {
        for _ in 0..10 {
            assert!(leased.check(key, policy, 1).await.unwrap().is_allowed());
        }
        clock.advance(Duration::from_millis(1));
    }
    leased.wait_for_grants().await;
    let (leases, unspent) = leased.outstanding();
    assert!(
        leases >= 1 && unspent > 0,
        "{leases} leases, {unspent} units"
    );
    unspent
}

/// How many requests of 1 `store` admits before its first denial.
async fn admit_all(store: &RedisStore, key: &Key, policy: &Policy) -> u64 {
    let mut admitted = 0;
    while store.check(key, policy, 1).await.unwrap().is_allowed() {
        admitted += 1;
    }
    admitted
}

/// 5 ms before `backlog` from now ends, another instance takes every
/// unit Redis admits of the key; then `leased` gives its leases back, and
/// it takes what they gave: all it admitted.
async fn admitted_around_the_return(
    redis: &RedisStore,
    leased: &LeasedStore<RedisStore>,
    clock: &FakeClock,
    backlog: Duration,
    (key, policy): (&Key, &Policy),
) -> u64 {
    clock.advance(backlog - Duration::from_millis(5));
    let admitted = admit_all(redis, key, policy).await;
    leased.return_leases().await;
    admitted + admit_all(redis, key, policy).await
}

/// A lease's unused part given back after it drained from the key's
/// backlog gives nothing twice. The lease's units drained (a GCRA frees a
/// unit each interval, spent or not); another instance then spent the
/// whole burst; the lease's late return handed its units out again, at
/// once, past the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_given_back_after_it_drained_gives_nothing_twice() {
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
    let (redis, leased) = leases_on("lease-drained", &clock).await;
    // A burst of 1,000, one unit back each millisecond.
    let policy = Policy::new("drained", Algorithm::Gcra, "1000/s").unwrap();
    let key = Key::user("ada");
    let unspent = take_a_lease(&leased, &clock, &key, &policy).await;
    // Two seconds on, everything this instance took has drained; another
    // instance spends the whole burst.
    clock.advance(Duration::from_secs(2));
    assert_eq!(admit_all(&redis, &key, &policy).await, 1_000);
    leased.return_leases().await;
    assert_eq!(leased.outstanding(), (0, 0));
    let after = redis.check(&key, &policy, 1).await.unwrap();
    assert!(
        !after.is_allowed(),
        "{unspent} units handed out again: {after:?}"
    );
}

/// Requests spent from a lease and refunded shorten, in Redis, the
/// backlog the grant left there, and with it the time the lease's unused
/// units stay in it: they drain sooner, by the units refunded. Given back
/// after they drained, they were handed out a second time, past the
/// limit (1,005 of a burst of 1,000 here). The lease counts the refunds
/// of its key sent through its instance, and gives back that much less.
/// GCRA and the token bucket, the rate-based algorithms that lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_of_leased_requests_shorten_what_the_lease_gives_back() {
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
        let (redis, leased) = leases_on("lease-refund", &clock).await;
        // A burst of 1,000, one unit back each millisecond.
        let policy = Policy::new("refunded", algorithm, "1000/s").unwrap();
        let key = Key::user("ada");
        let unspent = take_a_lease(&leased, &clock, &key, &policy).await;
        // Where the grant's backlog ends in Redis.
        let backlog = redis.status(&key, &policy).await.unwrap().reset();
        // Ten requests spent from the lease, each refunded whole: the
        // backlog in Redis ends 10 ms sooner.
        for _ in 0..10 {
            let spent = leased.check(&key, &policy, 1).await.unwrap();
            assert!(spent.is_allowed());
            let refund = Settlement::of(&spent, 1, 0);
            leased.settle(&key, &policy, refund).await.unwrap();
        }
        leased.wait_for_grants().await;
        assert!(unspent > 10, "{algorithm:?}: a lease of {unspent} units");
        assert_eq!(leased.outstanding().1, unspent - 10, "{algorithm:?}");
        let shortened = redis.status(&key, &policy).await.unwrap().reset();
        assert_eq!(
            shortened,
            backlog - Duration::from_millis(10),
            "{algorithm:?}"
        );
        // 5 ms before the grant's backlog would have ended, another
        // instance takes all Redis admits; then the lease is given back:
        // its unused units drained with the shortened backlog, 5 ms ago.
        let admitted =
            admitted_around_the_return(&redis, &leased, &clock, backlog, (&key, &policy)).await;
        assert_eq!(admitted, 1_000, "{algorithm:?}: a burst in all, no more");
    }
}

/// The bound of a refund sent by another instance, which this one does not
/// see: a lease's return gives back no more than the grant's backlog
/// still held, less this instance's refunds, so another instance's refund
/// of a request reserved before the grant can hand out at most that many
/// units a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instances_refund_hands_out_at_most_its_units_again() {
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
    let (redis, leased) = leases_on("lease-refund-elsewhere", &clock).await;
    let policy = Policy::new("elsewhere", Algorithm::Gcra, "1000/s").unwrap();
    let key = Key::user("ada");
    // Another instance reserves 3 before the grant, and refunds them
    // while the lease is held.
    let reserved = redis.check(&key, &policy, 3).await.unwrap();
    take_a_lease(&leased, &clock, &key, &policy).await;
    let backlog = redis.status(&key, &policy).await.unwrap().reset();
    redis
        .settle(&key, &policy, Settlement::of(&reserved, 3, 0))
        .await
        .unwrap();
    let admitted =
        admitted_around_the_return(&redis, &leased, &clock, backlog, (&key, &policy)).await;
    assert!(
        (1_000..=1_003).contains(&admitted),
        "{admitted} admitted of a burst of 1,000, after a refund of 3 elsewhere"
    );
}

/// A lease's return is a refund too: it shortens the backlog the key's
/// later grant left, and that lease's unused units drain sooner. The key
/// holds a lease and the next one, asked for ahead; a request the first
/// cannot serve ends it, and it gives back what it held; the second,
/// given back later, gives back that much less. Given back whole, it
/// handed its drained units out a second time, past the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leases_return_shortens_what_the_next_one_gives_back() {
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
    let (redis, leased) = leases_on("lease-return-then-return", &clock).await;
    let policy = Policy::new("returned", Algorithm::Gcra, "1000/s").unwrap();
    let key = Key::user("ada");
    take_a_lease(&leased, &clock, &key, &policy).await;
    // Spent on until the next lease is asked for ahead, and held.
    for _ in 0..1_000 {
        if leased.outstanding().0 == 2 {
            break;
        }
        assert!(leased.check(&key, &policy, 1).await.unwrap().is_allowed());
        leased.wait_for_grants().await;
    }
    let (leases, both) = leased.outstanding();
    assert_eq!(leases, 2, "a lease and the next, {both} units");
    // Where the later grant's backlog ends in Redis.
    let backlog = redis.status(&key, &policy).await.unwrap().reset();
    // Half of what both hold: more than the first, asked ahead of its last
    // eighth, still holds; the next one serves it, and the first goes back.
    let cost = both / 2;
    assert!(
        leased
            .check(&key, &policy, cost)
            .await
            .unwrap()
            .is_allowed()
    );
    leased.wait_for_grants().await;
    let (leases, left) = leased.outstanding();
    assert_eq!(leases, 1);
    let returned = both - cost - left;
    assert!(returned > 0, "the first lease gave nothing back");
    let shortened = redis.status(&key, &policy).await.unwrap().reset();
    assert_eq!(shortened, backlog - Duration::from_millis(returned));
    // 5 ms before the later grant's backlog would have ended, another
    // instance takes all Redis admits; then the lease is given back.
    let admitted =
        admitted_around_the_return(&redis, &leased, &clock, backlog, (&key, &policy)).await;
    assert_eq!(
        admitted, 1_000,
        "{returned} returned first: a burst, no more"
    );
}

/// A refund of a request spent from a lease granted before a reset is
/// fenced like the lease's own return: the fresh state gets nothing. The
/// reset went through the store behind the leases, so this instance was
/// not told and spent on from its old lease. Each such request was
/// stamped at the grant's time plus the time since, after the reset, and
/// its refund landed in the fresh state: 9 units each here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_of_a_request_spent_from_a_lease_granted_before_a_reset_gives_nothing() {
    for algorithm in LEASED {
        let (clock, redis, leased, policy, key) = a_leased_key("fenced", algorithm).await;
        let unspent = take_a_lease(&leased, &clock, &key, &policy).await;
        assert!(unspent >= 50, "{algorithm:?}: a lease of {unspent} units");
        redis.reset(&key, &policy).await.unwrap();
        clock.advance(Duration::from_millis(1));
        // The fresh state spends 100.
        let fresh = redis.check(&key, &policy, 100).await.unwrap();
        assert_eq!(fresh.remaining(), 900, "{algorithm:?}");
        // Five requests of 10 from the old lease, each costing 1: no call
        // to the store, neither a decision nor a grant asked ahead.
        let calls = leased.calls();
        for _ in 0..5 {
            let spent = leased.check(&key, &policy, 10).await.unwrap();
            assert!(spent.is_allowed(), "{algorithm:?}");
            assert!(spent.reserved_at() < spent.now(), "{algorithm:?}");
            let refund = Settlement::of(&spent, 10, 1);
            leased.settle(&key, &policy, refund).await.unwrap();
        }
        leased.wait_for_grants().await;
        let after = leased.calls();
        assert_eq!(
            (after.direct, after.grants),
            (calls.direct, calls.grants),
            "{algorithm:?}: all leased"
        );
        let status = redis.status(&key, &policy).await.unwrap();
        assert_eq!(status.remaining(), 900, "{algorithm:?}: no refund landed");
    }
}

/// A charge of a request spent from a lease is paid from the units the
/// key's leases still hold, which the store counted at their grant, and
/// only the rest goes to the store, so that the debt the charge leaves
/// holds at once. The store was charged in full, and the key went on
/// being admitted from its lease through its debt.
#[tokio::test]
async fn a_charge_is_paid_from_the_keys_leases_first() {
    for algorithm in LEASED {
        let (clock, redis, leased, policy, key) = a_leased_key("charged", algorithm).await;
        take_a_lease(&leased, &clock, &key, &policy).await;
        let spent = leased.check(&key, &policy, 1).await.unwrap();
        leased.wait_for_grants().await;
        let (_, unspent) = leased.outstanding();
        assert!(unspent >= 10, "{algorithm:?}: a lease of {unspent} units");
        let before = redis.status(&key, &policy).await.unwrap().remaining();
        // The request cost 10 more than it reserved: paid by the lease.
        let settled = leased.settle(&key, &policy, Settlement::of(&spent, 1, 11));
        settled.await.unwrap();
        assert_eq!(leased.outstanding().1, unspent - 10, "{algorithm:?}");
        let after = redis.status(&key, &policy).await.unwrap().remaining();
        assert_eq!(after, before, "{algorithm:?}: the store was not charged");
        // Then one that cost 500 more than the lease holds.
        let spent = leased.check(&key, &policy, 1).await.unwrap();
        leased.wait_for_grants().await;
        let before = redis.status(&key, &policy).await.unwrap().remaining();
        let left = leased.outstanding().1;
        let charge = left + 500;
        let settled = leased.settle(&key, &policy, Settlement::of(&spent, 1, 1 + charge));
        settled.await.unwrap();
        assert_eq!(leased.outstanding().1, 0, "{algorithm:?}");
        let after = redis.status(&key, &policy).await.unwrap().remaining();
        assert_eq!(
            after,
            before - 500,
            "{algorithm:?}: the store charged the rest"
        );
    }
}
