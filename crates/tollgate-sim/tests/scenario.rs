//! The seeds' scenario: 150 calls, then one every 2 s, through a sliding
//! log of 300 per 5 minutes and a fixed window of 60 per aligned minute.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::BTreeMap;

use tollgate_sim::{Pattern, PatternOptions, Run, SimOptions, chart, parse_policy, simulate};

const S: u64 = 1_000_000;

fn run(spec: &str) -> Run {
    let workload = Pattern::BurstThenSteady
        .workload(&PatternOptions::default())
        .unwrap();
    simulate(
        &workload,
        &parse_policy(spec).unwrap(),
        SimOptions::default(),
    )
    .unwrap()
}

/// Admissions per aligned minute (the pattern starts on a whole minute).
fn per_minute(attempts: impl IntoIterator<Item = u64>) -> BTreeMap<u64, u64> {
    let mut windows = BTreeMap::new();
    for at in attempts {
        *windows.entry(at / (60 * S)).or_default() += 1;
    }
    windows
}

#[test]
fn sliding_log_admits_everything_and_finishes_298_s_into_the_second_phase() {
    let run = run("sliding-log=sliding_log:300/5min");
    assert_eq!(
        (run.requests, run.allowed, run.denied, run.delayed),
        (300, 300, 0, 0)
    );
    // No traffic before 150 s; the burst is 150 calls within 5 s.
    let first = run.attempts.first().unwrap().at_us;
    let last_burst = run.attempts[149].at_us;
    assert_eq!(first, 150 * S);
    assert!(last_burst < 155 * S);
    // The second phase starts once all burst calls have succeeded.
    let phase_two = run.phase_starts_us[1];
    assert_eq!(phase_two, last_burst);
    let finished = run.finished_us.unwrap();
    assert_eq!(finished - phase_two, 298 * S);
    // About t = 453 s: the burst ends near 155 s, then 298 s of calls.
    assert_eq!(finished, 150 * S + 149 * 5 * S / 150 + 298 * S);
    assert!((452 * S..=453 * S).contains(&finished), "{finished}");
}

#[test]
fn fixed_window_takes_three_windows_for_the_burst_and_finishes_at_539_s() {
    let run = run("fixed-window=fixed_window:60/min");
    // No window admits more than 60.
    let admitted = run.attempts.iter().filter(|a| a.admitted);
    let windows = per_minute(admitted.clone().map(|a| a.at_us));
    assert!(windows.values().all(|&n| n <= 60), "{windows:?}");
    // The burst's 150 calls need three windows: 60 + 60 + 30.
    let burst: Vec<u64> = admitted.clone().take(150).map(|a| a.at_us).collect();
    let burst_windows: Vec<(u64, u64)> = per_minute(burst.iter().copied()).into_iter().collect();
    assert_eq!(burst_windows, [(2, 60), (3, 60), (4, 30)]);
    // Its retries are admitted within a second of the starts of the
    // windows at 180 s and 240 s: each client waits its `Retry-After`,
    // whole seconds rounded up, from its own refusal.
    assert!(
        burst[60..120]
            .iter()
            .all(|&at| (180 * S..181 * S).contains(&at))
    );
    assert!(
        burst[120..]
            .iter()
            .all(|&at| (240 * S..241 * S).contains(&at))
    );
    assert_eq!((run.denied, run.delayed), (90 + 30, 90));
    // So the second phase starts with the last retry, 29/30 s after
    // 240 s, and ends 298 s later.
    let last_retry = 240 * S + 29 * S / 30;
    assert_eq!(run.phase_starts_us[1], last_retry);
    assert_eq!(run.finished_us, Some(last_retry + 298 * S));
    assert_eq!(run.allowed, 300);
}

#[test]
fn the_sliding_log_finishes_86_s_before_the_fixed_window() {
    let sliding = run("sliding-log=sliding_log:300/5min").finished_us.unwrap();
    let fixed = run("fixed-window=fixed_window:60/min").finished_us.unwrap();
    assert_eq!(fixed, 538_966_666);
    assert_eq!(sliding, 452_966_666);
    assert_eq!(fixed - sliding, 86 * S);
}

/// The committed chart is this run's: regenerate it with
/// `cargo run -p tollgate-sim -- --pattern burst-then-steady
/// --policy sliding-log=sliding_log:300/5min
/// --policy fixed-window=fixed_window:60/min --chart docs/burst-then-steady`.
#[test]
fn the_committed_chart_is_this_run() {
    let runs = [
        run("sliding-log=sliding_log:300/5min"),
        run("fixed-window=fixed_window:60/min"),
    ];
    let svg = chart::svg(&runs, "tollgate-sim: pattern burst-then-steady");
    let docs = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/burst-then-steady");
    let committed = std::fs::read_to_string(format!("{docs}.svg")).unwrap();
    assert!(
        committed == svg,
        "docs/burst-then-steady.svg is stale: regenerate it"
    );
    let png = std::fs::read(format!("{docs}.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    // The PNG renders from the same SVG.
    assert_eq!(&chart::png(&svg).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
}
