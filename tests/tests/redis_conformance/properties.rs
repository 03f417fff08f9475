//! The property tests, 1,000 random cases each: memory and Redis agree
//! per algorithm, across two configurations of a policy, on calendar
//! periods, and when a
//! settlement of a larger cost must leave no more than a smaller one.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use tollgate_core::{Algorithm, Decision};

use super::harness::Harness;
use super::strategies::{calendar_case, calendar_change_case, case, change_case, settle_case};

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

fn config(name: &str) -> ProptestConfig {
    ProptestConfig {
        cases: 1_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            // Relative to the tests crate.
            Box::leak(format!("tests/proptest-regressions/{name}.txt").into_boxed_str()),
        ))),
        ..ProptestConfig::default()
    }
}

macro_rules! conformance {
    ($($test:ident => $cases:expr),* $(,)?) => {$(
        #[test]
        fn $test() {
            let harness = Harness::new(stringify!($test));
            proptest!(config(stringify!($test)), |(case in $cases)| {
                let (memory, redis) = harness.run(&case);
                for (i, (m, r)) in memory.iter().zip(&redis).enumerate() {
                    prop_assert_eq!(m, r, "request {} of {:?}", i, case.arrivals);
                }
            });
        }
    )*};
}

/// Per algorithm: two keys with one history, settled at two costs from the
/// whole `u64` range; memory and Redis agree on every decision, and on both
/// the larger cost leaves no more remaining and no earlier retry.
macro_rules! monotonic_settling {
    ($($test:ident => $algorithm:expr),* $(,)?) => {$(
        #[test]
        fn $test() {
            let harness = Harness::new(stringify!($test));
            let config = ProptestConfig { cases: 300, ..config(stringify!($test)) };
            proptest!(config, |(case in settle_case($algorithm))| {
                let [settled, next] = harness.settle_two(&case);
                let (a, b) = case.costs;
                for (i, (m, r)) in settled.iter().chain(&next).enumerate() {
                    prop_assert_eq!(m, r, "decision {} after settling {} and {}", i, a, b);
                }
                no_more_remaining(&settled[0].1, &settled[1].1)
                    .map_err(|e| TestCaseError::fail(format!("settled {a} then {b}: {e}")))?;
                no_earlier(&next[0].1, &next[1].1)
                    .map_err(|e| TestCaseError::fail(format!("next after {a} then {b}: {e}")))?;
            });
        }
    )*};
}

monotonic_settling! {
    fixed_window_larger_settled_costs_never_leave_more => Algorithm::FixedWindow,
    sliding_log_larger_settled_costs_never_leave_more => Algorithm::SlidingLog,
    sliding_window_larger_settled_costs_never_leave_more => Algorithm::SlidingWindow,
    token_bucket_larger_settled_costs_never_leave_more => Algorithm::TokenBucket,
    leaky_bucket_larger_settled_costs_never_leave_more => Algorithm::LeakyBucket,
    gcra_larger_settled_costs_never_leave_more => Algorithm::Gcra,
}

conformance! {
    fixed_window_memory_and_redis_agree => case(Algorithm::FixedWindow),
    sliding_log_memory_and_redis_agree => case(Algorithm::SlidingLog),
    sliding_window_memory_and_redis_agree => case(Algorithm::SlidingWindow),
    token_bucket_memory_and_redis_agree => case(Algorithm::TokenBucket),
    leaky_bucket_memory_and_redis_agree => case(Algorithm::LeakyBucket),
    gcra_memory_and_redis_agree => case(Algorithm::Gcra),
    fixed_window_agrees_across_configurations => change_case(Algorithm::FixedWindow),
    sliding_log_agrees_across_configurations => change_case(Algorithm::SlidingLog),
    sliding_window_agrees_across_configurations => change_case(Algorithm::SlidingWindow),
    token_bucket_agrees_across_configurations => change_case(Algorithm::TokenBucket),
    leaky_bucket_agrees_across_configurations => change_case(Algorithm::LeakyBucket),
    gcra_agrees_across_configurations => change_case(Algorithm::Gcra),
    calendar_memory_and_redis_agree => calendar_case(),
    calendar_changes_memory_and_redis_agree => calendar_change_case(),
}
