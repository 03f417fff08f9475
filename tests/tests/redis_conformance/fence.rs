//! The fence of a reset and of a block: a refund of a request reserved
//! at or before it changes nothing until the fence ends (`Settlement::fence` after the reset, or after the block
//! ends), a refund of one reserved after it lands, and so does a charge.
//! On memory and Redis alike, in every compact form and the general
//! scripts, with exact figures.

use std::time::Duration;

use tollgate_core::state::PolicyState;
use tollgate_core::{Algorithm, Clock, Key, MemoryStore, Policy, Settlement, Timestamp};

use super::harness::{Harness, Op, op, settle};

/// Each algorithm, with one limit (the compact forms where it has one)
/// and with two (the general script); a rate-based one also with a burst
/// above its count, whose backlog outlasts its period.
fn policies() -> Vec<Policy> {
    Algorithm::ALL
        .into_iter()
        .flat_map(|algorithm| {
            let bursty = algorithm.has_burst().then(|| {
                Policy::builder("fence3")
                    .algorithm(algorithm)
                    .limit("10/min")
                    .burst(30)
                    .build()
                    .unwrap()
            });
            [
                Some(Policy::new("fence", algorithm, "10/min").unwrap()),
                Some(
                    Policy::builder("fence2")
                        .algorithm(algorithm)
                        .limit("10/min")
                        .limit("100/h")
                        .build()
                        .unwrap(),
                ),
                bursty,
            ]
            .into_iter()
            .flatten()
        })
        .collect()
}

#[test]
fn a_refund_of_a_request_reserved_before_a_reset_or_a_block_changes_nothing_until_the_fence_ends() {
    let harness = Harness::new("fence");
    // The start of a minute and of an hour.
    let start = Timestamp::from_secs(1_700_002_800);
    let secs = |s: u64| Duration::from_secs(s);
    for block in [None, Some(secs(10))] {
        for policy in policies() {
            let memory = MemoryStore::builder()
                .clock(harness.clock.clone())
                .build()
                .unwrap();
            let key = Key::user(format!("fence-{}-{block:?}", policy));
            harness.clock.set(start);
            // A reserves 5 of the 10; then the operator acts.
            let a = op(&harness, &memory, &key, &policy, Op::Check(5));
            assert!(a.is_allowed(), "{policy}");
            harness.clock.advance(secs(1));
            let forgotten_at = harness.clock.now();
            let fresh_at = match block {
                None => {
                    op(&harness, &memory, &key, &policy, Op::Reset);
                    forgotten_at
                }
                Some(duration) => {
                    op(
                        &harness,
                        &memory,
                        &key,
                        &policy,
                        Op::Block(duration.as_micros() as u64),
                    );
                    forgotten_at + duration
                }
            };
            harness.clock.set(fresh_at + secs(1));
            // B reserves 4 of a fresh allowance.
            let b_at = fresh_at + secs(1);
            harness.clock.set(b_at);
            let mut reference = PolicyState::new(&policy, b_at);
            let b = op(&harness, &memory, &key, &policy, Op::Check(4));
            assert_eq!(b, reference.decide(&policy, b_at, 4), "{policy}");
            harness.clock.advance(secs(1));
            let now = harness.clock.now();

            // A used 1 of its 5: the 4 it would give back were already
            // given back by forgetting the key. Its refund changes nothing.
            let refund_a = Settlement::of(&a, 5, 1);
            let status = reference.decide(&policy, now, 0);
            let settled = settle(&harness, &memory, &key, &policy, refund_a);
            assert!(settled.is_allowed(), "{policy}");
            assert_eq!(
                settled.remaining(),
                status.remaining(),
                "{policy}: A's refund is fenced"
            );
            assert_eq!(settled.reset_at(), status.reset_at(), "{policy}");
            // B used 1 of its 4: 3 come back.
            let landed = reference.settle(&policy, now, &Settlement::of(&b, 4, 1));
            let settled = settle(&harness, &memory, &key, &policy, Settlement::of(&b, 4, 1));
            assert_eq!(settled, landed, "{policy}: B's refund lands");
            assert!(settled.remaining() > status.remaining(), "{policy}");
            // A charge is work done: A cost 7 of its 5, 2 more.
            let charged = reference.settle(&policy, now, &Settlement::of(&a, 5, 7));
            let settled = settle(&harness, &memory, &key, &policy, Settlement::of(&a, 5, 7));
            assert_eq!(settled, charged, "{policy}: A's charge lands");

            // The fence's bound: it ends the fence's span after the key
            // was reset, or after its block ended. Just before, with the
            // key spent again, a refund of A still changes nothing; from
            // then on, it is settled as on any key (the reference's
            // settlement), and gives nothing back either: A's units are
            // gone by then, from every algorithm's state (a window past,
            // an entry aged out, a backlog drained).
            let until = fresh_at + Settlement::fence(&policy);
            let before = until - Duration::from_micros(1);
            harness.clock.set(before);
            let left = op(&harness, &memory, &key, &policy, Op::Check(0)).remaining();
            assert!(left > 0, "{policy}");
            let spent = op(&harness, &memory, &key, &policy, Op::Check(left));
            assert_eq!(spent, reference.decide(&policy, before, left), "{policy}");
            let settled = settle(&harness, &memory, &key, &policy, refund_a);
            assert_eq!(settled.remaining(), 0, "{policy}: fenced to its end");
            harness.clock.set(until);
            let landed = reference.settle(&policy, until, &refund_a);
            let settled = settle(&harness, &memory, &key, &policy, refund_a);
            assert_eq!(settled, landed, "{policy}: after the fence");
            assert_eq!(settled.remaining(), 0, "{policy}: A's units are gone");
        }
    }
}

