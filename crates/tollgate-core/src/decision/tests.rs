//! A decision's size, its packed outcome, and how its times round.

use super::*;

#[test]
fn a_decision_moves_without_memcpy() {
    // Moves of up to 128 bytes compile to a few vector moves.
    assert!(std::mem::size_of::<Decision>() <= 128);
    assert!(std::mem::size_of::<Result<Decision, crate::StoreError>>() <= 128);
}

#[test]
fn the_packed_outcome_reads_back_as_given() {
    let policy = Policy::new("p", crate::Algorithm::Gcra, "10/s").unwrap();
    let p = policy.params()[0];
    let status = |retry| LimitStatus::new(0, p.limit, p.capacity, 3, Duration::ZERO, retry);
    let outcomes = [
        Outcome::Allowed,
        Outcome::Limited {
            retry_after: Duration::from_micros(1_500),
        },
        Outcome::CostExceedsCapacity {
            cost: 11,
            capacity: 10,
        },
    ];
    for outcome in outcomes {
        let retry = outcome_retry(outcome);
        let d = Decision::new(
            &policy,
            outcome,
            Timestamp::from_secs(5),
            Duration::ZERO,
            [status(retry)],
        );
        assert_eq!(d.outcome(), outcome);
        assert_eq!(d.retry_after(), retry);
        let costed = d.clone().with_cost(7);
        assert_eq!(costed.outcome(), outcome);
        let cost = match outcome {
            Outcome::CostExceedsCapacity { cost, .. } => cost,
            Outcome::Allowed | Outcome::Limited { .. } => 7,
        };
        assert_eq!(costed.cost(), cost);
        assert_eq!(d.is_allowed(), outcome == Outcome::Allowed);
        assert_eq!((d.limit(), d.remaining(), d.used()), (10, 3, 7));
        assert_eq!(d.binding().limit(), p.limit);
    }
}

fn outcome_retry(outcome: Outcome) -> Option<Duration> {
    match outcome {
        Outcome::Limited { retry_after } => Some(retry_after),
        Outcome::Allowed | Outcome::CostExceedsCapacity { .. } => None,
    }
}

#[test]
fn sub_microsecond_times_round_up_never_down() {
    let policy = Policy::new("p", crate::Algorithm::LeakyBucket, "10/s").unwrap();
    let limited = Outcome::Limited {
        retry_after: Duration::from_nanos(1_001),
    };
    let d = Decision::new(
        &policy,
        limited,
        Timestamp::from_secs(5),
        Duration::from_nanos(999),
        [],
    );
    assert_eq!(d.retry_after(), Some(Duration::from_micros(2)));
    assert_eq!(d.delay(), Duration::from_micros(1));
    // With no status given, every limit is reported exhausted.
    assert_eq!((d.limits().len(), d.remaining(), d.limit()), (1, 0, 10));
}
