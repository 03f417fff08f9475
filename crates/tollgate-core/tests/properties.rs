//! Properties of every algorithm on random arrival sequences.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use tollgate_core::state::{KeyState, PolicyState, decide_window_word};
use tollgate_core::{Algorithm, FakeClock, Key, MemoryStore, Outcome, Policy, Shape, Timestamp};

#[derive(Debug, Clone)]
struct Case {
    policy: Policy,
    start: u64,
    /// `(gap before the request in µs, cost)`.
    arrivals: Vec<(u64, u64)>,
}

fn periods() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(1_000u64),
        Just(7_000),
        Just(1_000_000),
        Just(13_000_000),
        Just(60_000_000),
        1_000u64..5_000_000,
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let algorithm = prop::sample::select(Algorithm::ALL.to_vec());
    let limits = prop::collection::vec((1u64..12, periods()), 1..=2);
    let burst = prop::option::of(1u64..15);
    (algorithm, limits, burst, 0u64..10_000_000_000)
        .prop_flat_map(|(algorithm, mut limits, burst, start)| {
            // A policy holds one limit per period.
            limits.dedup_by_key(|l| l.1);
            let mut b = Policy::builder("prop").algorithm(algorithm);
            for (count, period) in &limits {
                b = b.limit(tollgate_core::Limit::new(
                    *count,
                    Duration::from_micros(*period),
                ));
            }
            if algorithm.has_burst()
                && let Some(burst) = burst
            {
                b = b.burst(burst);
            }
            let policy = b.build().expect("generated policies are valid");
            let longest = limits.iter().map(|l| l.1).max().unwrap_or(1_000);
            let gap = prop_oneof![
                3 => Just(0u64),
                4 => 0..longest / 4 + 1,
                1 => 0..longest * 2,
            ];
            let arrivals = prop::collection::vec(
                (
                    gap,
                    prop_oneof![8 => Just(1u64), 1 => Just(0), 2 => 2u64..5],
                ),
                1..120,
            );
            (Just(policy), Just(start), arrivals)
        })
        .prop_map(|(policy, start, arrivals)| Case {
            policy,
            start: 1_600_000_000_000_000 + start,
            arrivals,
        })
}

/// The state the case's arrivals leave, and the time of the last one.
fn after_arrivals(case: &Case) -> (PolicyState, Timestamp) {
    let mut now = case.start;
    let mut state = PolicyState::new(&case.policy, Timestamp::from_micros(now));
    for &(gap, cost) in &case.arrivals {
        now += gap;
        state.decide(&case.policy, Timestamp::from_micros(now), cost);
    }
    (state, Timestamp::from_micros(now))
}

/// One admitted request.
#[derive(Debug, Clone, Copy)]
struct Admit {
    at: u64,
    cost: u64,
    departs: u64,
}

fn run(
    case: &Case,
    mut on_decision: impl FnMut(&PolicyState, u64, u64, &tollgate_core::Decision),
) -> Vec<Admit> {
    let mut now = case.start;
    let mut state = PolicyState::new(&case.policy, Timestamp::from_micros(now));
    let mut admits = Vec::new();
    for &(gap, cost) in &case.arrivals {
        now += gap;
        let before = state.clone();
        let d = state.decide(&case.policy, Timestamp::from_micros(now), cost);
        on_decision(&before, now, cost, &d);
        if d.is_allowed() && cost > 0 {
            admits.push(Admit {
                at: now,
                cost,
                departs: now + d.delay().as_micros() as u64,
            });
        }
    }
    admits
}

