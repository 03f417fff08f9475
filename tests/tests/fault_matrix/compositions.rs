//! Each store composition (Redis, leased Redis, both behind the local
//! fallback) under each fault and operator action.

use std::time::Duration;

use tollgate::{Algorithm, Key, Policy, Store};

use super::cell::{Cell, Composition, Fault, local, recovery, requests, signal};
use super::{LIMIT, USED};

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
