//! Our own overload is not a store failure: on an app runtime too busy to
//! poll its requests in time, or with every pooled connection in use by the
//! app's own calls, the breaker stays closed and nothing is decided
//! locally.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use metrics::{SharedString, Unit};
use metrics_util::CompositeKey;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tollgate::telemetry::{FALLBACKS, STORE_ERRORS, STORE_LATENCY};
use tollgate::{Algorithm, DecidedBy, FailureMode, Key, Policy, RateLimiter, StoreError};
use tollgate_redis::{BreakerState, Pool, RedisStore};
use tollgate_tests::{RedisServer, stalled, unique_prefix};

/// The store's deadline: its default.
const DEADLINE: Duration = Duration::from_millis(50);

/// How long the runtime's one thread is blocked after each request is
/// sent: past the deadline and its slack (a quarter of it), and well under
/// its ceiling (4 × the deadline), leaving Redis 130 ms to answer on a
/// busy machine.
const STALL: Duration = Duration::from_millis(70);

/// The tests that load the machine take turns: side by side, one test's
/// burst becomes another's stall on two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Every value of `name` (any labels) in `snapshot`: counters summed, and
/// the histogram's samples.
fn read(
    snapshot: &[(CompositeKey, Option<Unit>, Option<SharedString>, DebugValue)],
    name: &str,
) -> (u64, Vec<f64>) {
    let mut count = 0;
    let mut samples = Vec::new();
    for (key, _, _, value) in snapshot {
        if key.key().name() != name {
            continue;
        }
        match value {
            DebugValue::Counter(n) => count += n,
            DebugValue::Histogram(values) => {
                samples.extend(values.iter().map(|v| v.into_inner()));
            }
            DebugValue::Gauge(_) => panic!("{name} is a gauge"),
        }
    }
    (count, samples)
}

#[test]
fn a_starved_runtime_neither_opens_the_breaker_nor_decides_locally() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // A Redis of the test's own: healthy by construction. (The shared one
    // serves the other suites too, and its own latency peaks at tens of
    // milliseconds when they run beside this one.)
    let server = RedisServer::spawn();
    let url = server.url();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (admitted, stalled_requests, breaker) = metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let store = RedisStore::builder()
                .prefix(unique_prefix("overload"))
                .deadline(DEADLINE)
                .circuit_breaker(5, Duration::from_secs(60))
                .connect(url.as_str())
                .await
                .unwrap();
            // 100 at once, then one every 36 s: exactly 100 in this test.
            let policy = Policy::new("starved", Algorithm::Gcra, "100/h").unwrap();
            let limiter =
                RateLimiter::with_store(policy, store.clone()).on_store_error(FailureMode::Local);
            let key = Key::user("busy-app");
            let mut admitted = 0;
            let mut stalled_requests = 0;
            for _ in 0..300 {
                let (decision, stalled_request) = stalled(limiter.check(&key), STALL).await;
                admitted += u32::from(decision.unwrap().is_allowed());
                stalled_requests += u32::from(stalled_request);
                assert_eq!(store.breaker_state(), BreakerState::Closed);
            }
            (admitted, stalled_requests, store.breaker_state())
        })
    });
    assert_eq!(admitted, 100);
    assert_eq!(breaker, BreakerState::Closed);
    // Every admission waited on Redis through a stall past its deadline
    // (the denials after the first are answered by the deny cache).
    assert!(stalled_requests >= 100, "{stalled_requests} stalled");
    // One snapshot: it drains the histograms.
    let snapshot = snapshotter.snapshot().into_vec();
    let (store_errors, _) = read(&snapshot, STORE_ERRORS);
    let (_, latencies) = read(&snapshot, STORE_LATENCY);
    let (fallbacks, _) = read(&snapshot, FALLBACKS);
    let slowest = latencies.iter().copied().fold(0.0, f64::max);
    assert_eq!(
        store_errors, 0,
        "no store failure (slowest call {slowest} s)"
    );
    assert_eq!(fallbacks, 0, "nothing decided locally");
    // One sample per call, each as observed: with the stall, and under the
    // ceiling.
    assert_eq!(latencies.len(), stalled_requests as usize);
    assert!(
        latencies
            .iter()
            .all(|&s| s >= STALL.as_secs_f64() && s < (DEADLINE * 4).as_secs_f64()),
        "{latencies:?}"
    );
}

