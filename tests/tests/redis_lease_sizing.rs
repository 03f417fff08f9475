//! How many calls leases take for a key at a steady rate, on real Redis:
//! one grant per one and a half intervals of the key's traffic, nothing
//! given back while the rate holds, and a lease that ends with units left
//! hands over to the one asked for ahead rather than asking for another.
//! Every unit stays counted: what was admitted plus what the leases hold
//! is exactly what Redis counts as used.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use tollgate::{Algorithm, FakeClock, Key, Policy, Store, Timestamp};
use tollgate_redis::{LeaseCalls, LeasedStore, RedisStore};
use tollgate_tests::{RedisServer, leased_store, require_redis, unique_prefix};

const START: Timestamp = Timestamp::from_secs(1_700_000_000);
const INTERVAL: Duration = Duration::from_millis(100);
/// A fixed window of a day, far above the traffic: what Redis counts as
/// used is exactly `LIMIT - remaining`.
const LIMIT: u64 = 1_000_000;

async fn leased(url: &str, test: &str, clock: &FakeClock) -> LeasedStore<RedisStore> {
    leased_store(url, &unique_prefix(test), clock, INTERVAL, 16, 0).await
}

/// One request every `gap` for `requests` requests, each admitted, each
/// grant asked for ahead settled before time moves on.
async fn steady(
    store: &LeasedStore<RedisStore>,
    clock: &FakeClock,
    key: &Key,
    policy: &Policy,
    gap: Duration,
    requests: u64,
) {
    for _ in 0..requests {
        let decision = store.check(key, policy, 1).await.unwrap();
        assert!(decision.is_allowed(), "{decision:?}");
        store.wait_for_grants().await;
        clock.advance(gap);
    }
}

/// What Redis counts as used of `key` now.
async fn used_in_redis(store: &LeasedStore<RedisStore>, key: &Key, policy: &Policy) -> u64 {
    let status = store.get_ref().status(key, policy).await.unwrap();
    LIMIT - status.remaining()
}

