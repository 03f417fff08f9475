//! A store used from several runtimes (a store built on the main runtime,
//! used from per-thread ones, as job workers do): a request that waits
//! behind calls sent from another runtime is neither failed by that
//! runtime's lateness nor left hanging when that runtime stops running
//! tasks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::mpsc;
use std::time::Duration;

use tollgate_core::{Algorithm, Decision, Key, Policy};
use tollgate_redis::{BreakerState, RedisStore, RedisStoreError};
use tollgate_tests::{RedisServer, one_worker_runtime, thread_runtime, unique_prefix};

/// A store of `server` built on `home`, with `deadline` and a breaker
/// that one failure opens, connected and its scripts known.
fn store_on(
    home: &tokio::runtime::Runtime,
    server: &RedisServer,
    deadline: Duration,
    policy: &Policy,
) -> RedisStore {
    let store = home
        .block_on(
            RedisStore::builder()
                .prefix(unique_prefix("runtimes"))
                .deadline(deadline)
                .circuit_breaker(1, Duration::from_secs(60))
                .deny_cache(0)
                .connect(server.url().as_str()),
        )
        .unwrap();
    let first = home.block_on(store.decide(&Key::user("warm"), policy, 1));
    assert!(first.unwrap().is_allowed());
    store
}

/// On a thread of its own, a runtime of that thread only (tasks run only
/// while it blocks on a future) sends decisions for the keys `a` and `b`
/// at once, says so on `held` once both are sent, and after them `then`
/// runs on the thread. The thread blocks on the decision for `a` only, as
/// a job that needs one answer: then it goes on to other work. The
/// runtime lives on until `stop` is sent (or 5 s have passed). Returns
/// that decision.
fn sender_thread(
    store: &RedisStore,
    policy: &Policy,
    held: mpsc::Sender<()>,
    then: impl FnOnce() + Send + 'static,
    stop: mpsc::Receiver<()>,
) -> std::thread::JoinHandle<Result<Decision, RedisStoreError>> {
    let (store, policy) = (store.clone(), policy.clone());
    std::thread::spawn(move || {
        let local = thread_runtime();
        let decision = local.block_on(async move {
            let [a, _b] = ["a", "b"].map(|name| {
                let (store, policy) = (store.clone(), policy.clone());
                tokio::spawn(async move { store.decide(&Key::user(name), &policy, 1).await })
            });
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
            held.send(()).unwrap();
            then();
            a.await.unwrap()
        });
        let _ = stop.recv_timeout(Duration::from_secs(5));
        drop(local);
        decision
    })
}

/// The calls that hold the batch's places run on the runtime that sent
/// them. That runtime's one thread blocked (as by a handler's CPU-bound
/// work) is our own lateness, and a request queued behind its places from
/// another, idle runtime waits on for them, rather than meeting its
/// deadline in the queue and failing with Redis healthy.
#[test]
fn a_request_queued_behind_another_runtimes_stalled_calls_waits_for_them() {
    let server = RedisServer::spawn();
    let policy = Policy::new("runtimes", Algorithm::Gcra, "100/h").unwrap();
    let (home, caller) = (one_worker_runtime(), one_worker_runtime());
    let store = store_on(&home, &server, Duration::from_millis(100), &policy);

    // The two decisions take both places, then the thread is blocked for
    // 250 ms: past the deadline and its slack, within the ceiling (4
    // deadlines).
    let (held, holding) = mpsc::channel();
    let (stop, stopping) = mpsc::channel();
    let block = || std::thread::sleep(Duration::from_millis(250));
    let sender = sender_thread(&store, &policy, held, block, stopping);
    holding.recv().unwrap();
    let queued = caller.block_on(store.decide(&Key::user("queued"), &policy, 1));
    let _ = stop.send(());
    assert!(
        queued.as_ref().is_ok_and(Decision::is_allowed),
        "decided by Redis once the stalled runtime ran again: {queued:?}"
    );
    assert!(sender.join().unwrap().is_ok_and(|d| d.is_allowed()));
    assert_eq!(store.breaker_state(), BreakerState::Closed);
}