/// A runtime late past the store's ceiling (four deadlines) is refused as
/// the app's own load (`StoreError::Late`) only when Redis answered other
/// calls meanwhile (as in a burst, above and below). With no sign of life
/// from Redis (here it holds every call, on an app too busy to tell), the
/// call is a missed deadline: the breaker counts it, and the failure
/// policy decides, so a hung Redis on a saturated app still opens the
/// breaker.
#[test]
fn a_runtime_late_past_the_ceiling_with_redis_silent_is_a_store_failure() {
    let server = RedisServer::spawn();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = RedisStore::builder()
            .prefix(unique_prefix("overload-ceiling"))
            .deadline(DEADLINE)
            .circuit_breaker(1, Duration::from_secs(60))
            .connect(server.url().as_str())
            .await
            .unwrap();
        let policy = Policy::new("ceiling", Algorithm::Gcra, "100/h").unwrap();
        let limiter =
            RateLimiter::with_store(policy, store.clone()).on_store_error(FailureMode::Local);
        let key = Key::user("blocked-app");
        assert!(limiter.check(&key).await.unwrap().is_allowed());
        // Redis holds calls for eight deadlines; the runtime is blocked for
        // six, past the ceiling.
        server.pause_writes(DEADLINE.as_millis() as u64 * 8);
        let (decided, stalled_request) = stalled(limiter.check(&key), DEADLINE * 6).await;
        assert!(stalled_request);
        let decided = decided.unwrap();
        assert_eq!(decided.decided_by(), DecidedBy::LocalFallback);
        assert_eq!(store.breaker_state(), BreakerState::Open);
    });
}

