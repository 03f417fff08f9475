//! Quota leases on real Redis: four instances never admit more than the
//! limit, what they under-admit is exactly what their leases hold, a
//! returned unit is usable at once, resets and blocks end every lease,
//! and a Redis failure follows the failure policy.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use futures::future::join_all;
use tollgate::{Algorithm, FailureMode, FakeClock, FallbackStore, Key, Policy, Store, Timestamp};
use tollgate_redis::{LeasedStore, RedisStore};
use tollgate_tests::{RedisServer, leased_store, require_redis, unique_prefix};

const START: Timestamp = Timestamp::from_secs(1_700_000_000);

/// `n` instances, each a Redis store and a leased store on `clock`,
/// sharing one prefix and one invalidation channel. `deny_cache` sizes
/// each Redis store's cache of denials: a cached denial stands until its
/// own retry time, whatever other instances give back meanwhile.
async fn instances(
    url: &str,
    test: &str,
    clock: &FakeClock,
    n: usize,
    share: u64,
    deny_cache: usize,
) -> Vec<LeasedStore<RedisStore>> {
    let prefix = unique_prefix(test);
    let mut stores = Vec::new();
    for _ in 0..n {
        let interval = Duration::from_millis(8);
        stores.push(leased_store(url, &prefix, clock, interval, share, deny_cache).await);
    }
    stores
}

fn outstanding(stores: &[LeasedStore<RedisStore>]) -> u64 {
    stores.iter().map(|s| s.outstanding().1).sum()
}

/// Requests `per_instance` of cost 1 on each store at once; how many
/// were admitted.
async fn burst(
    stores: &[LeasedStore<RedisStore>],
    key: &Key,
    policy: &Policy,
    per_instance: usize,
) -> u64 {
    let calls = stores
        .iter()
        .flat_map(|s| (0..per_instance).map(move |_| s.check(key, policy, 1)));
    join_all(calls)
        .await
        .into_iter()
        .map(|d| u64::from(d.unwrap().is_allowed()))
        .sum()
}

