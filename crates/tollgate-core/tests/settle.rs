//! What settling a request's actual cost does under each algorithm, as the
//! table of `Settlement` documents it: refunds give back exactly the
//! unused part, charges past the allowance are debt that delays the next
//! admission, and window algorithms refund only in the window the request
//! was reserved in.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use tollgate_core::state::PolicyState;
use tollgate_core::{Algorithm, Policy, Settlement, Timestamp};

/// The start of a minute.
const T0: u64 = 1_700_000_040;

fn at(secs: u64) -> Timestamp {
    Timestamp::from_secs(T0) + Duration::from_secs(secs)
}

fn policy(algorithm: Algorithm) -> Policy {
    Policy::new("settle", algorithm, "10/min").unwrap()
}

#[test]
fn a_refund_gives_back_exactly_the_unused_part() {
    for algorithm in Algorithm::ALL {
        let policy = policy(algorithm);
        let mut state = PolicyState::new(&policy, at(0));
        let reserved = state.decide(&policy, at(0), 10);
        assert_eq!(reserved.remaining(), 0, "{algorithm}");
        let settled = state.settle(&policy, at(0), &Settlement::of(&reserved, 10, 3));
        assert!(settled.is_allowed(), "{algorithm}");
        assert_eq!(settled.remaining(), 7, "{algorithm}");
        // The 7 given back are admitted at once, and no more.
        assert!(state.decide(&policy, at(0), 7).is_allowed(), "{algorithm}");
        assert!(!state.decide(&policy, at(0), 1).is_allowed(), "{algorithm}");
    }
}

#[test]
fn a_charge_past_the_allowance_is_debt_that_delays_the_next_admission() {
    // 10 a minute: one unit every 6 s. A request reserved 1 and cost 16:
    // 6 past the allowance.
    let waits = [
        // Paid off at a unit per 6 s: 6 units of debt, then one for itself.
        (Algorithm::Gcra, 42),
        (Algorithm::TokenBucket, 42),
        (Algorithm::LeakyBucket, 42),
        // Until the window ends, which forgets the debt.
        (Algorithm::FixedWindow, 60),
        // The 16 weigh on the next window too: 16 x (60 - e) / 60 <= 9
        // first holds 26.25 s into it.
        (Algorithm::SlidingWindow, 87),
        // Until the entry of 16 ages out.
        (Algorithm::SlidingLog, 60),
    ];
    for (algorithm, wait) in waits {
        let policy = policy(algorithm);
        let mut state = PolicyState::new(&policy, at(0));
        let reserved = state.decide(&policy, at(0), 1);
        let settled = state.settle(&policy, at(0), &Settlement::of(&reserved, 1, 16));
        assert!(
            settled.is_allowed(),
            "a charge is never denied: {algorithm}"
        );
        assert_eq!(settled.remaining(), 0, "{algorithm}");
        let next = state.decide(&policy, at(0), 1);
        let retry = next.retry_after().unwrap().as_secs_f64().ceil() as u64;
        assert_eq!(retry, wait, "{algorithm}");
        assert!(
            state.decide(&policy, at(wait), 1).is_allowed(),
            "{algorithm}"
        );
    }
}

#[test]
fn windows_refund_only_the_window_the_request_was_reserved_in() {
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let policy = policy(algorithm);
        let mut state = PolicyState::new(&policy, at(0));
        // Reserved 10 in the last second of a window, settled at 0 in the
        // next one.
        let reserved = state.decide(&policy, at(59), 10);
        assert!(reserved.is_allowed());
        let settled = state.settle(&policy, at(61), &Settlement::of(&reserved, 10, 0));
        // A fixed window's count of it is gone with its window: nothing to
        // give back. A sliding window takes it from the previous window,
        // whose weight would otherwise have counted 10 x 59/60 of it. Both
        // are whole again.
        assert_eq!(settled.remaining(), 10, "{algorithm}");
        // Reserved and settled in one window: given back.
        let reserved = state.decide(&policy, at(62), 4);
        let settled = state.settle(&policy, at(119), &Settlement::of(&reserved, 4, 1));
        assert_eq!(settled.remaining(), 9, "{algorithm}");
    }
}

#[test]
fn a_sliding_log_refunds_only_entries_since_the_reservation() {
    let policy = policy(Algorithm::SlidingLog);
    let mut state = PolicyState::new(&policy, at(0));
    assert!(state.decide(&policy, at(0), 6).is_allowed());
    let reserved = state.decide(&policy, at(10), 2);
    // A refund larger than the reservation cannot reach the 6 before it.
    let settled = state.settle(&policy, at(20), &Settlement::of(&reserved, 2, 0));
    let settled_more = state.settle(&policy, at(20), &Settlement::new(5, 0, at(10)));
    assert_eq!(settled.remaining(), 4);
    assert_eq!(settled_more.remaining(), 4);
}
