//! The fault matrix: each store composition (Redis, leased Redis, both
//! behind the local fallback, and in-flight slots) under each fault (Redis
//! killed, paused, restarted empty, `FLUSHALL`, the script cache flushed,
//! the app's own runtime saturated) and each operator action (reset, block,
//! a limit change while a lease is out). Every cell asserts:
//! - admitted ≤ the limit plus the bound the guide documents for that
//!   fault (0 where it documents none);
//! - no failure reaches the caller: under `local`, every request is
//!   decided (an HTTP layer would answer 200 or 429, never 5xx);
//! - recovery within the documented time: decisions go through Redis
//!   again within 5 s of the fault ending.
//!
//! Each cell runs on a private `redis-server`, on the real clock (faults
//! are real), with a limit of 100 an hour, so that no unit comes back
//! within a cell. The table it prints is the one in the failure-modes
//! guide.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::process::Command;
use std::time::{Duration, Instant};

use tollgate::{Algorithm, FailureMode, FallbackStore, Key, MemoryStore, Policy, Store};
use tollgate_redis::{LeasedStore, RedisStore};
use tollgate_tests::{RedisServer, unique_prefix};

const LIMIT: u64 = 100;
/// Requests admitted before the fault.
const USED: u64 = 60;
/// How long recovery may take once the fault ends: a reconnection, and
/// the breaker's cooldown.
const RECOVERY: Duration = Duration::from_secs(5);
/// The leased composition's share: a lease holds at most a quarter.
const SHARE: u64 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Composition {
    Redis,
    Leased,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Killed,
    Paused,
    RestartedEmpty,
    FlushAll,
    ScriptFlush,
    AppSaturated,
    Reset,
    Block,
    LimitChange,
}

impl Fault {
    /// What the guide documents may be admitted beyond the limit, over
    /// the whole cell, with `USED` admitted before the fault, by
    /// `composition`.
    fn bound(self, composition: Composition) -> u64 {
        // Units a lease holds were counted in the Redis that lost them, and
        // are still spent: at most two leases of a limit's share.
        let leased = match composition {
            Composition::Redis => 0,
            Composition::Leased => 2 * (LIMIT / SHARE),
        };
        match self {
            Fault::FlushAll => USED + leased,
            // The local fallback, seeded with what Redis last said, admits
            // the rest of the limit while Redis is away; Redis never learns
            // of those admissions.
            Fault::Paused => LIMIT - USED,
            // Killed, and restarted without persistence: the fallback's
            // share, and the count Redis lost.
            Fault::Killed => LIMIT - USED + USED,
            // Redis lost what it counted: the count starts again (above).
            // The same, and while the connection is made anew the
            // fallback admits its share.
            Fault::RestartedEmpty => USED + (LIMIT - USED),
            // Not a store failure: nothing beyond the limit.
            Fault::ScriptFlush | Fault::AppSaturated | Fault::LimitChange => 0,
            // The operator gives the key a fresh allowance.
            Fault::Reset => USED,
            // Nothing is admitted once the block returns.
            Fault::Block => 0,
        }
    }
}

/// One cell's Redis, its store, and, for the leased composition, the
/// leased store over it.
struct Cell {
    server: RedisServer,
    redis: RedisStore,
    leased: Option<LeasedStore<RedisStore>>,
}

impl Cell {
    async fn new(composition: Composition) -> Self {
        let server = RedisServer::spawn();
        let url = server.url();
        let prefix = unique_prefix("matrix");
        let redis = RedisStore::builder()
            .prefix(prefix.as_str())
            .deadline(Duration::from_millis(100))
            .circuit_breaker(5, Duration::from_millis(200))
            .connect(url.as_str())
            .await
            .unwrap();
        let leased = match composition {
            Composition::Redis => None,
            Composition::Leased => Some(
                LeasedStore::builder()
                    .interval(Duration::from_millis(100))
                    .share(SHARE)
                    .ack_timeout(Duration::from_millis(500))
                    .channel(format!("{prefix}:leases"))
                    .connect(redis.clone(), url.as_str())
                    .await
                    .unwrap(),
            ),
        };
        Self {
            server,
            redis,
            leased,
        }
    }
}

/// `store` behind the local fallback.
fn local<S: Store>(store: S) -> FallbackStore<S> {
    FallbackStore::new(store)
        .on_store_error(FailureMode::Local)
        .local_fallback(MemoryStore::new())
}

