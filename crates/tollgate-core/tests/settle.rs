//! What settling a request's actual cost does under each algorithm, as the
//! table of `Settlement` documents it: refunds give back exactly the
//! unused part, charges past the allowance are debt that delays the next
//! admission, and window algorithms refund only in the window the request
//! was reserved in. A charge saturates at 2^50 µs of the limit, so a
//! larger actual cost, anywhere in the `u64` range, never leaves a key
//! better off than a smaller one.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use tollgate_core::state::PolicyState;
use tollgate_core::{
    Algorithm, Decision, FakeClock, Key, Limit, MemoryStore, Outcome, Policy, Settlement, Store,
    Timestamp,
};

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

/// A key of `policy` (10 a minute) that reserved 1 at `at(0)` and cost 16:
/// its state, and the settlement's decision.
fn in_debt(policy: &Policy) -> (PolicyState, Decision) {
    let mut state = PolicyState::new(policy, at(0));
    let reserved = state.decide(policy, at(0), 1);
    let settled = state.settle(policy, at(0), &Settlement::of(&reserved, 1, 16));
    (state, settled)
}

/// Seconds until `state` admits one more at `at(0)`, rounded up.
fn wait_for_one(state: &PolicyState, policy: &Policy) -> u64 {
    let next = state.clone().decide(policy, at(0), 1);
    next.retry_after().unwrap().as_secs_f64().ceil() as u64
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
        let (mut state, settled) = in_debt(&policy);
        assert!(
            settled.is_allowed(),
            "a charge is never denied: {algorithm}"
        );
        assert_eq!(settled.remaining(), 0, "{algorithm}");
        assert_eq!(wait_for_one(&state, &policy), wait, "{algorithm}");
        assert!(
            state.decide(&policy, at(wait), 1).is_allowed(),
            "{algorithm}"
        );
    }
}

/// A local fallback seeds a key's state from the last decision the shared
/// store made of it. A rate-based limit in debt reports nothing remaining
/// and its debt in its reset: seeded from what remains alone, the debt was
/// forgotten, and the seeded state admitted after one period (10 s here)
/// where the key owes 42.
#[test]
fn a_state_seeded_from_a_key_in_debt_keeps_the_debt() {
    let waits = [
        (Algorithm::Gcra, 42),
        (Algorithm::TokenBucket, 42),
        (Algorithm::LeakyBucket, 42),
        (Algorithm::FixedWindow, 60),
        // The seed holds one window's count at most: the 6 past it no
        // longer weigh on the next window (87 s in the store).
        (Algorithm::SlidingWindow, 66),
        (Algorithm::SlidingLog, 60),
    ];
    for (algorithm, wait) in waits {
        let policy = policy(algorithm);
        let (mut state, _) = in_debt(&policy);
        let last = state.decide(&policy, at(0), 0);
        let mut seeded = PolicyState::seeded(&policy, &last);
        assert_eq!(wait_for_one(&seeded, &policy), wait, "{algorithm}");
        assert!(
            !seeded.clone().decide(&policy, at(wait - 1), 1).is_allowed(),
            "{algorithm}"
        );
        assert!(
            seeded.decide(&policy, at(wait), 1).is_allowed(),
            "{algorithm}"
        );
    }
}

/// A local fallback that already holds a key seeds it again on the next
/// failure, keeping the more used of the two states: a key in debt and one
/// merely exhausted both leave nothing remaining, and the debt must win
/// (it kept the held state on the tie: 6 s to wait instead of 42).
#[test]
fn a_seed_in_debt_wins_over_a_held_state_with_nothing_remaining() {
    let policy = policy(Algorithm::Gcra);
    let clock = FakeClock::new(at(0));
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let key = Key::user("ada");
    let mut exhausted = PolicyState::new(&policy, at(0));
    exhausted.decide(&policy, at(0), 10);
    let last = exhausted.decide(&policy, at(0), 0);
    store
        .seed(&key, &policy, PolicyState::seeded(&policy, &last))
        .unwrap();
    let (mut owing, _) = in_debt(&policy);
    let last = owing.decide(&policy, at(0), 0);
    store
        .seed(&key, &policy, PolicyState::seeded(&policy, &last))
        .unwrap();
    let next = store.check_sync(&key, &policy, 1).unwrap();
    assert_eq!(next.retry_after(), Some(Duration::from_secs(42)));
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

/// The memory store's answer, which it gives without waiting.
fn now_or_never<T>(future: impl Future<Output = T>) -> T {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(value) => value,
        Poll::Pending => panic!("the memory store never waits"),
    }
}

