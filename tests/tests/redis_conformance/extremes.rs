//! Fixed cases at the extremes: a settlement at `u64::MAX`, and costs and
//! periods at the edges of what a policy holds.

use std::time::Duration;

use tollgate_core::{Algorithm, Limit, Outcome, Policy, Timestamp};

use super::harness::{Case, Harness, Op};
use super::strategies::{CAP_US, DAY_US};

/// A key settled at `u64::MAX` is denied next: a bucket or GCRA until its
/// debt, saturated at 2^50 µs, is paid off; a window until the debt ages
/// out. On memory and Redis alike, in every compact form and the general
/// scripts (a policy of one limit, and of two).
#[test]
fn a_key_settled_at_u64_max_is_denied_next_with_a_retry_at_the_cap() {
    let harness = Harness::new("u64-max");
    // The start of a minute; 10 a minute is a unit every 6 s.
    let start = Timestamp::from_secs(1_700_000_040).as_micros();
    // With 2/s beside it, a unit every 0.5 s, a bucket's debt holds the
    // next request until all but 1 unit of it is paid off there; windows
    // still wait for the minute's.
    let at_cap = Duration::from_micros(CAP_US - 9 * 6_000_000);
    let at_cap_of_2_per_s = Duration::from_micros(CAP_US - 500_000);
    let (minute, two_minutes) = (Duration::from_secs(60), Duration::from_secs(120));
    let retries = [
        (Algorithm::Gcra, [at_cap, at_cap_of_2_per_s]),
        (Algorithm::TokenBucket, [at_cap, at_cap_of_2_per_s]),
        (Algorithm::LeakyBucket, [at_cap, at_cap_of_2_per_s]),
        (Algorithm::FixedWindow, [minute; 2]),
        (Algorithm::SlidingWindow, [two_minutes; 2]),
        (Algorithm::SlidingLog, [minute; 2]),
    ];
    for (algorithm, retries) in retries {
        let one = Policy::new("max", algorithm, "10/min").unwrap();
        let two = Policy::builder("max2")
            .algorithm(algorithm)
            .limit("10/min")
            .limit("2/s")
            .build()
            .unwrap();
        for (policy, retry) in [one, two].into_iter().zip(retries) {
            let case = Case {
                policies: vec![policy.clone()],
                start,
                arrivals: vec![
                    (0, Op::Check(1), 0),
                    (0, Op::Settle(u64::MAX), 0),
                    (0, Op::Check(1), 0),
                ],
            };
            let (memory, redis) = harness.run(&case);
            assert_eq!(memory, redis, "{policy}");
            assert_eq!(redis[1].remaining(), 0, "{policy}");
            assert_eq!(redis[2].retry_after(), Some(retry), "{policy}");
            assert!(!redis[2].is_allowed(), "{policy}");
        }
    }
}

#[test]
fn extremes_agree_for_every_algorithm() {
    let harness = Harness::new("extremes");
    // 2040-01-01T00:00:00Z through the test hook.
    let start = Timestamp::from_secs(2_208_988_800).as_micros() + 123_457;
    let max = u64::from(u32::MAX);
    for algorithm in Algorithm::ALL {
        let policy = Policy::builder("extreme")
            .algorithm(algorithm)
            .limit(Limit::new(max, Duration::from_secs(30 * 86_400)))
            .limit("3/s")
            .build()
            .unwrap();
        let huge = Policy::new(
            "huge",
            algorithm,
            Limit::new(max, Duration::from_secs(30 * 86_400)),
        )
        .unwrap();
        for policy in [policy, huge] {
            let case = Case {
                policies: vec![policy.clone()],
                start,
                arrivals: [
                    (0, max - 1),
                    (0, 1),
                    (0, 0),
                    (0, max + 1),
                    (1, max),
                    (17 * DAY_US, 1 << 31),
                    (1_000_003, 2),
                    (29 * DAY_US, max),
                    (0, 0),
                ]
                .map(|(gap, cost)| (gap, Op::Check(cost), 0))
                .to_vec(),
            };
            let (memory, redis) = harness.run(&case);
            assert_eq!(memory, redis, "{algorithm}, {policy}");
            // A cost above capacity is never satisfiable, on both stores.
            assert!(
                matches!(redis[3].outcome(), Outcome::CostExceedsCapacity { cost, .. } if cost == max + 1),
                "{algorithm}: {:?}",
                redis[3].outcome()
            );
            // A peek consumes nothing.
            assert_eq!(
                redis[2].limits(),
                redis[1].limits(),
                "{algorithm}: peek after an admit"
            );
        }
    }
}
