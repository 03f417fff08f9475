//! Leases used from job workers' runtimes: a `LeasedStore` built on the
//! main runtime, used from per-thread current-thread runtimes, which run
//! tasks only while their thread blocks on a future. Work a worker's
//! request starts for others (a lease asked for ahead, a reset carried to
//! its end) runs on the store's runtime, not on the worker's, which goes
//! on to other work once its own answer is in.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::mpsc;
use std::time::Duration;

use tollgate_core::{Algorithm, FakeClock, Key, Policy, Store, Timestamp};
use tollgate_tests::{
    RedisServer, leased_store, one_worker_runtime, thread_runtime, unique_prefix,
};

const START: Timestamp = Timestamp::from_secs(1_700_000_000);

/// The next lease of a hot key, asked for ahead by a worker's request,
/// is granted on the store's runtime: the key's requests elsewhere never
/// wait on a grant that sits unrun on the idle worker.
#[test]
fn a_lease_asked_for_ahead_by_a_worker_is_granted_on_the_stores_runtime() {
    let server = RedisServer::spawn();
    let home = one_worker_runtime();
    let clock = FakeClock::new(START);
    let policy = Policy::new("ahead", Algorithm::Gcra, "100000/s").unwrap();
    let key = Key::user("hot");
    let interval = Duration::from_millis(8);
    let store = home.block_on(leased_store(
        &server.url(),
        &unique_prefix("lease-runtimes"),
        &clock,
        interval,
        4,
        0,
    ));
    // Warmed on the store's runtime: the key holds a lease.
    home.block_on(async {
        for _ in 0..10 {
            for _ in 0..10 {
                assert!(store.check(&key, &policy, 1).await.unwrap().is_allowed());
            }
            clock.advance(Duration::from_millis(1));
        }
        store.wait_for_grants().await;
    });
    assert!(store.outstanding().0 > 0, "a lease held");

    // The worker runs jobs of the key (spending its lease, asking for the
    // next ahead) until a task is left on its runtime, or 2,000 jobs.
    let (ran, running) = mpsc::channel();
    let (stop, stopping) = mpsc::channel::<()>();
    let worker = {
        let (store, policy, key) = (store.clone(), policy.clone(), key.clone());
        std::thread::spawn(move || {
            let local = thread_runtime();
            let mut jobs = 0;
            while local.metrics().num_alive_tasks() == 0 && jobs < 2_000 {
                let decision = local.block_on(store.check(&key, &policy, 1)).unwrap();
                assert!(decision.is_allowed());
                jobs += 1;
            }
            ran.send(local.metrics().num_alive_tasks()).unwrap();
            // Other work: the runtime lives on, blocking on nothing.
            let _ = stopping.recv_timeout(Duration::from_secs(20));
        })
    };
    let left = running.recv().unwrap();
    let granted = home.block_on(async {
        tokio::time::timeout(Duration::from_secs(3), store.wait_for_grants()).await
    });
    let decided = home.block_on(async {
        tokio::time::timeout(Duration::from_secs(3), async {
            for _ in 0..1_000 {
                store.check(&key, &policy, 1).await.unwrap();
            }
        })
        .await
    });
    let _ = stop.send(());
    worker.join().unwrap();
    assert_eq!(left, 0, "a task left on the worker's runtime");
    assert!(granted.is_ok(), "a grant sat unrun on the idle worker");
    assert!(decided.is_ok(), "the key's requests waited on that grant");
}

/// A reset whose caller, a job on a worker's runtime, gave up on it (its
/// own timeout) is carried to its end on the store's runtime: it lands in
/// Redis, and every instance's leases of the key end, though the worker
/// goes on to other work at once.
#[test]
fn a_reset_a_worker_gave_up_on_still_ends_every_instances_leases() {
    let server = RedisServer::spawn();
    let home = one_worker_runtime();
    let clock = FakeClock::new(START);
    let policy = Policy::new("reset", Algorithm::Gcra, "100000/s").unwrap();
    let key = Key::user("hot");
    let prefix = unique_prefix("lease-runtimes-reset");
    let interval = Duration::from_millis(8);
    let (a, b) = home.block_on(async {
        let a = leased_store(&server.url(), &prefix, &clock, interval, 4, 0).await;
        let b = leased_store(&server.url(), &prefix, &clock, interval, 4, 0).await;
        for _ in 0..10 {
            for _ in 0..10 {
                assert!(b.check(&key, &policy, 1).await.unwrap().is_allowed());
            }
            clock.advance(Duration::from_millis(1));
        }
        b.wait_for_grants().await;
        (a, b)
    });
    assert!(b.outstanding().0 > 0, "b holds a lease");
    // Redis holds the reset for 200 ms; the job gives up after 50 ms.
    server.pause_writes(200);
    let (gave_up, giving_up) = mpsc::channel();
    let (stop, stopping) = mpsc::channel::<()>();
    let worker = {
        let (a, policy, key) = (a.clone(), policy.clone(), key.clone());
        std::thread::spawn(move || {
            let local = thread_runtime();
            let reset = local.block_on(async {
                tokio::time::timeout(Duration::from_millis(50), a.reset(&key, &policy)).await
            });
            gave_up.send(reset.is_err()).unwrap();
            let _ = stopping.recv_timeout(Duration::from_secs(20));
        })
    };
    assert!(giving_up.recv().unwrap(), "the job gave up on the reset");
    // b's leases end within 3 s (the reset, then its invalidation).
    let started = std::time::Instant::now();
    while b.outstanding().0 > 0 && started.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let held = b.outstanding();
    let status = home.block_on(a.get_ref().status(&key, &policy)).unwrap();
    let _ = stop.send(());
    worker.join().unwrap();
    assert_eq!(status.remaining(), 100_000, "the reset landed in Redis");
    assert_eq!(
        held.0, 0,
        "b's leases outlived a reset that landed: {held:?}"
    );
}
