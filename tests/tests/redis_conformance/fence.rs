//! The fence of a reset and of a block: a refund of a request reserved
//! at or before it changes nothing until the fence ends (`Settlement::fence` after the reset, or after the block
//! ends), a refund of one reserved after it lands, and so does a charge.
//! On memory and Redis alike, in every compact form and the general
//! scripts, with exact figures.

use std::time::Duration;

use tollgate_core::state::PolicyState;
use tollgate_core::{Algorithm, Clock, Key, MemoryStore, Policy, Settlement, Timestamp};

use super::harness::{Harness, Op, RT};

/// Memory and Redis (both script orders) settle `settlement` of `key`
/// alike; returns the decision.
fn settle(
    harness: &Harness,
    memory: &MemoryStore,
    key: &Key,
    policy: &Policy,
    settlement: Settlement,
) -> tollgate_core::Decision {
    let (m, r) = RT.block_on(harness.apply(
        memory,
        key,
        policy,
        Op::Settle(settlement.actual()),
        Some((settlement.reserved(), settlement.reserved_at())),
    ));
    assert_eq!(m, r, "{policy}: settling {settlement:?}");
    r
}

fn op(
    harness: &Harness,
    memory: &MemoryStore,
    key: &Key,
    policy: &Policy,
    op: Op,
) -> tollgate_core::Decision {
    let (m, r) = RT.block_on(harness.apply(memory, key, policy, op, None));
    assert_eq!(m, r, "{policy}: {op:?}");
    r
}

/// Each algorithm, with one limit (the compact forms where it has one)
/// and with two (the general script).
fn policies() -> Vec<Policy> {
    Algorithm::ALL
        .into_iter()
        .flat_map(|algorithm| {
            [
                Policy::new("fence", algorithm, "10/min").unwrap(),
                Policy::builder("fence2")
                    .algorithm(algorithm)
                    .limit("10/min")
                    .limit("100/h")
                    .build()
                    .unwrap(),
            ]
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
            // then on, it lands as on any key (the reference's
            // settlement).
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
            if policy.algorithm().has_burst() && policy.params().len() == 1 {
                // A single rate-based limit gives A's 4 back to the spent
                // key: the fence held them back until then.
                assert!(settled.remaining() > 0, "{policy}");
            }
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