/// `n` requests of `key`, each decided (a failure is a defect here): how
/// many were admitted.
async fn requests(store: &impl Store, key: &Key, policy: &Policy, n: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..n {
        let decision = store.check(key, policy, 1).await;
        let decision = decision.unwrap_or_else(|e| panic!("a failure reached the caller: {e}"));
        admitted += u64::from(decision.is_allowed());
    }
    admitted
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits until decisions go through Redis again: the canary of the
/// health check, then the breaker closed by a decision of another key;
/// how long it took.
async fn recovery(cell: &Cell, store: &impl Store) -> Duration {
    let started = Instant::now();
    let (probe, policy) = (
        Key::user("probe"),
        Policy::new("probe", Algorithm::Gcra, "1000/s").unwrap(),
    );
    while cell.redis.health_check().await.is_err()
        || cell.redis.breaker_state() != tollgate_redis::BreakerState::Closed
    {
        assert!(
            started.elapsed() < RECOVERY,
            "no recovery within {RECOVERY:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        let _ = store.check(&probe, &policy, 1).await;
    }
    started.elapsed()
}

/// Runs one cell: `USED` requests, the fault, 100 requests during it, its
/// end, recovery, then 200 requests. Returns (admitted during, admitted
/// after, recovery time).
async fn run(composition: Composition, fault: Fault) -> (u64, u64, Duration) {
    let mut cell = Cell::new(composition).await;
    match cell.leased.clone() {
        Some(leased) => drive(&mut cell, &local(leased), composition, fault).await,
        None => {
            let redis = cell.redis.clone();
            drive(&mut cell, &local(redis), composition, fault).await
        }
    }
}

async fn drive(
    cell: &mut Cell,
    store: &impl Store,
    composition: Composition,
    fault: Fault,
) -> (u64, u64, Duration) {
    let policy = Policy::new("matrix", Algorithm::Gcra, "100/h").unwrap();
    let key = Key::user("ada");
    let before = requests(store, &key, &policy, USED).await;
    assert_eq!(before, USED, "{composition:?} {fault:?}: before the fault");
    if let Some(leased) = &cell.leased {
        leased.wait_for_grants().await;
    }
    let mut policy_after = policy.clone();
    let during = match fault {
        Fault::Killed => {
            cell.server.kill();
            let during = requests(store, &key, &policy, 100).await;
            cell.server.restart();
            during
        }
        Fault::Paused => {
            signal(cell.server.pid(), "-STOP");
            let during = requests(store, &key, &policy, 100).await;
            signal(cell.server.pid(), "-CONT");
            during
        }
        Fault::RestartedEmpty => {
            cell.server.restart();
            requests(store, &key, &policy, 100).await
        }
        Fault::FlushAll => {
            let _: () = redis::cmd("FLUSHALL")
                .query(&mut cell.server.connection())
                .unwrap();
            requests(store, &key, &policy, 100).await
        }
        Fault::ScriptFlush => {
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query(&mut cell.server.connection())
                .unwrap();
            requests(store, &key, &policy, 100).await
        }
        Fault::AppSaturated => {
            // The runtime's only thread is blocked past the deadline after
            // each request is sent: our own queueing, not Redis's.
            let mut admitted = 0;
            for _ in 0..20 {
                let check = store.check(&key, &policy, 1);
                let blocked = async {
                    tokio::task::yield_now().await;
                    std::thread::sleep(Duration::from_millis(130));
                };
                let (decision, ()) = tokio::join!(check, blocked);
                admitted += u64::from(decision.unwrap().is_allowed());
            }
            admitted
        }
        Fault::Reset => {
            cell.store_reset(&key, &policy).await;
            requests(store, &key, &policy, 100).await
        }
        Fault::Block => {
            cell.store_block(&key, &policy).await;
            requests(store, &key, &policy, 100).await
        }
        Fault::LimitChange => {
            // The same name, half the burst: state carries over, and what
            // a lease held under the old limit goes back first.
            policy_after = Policy::builder("matrix")
                .algorithm(Algorithm::Gcra)
                .limit("100/h")
                .burst(80)
                .build()
                .unwrap();
            requests(store, &key, &policy_after, 100).await
        }
    };
    let took = recovery(cell, store).await;
    let after = requests(store, &key, &policy_after, 200).await;
    (during, after, took)
}

impl Cell {
    async fn store_reset(&self, key: &Key, policy: &Policy) {
        match &self.leased {
            Some(leased) => leased.reset(key, policy).await.unwrap(),
            None => self.redis.reset(key, policy).await.unwrap(),
        }
    }

    async fn store_block(&self, key: &Key, policy: &Policy) {
        let hour = Duration::from_secs(3600);
        match &self.leased {
            Some(leased) => leased.block(key, policy, hour).await.unwrap(),
            None => self.redis.block(key, policy, hour).await.unwrap(),
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn every_composition_holds_its_bound_under_every_fault() {
    let faults = [
        Fault::Killed,
        Fault::Paused,
        Fault::RestartedEmpty,
        Fault::FlushAll,
        Fault::ScriptFlush,
        Fault::AppSaturated,
        Fault::Reset,
        Fault::Block,
        Fault::LimitChange,
    ];
    let mut broken = Vec::new();
    let mut table = String::from(
        "| composition | fault | admitted during | after | total | limit + bound | recovery |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for composition in [Composition::Redis, Composition::Leased] {
        for fault in faults {
            let (during, after, took) = run(composition, fault).await;
            let total = USED + during + after;
            let ceiling = LIMIT + fault.bound(composition);
            table += &format!(
                "| {composition:?} | {fault:?} | {during} | {after} | {total} | {ceiling} | {} ms |\n",
                took.as_millis()
            );
            if total > ceiling {
                broken.push(format!(
                    "{composition:?} {fault:?}: {total} admitted, more than {ceiling}"
                ));
            }
            if fault == Fault::Block && during + after != 0 {
                broken.push(format!(
                    "{composition:?}: {} admitted while blocked",
                    during + after
                ));
            }
            if matches!(fault, Fault::ScriptFlush | Fault::AppSaturated) && total != LIMIT {
                broken.push(format!(
                    "{composition:?} {fault:?}: {total} admitted, not exactly {LIMIT}"
                ));
            }
        }
    }
    eprintln!("{table}");
    assert!(broken.is_empty(), "{broken:#?}");
}

/// An app whose `/export` holds its in-flight slot until `go` lets it
/// finish.
struct Exports {
    app: axum::Router,
    running: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    go: std::sync::Arc<tokio::sync::Semaphore>,
}

impl Exports {
    fn new(store: &RedisStore) -> Self {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let limit = tollgate::InFlightLimit::new("matrix-exports", 2)
            .unwrap()
            .lease(Duration::from_millis(600))
            .unwrap();
        let layer = tollgate::InFlightLayer::new(limit, tollgate::GlobalKey)
            .store(store.clone())
            .on_store_error(FailureMode::Local)
            .local_fallback(MemoryStore::new());
        let running = Arc::new(AtomicUsize::new(0));
        let go = Arc::new(tokio::sync::Semaphore::new(0));
        let app = {
            let (running, go) = (running.clone(), go.clone());
            axum::Router::new()
                .route(
                    "/export",
                    axum::routing::get(move || {
                        let (running, go) = (running.clone(), go.clone());
                        async move {
                            running.fetch_add(1, Ordering::SeqCst);
                            go.acquire().await.unwrap().forget();
                            running.fetch_sub(1, Ordering::SeqCst);
                            "exported"
                        }
                    }),
                )
                .route_layer(layer)
        };
        Self { app, running, go }
    }

    /// Starts `n` exports at once; once each runs or is answered, how many
    /// run, and the statuses of those answered (none may be a 5xx).
    async fn start(&self, n: usize) -> (usize, Vec<tokio::task::JoinHandle<u16>>) {
        use std::sync::atomic::Ordering;
        use tower::ServiceExt;
        let before = self.running.load(Ordering::SeqCst);
        let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let (app, answered) = (self.app.clone(), answered.clone());
                tokio::spawn(async move {
                    let request = http::Request::get("/export")
                        .body(axum::body::Body::empty())
                        .unwrap();
                    let response = app.oneshot(request).await.unwrap();
                    let status = response.status().as_u16();
                    if status != 200 {
                        answered.fetch_add(1, Ordering::SeqCst);
                    }
                    let _ = axum::body::to_bytes(response.into_body(), 1 << 20).await;
                    status
                })
            })
            .collect();
        let started = Instant::now();
        while self.running.load(Ordering::SeqCst) + answered.load(Ordering::SeqCst) < before + n {
            assert!(started.elapsed() < Duration::from_secs(10), "exports stuck");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (self.running.load(Ordering::SeqCst) - before, tasks)
    }

    /// Waits one renewal period (a third of the lease) and a margin, for
    /// the running exports to take their slots back, then starts 5 more;
    /// how many of them run.
    async fn after_renewal(&self, tasks: &mut Vec<tokio::task::JoinHandle<u16>>) -> usize {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let (during, more) = self.start(5).await;
        tasks.extend(more);
        during
    }

    /// Lets every running export finish; the statuses of `tasks`.
    async fn finish(&self, tasks: Vec<tokio::task::JoinHandle<u16>>) -> Vec<u16> {
        self.go.add_permits(100);
        let mut statuses = Vec::new();
        for task in tasks {
            statuses.push(task.await.unwrap());
        }
        statuses
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_slots_hold_their_bound_under_every_fault() {
    let faults = [
        Fault::Killed,
        Fault::Paused,
        Fault::RestartedEmpty,
        Fault::FlushAll,
        Fault::ScriptFlush,
    ];
    let mut broken = Vec::new();
    let mut table = String::from(
        "| fault | new exports running beside 2 (limit 2) | after recovery | recovery |\n|---|---|---|---|\n",
    );
    for fault in faults {
        let mut cell = Cell::new(Composition::Redis).await;
        let exports = Exports::new(&cell.redis);
        let (running, mut tasks) = exports.start(2).await;
        assert_eq!(running, 2, "{fault:?}: before the fault");
        // The documented bound beside the 2 running: the local fallback's
        // whole limit while Redis is away (it knows nothing of the running
        // slots); nothing once a renewal period has passed after data loss.
        let bound = match fault {
            Fault::Killed | Fault::Paused => 2,
            Fault::RestartedEmpty
            | Fault::FlushAll
            | Fault::ScriptFlush
            | Fault::AppSaturated
            | Fault::Reset
            | Fault::Block
            | Fault::LimitChange => 0,
        };
        let during = match fault {
            Fault::Killed => {
                cell.server.kill();
                let (during, more) = exports.start(5).await;
                tasks.extend(more);
                cell.server.restart();
                during
            }
            Fault::Paused => {
                signal(cell.server.pid(), "-STOP");
                let (during, more) = exports.start(5).await;
                tasks.extend(more);
                signal(cell.server.pid(), "-CONT");
                during
            }
            Fault::RestartedEmpty => {
                cell.server.restart();
                exports.after_renewal(&mut tasks).await
            }
            Fault::FlushAll => {
                let _: () = redis::cmd("FLUSHALL")
                    .query(&mut cell.server.connection())
                    .unwrap();
                exports.after_renewal(&mut tasks).await
            }
            Fault::ScriptFlush => {
                let _: () = redis::cmd("SCRIPT")
                    .arg("FLUSH")
                    .query(&mut cell.server.connection())
                    .unwrap();
                exports.after_renewal(&mut tasks).await
            }
            Fault::AppSaturated | Fault::Reset | Fault::Block | Fault::LimitChange => {
                unreachable!("not an in-flight fault")
            }
        };
        let took = recovery(&cell, &local(cell.redis.clone())).await;
        let statuses = exports.finish(tasks).await;
        if statuses.iter().any(|&s| s >= 500) {
            broken.push(format!("{fault:?}: a 5xx: {statuses:?}"));
        }
        // Once the exports are done and their slots given back: exactly
        // the limit again. Slots are given back in the background, and a
        // local slot lives with its request; wait for a free slot first.
        let started = Instant::now();
        let after = loop {
            // A fresh gate: the last one has permits left over.
            let exports = Exports::new(&cell.redis);
            let (after, tasks) = exports.start(5).await;
            let _ = exports.finish(tasks).await;
            if after == 2 || started.elapsed() > RECOVERY {
                break after;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        table += &format!(
            "| {fault:?} | {during} | {after} | {} ms |\n",
            took.as_millis()
        );
        if during > bound {
            broken.push(format!(
                "{fault:?}: {during} new exports ran, more than {bound}"
            ));
        }
        if after != 2 {
            broken.push(format!("{fault:?}: {after} ran after recovery, not 2"));
        }
    }
    eprintln!("{table}");
    assert!(broken.is_empty(), "{broken:#?}");
}
