//! A hung Redis on an app whose runtime stays busy. Ready tasks waiting
//! for a worker are read as the app's own load while Redis may have
//! answered (the connection's reader may be among them), but not for
//! ever: here Redis answers nothing, so the breaker opens, and every
//! request ends.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tollgate::{Algorithm, DecidedBy, FailureMode, Key, Policy, RateLimiter};
use tollgate_redis::{BreakerState, RedisStore};
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