/// A bb8 pool whose every connection the app's own calls hold is the app's
/// load too. A decision that queues for a connection while the pool hands
/// connections to other calls waits on, and is decided by Redis once it
/// has one, or refused as overloaded at the store's ceiling: the breaker
/// never counts it, and the failure policy never decides it locally. A
/// pool that cannot get a connection at all, Redis being down, is a store
/// failure: it opens the breaker, and the failure policy decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_pool_neither_opens_the_breaker_nor_decides_locally() {
    let _turn = ONE_AT_A_TIME.lock().await;
    const HOLDERS: usize = 8;
    const CALLERS: usize = 8;
    let mut server = RedisServer::spawn();
    let store = pool_of_one(&unique_prefix("busy-pool"), Duration::from_millis(25))
        .connect_pool(server.url())
        .await
        .unwrap();
    let policy = Policy::new("busy-pool", Algorithm::Gcra, "1000/h").unwrap();
    let limiter =
        RateLimiter::with_store(policy.clone(), store.clone()).on_store_error(FailureMode::Local);
    let key = Key::user("queued");
    assert_eq!(limiter.check(&key).await.unwrap().remaining(), 999);

    // First, a queue of the app's own calls ahead of the store's, each
    // taking the one connection once for 4 ms: the store's calls wait for
    // their turn, past the pool's checkout timeout, and are decided.
    let (mut admitted, mut refused) = (0_u64, 0_u64);
    for _ in 0..3 {
        let pool = store.connection().clone();
        let started = pool.state().statistics.get_started;
        let holders: Vec<_> = (0..HOLDERS)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    // A checkout that times out asks again, at the back.
                    loop {
                        if let Ok(connection) = pool.get().await {
                            tokio::time::sleep(Duration::from_millis(4)).await;
                            return drop(connection);
                        }
                    }
                })
            })
            .collect();
        while pool.state().statistics.get_started < started + HOLDERS as u64 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let (served, turned_away) = decide_together(&limiter, &key, CALLERS).await;
        assert_eq!((served, turned_away), (CALLERS as u64, 0));
        admitted += served;
        assert_eq!(store.breaker_state(), BreakerState::Closed);
        for holder in holders {
            holder.await.unwrap();
        }
    }
    // Then holders that ask again at once after each turn, so that they
    // take every turn: the store's calls wait until the ceiling, and are
    // refused. On a store of the same keys whose deadline is shorter than
    // a checkout: a checkout still under way at the ceiling ends the wait,
    // not the deadline (which would count as a failure).
    let short = pool_of_one(store.prefix(), Duration::from_millis(25))
        .deadline(Duration::from_millis(20))
        .connect_pool(server.url())
        .await
        .unwrap();
    let short_limiter =
        RateLimiter::with_store(policy.clone(), short.clone()).on_store_error(FailureMode::Local);
    let busy = Arc::new(AtomicBool::new(true));
    let holders: Vec<_> = (0..HOLDERS)
        .map(|_| {
            let (pool, busy) = (short.connection().clone(), busy.clone());
            tokio::spawn(async move {
                while busy.load(Ordering::Relaxed) {
                    if let Ok(connection) = pool.get().await {
                        tokio::time::sleep(Duration::from_millis(4)).await;
                        drop(connection);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..3 {
        let (served, turned_away) = decide_together(&short_limiter, &key, CALLERS).await;
        admitted += served;
        refused += turned_away;
        assert_eq!(short.breaker_state(), BreakerState::Closed);
    }
    busy.store(false, Ordering::Relaxed);
    for holder in holders {
        holder.await.unwrap();
    }
    assert_eq!(admitted + refused, 6 * CALLERS as u64);
    // The pool free again, Redis decides, having counted exactly the
    // decisions it made.
    let decision = limiter.check(&key).await.unwrap();
    assert_eq!(decision.decided_by(), DecidedBy::Store);
    assert_eq!(decision.remaining(), 998 - admitted);

    // Redis down: no connection can be had, the breaker opens and the
    // failure policy decides every caller.
    server.kill();
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (limiter, key) = (limiter.clone(), key.clone());
            tokio::spawn(async move { limiter.check(&key).await })
        })
        .collect();
    for caller in callers {
        let decision = caller.await.unwrap().unwrap();
        assert_eq!(decision.decided_by(), DecidedBy::LocalFallback);
    }
    assert_eq!(store.breaker_state(), BreakerState::Open);
}

/// A checkout that times out while the pool hands out nothing, on a
/// runtime that stays busy after the timeout (a task always ready, as a
/// burst of requests keeps it, while its timers still fire on time), says
/// nothing of Redis: the calls that would give a connection back may
/// be among the tasks that wait. It waits again, and the decision is made
/// by Redis once the connection comes back; the breaker never counts it.
#[tokio::test(flavor = "current_thread")]
async fn a_checkout_that_times_out_on_a_busy_runtime_waits_again() {
    const CHECKOUT: Duration = Duration::from_millis(40);
    let server = RedisServer::spawn();
    let store = pool_of_one(&unique_prefix("busy-checkout"), CHECKOUT)
        .connect_pool(server.url())
        .await
        .unwrap();
    let policy = Policy::new("busy-checkout", Algorithm::Gcra, "1000/h").unwrap();
    let limiter = RateLimiter::with_store(policy, store.clone()).on_store_error(FailureMode::Local);
    let key = Key::user("waits");
    assert_eq!(limiter.check(&key).await.unwrap().remaining(), 999);
    // The pool's one connection, held by the app until 1.5 checkouts from
    // now, while the runtime is busy from a quarter of a checkout on,
    // through the checkout's end and the quarter of a checkout after it in
    // which the store looks for a worker going idle.
    let held = store.connection().get_owned().await.unwrap();
    let holder = tokio::spawn(async move {
        tokio::time::sleep(CHECKOUT * 3 / 2).await;
        drop(held);
    });
    let stop = Arc::new(AtomicBool::new(false));
    let busy = tokio::spawn({
        let stop = Arc::clone(&stop);
        async move {
            tokio::time::sleep(CHECKOUT / 4).await;
            while !stop.load(Ordering::Relaxed) {
                tokio::task::yield_now().await;
            }
        }
    });
    let decision = limiter.check(&key).await;
    stop.store(true, Ordering::Relaxed);
    busy.await.unwrap();
    holder.await.unwrap();
    let decision = decision.unwrap();
    assert_eq!(decision.decided_by(), DecidedBy::Store, "{decision:?}");
    assert_eq!(decision.remaining(), 998);
    assert_eq!(store.breaker_state(), BreakerState::Closed);
}

/// `callers` decisions of `key` at once, so that some queue in the store's
/// batch queue behind calls that wait in the pool: how many Redis decided
/// and how many were refused as the app's own load. Panics on any other
/// outcome (a failure, or a decision made locally).
async fn decide_together(
    limiter: &RateLimiter<RedisStore<Pool>>,
    key: &Key,
    callers: usize,
) -> (u64, u64) {
    let callers: Vec<_> = (0..callers)
        .map(|_| {
            let (limiter, key) = (limiter.clone(), key.clone());
            tokio::spawn(async move { limiter.check(&key).await })
        })
        .collect();
    let (mut decided, mut refused) = (0, 0);
    for caller in callers {
        match caller.await.unwrap() {
            Ok(decision) => {
                assert_eq!(decision.decided_by(), DecidedBy::Store, "{decision:?}");
                decided += 1;
            }
            // The pool's own queue, or (on a machine too busy to run the
            // test's runtime in time) a reply left unread: the app's load.
            Err(own) if own.is_own_load() => refused += 1,
            Err(other) => panic!("queued behind the app's own calls: {other}"),
        }
    }
    (decided, refused)
}

/// A store built on one runtime keeps its connection's tasks there, the
/// reader of Redis's replies among them. Used from another runtime (per
/// thread runtimes, a store built on the main one), its runtime too busy
/// to read a reply is our own lateness as well: the caller's runtime
/// going idle meanwhile does not make the deadline Redis's.
#[test]
fn a_reply_the_stores_own_busy_runtime_has_not_read_is_waited_for() {
    let server = RedisServer::spawn();
    let deadline = Duration::from_millis(100);
    let runtime = |workers| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .unwrap()
    };
    let (home, caller) = (runtime(1), runtime(1));
    let store = home
        .block_on(
            RedisStore::builder()
                .prefix(unique_prefix("overload-home"))
                .deadline(deadline)
                // One failure would open it.
                .circuit_breaker(1, Duration::from_secs(60))
                .connect(server.url().as_str()),
        )
        .unwrap();
    let policy = Policy::new("home", Algorithm::Gcra, "100/h").unwrap();
    let key = Key::user("elsewhere");
    // Connected, and the scripts known: the call below is one round trip.
    let first = caller.block_on(store.decide(&key, &policy, 1)).unwrap();
    assert!(first.is_allowed());

    // Redis holds the next script for 60 ms; meanwhile the store's
    // runtime is blocked for 250 ms (its one worker, as by a long poll),
    // so the reply waits in the socket with no one to read it, past the
    // deadline (100 ms) and its slack, while the caller's runtime idles.
    server.pause_writes(60);
    let call = caller.spawn({
        let (store, key, policy) = (store.clone(), key.clone(), policy.clone());
        async move { store.decide(&key, &policy, 1).await }
    });
    std::thread::sleep(Duration::from_millis(15));
    let (blocked, blocking) = std::sync::mpsc::channel();
    home.spawn(async move {
        blocked.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(250));
    });
    blocking.recv().unwrap();
    let decision = caller.block_on(call).unwrap();
    assert!(
        decision.as_ref().is_ok_and(|d| d.is_allowed()),
        "decided by Redis, within the ceiling: {decision:?}"
    );
    assert_eq!(store.breaker_state(), BreakerState::Closed);
}

/// A store of a pool of one connection under `prefix`, with the default
/// deadline and a breaker that one failure opens.
fn pool_of_one(prefix: &str, checkout: Duration) -> tollgate_redis::RedisStoreBuilder {
    RedisStore::builder()
        .prefix(prefix)
        .pool_size(1)
        .pool_checkout_timeout(checkout)
        .deadline(DEADLINE)
        .circuit_breaker(1, Duration::from_secs(60))
}

/// A burst of 15,000 new keys at once under a policy of two limits (the
/// general script, one call per key), then under one limit with batching
/// off (as on a cluster, which batches nothing): our own queueing, on a
/// healthy Redis. Every request is decided by Redis or refused as the
/// app's own load (the store's own queue full, or its reply unread by a
/// runtime too busy), none locally, and the breaker stays closed. (Each one's call went on the connection at once, and the
/// tail met its deadline behind the head.) One after the other: two at
/// once on two cores would starve the servers for real.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_new_keys_is_not_a_store_failure() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let general = Policy::builder("spray-general")
        .algorithm(Algorithm::Gcra)
        .limit("100/h")
        .limit("1000/d")
        .build()
        .unwrap();
    burst_of_new_keys(general, 1_024).await;
    let unbatched = Policy::new("spray-unbatched", Algorithm::Gcra, "100/h").unwrap();
    burst_of_new_keys(unbatched, 1).await;
}