/// The most a debt reaches: 2^50 µs, as `Settlement` documents.
const CAP_US: u64 = 1 << 50;

#[test]
fn a_key_settled_at_u64_max_is_denied_next_with_a_retry_at_the_cap() {
    // 10 a minute: a unit every 6 s. The debt saturates at 2^50 µs of
    // backlog; the next request of 1 fits once all but 9 units of it are
    // paid off. Windows forget it when it ages out: a fixed window and the
    // log at the end of the period, a sliding window once the window the
    // debt was counted in no longer weighs on the current one.
    let interval = 6_000_000;
    let at_cap = Duration::from_micros(CAP_US - 9 * interval);
    let retries = [
        (Algorithm::Gcra, at_cap),
        (Algorithm::TokenBucket, at_cap),
        (Algorithm::LeakyBucket, at_cap),
        (Algorithm::FixedWindow, Duration::from_secs(60)),
        (Algorithm::SlidingWindow, Duration::from_secs(120)),
        (Algorithm::SlidingLog, Duration::from_secs(60)),
    ];
    for (algorithm, retry) in retries {
        let policy = policy(algorithm);
        let clock = FakeClock::new(at(0));
        let store = MemoryStore::builder().clock(clock).build().unwrap();
        let key = Key::user("u64-max");
        let mut state = PolicyState::new(&policy, at(0));
        let reserved = state.decide(&policy, at(0), 1);
        let from_store = now_or_never(store.check(&key, &policy, 1)).unwrap();
        assert_eq!(from_store, reserved, "{algorithm}");
        let settlement = Settlement::of(&reserved, 1, u64::MAX);
        let settled = state.settle(&policy, at(0), &settlement);
        assert_eq!(settled.remaining(), 0, "{algorithm}");
        let next = state.decide(&policy, at(0), 1);
        assert_eq!(
            next.outcome(),
            Outcome::Limited { retry_after: retry },
            "{algorithm}"
        );
        // The store (in its compact form where the policy has one) agrees.
        let stored = now_or_never(store.settle(&key, &policy, settlement)).unwrap();
        assert_eq!(stored, settled, "{algorithm}");
        let stored_next = now_or_never(store.check(&key, &policy, 1)).unwrap();
        assert_eq!(stored_next, next, "{algorithm}");
    }
}

/// A cost anywhere in the `u64` range, most often near where arithmetic
/// could wrap or saturate: 2^50 units (the cap of an amount), `near` (the
/// units of a limit's interval that make 2^50 µs), 2^53 (the integers Lua
/// holds exactly), 2^63 and `u64::MAX`; and small ones.
fn any_cost(near: u64) -> impl Strategy<Value = u64> {
    let around = |x: u64| x.saturating_sub(40)..=x.saturating_add(40);
    prop_oneof![
        3 => 0u64..24,
        3 => any::<u64>(),
        1 => around(u64::from(u32::MAX)),
        2 => around(near),
        2 => around(1 << 50),
        1 => around(1 << 53),
        1 => around(1 << 63),
        2 => around(u64::MAX),
    ]
}

/// A policy, a history of requests, and two actual costs `a < b` of the
/// last admitted request.
#[derive(Debug, Clone)]
struct SettleCase {
    policy: Policy,
    start: u64,
    /// `(gap before the request in µs, cost)`.
    history: Vec<(u64, u64)>,
    /// The gap from the last request to the settlement, in µs.
    then: u64,
    costs: (u64, u64),
    /// The gap from the settlement to the next request, in µs, and its cost.
    next: (u64, u64),
}

