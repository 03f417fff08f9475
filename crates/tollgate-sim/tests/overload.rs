//! The overload scenarios of issue 33, asserted: the default algorithm
//! keeps goodput at three times the capacity where no protection
//! collapses, sheds in order, and follows a capacity that halves. The
//! simulation is seeded, so the figures are the same on every run; the
//! bounds are the targets (its figures, with other seeds too, are
//! in `BENCHMARKS.md`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use tollgate_core::{AdaptiveLimit, LimitAlgorithm, Priority};
use tollgate_sim::overload::{
    Baselines, OverloadOptions, OverloadRun, Plan, Protection, Scenario, Summary, WINDOW_US,
    simulate, summarize,
};

/// The limit under test: the default algorithm, with 20 % of the limit
/// kept for critical requests and 10 % more for default ones (the
/// command line's defaults).
fn default_limit(critical: f64, default: f64) -> Protection {
    let config = AdaptiveLimit::builder("backend")
        .reserve(Priority::Critical, critical)
        .reserve(Priority::Default, default)
        .build()
        .unwrap();
    assert_eq!(config.algorithm(), LimitAlgorithm::Vegas);
    Protection::Adaptive(config)
}

/// Each algorithm as the command line runs it: 20 % kept for critical
/// requests, 10 % more for default ones, AIMD over twice the service time.
fn the_three_limits() -> Vec<Protection> {
    let aimd = LimitAlgorithm::Aimd {
        latency_ceiling: std::time::Duration::from_millis(40),
    };
    [LimitAlgorithm::Vegas, LimitAlgorithm::Gradient2, aimd]
        .into_iter()
        .map(|algorithm| {
            let config = AdaptiveLimit::builder("backend")
                .algorithm(algorithm)
                .reserve(Priority::Critical, 0.2)
                .reserve(Priority::Default, 0.1)
                .build()
                .unwrap();
            Protection::Adaptive(config)
        })
        .collect()
}

fn run(scenario: Scenario, protection: &Protection) -> Summary {
    let plan = Plan::new(scenario, &OverloadOptions::default()).unwrap();
    summarize(&simulate(&plan, protection), &Baselines::new(&plan))
}

#[test]
fn at_three_times_capacity_the_default_keeps_goodput_and_no_protection_collapses() {
    let vegas = run(Scenario::Ramp, &default_limit(0.2, 0.1));
    let none = run(Scenario::Ramp, &Protection::None);
    let (vegas, none) = (vegas.phase("hold").unwrap(), none.phase("hold").unwrap());
    assert!((2.9..3.1).contains(&vegas.offered), "{vegas:?}");
    assert!(vegas.goodput >= 0.9, "{vegas:?}");
    let ratio = vegas.p99_ratio().unwrap();
    assert!(ratio <= 2.0, "critical p99 {ratio}× the unloaded one");
    // Without protection every response at 3× comes after its deadline.
    assert!(none.goodput < 0.01, "{none:?}");
    assert!(none.p99_ratio().unwrap() > 100.0, "{none:?}");
}

/// The 100 ms windows of `run` in which a critical request was refused
/// and a sheddable one admitted, from `from_s` on.
fn order_windows(run: &OverloadRun, from_s: usize) -> usize {
    let (critical, sheddable) = (Priority::Critical.index(), Priority::Sheddable.index());
    run.windows
        .iter()
        .skip(from_s * 10)
        .filter(|w| w.shed[critical] > 0 && w.admitted[sheddable] > 0)
        .count()
}

#[test]
fn the_default_sheds_the_lowest_class_first() {
    for scenario in [Scenario::Ramp, Scenario::Halving, Scenario::Slowdown] {
        let plan = Plan::new(scenario, &OverloadOptions::default()).unwrap();
        let run = simulate(&plan, &default_limit(0.2, 0.1));
        let summary = summarize(&run, &Baselines::new(&plan));
        // Never a critical request refused when a sheddable one would
        // have been admitted,
        assert_eq!(summary.inverted(), 0, "{scenario}");
        // nor within a 100 ms window, but in the first second of a run
        // that starts at three times the capacity (every class comes in
        // before the first critical request is refused).
        assert!(summary.order_windows() <= 1, "{scenario}");
        assert_eq!(order_windows(&run, 1), 0, "{scenario}");
        for phase in &summary.phases {
            let [critical, default, sheddable] = phase.shed;
            assert!(
                critical <= default && default <= sheddable,
                "{scenario} {}: {:?}",
                phase.name,
                phase.shed
            );
        }
        let hold = summary.phases.last().unwrap();
        assert!(hold.shed[0] < 0.01, "{scenario}: {hold:?}");
        assert!(hold.shed[2] > 0.98, "{scenario}: {hold:?}");
    }
}

