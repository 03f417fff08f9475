//! GCRA gives the same allow/deny sequence as the `governor` crate.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock as _, FakeRelativeClock};
use governor::{Quota, RateLimiter};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use tollgate_core::state::PolicyState;
use tollgate_core::{Algorithm, Limit, Policy, Timestamp};

/// Quotas whose replenish interval is a whole number of microseconds, so
/// both sides compute the same interval.
fn quota() -> impl Strategy<Value = (u32, u64, u32)> {
    // (count, period in ms, burst)
    (
        prop::sample::select(vec![1u32, 2, 4, 5, 10, 20, 25, 50, 100]),
        prop::sample::select(vec![1u64, 10, 100, 1_000, 60_000]),
        1u32..30,
    )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/proptest-regressions/gcra_vs_governor.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn same_decisions_as_governor(
        (count, period_ms, burst) in quota(),
        gaps in prop::collection::vec(prop_oneof![2 => Just(0u64), 5 => 0u64..200_000, 1 => 0u64..5_000_000], 1..300),
    ) {
        let period = Duration::from_millis(period_ms);
        let limit = Limit::new(u64::from(count), period).unwrap();
        let policy = Policy::builder("gcra")
            .algorithm(Algorithm::Gcra)
            .limit(limit)
            .burst(u64::from(burst))
            .build()
            .unwrap();
        let quota = Quota::with_period(period / count)
            .unwrap()
            .allow_burst(NonZeroU32::new(burst).unwrap());
        let clock = FakeRelativeClock::default();
        let governor = RateLimiter::direct_with_clock(quota, clock.clone());

        let mut now = 1_700_000_000_000_000u64;
        let mut ours = PolicyState::new(&policy, Timestamp::from_micros(now));
        let mut allowed = 0;
        for (i, gap) in gaps.into_iter().enumerate() {
            now += gap;
            clock.advance(Duration::from_micros(gap));
            let d = ours.decide(&policy, Timestamp::from_micros(now), 1);
            let theirs = governor.check();
            prop_assert_eq!(d.is_allowed(), theirs.is_ok(), "request {} at +{} µs", i, gap);
            if let Err(not_until) = theirs {
                prop_assert_eq!(d.retry_after(), Some(not_until.wait_time_from(clock.now())));
            }
            allowed += usize::from(d.is_allowed());
        }
        prop_assert!(allowed >= 1);
    }
}
