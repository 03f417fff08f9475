//! The command line: logs with malformed lines, strict mode, patterns.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::path::PathBuf;
use std::process::{Command, Output};

fn temp(name: &str, contents: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

fn sim(args: &[&str]) -> (Output, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate-sim"))
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

/// The numbers of a policy's row: requests, allowed, denied, delayed,
/// never admitted, last served (in seconds).
fn columns(stdout: &str, policy: &str) -> Vec<String> {
    let row = stdout
        .lines()
        .find(|l| l.starts_with(&format!("{policy} ")))
        .unwrap_or_else(|| panic!("no row for {policy} in {stdout}"));
    let fields: Vec<&str> = row.split_whitespace().collect();
    // The row ends with the six numbers and the unit "s".
    fields[fields.len() - 7..fields.len() - 1]
        .iter()
        .map(|f| (*f).to_owned())
        .collect()
}

const LOG: &str = "timestamp,key,cost
2026-11-22T10:00:00Z,alice
2026-11-22T10:00:00.500Z,alice
not-a-time,bob
1795341600.9,alice
1795341601000,bob,2
1795341601000,bob,many
1795341601000
2026-11-22T10:00:02+00:00,carol,1
";

#[test]
fn malformed_lines_are_named_and_skipped() {
    let path = temp("mixed.csv", LOG);
    let (out, stdout, stderr) = sim(&[
        "--log",
        path.to_str().unwrap(),
        "--policy",
        "two=fixed_window:2/min",
    ]);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("line 4: invalid timestamp \"not-a-time\""),
        "{stderr}"
    );
    assert!(stderr.contains("line 7: invalid cost \"many\""), "{stderr}");
    assert!(
        stderr.contains("line 8: expected timestamp,key[,cost], got 1 fields"),
        "{stderr}"
    );
    assert!(stderr.contains("skipped 3 malformed lines"), "{stderr}");
    // Five requests: alice 3 (one denied), bob 1 (cost 2, fits), carol 1.
    // requests, allowed, denied, delayed, never, last served.
    assert_eq!(columns(&stdout, "two"), ["5", "4", "1", "0", "1", "2.000"]);
    assert!(
        stdout.contains("top keys by denials, two:\n  alice: 1"),
        "{stdout}"
    );
}

#[test]
fn strict_mode_stops_at_the_first_malformed_line() {
    let path = temp("strict.csv", LOG);
    let (out, stdout, stderr) = sim(&[
        "--log",
        path.to_str().unwrap(),
        "--policy",
        "gcra:1/s",
        "--strict",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr.contains("line 4: invalid timestamp \"not-a-time\""),
        "{stderr}"
    );
    assert!(stdout.is_empty(), "{stdout}");
}

#[test]
fn bad_policies_and_missing_input_are_refused() {
    let (out, _, stderr) = sim(&["--pattern", "steady", "--policy", "gcra:0/s"]);
    assert!(!out.status.success());
    assert!(
        stderr.contains("limit count must be at least 1"),
        "{stderr}"
    );
    let (out, _, stderr) = sim(&["--policy", "gcra:1/s"]);
    assert!(!out.status.success());
    assert!(stderr.contains("--log"), "{stderr}");
    let (out, _, stderr) = sim(&["--pattern", "sawtooth", "--policy", "gcra:1/s"]);
    assert!(!out.status.success());
    assert!(stderr.contains("unknown pattern \"sawtooth\""), "{stderr}");
    // Two policies of one name could not be told apart in the report.
    let twice = ["--pattern", "steady", "--policy", "a=gcra:1/s"];
    let (out, stdout, stderr) = sim(&[&twice[..], &["--policy", "a=fixed_window:2/s"]].concat());
    assert!(!out.status.success());
    assert!(
        stderr.contains(r#"two --policy specs are named "a""#),
        "{stderr}"
    );
    assert!(stdout.is_empty(), "{stdout}");
}

#[test]
fn the_boundary_pattern_shows_the_fixed_window_admitting_twice_its_limit() {
    let chart = std::env::temp_dir().join(format!("tollgate-sim-{}-boundary", std::process::id()));
    let (out, stdout, stderr) = sim(&[
        "--pattern",
        "boundary",
        "--burst",
        "60",
        "--duration",
        "2m",
        "--policy",
        "fixed=fixed_window:60/min",
        "--policy",
        "sliding=sliding_window:60/min",
        "--policy",
        "gcra=gcra:60/min",
        "--chart",
        chart.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{stderr}");
    let allowed = |name: &str| -> u64 { columns(&stdout, name)[1].parse().unwrap() };
    // 60 just before the minute and 60 just after: all 120 in 200 ms.
    assert_eq!(allowed("fixed"), 120);
    // The sliding window counts the previous minute: the second burst waits.
    assert_eq!(allowed("sliding"), 60);
    // GCRA with a burst of 60 admits the first burst, then one per second.
    assert_eq!(allowed("gcra"), 60);
    assert!(
        std::fs::read_to_string(format!("{}.svg", chart.display()))
            .unwrap()
            .starts_with("<svg")
    );
    assert!(
        std::fs::metadata(format!("{}.png", chart.display()))
            .unwrap()
            .len()
            > 1_000
    );
}

#[test]
fn overload_compares_protections_in_a_table_with_a_chart() {
    let chart = std::env::temp_dir().join(format!("tollgate-sim-{}-halving", std::process::id()));
    let (out, stdout, stderr) = sim(&[
        "overload",
        "--scenario",
        "halving",
        "--algorithm",
        "vegas",
        "--algorithm",
        "none",
        "--chart",
        chart.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{stderr}");
    for row in ["full      vegas", "halved    none", "restored  vegas"] {
        assert!(stdout.contains(row), "no {row:?} in {stdout}");
    }
    let settle = stdout
        .lines()
        .find(|l| l.starts_with("limit settles ≤ 5 s (halved)"))
        .unwrap_or_else(|| panic!("no settle row in {stdout}"));
    assert!(
        settle.trim_end().ends_with('-'),
        "none has no limit: {settle}"
    );
    let svg = std::fs::read_to_string(chart.with_extension("svg")).unwrap();
    assert!(svg.contains("vegas") && svg.contains("none"));
    assert_eq!(
        &std::fs::read(chart.with_extension("png")).unwrap()[..4],
        b"\x89PNG"
    );
}

#[test]
fn overload_refuses_what_it_cannot_simulate() {
    let (out, _, stderr) = sim(&["overload", "--workers", "0"]);
    assert!(!out.status.success());
    assert!(stderr.contains("invalid workers"), "{stderr}");
    // A deadline or service time no run could reach is refused, not a panic.
    for (option, value) in [
        ("--deadline-ms", "18446744073709551615"),
        ("--service-ms", "1e12"),
    ] {
        let (out, _, stderr) = sim(&["overload", "--give-up", option, value]);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("at most a day"), "{stderr}");
    }
    // A backend or a load no run could hold is refused, not an abort.
    for (option, value, said) in [
        ("--workers", "4000000000", "at most 1,000,000"),
        ("--workers", "1000000", "more than 20,000,000 requests"),
    ] {
        let (out, _, stderr) = sim(&["overload", option, value]);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(said), "{stderr}");
    }
    let (out, _, stderr) = sim(&["overload", "--scenario", "spike"]);
    assert!(!out.status.success());
    assert!(stderr.contains("unknown scenario \"spike\""), "{stderr}");
    // The replay's options are not the subcommand's.
    let (out, _, _) = sim(&["overload", "--policy", "gcra:1/s"]);
    assert!(!out.status.success());
}
