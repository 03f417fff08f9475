//! The gate of the general-script calls: turns, and windows with none
//! back.

use std::sync::Arc;
use std::time::Duration;

use super::{GENERAL_IN_FLIGHT, Gate};
use crate::error::RedisStoreError;
use crate::patience::Home;

/// A call that waits past one window of the gate, while calls came
/// back (not yet to it), keeps its turn: a call that came later does
/// not go first.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_call_waiting_past_a_window_keeps_its_turn() {
    let gate = Arc::new(Gate::default());
    // A deadline of 10 ms: a ceiling of 40 ms, a window of 80 ms.
    let deadline = Duration::from_millis(10);
    let mut held: Vec<_> = (0..GENERAL_IN_FLIGHT)
        .map(|_| gate.places.try_acquire().unwrap())
        .collect();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let waiter = |name: &'static str| {
        let (gate, tx) = (Arc::clone(&gate), tx.clone());
        tokio::spawn(async move {
            let _place = gate.enter(deadline, &Home::NONE).await.unwrap();
            tx.send(name).unwrap();
            std::future::pending::<()>().await;
        })
    };
    // A call comes back: its place is given back, and counted.
    let back = |held: &mut Vec<_>| {
        drop(held.pop());
        gate.back.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    };
    let start = tokio::time::Instant::now();
    let at = |ms: u64| tokio::time::sleep_until(start + Duration::from_millis(ms));
    let _x = waiter("x");
    at(1).await;
    let _a = waiter("a");
    at(70).await;
    back(&mut held);
    at(72).await;
    assert_eq!(rx.try_recv().ok(), Some("x"));
    at(75).await;
    let _b = waiter("b");
    // a's first window ends at 81 ms, with a call back meanwhile.
    at(85).await;
    back(&mut held);
    at(87).await;
    assert_eq!(
        rx.try_recv().ok(),
        Some("a"),
        "a waited since 1 ms, b since 75"
    );
}

/// A window of the gate with no call back fails the wait: as Redis's
/// lateness (`Deadline`) if our runtime ran its timer on time, or ran on
/// time at the last look after a late one; as our own (`Late`) if it ran
/// both late (the calls on their way, late with it, answer to the
/// breaker themselves).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_window_with_none_back_fails_as_our_runtime_ran_it() {
    let gate = Gate::default();
    // A deadline of 10 ms: a window of 80 ms, a slack of 2.5 ms.
    let deadline = Duration::from_millis(10);
    let window = Duration::from_millis(80);
    let _held: Vec<_> = (0..GENERAL_IN_FLIGHT)
        .map(|_| gate.places.try_acquire().unwrap())
        .collect();
    let start = tokio::time::Instant::now();
    let on_time = gate.enter(deadline, &Home::NONE).await;
    assert!(
        matches!(on_time, Err(RedisStoreError::Deadline(w)) if w == window),
        "{:?}",
        on_time.err()
    );
    assert_eq!(start.elapsed(), window);
    // The clock moves past the window's timer while this task runs other
    // work (as on a busy runtime), then the runtime runs on time, or
    // stays late through the last look (its timer due 2.5 ms later).
    for late_twice in [false, true] {
        let start = tokio::time::Instant::now();
        let (outcome, ()) = tokio::join!(gate.enter(deadline, &Home::NONE), async {
            tokio::time::sleep(window - Duration::from_millis(1)).await;
            tokio::time::advance(Duration::from_millis(20)).await;
            if late_twice {
                tokio::time::sleep(Duration::from_millis(1)).await;
                tokio::time::advance(Duration::from_millis(20)).await;
            }
        });
        let waited = start.elapsed();
        match late_twice {
            false => assert!(
                matches!(outcome, Err(RedisStoreError::Deadline(w)) if w == waited),
                "{:?}",
                outcome.err()
            ),
            true => assert!(
                matches!(outcome, Err(RedisStoreError::Late(w)) if w == waited),
                "{:?}",
                outcome.err()
            ),
        }
    }
}
