//! A hung Redis on an app whose runtime stays busy. Ready tasks waiting
//! for a worker are read as the app's own load while Redis may have
//! answered (the connection's reader may be among them), but not for
//! ever: here Redis answers nothing, so the breaker opens, and every
//! request ends. And the converse: a healthy Redis on an app whose whole
//! process stalls while a call waits for a pooled connection is the app's
//! own load, which opens no breaker.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tollgate::{Algorithm, DecidedBy, Decision, FailureMode, Key, Policy, RateLimiter, StoreError};
use tollgate_redis::{BreakerState, Pool, RedisStore};
use tollgate_tests::{RedisServer, unique_prefix};

/// How long Redis holds every write.
const HUNG: Duration = Duration::from_secs(4);

/// Requests on their way at once.
const CALLERS: usize = 8;

/// Keeps `runtime` backlogged, with ready tasks waiting for a worker (as
/// an app's accept loop under load keeps it), until `stop` is set: from a
/// thread of its own, it spawns short tasks whenever fewer than 256 wait.
fn keep_backlogged(
    runtime: tokio::runtime::Handle,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if runtime.metrics().global_queue_depth() >= 256 {
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            for _ in 0..256 {
                runtime.spawn(async {
                    let end = Instant::now() + Duration::from_micros(20);
                    while Instant::now() < end {
                        std::hint::spin_loop();
                    }
                });
            }
        }
    })
}

/// Redis holds every write for 4 s while the app's runtime always has
/// ready tasks waiting for a worker, and 8 requests at a time keep
/// coming: the breaker opens while Redis is still silent, and every
/// request ends, decided by the failure policy or refused as the app's
/// own load. (Each call whose last look found ready tasks waiting was
/// refused as the app's own load, not counted: the breaker never opened.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_on_a_busy_runtime_opens_the_breaker() {
    let policy = Policy::new("hung-busy", Algorithm::Gcra, "100/h").unwrap();
    let server = RedisServer::spawn();
    let store = RedisStore::builder()
        .prefix(unique_prefix("hung-busy"))
        .connect(server.url())
        .await
        .unwrap();
    let limiter =
        Arc::new(RateLimiter::with_store(policy, store.clone()).on_store_error(FailureMode::Local));
    limiter.check(&Key::user("warm")).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let busy = keep_backlogged(tokio::runtime::Handle::current(), stop.clone());
    server.pause_writes(HUNG.as_millis() as u64);
    let hung = Instant::now();
    let callers: Vec<_> = (0..CALLERS)
        .map(|caller| {
            let (limiter, store) = (limiter.clone(), store.clone());
            tokio::spawn(async move {
                let (mut local, mut own_load) = (0, 0);
                for i in 0.. {
                    if store.breaker_state() == BreakerState::Open || hung.elapsed() > HUNG {
                        break;
                    }
                    match limiter
                        .check(&Key::user(format!("hung-{caller}-{i}")))
                        .await
                    {
                        Ok(d) if d.decided_by() == DecidedBy::LocalFallback => local += 1,
                        // Sent before Redis came back, answered after.
                        Ok(d) if d.decided_by() == DecidedBy::Store => {}
                        Ok(other) => panic!("{:?}", other.decided_by()),
                        Err(own) if own.is_own_load() => own_load += 1,
                        Err(other) => panic!("{other}"),
                    }
                }
                (local, own_load)
            })
        })
        .collect();
    let (mut local, mut own_load) = (0, 0);
    for caller in callers {
        let (l, o) = caller.await.unwrap();
        (local, own_load) = (local + l, own_load + o);
    }
    let opened = hung.elapsed();
    stop.store(true, Ordering::Relaxed);
    busy.join().unwrap();
    println!(
        "breaker {:?} after {opened:?}: {local} local, {own_load} refused",
        store.breaker_state()
    );
    assert_eq!(
        store.breaker_state(),
        BreakerState::Open,
        "after {opened:?}"
    );
    assert!(opened < HUNG, "{opened:?}");
}

/// A decision waits for the one pooled connection, which the app's own
/// call holds, and the whole process stalls (the one thread of its
/// runtime blocked) past the store's ceiling and its slack, Redis
/// healthy: the checkout's timers fire late, past the ceiling, and the
/// decision is refused as the app's own load. The breaker, which one
/// failure opens, stays closed, and nothing is decided locally. (It
/// failed as `PoolTimeout`, which opened the breaker.)
#[tokio::test(flavor = "current_thread")]
async fn a_checkout_a_stall_of_the_whole_process_ran_past_the_ceiling_is_our_own_load() {
    let pool = PoolOfOne::spawn("stalled-checkout", DEADLINE, CHECKOUT).await;
    let held = pool.store.connection().get_owned().await.unwrap();
    // Past the ceiling (four deadlines) and its slack (a quarter of one).
    let refused = pool.stalled_checkout(Duration::ZERO, DEADLINE * 8).await;
    let refused = refused.unwrap_err();
    assert!(refused.is_own_load(), "{refused}");
    assert_eq!(pool.store.breaker_state(), BreakerState::Closed);

    drop(held);
    let after = pool.limiter.check(&PoolOfOne::key()).await.unwrap();
    assert_eq!(after.decided_by(), DecidedBy::Store);
    assert_eq!(after.remaining(), 98, "the refused decision took nothing");
}