/// While the workers are halved, the critical requests alone (a fifth of
/// six times the halved capacity) are more than it: some of them must be
/// shed, and then no sheddable request is admitted, and a default one only
/// when no critical request was refused in the 100 ms before.
#[test]
fn while_critical_requests_are_shed_the_classes_below_are_closed() {
    let plan = Plan::new(Scenario::Halving, &OverloadOptions::default()).unwrap();
    let run = simulate(&plan, &default_limit(0.2, 0.1));
    let halved = &plan.phases[1];
    let windows = &run.windows[(halved.start_us / WINDOW_US) as usize..][..200];
    let sum = |class: usize, field: fn(&tollgate_sim::overload::Window) -> [u64; 3]| -> u64 {
        windows.iter().map(|w| field(w)[class]).sum()
    };
    let (critical_shed, critical_sent) = (sum(0, |w| w.shed), sum(0, |w| w.offered));
    assert!(
        critical_shed * 10 > critical_sent,
        "{critical_shed} of {critical_sent}"
    );
    assert_eq!(sum(2, |w| w.admitted), 0);
    let (default_in, default_sent) = (sum(1, |w| w.admitted), sum(1, |w| w.offered));
    assert!(
        default_in * 100 < default_sent,
        "{default_in} of {default_sent}"
    );
}

#[test]
fn when_capacity_halves_the_limit_settles_within_5_s_and_recovers_within_10_s() {
    for scenario in [Scenario::Halving, Scenario::Slowdown] {
        let summary = run(scenario, &default_limit(0.2, 0.1));
        let changed = &summary.phases[1];
        let restored = summary.phase("restored").unwrap();
        assert!(changed.settle_us.unwrap() <= 5_000_000, "{changed:?}");
        assert!(restored.settle_us.unwrap() <= 10_000_000, "{restored:?}");
        for phase in &summary.phases {
            assert!(phase.goodput >= 0.9, "{scenario}: {phase:?}");
            // The 2x is for 3x the capacity; halved, the load is
            // 6x, and critical requests alone are 1.2x the capacity.
            let bound = if phase.offered > 4.0 { 2.25 } else { 2.0 };
            let ratio = phase.p99_ratio().unwrap();
            assert!(ratio <= bound, "{scenario}: {phase:?}");
        }
    }
    // Half the workers: the limit follows them down and back up.
    let summary = run(Scenario::Halving, &default_limit(0.2, 0.1));
    let full = summary.phase("full").unwrap().limit_median.unwrap();
    let halved = summary.phase("halved").unwrap().limit_median.unwrap();
    assert!(halved < full * 0.7, "{halved} against {full}");
}

#[test]
fn a_run_is_the_same_every_time() {
    let plan = Plan::new(Scenario::Halving, &OverloadOptions::default()).unwrap();
    let protection = default_limit(0.2, 0.1);
    let (a, b) = (simulate(&plan, &protection), simulate(&plan, &protection));
    assert_eq!(a.windows, b.windows);
    assert_eq!(a.ticks, b.ticks);
    assert_eq!(a.responses, b.responses);
}

/// The committed charts are these runs: regenerate them with
/// `cargo run --release -p tollgate-sim -- overload --scenario SCENARIO
/// --chart docs/overload-SCENARIO`.
#[test]
fn the_committed_charts_are_these_runs() {
    use tollgate_sim::overload::{chart, report};

    for scenario in [Scenario::Ramp, Scenario::Halving, Scenario::Slowdown] {
        let plan = Plan::new(scenario, &OverloadOptions::default()).unwrap();
        let mut protections = the_three_limits();
        protections.push(Protection::None);
        let baselines = Baselines::new(&plan);
        let runs: Vec<_> = protections.iter().map(|p| simulate(&plan, p)).collect();
        let summaries: Vec<_> = runs.iter().map(|r| summarize(r, &baselines)).collect();
        let title = format!("tollgate-sim overload --scenario {scenario}");
        let svg = chart::svg(&runs, &summaries, &title, &report::setup(&plan));
        let path = format!(
            "{}/../../docs/overload-{scenario}",
            env!("CARGO_MANIFEST_DIR")
        );
        let committed = std::fs::read_to_string(format!("{path}.svg")).unwrap();
        assert!(committed == svg, "{path}.svg is stale: regenerate it");
        let png = std::fs::read(format!("{path}.png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }
}

/// Clients that give up at 30 ms, while the service slows from 20 to
/// 40 ms and back: in the slowed phase no answer comes in time, and every
/// admitted request is abandoned, its work going on in the backend. The
/// limit must still come down (requests abandoned in numbers are a drop),
/// or the backlog left behind keeps every answer late once the service is
/// back at speed.
#[test]
fn clients_giving_up_before_any_answer_still_bring_every_limit_down() {
    let options = OverloadOptions {
        deadline: std::time::Duration::from_millis(30),
        give_up: true,
        ..OverloadOptions::default()
    };
    let plan = Plan::new(Scenario::Slowdown, &options).unwrap();
    let baselines = Baselines::new(&plan);
    for protection in the_three_limits() {
        let algorithm = protection.name();
        let summary = summarize(&simulate(&plan, &protection), &baselines);
        let slowed = summary.phase("slowed").unwrap();
        let restored = summary.phase("restored").unwrap();
        // Down to a few slots while nothing is answered in time,
        assert!(
            slowed.limit_median.unwrap() <= 8.0,
            "{algorithm:?}: {slowed:?}"
        );
        // and back to the capacity once answers come in time again.
        assert!(restored.goodput >= 0.85, "{algorithm}: {restored:?}");
    }
}
