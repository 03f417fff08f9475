//! The proptest strategies: policies of one to three limits, arrivals with
//! checks, settlements, blocks and resets, two configurations of a policy served
//! in turn, settlements at costs from the whole `u64` range, and calendar
//! periods around their hard moments.

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
        3 => actual.clone().prop_map(Op::Settle),
        1 => (actual, 0usize..3).prop_map(|(actual, back)| Op::SettleOlder(actual, back)),
        1 => block.prop_map(Op::Block),
        1 => Just(Op::Reset),
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

/// Moments where calendars are hard, in µs: month ends of 28, 29, 30 and
/// 31 days (the leap day of 2028), and the daylight-saving changes of
/// Europe/Berlin (2027-03-28 01:00 and 2027-10-31 01:00 UTC), of
/// America/Santiago (its midnight of 2027-09-05 does not exist) and of
/// Australia/Lord_Howe (half an hour, 2027-10-03 02:00 local); and the
/// ends of a 30-day month and a year.
const HARD_MOMENTS: [u64; 8] = [
    1_835_481_600_000_000, // 2028-03-01T00:00:00Z
    1_832_976_000_000_000, // 2028-02-01T00:00:00Z
    1_806_195_600_000_000, // 2027-03-28T01:00:00Z
    1_824_944_400_000_000, // 2027-10-31T01:00:00Z
    1_820_116_800_000_000, // 2027-09-05T04:00:00Z
    1_822_491_000_000_000, // 2027-10-02T15:30:00Z
    1_809_129_600_000_000, // 2027-05-01T00:00:00Z
    1_798_761_600_000_000, // 2027-01-01T00:00:00Z
];

/// The fixed window on a calendar: a zone (with daylight-saving changes
/// of an hour, of half an hour, at midnight, or none), an offset shorter
/// than a day, limits per day, week or month (and now and then one per
/// minute beside them), starting within two days of a hard moment or
/// anywhere in 2001 to 2100; one configuration, or two served in turn
/// whose counts differ (the period's usage carries over).
pub(crate) fn calendar_case() -> impl Strategy<Value = Case> {
    let zone = prop::sample::select(vec![
        "Europe/Berlin",
        "America/Santiago",
        "Australia/Lord_Howe",
        "Asia/Kolkata",
        "UTC",
    ]);
    let offset = prop_oneof![2 => Just(0u64), 1 => 0u64..86_400_000_000];
    let count = || prop_oneof![4 => 1u64..12, 1 => 12u64..1_000];
    let unit = prop::sample::select(vec!["day", "week", "month"]);
    let limits = prop::collection::vec((count(), unit), 1..=3);
    let minute = prop::option::of(count());
    let recount = prop::collection::vec(count(), 3);
    let start = prop_oneof![
        3 => (prop::sample::select(HARD_MOMENTS.to_vec()), 0..4 * DAY_US)
            .prop_map(|(moment, around)| moment - 2 * DAY_US + around),
        1 => 1_000_000_000_000_000u64..4_102_444_800_000_000,
    ];
    (
        zone,
        offset,
        limits,
        minute,
        prop::option::of(recount),
        start,
    )
        .prop_flat_map(|(zone, offset, limits, minute, recount, start)| {
            let calendar = tollgate_core::Calendar::new(zone)
                .unwrap()
                .with_offset(Duration::from_micros(offset));
            let build = |counts: &[u64]| {
                let mut builder = Policy::builder("conf")
                    .algorithm(Algorithm::FixedWindow)
                    .calendar(calendar);
                let mut units = Vec::new();
                for (&(_, unit), &count) in limits.iter().zip(counts) {
                    if !units.contains(&unit) {
                        units.push(unit);
                        builder = builder.limit(format!("{count}/{unit}"));
                    }
                }
                if let Some(count) = minute {
                    builder = builder.limit(format!("{count}/min"));
                }
                builder.build().unwrap()
            };
            let counts: Vec<u64> = limits.iter().map(|l| l.0).collect();
            let mut policies = vec![build(&counts)];
            if let Some(recount) = recount {
                policies.push(build(&recount));
            }
            let shortest = if minute.is_some() {
                60_000_000
            } else if units_of(&limits).contains(&"day") {
                DAY_US
            } else {
                7 * DAY_US
            };
            let configs = policies.len();
            (Just(policies), Just(start), arrivals(shortest, configs))
        })
        .prop_map(|(policies, start, arrivals)| Case {
            policies,
            start,
            arrivals,
        })
}

fn units_of(limits: &[(u64, &'static str)]) -> Vec<&'static str> {
    limits.iter().map(|l| l.1).collect()
}

/// Two configurations of one fixed-window policy served in turn that
/// differ in their calendar (zone, offset, or none at all), with the same
/// or other counts, over the hard moments; checks (peeks among them),
/// settlements, blocks and resets: a deploy that moves a policy to
/// another calendar (or adds a monthly limit to a weekly one, which moves
/// its weeks) carries each key's use over alike on both stores.
pub(crate) fn calendar_change_case() -> impl Strategy<Value = Case> {
    let zone = prop::sample::select(vec![
        "",
        "Europe/Berlin",
        "America/Santiago",
        "Australia/Lord_Howe",
        "Asia/Kolkata",
        "UTC",
        "Pacific/Kiritimati",
        "America/Adak",
    ]);
    let offset = prop_oneof![2 => Just(0u64), 1 => 0u64..86_400_000_000];
    let count = || prop_oneof![4 => 1u64..12, 1 => 12u64..1_000];
    let unit = prop::sample::select(vec!["day", "week", "month"]);
    let limits = prop::collection::vec((count(), unit), 1..=2);
    let minute = prop::option::of(count());
    let recount = prop::collection::vec(count(), 2);
    let start = prop_oneof![
        3 => (prop::sample::select(HARD_MOMENTS.to_vec()), 0..4 * DAY_US)
            .prop_map(|(moment, around)| moment - 2 * DAY_US + around),
        1 => 1_000_000_000_000_000u64..4_102_444_800_000_000,
    ];
    (
        (zone.clone(), offset.clone()),
        (zone, offset),
        limits,
        minute,
        recount,
        start,
    )
        .prop_flat_map(|((z1, o1), (z2, o2), limits, minute, recount, start)| {
            let build = |zone: &str, offset: u64, counts: &[u64]| {
                let mut builder = Policy::builder("conf").algorithm(Algorithm::FixedWindow);
                if !zone.is_empty() {
                    let calendar = tollgate_core::Calendar::new(zone)
                        .unwrap()
                        .with_offset(Duration::from_micros(offset));
                    builder = builder.calendar(calendar);
                }
                let mut units = Vec::new();
                for (&(_, unit), &count) in limits.iter().zip(counts) {
                    if !units.contains(&unit) {
                        units.push(unit);
                        builder = builder.limit(format!("{count}/{unit}"));
                    }
                }
                if let Some(count) = minute {
                    builder = builder.limit(format!("{count}/min"));
                }
                builder.build().unwrap()
            };
            let counts: Vec<u64> = limits.iter().map(|l| l.0).collect();
            let policies = vec![build(z1, o1, &counts), build(z2, o2, &recount)];
            let shortest = if minute.is_some() {
                60_000_000
            } else if units_of(&limits).contains(&"day") {
                DAY_US
            } else {
                7 * DAY_US
            };
            (Just(policies), Just(start), arrivals(shortest, 2))
        })
        .prop_map(|(policies, start, arrivals)| Case {
            policies,
            start,
            arrivals,
        })
}
