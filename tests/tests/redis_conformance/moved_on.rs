//! A refund or a charge of a request reserved under a configuration that
//! the key has moved on from (a plan before its override was known, a
//! lease of the plan returned after an override, a deploy) changes
//! nothing where the key's own configuration has a limit whose period the
//! settlement's lacks (or another algorithm), on memory and Redis alike,
//! in every compact form and the general scripts. Carrying the key over to
//! the settlement's configuration used to drop what those limits held, and
//! hand out a fresh quota. Where the key's state carries over whole, or
//! holds nothing any more, the settlement lands as before.

use std::time::Duration;

use tollgate_core::{Algorithm, Decision, Key, MemoryStore, Policy, Settlement, Timestamp};

use super::harness::{Harness, Op, op, settle};

fn policy(algorithm: Algorithm, limits: &[&str]) -> Policy {
    let mut builder = Policy::builder("moved").algorithm(algorithm);
    for limit in limits {
        builder = builder.limit(*limit);
    }
    builder.build().unwrap()
}

/// The configuration a request was reserved under, the one the key moved
/// on to, and how many units the refund of one gives the spent key back:
/// none where the key's limits include another period (another period
/// alone, two limits against one, or two of which one period is kept),
/// one where they carry over whole (the same period with another count,
/// or one limit of the two: a compact form's string against the general
/// script's hash, both ways).
const MOVES: [(&[&str], &[&str], u64); 5] = [
    (&["10/min"], &["10/h"], 0),
    (&["10/min"], &["20/min"], 1),
    (&["10/min", "100/h"], &["10/min", "100/d"], 0),
    (&["10/min"], &["10/min", "100/h"], 0),
    (&["10/min", "100/h"], &["10/min"], 1),
];

/// A key that took request A under `before`, then moved on to `after` at
/// `start` plus a second and spent it: memory and Redis alike.
struct Spent {
    memory: MemoryStore,
    key: Key,
    a: Decision,
    reserved_under: Policy,
    moved_to: Policy,
    case: String,
}

fn spent(
    harness: &Harness,
    start: Timestamp,
    name: String,
    moves: (&[&str], &[&str]),
    algorithm: Algorithm,
) -> Spent {
    let (reserved_under, moved_to) = (policy(algorithm, moves.0), policy(algorithm, moves.1));
    let memory = MemoryStore::builder()
        .clock(harness.clock.clone())
        .build()
        .unwrap();
    let key = Key::user(name);
    let case = format!("{reserved_under} then {moved_to}");
    harness.clock.set(start);
    let a = op(harness, &memory, &key, &reserved_under, Op::Check(1));
    assert!(a.is_allowed(), "{case}");
    harness.clock.set(start + Duration::from_secs(1));
    let admitted = drain(harness, &memory, &key, &moved_to, &case);
    assert!(admitted > 0, "{case}");
    Spent {
        memory,
        key,
        a,
        reserved_under,
        moved_to,
        case,
    }
}

impl Spent {
    /// Settles A, which reserved 1, at `actual`, under the configuration
    /// it was reserved under.
    fn settle_a(&self, harness: &Harness, actual: u64) -> Decision {
        let settlement = Settlement::of(&self.a, 1, actual);
        settle(
            harness,
            &self.memory,
            &self.key,
            &self.reserved_under,
            settlement,
        )
    }

    /// The key's next request, of cost 1, under the configuration it moved
    /// on to.
    fn next(&self, harness: &Harness) -> Decision {
        op(
            harness,
            &self.memory,
            &self.key,
            &self.moved_to,
            Op::Check(1),
        )
    }
}

/// How many requests of cost 1 `policy` admits of `key` now, in a row.
fn drain(harness: &Harness, memory: &MemoryStore, key: &Key, policy: &Policy, case: &str) -> u64 {
    let mut admitted = 0;
    while op(harness, memory, key, policy, Op::Check(1)).is_allowed() {
        admitted += 1;
        assert!(admitted <= 20, "{case}");
    }
    admitted
}

#[test]
fn a_refund_under_a_configuration_the_key_moved_on_from_drops_none_of_its_limits() {
    let harness = Harness::new("moved-on");
    let start = Timestamp::from_secs(1_700_002_800);
    for algorithm in Algorithm::ALL {
        for (i, (before, after, freed)) in MOVES.into_iter().enumerate() {
            let name = format!("moved-{algorithm:?}-{i}");
            let spent = spent(&harness, start, name, (before, after), algorithm);
            let case = &spent.case;
            // A's refund under the configuration it was reserved under
            // starts nothing afresh: it gives the spent key back its own
            // unit, or nothing.
            spent.settle_a(&harness, 0);
            let more = drain(&harness, &spent.memory, &spent.key, &spent.moved_to, case);
            assert_eq!(more, freed, "{case}: what the refund freed");
            // A minute on, the key's units have left its minute's limit.
            // A refund then leaves the key's own state whole (a sliding
            // log's entries with the sums its hash keeps of them) for the
            // decisions after it.
            harness.clock.set(start + Duration::from_secs(62));
            spent.settle_a(&harness, 0);
            spent.next(&harness);
        }
    }
}

#[test]
fn a_charge_under_a_configuration_the_key_moved_on_from_drops_none_of_its_limits() {
    let harness = Harness::new("moved-on-charge");
    let start = Timestamp::from_secs(1_700_002_800);
    for algorithm in Algorithm::ALL {
        for (i, (before, after, _)) in MOVES.into_iter().enumerate() {
            let name = format!("charged-{algorithm:?}-{i}");
            let spent = spent(&harness, start, name, (before, after), algorithm);
            let case = &spent.case;
            // A cost one more than A reserved, settled under the
            // configuration it was reserved under: the spent key stays
            // spent (it used to be carried back, and its own limit that
            // the old configuration lacks started afresh).
            spent.settle_a(&harness, 2);
            let after_charge = spent.next(&harness);
            assert!(
                !after_charge.is_allowed(),
                "{case}: admitted after the charge"
            );
            // Two days on, the key's state holds nothing: carrying it over
            // drops nothing, and the charge lands as on a new key (Redis
            // still has the key: tests keep keys for ten minutes).
            harness.clock.set(start + Duration::from_secs(2 * 86_400));
            let landed = spent.settle_a(&harness, 2);
            let fresh = Key::user(format!("charged-fresh-{algorithm:?}-{i}"));
            let on_a_new_key = settle(
                &harness,
                &spent.memory,
                &fresh,
                &spent.reserved_under,
                Settlement::of(&spent.a, 1, 2),
            );
            assert_eq!(landed, on_a_new_key, "{case}: the charge landed");
            let first = &landed.limits()[0];
            assert!(first.remaining() < first.capacity(), "{case}: charged");
        }
    }
}