/// 15,000 new keys at once under `policy`, on a store of `batch_size`:
/// every one decided by Redis or refused as overloaded, none locally, the
/// breaker closed.
async fn burst_of_new_keys(policy: Policy, batch_size: usize) {
    let server = RedisServer::spawn();
    let store = RedisStore::builder()
        .prefix(unique_prefix(policy.name()))
        .batch_size(batch_size)
        .connect(server.url())
        .await
        .unwrap();
    let limiter =
        Arc::new(RateLimiter::with_store(policy, store.clone()).on_store_error(FailureMode::Local));
    limiter.check(&Key::user("warm")).await.unwrap();
    let tasks: Vec<_> = (0..15_000)
        .map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.check(&Key::user(format!("spray-{i}"))).await })
        })
        .collect();
    let (mut by_redis, mut overloaded) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(decision) => {
                assert_eq!(decision.decided_by(), DecidedBy::Store);
                assert!(decision.is_allowed());
                by_redis += 1;
            }
            // The store's queue full, or (on a machine too busy to run
            // the test's runtime in time) a reply left unread.
            Err(own) if own.is_own_load() => overloaded += 1,
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!(by_redis + overloaded, 15_000);
    assert_eq!(store.breaker_state(), BreakerState::Closed);
}

/// 15,000 settlements of new keys at once, then 15,000 acquires of their
/// in-flight slots, on a healthy Redis: every call answered by Redis, and
/// the breaker never seen open while they run. (They skipped the store's places for
/// unbatched calls, went on the connection all at once, and the tail met
/// its deadline behind the head: the breaker opened.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_settlements_or_slot_calls_is_not_a_store_failure() {
    let _turn = ONE_AT_A_TIME.lock().await;
    use tollgate::{InFlightLimit, Settlement, SlotStore, Store, Timestamp};
    let server = RedisServer::spawn();
    let store = RedisStore::builder()
        .prefix(unique_prefix("settle-burst"))
        .connect(server.url())
        .await
        .unwrap();
    let policy = Policy::new("settle-burst", Algorithm::Gcra, "100/h").unwrap();
    let limit = InFlightLimit::new("slot-burst", 10).unwrap();
    store.check(&Key::user("warm"), &policy, 1).await.unwrap();
    // Watched from a thread of its own: the runtime's workers are busy.
    let (stop, opened) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let watch = std::thread::spawn({
        let (stop, opened, store) = (stop.clone(), opened.clone(), store.clone());
        move || {
            while !stop.load(Ordering::Relaxed) {
                if store.breaker_state() != BreakerState::Closed {
                    opened.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    // Refused as the app's own load: its queue full, or (on a machine too
    // busy to run the test's runtime in time) its reply left unread.
    let count = |results: Vec<Result<(), StoreError>>| {
        let overloaded = results
            .iter()
            .filter(|r| r.as_ref().is_err_and(StoreError::is_own_load));
        let overloaded = overloaded.count();
        let failed: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        assert_eq!(failed.len(), overloaded, "{:?}", failed.first());
        results.len() - overloaded
    };
    let settlements: Vec<_> = (0..15_000)
        .map(|i| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move {
                let refund = Settlement::new(2, 1, Timestamp::from_secs(1));
                store
                    .settle(&Key::user(format!("s-{i}")), &policy, refund)
                    .await
                    .map(drop)
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in settlements {
        results.push(task.await.unwrap());
    }
    let settled = count(results);
    let acquires: Vec<_> = (0..15_000u64)
        .map(|i| {
            let (store, limit) = (store.clone(), limit.clone());
            tokio::spawn(async move {
                store
                    .acquire(&Key::user(format!("a-{i}")), &limit, i)
                    .await
                    .map(drop)
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in acquires {
        results.push(task.await.unwrap());
    }
    let acquired = count(results);
    stop.store(true, Ordering::Relaxed);
    watch.join().unwrap();
    assert!(
        !opened.load(Ordering::Relaxed),
        "the breaker opened on a healthy Redis"
    );
    assert!(
        settled > 0 && acquired > 0,
        "{settled} settled, {acquired} acquired"
    );
}