fn settle_case() -> impl Strategy<Value = SettleCase> {
    let algorithm = prop::sample::select(Algorithm::ALL.to_vec());
    let count = prop_oneof![6 => 1u64..12, 1 => 12u64..1_000_000, 1 => Just(u64::from(u32::MAX))];
    let period = prop_oneof![
        Just(1_000u64),
        Just(1_000_000),
        Just(60_000_000),
        1_000u64..90_000_000_000,
    ];
    let limits = prop::collection::vec((count, period), 1..=2);
    let burst = prop::option::of(1u64..15);
    (algorithm, limits, burst, 0u64..10_000_000_000)
        .prop_filter_map("a valid policy", |(algorithm, limits, burst, start)| {
            let mut b = Policy::builder("prop").algorithm(algorithm);
            let mut periods = Vec::new();
            for (count, period) in limits {
                if !periods.contains(&period) {
                    periods.push(period);
                    b = b.limit(Limit::new(count, Duration::from_micros(period)));
                }
            }
            if let (true, Some(burst)) = (algorithm.has_burst(), burst) {
                b = b.burst(burst);
            }
            Some((b.build().ok()?, start))
        })
        .prop_flat_map(|(policy, start)| {
            let p = &policy.params()[0];
            let near = (CAP_US / p.interval_us.max(1)).max(1);
            let longest = policy
                .params()
                .iter()
                .map(|p| p.period_us)
                .max()
                .unwrap_or(1);
            let gap = prop_oneof![3 => Just(0u64), 3 => 0..longest / 4 + 1, 1 => 0..longest * 2];
            let cost = prop_oneof![6 => Just(1u64), 1 => Just(0), 2 => 2u64..5];
            let history = prop::collection::vec((gap.clone(), cost.clone()), 1..16);
            let costs = (any_cost(near), any_cost(near))
                .prop_filter("two costs", |(a, b)| a != b)
                .prop_map(|(a, b)| (a.min(b), a.max(b)));
            (
                Just(policy),
                Just(start),
                history,
                gap.clone(),
                costs,
                (gap, cost),
            )
        })
        .prop_map(|(policy, start, history, then, costs, next)| SettleCase {
            policy,
            start: 1_600_000_000_000_000 + start,
            history,
            then,
            costs,
            next,
        })
}

/// `larger`, the settlement of more than `smaller` from the same state at
/// the same instant: no limit has more remaining.
fn no_more_remaining(smaller: &Decision, larger: &Decision) -> Result<(), String> {
    for (s, l) in smaller.limits().iter().zip(larger.limits()) {
        if l.remaining() > s.remaining() {
            return Err(format!(
                "limit {}: {} remaining after the larger cost, {} after the smaller",
                s.index(),
                l.remaining(),
                s.remaining()
            ));
        }
    }
    Ok(())
}

