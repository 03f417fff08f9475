//! In-flight slots on Redis, behind the local fallback, under each fault
//! that can lose them.

use std::time::{Duration, Instant};

use tollgate::{FailureMode, MemoryStore};
use tollgate_redis::RedisStore;

use super::RECOVERY;
use super::cell::{Cell, Composition, Fault, local, recovery, signal};

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
        // The documented bound beside the 2 running: nothing. While Redis
        // is away the running two hold their slots in the local fallback
        // too; after data loss, once a renewal period has passed, they
        // hold them in Redis again.
        let bound = match fault {
            Fault::Killed
            | Fault::Paused
            | Fault::RestartedEmpty
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
