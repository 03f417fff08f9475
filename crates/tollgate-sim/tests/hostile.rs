//! The simulator's patterns send what they say, and bad or huge input is
//! a clear error, never a panic.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::process::Command;
use std::time::Duration;

use tollgate_core::{Algorithm, Policy};
use tollgate_sim::{
    EpochUnit, Log, LogError, Pattern, PatternError, PatternOptions, SimOptions, simulate,
};

/// A client sending at exactly a limit's rate is never over it: 3 a
/// second for 10 minutes are 1,800 requests, each a third of a second
/// after the last (rounded down, the fourth came 1 µs inside the first
/// one's second, and a sliding log of 3/s refused a quarter of them).
#[test]
fn a_steady_client_at_the_limits_rate_is_never_refused() {
    let options = PatternOptions {
        rate: (3, Duration::from_secs(1)),
        duration: Duration::from_secs(600),
        ..PatternOptions::default()
    };
    let workload = Pattern::Steady.workload(&options).unwrap();
    assert_eq!(workload.len(), 1_800);
    let policy = Policy::new("log", Algorithm::SlidingLog, "3/s").unwrap();
    let run = simulate(&workload, &policy, SimOptions::default()).unwrap();
    assert_eq!(run.denied, 0);
}

/// 7 a millisecond for a second are 7,000 requests (7,042 with the
/// interval rounded down to 142 µs).
#[test]
fn a_steady_pattern_sends_the_rate_asked() {
    let options = PatternOptions {
        rate: (7, Duration::from_millis(1)),
        duration: Duration::from_secs(1),
        ..PatternOptions::default()
    };
    assert_eq!(Pattern::Steady.workload(&options).unwrap().len(), 7_000);
}

/// Patterns of more requests than the simulator holds are refused, with
/// how many they would make: a steady one of years at billions a
/// millisecond, bursts of 2^64 - 1, a boundary pattern of 2^64 - 1 a side.
#[test]
fn a_pattern_too_large_to_hold_is_an_error() {
    let huge = [
        (
            Pattern::Steady,
            PatternOptions {
                rate: (u64::from(u32::MAX), Duration::from_millis(1)),
                duration: Duration::MAX,
                ..PatternOptions::default()
            },
        ),
        (
            Pattern::Burst,
            PatternOptions {
                burst: u64::MAX,
                ..PatternOptions::default()
            },
        ),
        (
            Pattern::Burst,
            PatternOptions {
                every: Duration::ZERO,
                duration: Duration::from_secs(3600),
                ..PatternOptions::default()
            },
        ),
        (
            Pattern::Boundary,
            PatternOptions {
                burst: u64::MAX,
                ..PatternOptions::default()
            },
        ),
    ];
    for (pattern, options) in huge {
        let made = pattern.workload(&options).map(|w| w.len());
        let Err(PatternError::TooManyRequests { requests }) = made else {
            panic!("{pattern}: {made:?}");
        };
        assert!(requests > u128::from(tollgate_sim::MAX_PATTERN_REQUESTS));
    }
}

/// The command line says so and exits with 1, not a panic's 101.
#[test]
fn the_cli_refuses_a_pattern_too_large_to_hold() {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate-sim"))
        .args(["--pattern", "steady", "--rate", "4000000000/ms"])
        .args(["--duration", "100000000000h", "--policy", "gcra:10/s"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("error: the pattern would make ")
            && stderr.contains("shorten --duration"),
        "{stderr}"
    );
}

/// A log of only malformed lines says which line was wrong, and why.
#[test]
fn a_log_of_malformed_lines_names_the_first() {
    let log = "oops,alice\n1700000000,\n";
    let error = Log::read(log.as_bytes(), EpochUnit::Auto, false, |_| {}).unwrap_err();
    assert!(
        matches!(error, LogError::NoValidLine { skipped: 2, .. }),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(text.contains("line 1"), "{text}");
    let empty = Log::read("# nothing\n".as_bytes(), EpochUnit::Auto, false, |_| {});
    assert!(matches!(empty, Err(LogError::Empty)));
}

/// A spec of many limits given without a name is taken: its made-up name
/// is shortened to a policy name's 64 characters, and stays apart from
/// another spec's.
#[test]
fn a_long_spec_without_a_name_is_taken() {
    let specs = [
        "sliding_window:1000000/s+2000000/min+3000000/h+4000000/d+5000000/week",
        "sliding_window:1000000/s+2000000/min+3000000/h+4000000/d+6000000/week",
    ];
    let names: Vec<String> = specs
        .iter()
        .map(|spec| tollgate_sim::parse_policy(spec).unwrap().name().to_owned())
        .collect();
    assert!(names.iter().all(|n| n.len() <= 64), "{names:?}");
    assert_ne!(names[0], names[1]);
}
