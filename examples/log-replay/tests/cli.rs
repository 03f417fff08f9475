//! The `log-replay` binary: generate, replay with a report, CSV and
//! chart; malformed lines counted, lines out of order too; a bad policy
//! file named.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_log-replay");
const POLICIES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../axum-app/policies.toml");

#[test]
fn generate_then_replay() {
    let dir = std::env::temp_dir().join(format!("log-replay-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("access.log");
    let status = Command::new(BIN)
        .args(["generate", "--lines", "3000", "--span-secs", "30", "--out"])
        .arg(&log)
        .status()
        .unwrap();
    assert!(status.success());
    let mut text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.lines().count(), 3000);
    // A line of a wrong clock, then the log goes on: the line after it
    // is out of order, and said to be.
    text.push_str(
        "10.0.0.1 - u1 [01/Jan/2099:00:00:00 +0000] \"GET /health HTTP/1.1\" 200 3 \"-\" \"-\"\n",
    );
    text.push_str(
        "10.0.0.1 - u1 [20/Nov/2026:00:00:30 +0000] \"GET /health HTTP/1.1\" 200 3 \"-\" \"-\"\n",
    );
    text.push_str("this is not a log line\n");
    std::fs::write(&log, text).unwrap();

    let out = Command::new(BIN)
        .args([
            "replay",
            "--format",
            "combined",
            "--policies",
            POLICIES,
            "--log",
        ])
        .arg(&log)
        .arg("--csv")
        .arg(dir.join("refusals.csv"))
        .arg("--chart")
        .arg(dir.join("chart"))
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("read 3003 lines in"), "{stdout}");
    assert!(
        stdout.contains(" 1 malformed, skipped\n  line 3003: "),
        "{stdout}"
    );
    assert!(stdout.contains("replayed 3001 requests of "), "{stdout}");
    assert!(
        stdout.contains(
            " clients (0 not replayable, 1 out of order)\n\
             warning: 1 lines logged more than 60 s before the replay clock were not replayed; \
             the furthest behind was logged at 2026-11-20 00:00:30, when the clock was at \
             2099-01-01 00:00:00 "
        ),
        "{stdout}"
    );
    assert!(stdout.contains("policies.toml: refused "), "{stdout}");
    let csv = std::fs::read_to_string(dir.join("refusals.csv")).unwrap();
    assert!(
        csv.starts_with("client,requests,policies.toml refused,"),
        "{csv}"
    );
    assert!(
        std::fs::read_to_string(dir.join("chart.svg"))
            .unwrap()
            .starts_with("<svg")
    );
    assert!(std::fs::metadata(dir.join("chart.png")).unwrap().len() > 1000);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bad_policy_file_is_named() {
    let dir = std::env::temp_dir().join(format!("log-replay-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "instances = 0\n").unwrap();
    let out = Command::new(BIN)
        .args(["replay", "--log", "-", "--policies"])
        .arg(&bad)
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.starts_with(&format!("error: {}: ", bad.display())),
        "{stderr}"
    );
    assert!(stderr.contains("instances"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}