/// Makes `store` measure a hot key: 10 requests a millisecond for 10 ms,
/// more than one lease interval.
async fn warm(
    store: &LeasedStore<RedisStore>,
    clock: &FakeClock,
    key: &Key,
    policy: &Policy,
) -> u64 {
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += burst(std::slice::from_ref(store), key, policy, 10).await;
        clock.advance(Duration::from_millis(1));
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_admit_exactly_the_limit_of_each_window() {
    let url = require_redis().await;
    let clock = FakeClock::new(START);
    // No deny cache: an exhausted key's requests go to the store rather
    // than ask for leases, and a cached denial would outlive the units
    // another instance gives back (see the bound test below).
    let stores = instances(&url, "lease-exact", &clock, 4, 16, 0).await;
    let policy = Policy::new("hot", Algorithm::FixedWindow, "20000/s").unwrap();
    let key = Key::user("hot");
    let cap = 20_000 / 16;
    let calls = || stores.iter().map(|s| s.calls().total()).sum::<u64>();
    for window in 0..3 {
        let mut admitted = 0;
        let calls_before = calls();
        // Demand of 40 a millisecond, twice the limit.
        for tick in 0..1000 {
            admitted += burst(&stores, &key, &policy, 10).await;
            if tick == 399 && window > 0 {
                // Far from the limit, with the rate known: at most one
                // store call in 20 admissions.
                let spent = calls() - calls_before;
                assert!(
                    spent * 20 <= admitted,
                    "{spent} store calls for {admitted} admissions"
                );
            }
            if tick == 999 {
                // The window's last moment: the store counted every
                // admission plus what the leases hold, which is the limit.
                for store in &stores {
                    store.wait_for_grants().await;
                }
                let held = outstanding(&stores);
                assert_eq!(
                    admitted + held,
                    20_000,
                    "window {window}: {admitted} admitted, {held} held"
                );
                assert!(held <= 4 * 2 * cap, "window {window}: {held} held");
            }
            clock.advance(Duration::from_millis(1));
        }
        assert!(admitted <= 20_000);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_admission_is_what_leases_hold_and_returned_units_are_usable_at_once() {
    let url = require_redis().await;
    let clock = FakeClock::new(START);
    let stores = instances(&url, "lease-bound", &clock, 2, 4, 0).await;
    let (a, b) = (&stores[0], &stores[1]);
    let policy = Policy::new("bound", Algorithm::Gcra, "600/min").unwrap();
    let key = Key::user("ada");
    let by_a = warm(a, &clock, &key, &policy).await;
    assert_eq!(by_a, 100, "far from the limit, all admitted");
    // The lease being spent, and perhaps the next, asked for ahead.
    a.wait_for_grants().await;
    let (leases, held) = a.outstanding();
    assert!((1..=2).contains(&leases), "the hot key has a lease");
    assert!(
        held > 0 && held <= 2 * 600 / 4,
        "each lease at most a quarter: {held}"
    );

    // With time standing still, B gets exactly what neither A's
    // admissions nor A's lease took.
    let mut by_b = 0;
    while b.check(&key, &policy, 1).await.unwrap().is_allowed() {
        by_b += 1;
    }
    assert_eq!(by_b, 600 - by_a - held);

    // A gives its lease back: B gets those units at once.
    a.return_leases().await;
    assert_eq!(a.outstanding(), (0, 0));
    let mut after = 0;
    while b.check(&key, &policy, 1).await.unwrap().is_allowed() {
        after += 1;
    }
    assert_eq!(after, held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_or_reset_on_one_instance_ends_the_leases_of_all() {
    let url = require_redis().await;
    let clock = FakeClock::new(START);
    let stores = instances(&url, "lease-reset", &clock, 2, 4, 0).await;
    let (a, b) = (&stores[0], &stores[1]);
    let policy = Policy::new("ops", Algorithm::TokenBucket, "600/min").unwrap();
    let key = Key::user("mallory");
    warm(a, &clock, &key, &policy).await;
    a.wait_for_grants().await;
    assert!(a.outstanding().0 >= 1);

    // Blocked from B: A's next request is denied, with the block's exact
    // Retry-After, though A held units.
    b.block(&key, &policy, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(a.outstanding(), (0, 0));
    let denied = a.check(&key, &policy, 1).await.unwrap();
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(60)));

    // Reset from B: the key starts afresh, and no unit leased before the
    // reset is spent after it. A and B together admit exactly the
    // capacity, once A gives back what it holds.
    b.reset(&key, &policy).await.unwrap();
    let mut admitted = warm(a, &clock, &key, &policy).await;
    a.wait_for_grants().await;
    assert!(a.outstanding().0 >= 1, "a new lease, from the fresh state");
    let mut held = a.outstanding().1;
    while b.check(&key, &policy, 1).await.unwrap().is_allowed() {
        admitted += 1;
    }
    // Time moved 10 ms while warming: the bucket refilled by 0.1 token,
    // less than one, so the count is exact.
    assert_eq!(admitted + held, 600);
    a.return_leases().await;
    held = 0;
    while b.check(&key, &policy, 1).await.unwrap().is_allowed() {
        admitted += 1;
    }
    assert_eq!(admitted + held, 600);
}

/// A block this instance hears nothing of (made through a plain store,
/// by an admin process, say): once the store answers one of its grants
/// blocked, the instance spends none of the leases it holds, and every
/// request is denied with the block's Retry-After. It went on spending
/// the lease it held after that answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_answer_from_the_store_ends_the_leases_it_never_heard_of() {
    let url = require_redis().await;
    let clock = FakeClock::new(START);
    let stores = instances(&url, "lease-unheard", &clock, 1, 4, 0).await;
    let a = &stores[0];
    let policy = Policy::new("ops", Algorithm::TokenBucket, "600/min").unwrap();
    let key = Key::user("eve");
    warm(a, &clock, &key, &policy).await;
    a.wait_for_grants().await;
    assert!(a.outstanding().1 > 0, "{:?}", a.outstanding());
    a.get_ref()
        .block(&key, &policy, Duration::from_secs(60))
        .await
        .unwrap();
    // Requests spend the lease until a grant is asked for, and refused.
    let grants = a.calls().grants;
    for spent in 0.. {
        assert!(spent < 200, "no grant asked for");
        let decision = a.check(&key, &policy, 1).await.unwrap();
        a.wait_for_grants().await;
        if a.calls().grants > grants || !decision.is_allowed() {
            break;
        }
    }
    assert_eq!(a.outstanding(), (0, 0));
    for _ in 0..20 {
        let denied = a.check(&key, &policy, 1).await.unwrap();
        assert!(denied.is_blocked(), "{denied:?}");
        assert_eq!(denied.retry_after(), Some(Duration::from_secs(60)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_failure_during_a_lease_follows_the_failure_policy() {
    let mut server = RedisServer::spawn();
    let url = server.url();
    let clock = FakeClock::new(START);
    let stores = instances(&url, "lease-fail", &clock, 1, 4, 10_000).await;
    let leased = stores.into_iter().next().unwrap();
    let policy = Policy::new("fail", Algorithm::Gcra, "600/min").unwrap();
    let key = Key::user("ada");
    warm(&leased, &clock, &key, &policy).await;
    leased.wait_for_grants().await;
    assert!(leased.outstanding().0 >= 1);

    server.kill();
    // The lost subscription drops the lease: the instance could no
    // longer hear of a reset or block.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while leased.is_listening() {
        assert!(
            std::time::Instant::now() < deadline,
            "the loss went unnoticed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(leased.outstanding(), (0, 0));

    // Every decision now needs Redis, and its failure is the policy's.
    assert!(leased.check(&key, &policy, 1).await.is_err());
    let closed = FallbackStore::new(leased.clone()).on_store_error(FailureMode::Closed);
    assert!(closed.check(&key, &policy, 1).await.is_err());
    let local = FallbackStore::new(leased.clone()).on_store_error(FailureMode::Local);
    let decided = local.check(&key, &policy, 1).await.unwrap();
    assert!(decided.is_allowed());
    assert_eq!(decided.limit(), 600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_log_or_leaky_bucket_is_never_leased() {
    let url = require_redis().await;
    let clock = FakeClock::new(START);
    let stores = instances(&url, "lease-never", &clock, 1, 4, 10_000).await;
    let key = Key::user("ada");
    for algorithm in [Algorithm::SlidingLog, Algorithm::LeakyBucket] {
        let policy = Policy::new(algorithm.as_str(), algorithm, "600/min").unwrap();
        assert_eq!(warm(&stores[0], &clock, &key, &policy).await, 100);
    }
    assert_eq!(stores[0].outstanding(), (0, 0));
    let calls = stores[0].calls();
    assert_eq!(
        (calls.grants, calls.direct),
        (0, 200),
        "every request decided by Redis"
    );
}

/// Spends `key` through `store`, 10 requests a millisecond for 150 ms,
/// then checks it 2,000 times more within the same window; how many were
/// admitted, and how many scripts Redis ran for the 2,000.
async fn spend_then_deny(
    store: &impl Store,
    con: &mut redis::Connection,
    clock: &FakeClock,
    key: &Key,
    policy: &Policy,
) -> (u64, u64) {
    let scripts = |con: &mut redis::Connection| {
        tollgate_tests::command_calls(con, "evalsha") + tollgate_tests::command_calls(con, "eval")
    };
    let mut admitted = 0;
    for _ in 0..150 {
        for _ in 0..10 {
            admitted += u64::from(store.check(key, policy, 1).await.unwrap().is_allowed());
        }
        clock.advance(Duration::from_millis(1));
    }
    let before = scripts(con);
    for _ in 0..200 {
        for _ in 0..10 {
            assert!(!store.check(key, policy, 1).await.unwrap().is_allowed());
        }
        clock.advance(Duration::from_millis(1));
    }
    (admitted, scripts(con) - before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_key_costs_no_more_redis_calls_than_without_leases() {
    let server = RedisServer::spawn();
    let url = server.url();
    let mut con = server.connection();
    let clock = FakeClock::new(START);
    let policy = Policy::new("spent", Algorithm::FixedWindow, "1000/min").unwrap();
    let key = Key::user("hot");
    let plain = RedisStore::builder()
        .prefix(unique_prefix("plain-spent"))
        .deadline(Duration::from_secs(2))
        .test_clock(clock.clone())
        .connect(url.as_str())
        .await
        .unwrap();
    let (admitted, plain_calls) = spend_then_deny(&plain, &mut con, &clock, &key, &policy).await;
    assert_eq!(admitted, 1000);

    let leased = instances(&url, "lease-spent", &clock, 1, 4, 10_000)
        .await
        .remove(0);
    let (admitted, leased_calls) = spend_then_deny(&leased, &mut con, &clock, &key, &policy).await;
    leased.wait_for_grants().await;
    assert_eq!(
        admitted + leased.outstanding().1,
        1000,
        "the limit, exactly"
    );
    assert!(
        leased.calls().grants > 0,
        "the key was leased while it had room"
    );
    assert!(plain_calls <= 2, "the deny cache answers: {plain_calls}");
    assert!(
        leased_calls <= plain_calls,
        "2,000 denials: {leased_calls} Redis calls with leases, {plain_calls} without"
    );
}

/// Hammers `key` from every store, two tasks each, until 2,000 requests
/// were admitted; then, while the tasks wait and leases are out, runs
/// `operate` once, and lets the tasks go on for `checks_after` more
/// checks. Returns the admissions of checks that began before the
/// operation returned, and of those that began after it.
///
/// The tasks stop for the operation rather than race it: with time
/// standing still a small limit is soon spent, and an operation that
/// waited, on a busy machine, for a moment some lease is out could wait
/// for one that never comes.
async fn hammer_across_a_fence(
    stores: &[LeasedStore<RedisStore>],
    key: &Key,
    policy: &Policy,
    checks_after: u64,
    operate: impl Future<Output = ()>,
) -> (u64, u64) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const BEFORE: u64 = 2_000;
    let fenced = Arc::new(AtomicBool::new(false));
    let (go_on, _) = tokio::sync::watch::channel(false);
    let (before, after, checked, waiting) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut tasks = Vec::new();
    for store in stores {
        for _ in 0..2 {
            let (store, key, policy) = (store.clone(), key.clone(), policy.clone());
            let fenced = fenced.clone();
            let mut go_on = go_on.subscribe();
            let (before, after, checked, waiting) = (
                before.clone(),
                after.clone(),
                checked.clone(),
                waiting.clone(),
            );
            tasks.push(tokio::spawn(async move {
                while checked.load(Ordering::Relaxed) < checks_after {
                    if before.load(Ordering::Relaxed) >= BEFORE && !fenced.load(Ordering::Acquire) {
                        waiting.fetch_add(1, Ordering::Release);
                        go_on.wait_for(|go| *go).await.unwrap();
                    }
                    let was_fenced = fenced.load(Ordering::Acquire);
                    let admitted = store.check(&key, &policy, 1).await.unwrap().is_allowed();
                    match (was_fenced, admitted) {
                        (false, true) => before.fetch_add(1, Ordering::Relaxed),
                        (true, true) => after.fetch_add(1, Ordering::Relaxed),
                        (_, false) => 0,
                    };
                    if was_fenced {
                        checked.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::task::yield_now().await;
                }
            }));
        }
    }
    let waited = std::time::Instant::now();
    while waiting.load(Ordering::Acquire) < tasks.len() as u64 {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(60),
            "the tasks admit {BEFORE} and wait: {} admitted",
            before.load(Ordering::Relaxed)
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    for store in stores {
        store.wait_for_grants().await;
    }
    // Leases are out when the operator acts: if the pause caught every
    // instance between a spent lease and its next grant, a few more
    // checks take one.
    let mut more = 0;
    while !stores.iter().any(|s| s.outstanding().0 > 0) {
        assert!(more < 1_000, "no lease granted in {more} more checks");
        let store = &stores[more % stores.len()];
        if store.check(key, policy, 1).await.unwrap().is_allowed() {
            before.fetch_add(1, Ordering::Relaxed);
        }
        store.wait_for_grants().await;
        more += 1;
    }
    operate.await;
    fenced.store(true, Ordering::Release);
    go_on.send_replace(true);
    for task in tasks {
        task.await.unwrap();
    }
    (
        before.load(Ordering::Relaxed),
        after.load(Ordering::Relaxed),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_a_block_returns_no_instance_admits() {
    let url = require_redis().await;
    let clock = FakeClock::new(START);
    let stores = instances(&url, "lease-fence-block", &clock, 4, 16, 10_000).await;
    let policy = Policy::new("fence", Algorithm::Gcra, "50000/min").unwrap();
    let key = Key::user("mallory");
    let blocker = stores[3].clone();
    let (before, after) = hammer_across_a_fence(&stores, &key, &policy, 20_000, async {
        blocker
            .block(&key, &policy, Duration::from_secs(60))
            .await
            .unwrap();
    })
    .await;
    assert!(before >= 2_000);
    assert_eq!(after, 0, "admitted after the block returned");
    assert_eq!(outstanding(&stores), 0, "no lease survives the block");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_a_reset_returns_only_the_fresh_allowance_is_spent() {
    let url = require_redis().await;
    let clock = FakeClock::new(START);
    let stores = instances(&url, "lease-fence-reset", &clock, 4, 16, 0).await;
    let policy = Policy::new("fence", Algorithm::Gcra, "5000/min").unwrap();
    let key = Key::user("mallory");
    let resetter = stores[3].clone();
    let (_, after) = hammer_across_a_fence(&stores, &key, &policy, 30_000, async {
        resetter.reset(&key, &policy).await.unwrap();
    })
    .await;
    for store in &stores {
        store.wait_for_grants().await;
    }
    // Time stands still: the fresh allowance is 5,000. What checks begun
    // after the reset returned were admitted, plus what the leases hold,
    // fits in it: no unit leased before the reset is spent after it.
    // (Checks begun while the reset was under way spent fresh units too.)
    let held = outstanding(&stores);
    assert!(after + held <= 5_000, "{after} admitted + {held} held");
    // Whether any fresh unit is left once the reset returns depends on how
    // fast the invalidation travels: until an instance hears it, it may
    // take fresh leases that the fence then ends (their units are not
    // given back: the instance cannot tell them from leases granted before
    // the reset). So this asserts what the reset promises beyond the
    // fence: no instance is left refusing the key. A period later, each
    // admits it.
    println!("after the reset: {after} admitted, {held} held");
    clock.advance(Duration::from_secs(60));
    for store in &stores {
        let decision = store.check(&key, &policy, 1).await.unwrap();
        assert!(decision.is_allowed(), "{decision:?}");
    }
}