/// The bound of the test above: when Redis answered no call for a second
/// before the stall (the connection held that long, as by a call that
/// hangs), the checkout is a failure, which opens the breaker, and the
/// failure policy decides.
#[tokio::test(flavor = "current_thread")]
async fn a_stalled_checkout_after_a_second_with_no_answer_is_a_failure() {
    let pool = PoolOfOne::spawn("stalled-checkout-quiet", DEADLINE, CHECKOUT).await;
    let _held = pool.store.connection().get_owned().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let decided = pool.stalled_checkout(Duration::ZERO, DEADLINE * 8).await;
    let decided = decided.unwrap();
    assert_eq!(decided.decided_by(), DecidedBy::LocalFallback);
    assert_eq!(pool.store.breaker_state(), BreakerState::Open);
}

/// A stall that begins in the checkout's second wait, after one checkout
/// timeout in which the pool served no one (the connection held), and
/// ends past the ceiling and its slack, Redis healthy: the app's own load
/// too. (The wait past the ceiling that the stall made started the
/// call's deadline, and the checkout's lateness was judged from there: a
/// failure, which opened the breaker.)
#[tokio::test(flavor = "current_thread")]
async fn a_stall_in_the_checkouts_second_wait_is_our_own_load() {
    // Deadline 400 ms: ceiling 1.6 s and a slack of 100 ms. Checkout 800
    // ms, then a second wait of a quarter of one, to 1 s.
    let deadline = Duration::from_millis(400);
    let checkout = Duration::from_millis(800);
    let pool = PoolOfOne::spawn("stalled-second-wait", deadline, checkout).await;
    let _held = pool.store.connection().get_owned().await.unwrap();
    let stall = (Duration::from_millis(900), Duration::from_millis(1_000));
    let refused = pool.stalled_checkout(stall.0, stall.1).await.unwrap_err();
    assert!(refused.is_own_load(), "{refused}");
    assert_eq!(pool.store.breaker_state(), BreakerState::Closed);
}

/// The store's deadline and the pool's checkout timeout in the first two
/// tests above.
const DEADLINE: Duration = Duration::from_millis(50);
const CHECKOUT: Duration = Duration::from_millis(25);

/// A Redis server, a store of it on a pool of one connection with a
/// breaker that one failure opens, and a limiter of 100 an hour on that
/// store.
struct PoolOfOne {
    _server: RedisServer,
    store: RedisStore<Pool>,
    limiter: Arc<RateLimiter<RedisStore<Pool>>>,
}

impl PoolOfOne {
    /// Connected, with `deadline` and a `checkout` timeout, and a first
    /// decision of [`Self::key`] made.
    async fn spawn(name: &str, deadline: Duration, checkout: Duration) -> Self {
        let server = RedisServer::spawn();
        let store = RedisStore::builder()
            .prefix(unique_prefix(name))
            .pool_size(1)
            .pool_checkout_timeout(checkout)
            .deadline(deadline)
            .circuit_breaker(1, Duration::from_secs(60))
            .connect_pool(server.url())
            .await
            .unwrap();
        let policy = Policy::new(name, Algorithm::Gcra, "100/h").unwrap();
        let limiter = RateLimiter::with_store(policy, store.clone());
        let limiter = Arc::new(limiter.on_store_error(FailureMode::Local));
        assert!(limiter.check(&Self::key()).await.unwrap().is_allowed());
        Self {
            _server: server,
            store,
            limiter,
        }
    }

    /// The key decided.
    fn key() -> Key {
        Key::user("stalled")
    }

    /// A decision that waits for the connection (held by the caller) while
    /// the whole process stalls for `stall`, `before` after the decision
    /// began: its outcome.
    async fn stalled_checkout(
        &self,
        before: Duration,
        stall: Duration,
    ) -> Result<Decision, StoreError> {
        let waiting = tokio::spawn({
            let limiter = self.limiter.clone();
            async move { limiter.check(&Self::key()).await }
        });
        // Under way, waiting for the connection.
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(before).await;
        std::thread::sleep(stall);
        waiting.await.unwrap()
    }
}