fn check_admission_bounds(case: &Case, admits: &[Admit]) -> Result<(), TestCaseError> {
    for p in case.policy.params() {
        let (n, period, t, cap) = (p.limit.count(), p.period_us, p.interval_us, p.capacity);
        match case.policy.algorithm() {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                // Never more than n in any aligned window.
                let mut by_window = std::collections::HashMap::<u64, u64>::new();
                for a in admits {
                    *by_window.entry(a.at / period).or_default() += a.cost;
                }
                for (w, sum) in by_window {
                    prop_assert!(sum <= n, "window {w}: {sum} > {n}");
                }
            }
            Algorithm::SlidingLog => {
                // Never more than n in any period-long interval.
                for (i, a) in admits.iter().enumerate() {
                    let sum: u64 = admits[..=i]
                        .iter()
                        .filter(|b| b.at + period > a.at)
                        .map(|b| b.cost)
                        .sum();
                    prop_assert!(sum <= n, "{sum} > {n} in the period ending at {}", a.at);
                }
            }
            Algorithm::TokenBucket | Algorithm::Gcra => {
                // In any interval [a, b]: at most capacity + (b - a) / interval.
                for i in 0..admits.len() {
                    let mut sum = 0;
                    for j in i..admits.len() {
                        sum += admits[j].cost;
                        let allowance = cap + (admits[j].at - admits[i].at) / t;
                        prop_assert!(sum <= allowance, "{sum} > {allowance}");
                    }
                }
            }
            Algorithm::LeakyBucket => {
                // Departures are spaced by cost * interval, and nobody waits
                // longer than the queue holds.
                let mut departures: Vec<Admit> = admits.to_vec();
                departures.sort_by_key(|a| a.departs);
                for w in departures.windows(2) {
                    prop_assert!(
                        w[1].departs - w[0].departs >= w[0].cost * t,
                        "departures {} and {} closer than {}",
                        w[0].departs,
                        w[1].departs,
                        w[0].cost * t
                    );
                }
                for a in admits {
                    prop_assert!(a.departs - a.at <= (cap - a.cost) * t);
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 768,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/proptest-regressions/properties.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn never_more_admits_than_the_limit_allows(case in case()) {
        let admits = run(&case, |_, _, _, _| {});
        check_admission_bounds(&case, &admits)?;
    }

    #[test]
    fn retry_after_is_exact(case in case()) {
        let mut failures = Vec::new();
        run(&case, |before, now, cost, d| {
            let Outcome::Limited { retry_after } = d.outcome() else { return };
            let r = retry_after.as_micros() as u64;
            if r == 0 {
                failures.push(format!("zero retry_after at {now}"));
                return;
            }
            let mut probe = before.clone();
            if probe.decide(&case.policy, Timestamp::from_micros(now + r - 1), cost).is_allowed() {
                failures.push(format!("allowed 1 µs before retry_after {r} at {now}"));
            }
            let mut probe = before.clone();
            if !probe.decide(&case.policy, Timestamp::from_micros(now + r), cost).is_allowed() {
                failures.push(format!("denied at retry_after {r} from {now}"));
            }
        });
        prop_assert!(failures.is_empty(), "{failures:?}");
    }

    #[test]
    fn remaining_never_grows_without_time_passing(case in case()) {
        let mut last: Option<(u64, u64)> = None;
        let mut failures = Vec::new();
        run(&case, |_, now, _, d| {
            let remaining = d.limits().iter().map(|l| l.remaining()).min().unwrap_or(0);
            if let Some((at, before)) = last
                && at == now && remaining > before {
                    failures.push(format!("remaining grew from {before} to {remaining} at {now}"));
                }
            last = Some((now, remaining));
        });
        prop_assert!(failures.is_empty(), "{failures:?}");
    }

    /// What an admission says remains is exactly what is admitted at once:
    /// that many requests of one unit, at the same instant, and not one
    /// more. (The leaky bucket's joint queue, two limits of different
    /// rates, promised about twice what it admitted.)
    #[test]
    fn remaining_is_what_is_admitted_at_once(case in case()) {
        let mut failures = Vec::new();
        let mut state = PolicyState::new(&case.policy, Timestamp::from_micros(case.start));
        let mut now = case.start;
        for &(gap, cost) in &case.arrivals {
            now += gap;
            let at = Timestamp::from_micros(now);
            let decision = state.decide(&case.policy, at, cost);
            let promised = decision.remaining();
            let mut after = state.clone();
            let admitted = (0..=promised)
                .take_while(|_| after.decide(&case.policy, at, 1).is_allowed())
                .count() as u64;
            // A denial's binding limit is the one that admits it last, whose
            // count another limit may undercut.
            if decision.is_allowed() && admitted != promised {
                failures.push(format!("{promised} promised, {admitted} admitted at {now}"));
            }
        }
        prop_assert!(failures.is_empty(), "{failures:?}");
    }

    #[test]
    fn denials_consume_nothing(case in case()) {
        let mut failures = Vec::new();
        run(&case, |before, now, _, d| {
            if d.is_allowed() {
                return;
            }
            // The state after a denial decides the next peek exactly as the
            // state before it did.
            let mut a = before.clone();
            let mut b = before.clone();
            let denied = b.decide(&case.policy, Timestamp::from_micros(now), 1_000_000);
            let _ = denied;
            let later = Timestamp::from_micros(now + 1);
            if a.decide(&case.policy, later, 0) != b.decide(&case.policy, later, 0) {
                failures.push(format!("denial at {now} changed the state"));
            }
        });
        prop_assert!(failures.is_empty(), "{failures:?}");
    }

    #[test]
    fn the_window_word_decides_exactly_as_the_reference(case in case()) {
        // The first limit as a single fixed window (the generated counts
        // are all below their periods in µs), whatever the case's algorithm.
        let first = case.policy.limits()[0];
        let policy = Policy::builder("prop")
            .algorithm(Algorithm::FixedWindow)
            .limit(first)
            .build()
            .unwrap();
        prop_assert_eq!(policy.shape(), Shape::WindowWord);
        let case = Case { policy, ..case };
        let mut word = 0;
        let mut failures = Vec::new();
        run(&case, |_, now, cost, d| {
            let from_word =
                decide_window_word(&case.policy, &mut word, Timestamp::from_micros(now), cost);
            if from_word != *d {
                failures.push(format!("at {now}, cost {cost}: word {from_word:?}, reference {d:?}"));
            }
        });
        prop_assert!(failures.is_empty(), "{failures:?}");
    }

    #[test]
    fn the_memory_store_decides_exactly_as_the_reference(case in case()) {
        // The store keeps some policies in a compact form with arithmetic of
        // its own; every decision must still equal the reference's.
        let clock = FakeClock::new(Timestamp::from_micros(case.start));
        let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        let key = Key::user("prop");
        let mut at = case.start;
        let mut failures = Vec::new();
        run(&case, |_, now, cost, d| {
            clock.advance(std::time::Duration::from_micros(now - at));
            at = now;
            let stored = store.check_sync(&key, &case.policy, cost).unwrap();
            if stored != *d {
                failures.push(format!("at {now}, cost {cost}: store {stored:?}, reference {d:?}"));
            }
        });
        prop_assert!(failures.is_empty(), "{failures:?}");
    }

    #[test]
    fn a_seeded_state_admits_no_more_than_the_state_it_was_seeded_from(case in case()) {
        // Whatever the arrivals left, a state seeded from the last decision
        // admits, at that instant, at most what the state itself admits.
        let (mut state, at) = after_arrivals(&case);
        let last = state.clone().decide(&case.policy, at, 0);
        let mut seeded = PolicyState::seeded(&case.policy, &last);
        let count = |s: &mut PolicyState| (0..40).filter(|_| s.decide(&case.policy, at, 1).is_allowed()).count();
        let (from_seed, from_state) = (count(&mut seeded), count(&mut state));
        prop_assert!(from_seed <= from_state, "{} > {}", from_seed, from_state);
    }

    /// A state seeded from a decision of rate-based limits tells the same
    /// wait as the state itself, to the microsecond: a client told that
    /// wait by the store, then decided by a fallback seeded from it, is
    /// admitted when told (whole units rounded the backlog up to an
    /// interval: told 4.7 s, refused for 1.3 s more). A window's or a
    /// log's never outlasts the time the state is whole again (a sliding
    /// window's use, all in the previous window, counted for a period
    /// more: told 5.7 s, refused for 60 s more).
    #[test]
    fn a_seeded_state_tells_the_same_wait_or_at_most_until_whole(case in case()) {
        let (mut state, at) = after_arrivals(&case);
        let last = state.clone().decide(&case.policy, at, 0);
        let mut seeded = PolicyState::seeded(&case.policy, &last);
        let first = |s: &mut PolicyState| {
            let d = s.decide(&case.policy, at, 1);
            (d.is_allowed(), d.retry_after(), d.remaining())
        };
        let (from_seed, from_state) = (first(&mut seeded), first(&mut state));
        match case.policy.algorithm() {
            Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                prop_assert_eq!(from_seed, from_state);
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog => {
                let whole = last.limits().iter().map(|l| l.reset()).max().unwrap_or_default();
                prop_assert!(from_seed.1.is_none_or(|wait| wait <= whole), "{:?} > {:?}", from_seed, whole);
            }
        }
    }

    #[test]
    fn the_memory_store_carries_use_across_configurations_as_the_reference(case in change_case()) {
        let clock = FakeClock::new(Timestamp::from_micros(case.start));
        let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        let key = Key::user("change");
        let mut now = case.start;
        let mut reference = PolicyState::new(&case.configs[0], Timestamp::from_micros(now));
        for (i, &(gap, cost, which)) in case.arrivals.iter().enumerate() {
            now += gap;
            clock.advance(Duration::from_micros(gap));
            let policy = &case.configs[which];
            let expected = reference.decide(policy, Timestamp::from_micros(now), cost);
            let stored = store.check_sync(&key, policy, cost).unwrap();
            prop_assert_eq!(&stored, &expected, "arrival {} at {}", i, now);
        }
    }

    #[test]
    fn a_state_kept_as_bytes_decides_exactly_as_the_reference(case in change_case()) {
        // A store over bytes saves the state after every request and loads
        // it before the next, whichever configuration serves it.
        let mut now = case.start;
        let mut reference = PolicyState::new(&case.configs[0], Timestamp::from_micros(now));
        let mut saved = KeyState::new(&case.configs[0], Timestamp::from_micros(now)).to_bytes();
        for (i, &(gap, cost, which)) in case.arrivals.iter().enumerate() {
            now += gap;
            let policy = &case.configs[which];
            let at = Timestamp::from_micros(now);
            let expected = reference.decide(policy, at, cost);
            let mut loaded = KeyState::from_bytes(policy, &saved).unwrap();
            let decided = loaded.decide(policy, at, cost);
            prop_assert_eq!(&decided, &expected, "arrival {} at {}", i, now);
            saved = loaded.to_bytes();
        }
    }

    #[test]
    fn use_under_one_configuration_counts_under_the_other(case in change_case()) {
        // All the first configuration admits at one instant, then all the
        // second admits at that instant: under every limit of the second
        // whose period the first had, the two together stay within the
        // larger of the two capacities.
        let now = Timestamp::from_micros(case.start);
        let [a, b] = &case.configs;
        prop_assume!(a.algorithm() == b.algorithm());
        let mut state = PolicyState::new(a, now);
        let mut used = 0;
        while state.decide(a, now, 1).is_allowed() {
            used += 1;
            prop_assert!(used <= 100, "runaway");
        }
        let mut more = 0;
        while state.decide(b, now, 1).is_allowed() {
            more += 1;
            prop_assert!(more <= 100, "runaway");
        }
        for p in b.params() {
            if let Some(q) = a.params().iter().find(|q| q.period_us == p.period_us) {
                let larger = p.capacity.max(q.capacity);
                prop_assert!(
                    used + more <= larger,
                    "{} under {} then {} under {}", used, a, more, b
                );
            }
        }
    }
}

/// Two configurations of one policy name, and arrivals that each pick one.
#[derive(Debug, Clone)]
struct ChangeCase {
    configs: [Policy; 2],
    start: u64,
    /// `(gap before the request in µs, cost, which configuration)`.
    arrivals: Vec<(u64, u64, usize)>,
}

/// Two configurations of one name: the same algorithm (or, now and then,
/// another), and limits of which the second reuses some of the first's
/// periods with other counts and bursts, adds others and drops some. So
/// stores meet every change of layout too.
fn change_case() -> impl Strategy<Value = ChangeCase> {
    let algorithm = prop::sample::select(Algorithm::ALL.to_vec());
    let limits = prop::collection::vec((1u64..12, periods()), 1..=2);
    let other = prop::collection::vec((1u64..12, periods(), any::<bool>()), 1..=3);
    let bursts = (prop::option::of(1u64..15), prop::option::of(1u64..15));
    (algorithm, limits, other, bursts, 0u64..10_000_000_000)
        .prop_filter_map(
            "one limit per period",
            |(algorithm, mut limits, other, bursts, start)| {
                limits.dedup_by_key(|l| l.1);
                let mut second: Vec<(u64, u64)> = other
                    .iter()
                    .enumerate()
                    .map(|(i, &(count, fresh, keep))| match limits.get(i) {
                        Some(&(_, period)) if keep => (count, period),
                        _ => (count, fresh),
                    })
                    .collect();
                second.sort_by_key(|l| l.1);
                second.dedup_by_key(|l| l.1);
                let build = |limits: &[(u64, u64)], burst: Option<u64>| {
                    let mut b = Policy::builder("change").algorithm(algorithm);
                    for &(count, period) in limits {
                        b = b.limit(tollgate_core::Limit::new(
                            count,
                            Duration::from_micros(period),
                        ));
                    }
                    if let (true, Some(burst)) = (algorithm.has_burst(), burst) {
                        b = b.burst(burst);
                    }
                    b.build().ok()
                };
                let configs = [build(&limits, bursts.0)?, build(&second, bursts.1)?];
                let longest = limits
                    .iter()
                    .chain(&second)
                    .map(|l| l.1)
                    .max()
                    .unwrap_or(1_000);
                Some((configs, start, longest))
            },
        )
        .prop_flat_map(|(configs, start, longest)| {
            let gap = prop_oneof![3 => Just(0u64), 4 => 0..longest / 4 + 1, 1 => 0..longest * 2];
            let cost = prop_oneof![8 => Just(1u64), 1 => Just(0), 2 => 2u64..5];
            let which = prop_oneof![1 => Just(0usize), 1 => Just(1usize)];
            let arrivals = prop::collection::vec((gap, cost, which), 1..120);
            (Just(configs), Just(start), arrivals)
        })
        .prop_map(|(configs, start, arrivals)| ChangeCase {
            configs,
            start: 1_600_000_000_000_000 + start,
            arrivals,
        })
}
