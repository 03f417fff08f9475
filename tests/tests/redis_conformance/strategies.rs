//! The proptest strategies: policies of one to three limits, arrivals with
//! checks, settlements and blocks, two configurations of a policy served
//! in turn, and settlements at costs from the whole `u64` range.

use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::{Algorithm, Limit, Policy};

use super::harness::{Case, Op, SettleCase};

pub(crate) const DAY_US: u64 = 86_400_000_000;

fn limit() -> impl Strategy<Value = (u64, u64)> {
    let count = prop_oneof![
        6 => 1u64..12,
        1 => 12u64..1_000,
        1 => Just(u64::from(u32::MAX)),
        1 => (1u64 << 31)..=u64::from(u32::MAX),
    ];
    let period = prop_oneof![
        2 => Just(1_000u64),
        2 => 1_000u64..3_000_000,
        2 => Just(60_000_000u64),
        1 => Just(30 * DAY_US),
        1 => 1_000u64..=(366 * DAY_US),
    ];
    (count, period)
}

/// A policy named "conf" with `limits` (one per period: later ones of a
/// period already taken are left out) and, if it fits the supported span,
/// `burst`.
fn conf(algorithm: Algorithm, limits: &[(u64, u64)], burst: Option<u64>) -> Policy {
    let mut periods = Vec::new();
    let mut builder = Policy::builder("conf").algorithm(algorithm);
    for &(count, period) in limits {
        if !periods.contains(&period) {
            periods.push(period);
            builder = builder.limit(Limit::new(count, Duration::from_micros(period)));
        }
    }
    let with_burst = match burst {
        Some(burst) if algorithm.has_burst() => builder.clone().burst(burst).build().ok(),
        _ => None,
    };
    // Some generated rate policies overflow the supported span; fall back
    // to the same limits without the burst.
    with_burst.unwrap_or_else(|| builder.build().unwrap())
}

fn arrivals(shortest: u64, configs: usize) -> impl Strategy<Value = Vec<(u64, Op, usize)>> {
    let gap = prop_oneof![
        3 => Just(0u64),
        4 => 0..shortest / 3 + 2,
        2 => 0..shortest * 2 + 2,
        1 => 0..DAY_US,
    ];
    let cost = prop_oneof![
        8 => Just(1u64),
        1 => Just(0u64),
        2 => 2u64..6,
        1 => Just(u64::from(u32::MAX)),
        1 => (1u64 << 31)..(1u64 << 33),
    ];
    let actual = prop_oneof![
        6 => 0u64..12,
        1 => Just(u64::from(u32::MAX)),
        1 => (1u64 << 31)..(1u64 << 52),
    ];
    let block = prop_oneof![
        3 => 0..shortest * 2 + 2,
        1 => 0..DAY_US,
    ];
    let op = prop_oneof![
        12 => cost.prop_map(Op::Check),
        3 => actual.prop_map(Op::Settle),
        1 => block.prop_map(Op::Block),
    ];
    prop::collection::vec((gap, op, 0..configs), 1..25)
}

pub(crate) fn case(algorithm: Algorithm) -> impl Strategy<Value = Case> {
    let limits = prop::collection::vec(limit(), 1..=3);
    let burst = prop::option::of(prop_oneof![1u64..20, Just(u64::from(u32::MAX))]);
    // Start anywhere from 2001 to 2100 (2040 is 2_208_988_800 s).
    let start = 1_000_000_000_000_000u64..4_102_444_800_000_000;
    (limits, burst, start)
        .prop_flat_map(move |(limits, burst, start)| {
            let policy = conf(algorithm, &limits, burst);
            let shortest = limits.iter().map(|l| l.1).min().unwrap_or(1_000);
            (Just(vec![policy]), Just(start), arrivals(shortest, 1))
        })
        .prop_map(|(policies, start, arrivals)| Case {
            policies,
            start,
            arrivals,
        })
}

/// Two configurations of one policy, served in turn: the second keeps some
/// of the first's periods with other counts and bursts, adds and drops
/// others (so the key also moves between layouts), and now and then uses
/// another algorithm.
pub(crate) fn change_case(algorithm: Algorithm) -> impl Strategy<Value = Case> {
    let limits = prop::collection::vec(limit(), 1..=3);
    let others = prop::collection::vec((limit(), any::<bool>()), 1..=3);
    let burst = || prop::option::of(prop_oneof![1u64..20, Just(u64::from(u32::MAX))]);
    let other_algorithm = prop_oneof![
        6 => Just(algorithm),
        1 => prop::sample::select(Algorithm::ALL.to_vec()),
    ];
    let start = 1_000_000_000_000_000u64..4_102_444_800_000_000;
    (limits, others, burst(), burst(), other_algorithm, start)
        .prop_flat_map(move |(limits, others, b1, b2, algorithm2, start)| {
            let second: Vec<(u64, u64)> = others
                .iter()
                .enumerate()
                .map(|(i, &((count, period), keep))| match limits.get(i) {
                    Some(&(_, kept)) if keep => (count, kept),
                    _ => (count, period),
                })
                .collect();
            let policies = vec![conf(algorithm, &limits, b1), conf(algorithm2, &second, b2)];
            let shortest = limits
                .iter()
                .chain(&second)
                .map(|l| l.1)
                .min()
                .unwrap_or(1_000);
            (Just(policies), Just(start), arrivals(shortest, 2))
        })
        .prop_map(|(policies, start, arrivals)| Case {
            policies,
            start,
            arrivals,
        })
}

/// The most a debt reaches: 2^50 µs, as `Settlement` documents.
pub(crate) const CAP_US: u64 = 1 << 50;

/// A cost anywhere in the `u64` range, most often near where arithmetic
/// could wrap or saturate: 2^50 units (the cap of an amount), `near` (the
/// units of the first limit's interval that make 2^50 µs), 2^53 (the
/// integers Lua holds exactly), 2^63 and `u64::MAX`; and small ones.
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

pub(crate) fn settle_case(algorithm: Algorithm) -> impl Strategy<Value = SettleCase> {
    case(algorithm).prop_flat_map(|history| {
        let p = &history.policies[0].params()[0];
        let near = (CAP_US / p.interval_us.max(1)).max(1);
        let gap = || prop_oneof![3 => Just(0u64), 3 => 0u64..2_000_000, 1 => 0..DAY_US];
        let costs = (any_cost(near), any_cost(near))
            .prop_filter("two costs", |(a, b)| a != b)
            .prop_map(|(a, b)| (a.min(b), a.max(b)));
        let cost = prop_oneof![6 => Just(1u64), 1 => Just(0u64), 2 => 2u64..6];
        (Just(history), gap(), costs, (gap(), cost)).prop_map(|(history, then, costs, next)| {
            SettleCase {
                history,
                then,
                costs,
                next,
            }
        })
    })
}