/// A request waiting behind another runtime's call (queued for a batch
/// behind its places, or in its key's lane) is sent when that call
/// returns, by a task of its own. A runtime of one thread runs tasks only
/// while it blocks on a future, and the sender's thread goes on to other
/// work once its own decisions are in: the request is sent on a runtime
/// that runs (the store's), rather than waiting, with no deadline, for the
/// sender's thread to block on a future again.
#[test]
fn a_request_waiting_behind_a_runtime_that_stops_running_tasks_is_sent() {
    let server = RedisServer::spawn();
    let one_limit = Policy::new("batched", Algorithm::Gcra, "100/h").unwrap();
    // Two limits: the general script, and a lane per key.
    let two_limits = Policy::builder("in-lanes")
        .algorithm(Algorithm::Gcra)
        .limit("100/h")
        .limit("1000/d")
        .build()
        .unwrap();
    for policy in [one_limit, two_limits] {
        let (home, waiter) = (one_worker_runtime(), one_worker_runtime());
        // A deadline well past Redis's pause below.
        let store = store_on(&home, &server, Duration::from_secs(2), &policy);
        // Redis holds the sender's two calls for 150 ms, so that the
        // waiter's request, for the key `a`, queues behind them.
        server.pause_writes(150);
        let (held, holding) = mpsc::channel();
        let (stop, stopping) = mpsc::channel();
        let sender = sender_thread(&store, &policy, held, || {}, stopping);
        holding.recv().unwrap();
        let waited = waiter.block_on(store.decide(&Key::user("a"), &policy, 1));
        let _ = stop.send(());
        let name = policy.name();
        assert!(
            waited.as_ref().is_ok_and(Decision::is_allowed),
            "{name}: decided by Redis: {waited:?}"
        );
        let sent = sender.join().unwrap();
        assert!(sent.is_ok_and(|d| d.is_allowed()), "{name}");
        assert_eq!(store.breaker_state(), BreakerState::Closed, "{name}");
    }
}

/// A connection made anew because a worker's call met `READONLY` (as on
/// a demoted master) is made on the store's runtime: the fresh
/// connection's tasks, which every runtime's calls wait on, do not live
/// on the worker's runtime, which runs them only while it blocks on a
/// future.
#[test]
fn a_connection_a_workers_call_replaced_runs_on_the_stores_runtime() {
    let server = RedisServer::spawn();
    let policy = Policy::new("replaced", Algorithm::Gcra, "100/h").unwrap();
    let home = one_worker_runtime();
    let store = home
        .block_on(
            RedisStore::builder()
                .prefix(unique_prefix("runtimes-refresh"))
                .deadline(Duration::from_millis(300))
                .circuit_breaker(1_000, Duration::from_secs(60))
                .deny_cache(0)
                .connect(server.url().as_str()),
        )
        .unwrap();
    let warm = home.block_on(store.decide(&Key::user("warm"), &policy, 1));
    assert!(warm.unwrap().is_allowed());
    let mut admin = server.connection();
    let mut replica_of = |host: &str, port: &str| {
        let set = redis::cmd("REPLICAOF")
            .arg(host)
            .arg(port)
            .query::<()>(&mut admin);
        set.unwrap();
    };
    // Redis turns writes away: READONLY.
    replica_of("127.0.0.1", "1");
    let (step, stepped) = mpsc::channel();
    let (go, going) = mpsc::channel::<()>();
    let worker = {
        let (store, policy) = (store.clone(), policy.clone());
        std::thread::spawn(move || {
            let local = thread_runtime();
            let first = local.block_on(store.decide(&Key::user("job"), &policy, 1));
            step.send(first.is_err()).unwrap();
            going.recv().unwrap();
            // The next job, with async work of its own after its decision.
            let second = local.block_on(async {
                let decided = store.decide(&Key::user("job"), &policy, 1).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                decided
            });
            step.send(second.is_ok()).unwrap();
            // Other work.
            let _ = going.recv_timeout(Duration::from_secs(20));
        })
    };
    assert!(stepped.recv().unwrap(), "the first job met READONLY");
    replica_of("NO", "ONE");
    // Whoever made the connection anew, it serves the store's runtime.
    let _ = home.block_on(store.decide(&Key::user("home-before"), &policy, 1));
    go.send(()).unwrap();
    let second = stepped.recv().unwrap();
    // The worker is idle now.
    let after = home.block_on(store.decide(&Key::user("home-after"), &policy, 1));
    let _ = go.send(());
    worker.join().unwrap();
    assert!(second, "the worker's second job was decided");
    assert!(
        after.as_ref().is_ok_and(Decision::is_allowed),
        "decided while the worker idles: {after:?}"
    );
}