/// `larger`, the decision of the request after settling more than
/// `smaller` did: if it is admitted, so is `smaller`, with no longer a
/// delay; if it is denied, `smaller` is admitted or retried no later.
fn no_earlier(smaller: &Decision, larger: &Decision) -> Result<(), String> {
    match (smaller.is_allowed(), larger.is_allowed()) {
        (true, true) if larger.delay() < smaller.delay() => Err(format!(
            "delayed {:?} after the larger cost, {:?} after the smaller",
            larger.delay(),
            smaller.delay()
        )),
        (false, true) => Err("admitted after the larger cost, denied after the smaller".into()),
        (false, false) => match (smaller.retry_after(), larger.retry_after()) {
            (Some(s), Some(l)) if l < s => Err(format!(
                "retry in {l:?} after the larger cost, {s:?} after the smaller"
            )),
            (s, l) if s.is_some() != l.is_some() => Err(format!("retry {l:?} against {s:?}")),
            _ => Ok(()),
        },
        (true, false) | (true, true) => Ok(()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/proptest-regressions/settle.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_larger_settled_cost_never_leaves_more(case in settle_case()) {
        let policy = &case.policy;
        let clock = FakeClock::new(Timestamp::from_micros(case.start));
        let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        let keys = [Key::user("a"), Key::user("b")];
        let mut now = case.start;
        let mut reference = PolicyState::new(policy, Timestamp::from_micros(now));
        // The last admitted request: its cost and when.
        let mut reserved = (0, Timestamp::from_micros(now));
        for &(gap, cost) in &case.history {
            now += gap;
            clock.advance(Duration::from_micros(gap));
            let expected = reference.decide(policy, Timestamp::from_micros(now), cost);
            for key in &keys {
                let stored = now_or_never(store.check(key, policy, cost)).unwrap();
                prop_assert_eq!(&stored, &expected);
            }
            if expected.is_allowed() {
                reserved = (cost, expected.now());
            }
        }
        now += case.then;
        clock.advance(Duration::from_micros(case.then));
        let at = Timestamp::from_micros(now);
        let (a, b) = case.costs;
        let mut settled = Vec::new();
        let mut states = Vec::new();
        for (key, actual) in keys.iter().zip([a, b]) {
            let settlement = Settlement::new(reserved.0, actual, reserved.1);
            let mut state = reference.clone();
            let expected = state.settle(policy, at, &settlement);
            let stored = now_or_never(store.settle(key, policy, settlement)).unwrap();
            prop_assert_eq!(&stored, &expected, "settling {}", actual);
            settled.push(expected);
            states.push(state);
        }
        let (gap, cost) = case.next;
        clock.advance(Duration::from_micros(gap));
        let later = Timestamp::from_micros(now + gap);
        let mut next = Vec::new();
        for ((key, actual), state) in keys.iter().zip([a, b]).zip(&mut states) {
            let expected = state.decide(policy, later, cost);
            let stored = now_or_never(store.check(key, policy, cost)).unwrap();
            prop_assert_eq!(&stored, &expected, "the request after settling {}", actual);
            next.push(expected);
        }
        no_more_remaining(&settled[0], &settled[1])
            .map_err(|e| TestCaseError::fail(format!("settled {a} then {b}: {e}")))?;
        no_earlier(&next[0], &next[1])
            .map_err(|e| TestCaseError::fail(format!("next after {a} then {b}: {e}")))?;
    }
}

/// A fixed window whose limit is more than half its period in µs counted
/// as a single word, capped at the period less 1 µs: a charge up to the
/// cap, then the refund of a request the window had admitted, reopened
/// the window, where the reference (and the same limit beside another)
/// stays full until the window ends. Such limits now keep their full
/// state (found by an audit comparing the stores with the reference).
#[test]
fn a_refund_after_a_charge_past_the_cap_leaves_a_large_window_full() {
    for limit in ["3000000/5s", "600/ms", "499/ms"] {
        let policy = Policy::new("bytes", Algorithm::FixedWindow, limit).unwrap();
        let capacity = policy.params()[0].capacity;
        let clock = FakeClock::new(Timestamp::from_secs(T0));
        let store = MemoryStore::builder().clock(clock).build().unwrap();
        let mut reference = PolicyState::new(&policy, at(0));
        let key = Key::user("uploads");
        let (big, small) = (capacity - capacity / 6, capacity / 6);
        reference.decide(&policy, at(0), big);
        reference.decide(&policy, at(0), small);
        let a = store.check_sync(&key, &policy, big).unwrap();
        let b = store.check_sync(&key, &policy, small).unwrap();
        assert!(a.is_allowed() && b.is_allowed(), "{limit}");
        let charge = Settlement::of(&b, small, u64::MAX);
        let refund = Settlement::of(&a, big, 0);
        for settlement in [charge, refund] {
            reference.settle(&policy, at(0), &settlement);
            store.settle_sync(&key, &policy, &settlement).unwrap();
        }
        let expected = reference.decide(&policy, at(0), 1);
        let next = store.check_sync(&key, &policy, 1).unwrap();
        assert!(!expected.is_allowed(), "{limit}");
        assert_eq!((next.is_allowed(), next.remaining()), (false, 0), "{limit}");
    }
}