fn since(after: LeaseCalls, before: LeaseCalls) -> (u64, u64, u64) {
    (
        after.grants - before.grants,
        after.direct - before.direct,
        after.returns - before.returns,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_key_takes_one_grant_per_one_and_a_half_intervals() {
    let url = require_redis().await;
    let clock = FakeClock::new(START);
    let store = leased(&url, "lease-sizing", &clock).await;
    let policy = Policy::new("sizing", Algorithm::FixedWindow, "1000000/day").unwrap();
    let key = Key::user("steady");
    // Ten requests an interval. Warming up: decided by Redis until the
    // key has shown a lease's worth, then leases that grow to its rate.
    let gap = INTERVAL / 10;
    steady(&store, &clock, &key, &policy, gap, 100).await;
    let warm = store.calls();
    assert_eq!(
        warm.direct, 3,
        "three decided by Redis, then a lease: {warm:?}"
    );

    // Then 60 intervals at that rate: 600 requests in leases of 15, one
    // and a half intervals each (one interval each took 60 grants).
    steady(&store, &clock, &key, &policy, gap, 600).await;
    let (grants, direct, returns) = since(store.calls(), warm);
    assert_eq!((direct, returns), (0, 0), "all from leases, nothing back");
    assert!(
        (39..=41).contains(&grants),
        "{grants} grants for 600 requests"
    );

    // Every admission and every unit held is counted in Redis.
    assert_eq!(
        used_in_redis(&store, &key, &policy).await,
        700 + store.outstanding().1
    );
    store.return_leases().await;
    assert_eq!(used_in_redis(&store, &key, &policy).await, 700);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_ends_with_units_left_hands_over_to_the_one_asked_for_ahead() {
    let url = require_redis().await;
    let clock = FakeClock::new(START);
    let store = leased(&url, "lease-handover", &clock).await;
    let policy = Policy::new("handover", Algorithm::FixedWindow, "1000000/day").unwrap();
    let key = Key::user("pausing");
    let gap = INTERVAL / 10;
    steady(&store, &clock, &key, &policy, gap, 100).await;
    // On until the next lease has just been asked for, ahead.
    let mut requests = 100;
    while store.outstanding().0 < 2 {
        steady(&store, &clock, &key, &policy, gap, 1).await;
        requests += 1;
        assert!(requests < 200, "no lease asked for ahead");
    }
    // The key pauses until the current lease has ended, with units
    // left, and the next one, asked for a request later, has not. (Read
    // before the pause: from then on, the store's sweep may give the
    // ended lease back first; the next one takes over either way.)
    let before = store.calls();
    let held = store.outstanding().1;
    clock.advance(2 * INTERVAL - gap - Duration::from_millis(1));
    steady(&store, &clock, &key, &policy, gap, 1).await;
    requests += 1;
    let (grants, direct, returns) = since(store.calls(), before);
    assert_eq!(
        (grants, direct, returns),
        (0, 0, 1),
        "spent from the next lease, the ended one given back"
    );
    let (leases, after) = store.outstanding();
    assert_eq!(leases, 1, "the next lease is now the current one");
    assert!(after < held - 1, "the ended lease's units went back");
    assert_eq!(used_in_redis(&store, &key, &policy).await, requests + after);
    store.return_leases().await;
    assert_eq!(used_in_redis(&store, &key, &policy).await, requests);
}

/// A request dropped while the grant it asked for is on its way (its
/// client went away, or a timeout above the store gave up) leaves no
/// request of the key waiting for that grant: the key's next requests are
/// decided. The grant's units, counted by Redis and never spent, are the
/// only ones lost: under-admission by one grant, never over. (On a server
/// of its own, paused while the grant is sent.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_while_its_grant_is_on_its_way_leaves_no_request_waiting() {
    let server = RedisServer::spawn();
    let url = server.url();
    let clock = FakeClock::new(START);
    let store = leased(&url, "lease-dropped", &clock).await;
    let policy = Policy::new("dropped", Algorithm::FixedWindow, "1000000/day").unwrap();
    let key = Key::user("leaving");
    let gap = INTERVAL / 10;
    // Three decided by Redis; the fourth asks for the key's first lease.
    steady(&store, &clock, &key, &policy, gap, 3).await;
    assert_eq!(store.calls().grants, 0);
    server.pause_writes(300);
    let mut asking = Box::pin(store.check(&key, &policy, 1));
    assert!(futures::poll!(asking.as_mut()).is_pending());
    assert_eq!(
        store.calls().grants,
        1,
        "the fourth request asked for a lease"
    );
    // Redis counts the grant; the request is dropped before it reads the
    // answer.
    let waited = std::time::Instant::now();
    let granted = loop {
        let used = used_in_redis(&store, &key, &policy).await;
        if used > 3 {
            break used - 3;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "the grant never reached Redis"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    drop(asking);
    clock.advance(gap);

    for _ in 0..100 {
        let deciding = store.check(&key, &policy, 1);
        let decision = tokio::time::timeout(Duration::from_secs(10), deciding)
            .await
            .expect("decided, not left waiting for the dropped request's grant")
            .unwrap();
        assert!(decision.is_allowed(), "{decision:?}");
        store.wait_for_grants().await;
        clock.advance(gap);
    }
    store.return_leases().await;
    assert_eq!(
        granted, 4,
        "the key's first lease, as sized from its first four requests"
    );
    assert_eq!(
        used_in_redis(&store, &key, &policy).await,
        103 + granted,
        "103 admitted, and the dropped grant's units, never spent"
    );
}

/// A lease asked for ahead by a task that never runs leaves nothing
/// waiting for it: not the key's next requests, which would wait for that
/// grant, nor `wait_for_grants`, which would count it forever. Nothing is
/// lost either: the grant never reached Redis. Two keys with the same
/// history: one asks ahead onto a runtime that is never driven and then
/// shuts down, dropping the task unrun; the other onto a runtime already
/// shut down, which drops it inside the spawn. (A task that panics is
/// dropped the same way.) The store's own runtime is a current-thread
/// one: on a multi-threaded one, work asked for from another runtime's
/// current-thread context is handed to it and runs (see
/// `redis_lease_runtimes`), and this raced with that grant.
#[tokio::test(flavor = "current_thread")]
async fn a_lease_asked_for_ahead_by_a_task_that_never_runs_leaves_nothing_waiting() {
    let url = require_redis().await;
    let clock = FakeClock::new(START);
    let store = leased(&url, "lease-unrun", &clock).await;
    let policy = Policy::new("unrun", Algorithm::FixedWindow, "1000000/day").unwrap();
    let keys = [Key::user("idle"), Key::user("shut-down")];
    let gap = INTERVAL / 10;
    // Both keys in step: a request each every gap, until each holds one
    // lease, with no other on its way or waiting.
    let mut requests = 0;
    while requests < 100 || store.outstanding().0 != 2 {
        for key in &keys {
            let decision = store.check(key, &policy, 1).await.unwrap();
            assert!(decision.is_allowed(), "{decision:?}");
        }
        store.wait_for_grants().await;
        clock.advance(gap);
        requests += 1;
        assert!(requests < 200, "never a single lease each");
    }
    requests *= 2;

    // Each lease spent without waiting until it is used up, in the
    // context of a runtime that cannot run the grant asked for ahead on
    // the way.
    let spend = |key: &Key, runtime: &tokio::runtime::Handle| {
        let _inside = runtime.enter();
        let mut spent = 0;
        while let Some(decided) = store.try_check_now(key, &policy, 1) {
            assert!(decided.unwrap().is_allowed());
            spent += 1;
            assert!(spent < 1_000, "the lease never ran out");
        }
        spent
    };
    let before = store.calls();
    let idle = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let spent = spend(&keys[0], idle.handle());
    let mut waiting = Box::pin(store.wait_for_grants());
    assert!(
        futures::poll!(waiting.as_mut()).is_pending(),
        "a lease was asked for ahead, not run"
    );
    drop(waiting);
    idle.shutdown_background();

    let dead = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let shut_down = dead.handle().clone();
    dead.shutdown_background();
    assert_eq!(spend(&keys[1], &shut_down), spent, "the same history");
    assert_eq!(store.calls(), before, "neither grant asked ahead ran");
    requests += 2 * spent;

    let waited = tokio::time::timeout(Duration::from_secs(10), store.wait_for_grants()).await;
    assert!(waited.is_ok(), "wait_for_grants counted the unrun grants");
    for _ in 0..100 {
        for key in &keys {
            let deciding = store.check(key, &policy, 1);
            let decision = tokio::time::timeout(Duration::from_secs(10), deciding)
                .await
                .expect("decided, not left waiting for the grant that never ran")
                .unwrap();
            assert!(decision.is_allowed(), "{decision:?}");
        }
        store.wait_for_grants().await;
        clock.advance(gap);
    }
    requests += 200;
    store.return_leases().await;
    let mut used = 0;
    for key in &keys {
        used += used_in_redis(&store, key, &policy).await;
    }
    assert_eq!(used, requests, "every admission counted, and nothing more");
}

/// A lease held when its policy's limits change is dropped, not given
/// back: a return settles under the configuration it was granted under,
/// which wrote the key back under the old one and lost what the new one
/// had counted since (all of it here, where the period changed: another
/// instance's 100 of the hour were forgotten).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_an_old_configuration_does_not_undo_the_new_one() {
    let url = require_redis().await;
    let clock = FakeClock::new(START);
    let store = leased(&url, "lease-config", &clock).await;
    let minute = Policy::new("config", Algorithm::FixedWindow, "600000/min").unwrap();
    let hour = Policy::new("config", Algorithm::FixedWindow, "1000000/h").unwrap();
    let key = Key::user("changed");
    // Ten requests an interval: the key holds a lease of the minute.
    steady(&store, &clock, &key, &minute, INTERVAL / 10, 100).await;
    assert!(store.calls().grants > 0, "{:?}", store.calls());
    // The limits change; another instance spends 100 of the hour.
    let other = store.get_ref();
    assert!(other.check(&key, &hour, 100).await.unwrap().is_allowed());
    // This instance's next request comes under the hour.
    let decision = store.check(&key, &hour, 1).await.unwrap();
    assert!(decision.is_allowed());
    store.wait_for_grants().await;
    let status = other.status(&key, &hour).await.unwrap();
    assert!(
        1_000_000 - status.remaining() >= 101,
        "the hour keeps the other instance's 100 and this request: {status:?}"
    );
}

/// A lease that another instance's configuration overtook: its return
/// settles under the configuration it was granted under, which the key
/// has moved on from, and changes nothing. (It used to carry the key back
/// to the minute, which dropped the hour and the other instance's 100.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_returned_after_another_instance_moved_the_key_on_takes_nothing_from_it() {
    let url = require_redis().await;
    let clock = FakeClock::new(START);
    let store = leased(&url, "lease-moved", &clock).await;
    let minute = Policy::new("moved", Algorithm::FixedWindow, "600000/min").unwrap();
    let hour = Policy::new("moved", Algorithm::FixedWindow, "1000000/h").unwrap();
    let key = Key::user("overtaken");
    steady(&store, &clock, &key, &minute, INTERVAL / 10, 100).await;
    assert!(store.outstanding().1 > 0, "{:?}", store.outstanding());
    // Another instance, on the new limits, spends 100 of the hour; then
    // this one gives its lease of the minute back.
    let other = store.get_ref();
    assert!(other.check(&key, &hour, 100).await.unwrap().is_allowed());
    store.return_leases().await;
    assert_eq!(store.outstanding(), (0, 0));
    let status = other.status(&key, &hour).await.unwrap();
    assert_eq!(1_000_000 - status.remaining(), 100, "{status:?}");
}

/// A key's lease size, learnt under one configuration, is held to the
/// largest lease of the next: 16 instances' shares of 160 an hour are 10
/// each, whatever the key's first costly requests asked for under the
/// day's million (a lease of 100). A lease of 100 of the hour's 160 would
/// let the instances together exceed the hour by far more than the
/// leases' bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_after_a_configuration_change_is_no_larger_than_the_new_share() {
    let url = require_redis().await;
    let clock = FakeClock::new(START);
    let store = leased(&url, "lease-shrunk", &clock).await;
    let day = Policy::new("shrunk", Algorithm::FixedWindow, "1000000/day").unwrap();
    let hour = Policy::new("shrunk", Algorithm::FixedWindow, "160/h").unwrap();
    let key = Key::user("shrunk");
    // Two requests of 50 within an interval: the second takes a lease of
    // the 100 seen.
    for _ in 0..2 {
        assert!(store.check(&key, &day, 50).await.unwrap().is_allowed());
        store.wait_for_grants().await;
    }
    assert_eq!(store.calls().grants, 1, "{:?}", store.calls());
    // The limits change within the interval: the first request under the
    // hour asks for a lease, of the hour's share.
    let decision = store.check(&key, &hour, 1).await.unwrap();
    assert!(decision.is_allowed(), "{decision:?}");
    store.wait_for_grants().await;
    assert_eq!(store.calls().grants, 2, "{:?}", store.calls());
    let status = store.get_ref().status(&key, &hour).await.unwrap();
    assert_eq!(
        160 - status.remaining(),
        10,
        "one lease of the share: {status:?}"
    );
}