/// The fence's edge: a refund of a request reserved in the microsecond of
/// the reset is dropped (it may have come just before it); one reserved a
/// microsecond later lands.
#[test]
fn the_fence_drops_refunds_of_requests_reserved_at_the_reset_and_no_later() {
    let harness = Harness::new("fence-edge");
    let start = Timestamp::from_secs(1_700_002_800);
    let micro = Duration::from_micros(1);
    for policy in policies() {
        let memory = MemoryStore::builder()
            .clock(harness.clock.clone())
            .build()
            .unwrap();
        let key = Key::user(format!("edge-{policy}"));
        harness.clock.set(start);
        op(&harness, &memory, &key, &policy, Op::Reset);
        let mut reference = PolicyState::new(&policy, start);
        let c = op(&harness, &memory, &key, &policy, Op::Check(2));
        assert_eq!(c, reference.decide(&policy, start, 2), "{policy}");
        let next = start + micro;
        harness.clock.set(next);
        let d = op(&harness, &memory, &key, &policy, Op::Check(2));
        assert_eq!(d, reference.decide(&policy, next, 2), "{policy}");
        let status = reference.decide(&policy, next, 0);
        let settled = settle(&harness, &memory, &key, &policy, Settlement::of(&c, 2, 0));
        assert_eq!(
            settled.remaining(),
            status.remaining(),
            "{policy}: reserved at the reset"
        );
        let landed = reference.settle(&policy, next, &Settlement::of(&d, 2, 0));
        let settled = settle(&harness, &memory, &key, &policy, Settlement::of(&d, 2, 0));
        assert_eq!(settled, landed, "{policy}: reserved after it");
        if policy.params().len() == 1 {
            assert_eq!(settled.remaining(), status.remaining() + 2, "{policy}");
        }
    }
}

/// A refund that comes after its request's units have left the key's
/// state (a backlog drained, a log entry aged out) gives nothing back:
/// what it would take off is a later request's, admitted a second time.
/// A reserves the whole minute at 0 s and B the next at 61 s; A's refund
/// of all 10 at 70 s leaves exactly what B left: one unit drained from a
/// rate-based backlog (9 s at 6 s a unit), none from the log, whose
/// entries are all B's. (Before, 10 more were admitted at 70 s.)
#[test]
fn a_refund_after_its_units_are_gone_takes_nothing_of_later_requests() {
    let harness = Harness::new("late-refund");
    let start = Timestamp::from_secs(1_700_002_800);
    let secs = |s: u64| Duration::from_secs(s);
    for policy in policies() {
        let algorithm = policy.algorithm();
        let left_for_one = match algorithm {
            Algorithm::Gcra | Algorithm::LeakyBucket | Algorithm::TokenBucket => 1,
            Algorithm::SlidingLog => 0,
            // A window's refund has no backlog to outlive: the fixed window
            // drops one of a window past, and the sliding window weighs the
            // previous window's count, A's own, which its refund lowers.
            Algorithm::FixedWindow | Algorithm::SlidingWindow => continue,
        };
        // A burst of 30 leaves room beside B's 10; a leaky bucket's hourly
        // queue holds B's 10 back.
        let two_leaky = algorithm == Algorithm::LeakyBucket && policy.params().len() > 1;
        if policy.name() == "fence3" || two_leaky {
            continue;
        }
        let memory = MemoryStore::builder()
            .clock(harness.clock.clone())
            .build()
            .unwrap();
        let key = Key::user(format!("late-refund-{policy}"));
        harness.clock.set(start);
        let a = op(&harness, &memory, &key, &policy, Op::Check(10));
        assert!(a.is_allowed(), "{policy}");
        harness.clock.set(start + secs(61));
        let b = op(&harness, &memory, &key, &policy, Op::Check(10));
        assert!(b.is_allowed(), "{policy}");
        harness.clock.set(start + secs(70));
        settle(&harness, &memory, &key, &policy, Settlement::of(&a, 10, 0));
        let mut admitted = 0;
        while op(&harness, &memory, &key, &policy, Op::Check(1)).is_allowed() {
            admitted += 1;
            assert!(admitted <= 10, "{policy}");
        }
        assert_eq!(
            admitted, left_for_one,
            "{policy}: A's refund took B's units"
        );
    }
}

/// A refund whose reservation time is far in the future (a time in
/// nanoseconds passed as microseconds, say) settles alike on both stores,
/// in the general script and the word script: the script reads the time
/// capped at 2^52 µs, within what a Lua double holds exactly (the general
/// script's arithmetic on it never ended before, and held Redis busy).
#[test]
fn a_refund_reserved_far_in_the_future_settles_alike_and_ends() {
    let harness = Harness::new("far-refund");
    harness.clock.set(Timestamp::from_secs(1_700_002_800));
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ] {
        let single = Policy::new("far", algorithm, "10000/s").unwrap();
        let two = Policy::builder("far2")
            .algorithm(algorithm)
            .limit("10000/s")
            .limit("500000/min")
            .build()
            .unwrap();
        for policy in [single, two] {
            let memory = MemoryStore::builder()
                .clock(harness.clock.clone())
                .build()
                .unwrap();
            for at in [1_700_002_800_000_000_000, u64::MAX] {
                let key = Key::user(format!("far-{policy}-{at}"));
                let reserved = op(&harness, &memory, &key, &policy, Op::Check(100));
                assert!(reserved.is_allowed(), "{policy}");
                let far = Settlement::new(100, 95, Timestamp::from_micros(at));
                let settled = settle(&harness, &memory, &key, &policy, far);
                // The reservation's units are all still held: 5 back.
                assert!(settled.remaining() > reserved.remaining(), "{policy}");
            }
        }
    }
}
