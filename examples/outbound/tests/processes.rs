//! The demo's own command, at a sixth of the acceptance run: two worker
//! processes for 10 s, sharing the limits through the Redis at
//! `REDIS_URL` (or 127.0.0.1:6379), against a partner whose day is a
//! sixth of the demo's (83 calls). It must exit with success: no 429,
//! and at least 95 % of the allowance used.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::process::Command;

#[test]
fn two_worker_processes_pass_the_acceptance_at_a_sixth_of_its_length() {
    // The partner's day and the demo's daily window are UTC days, on this
    // machine's clock (Redis's `TIME` here, and the stand-in partner's):
    // a run that crossed midnight would find a fresh day's allowance. So a
    // run that would end within a margin of midnight starts after it.
    use tollgate::Clock;
    let now = tollgate::SystemClock.now().as_micros() / 1_000_000;
    let left_today = 86_400 - now % 86_400;
    if left_today < 30 {
        std::thread::sleep(std::time::Duration::from_secs(left_today + 1));
    }
    let output = Command::new(env!("CARGO_BIN_EXE_outbound"))
        .args(["--seconds", "10", "--daily", "83", "--processes", "2"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the run failed (is Redis up?):\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains(
            "the partner accepted 83 calls of its allowance of 83 (100.0 %), answered 0 with 429"
        ),
        "{stdout}"
    );
}

#[test]
fn a_run_longer_than_a_year_is_refused_before_it_starts() {
    let output = Command::new(env!("CARGO_BIN_EXE_outbound"))
        .args(["--seconds", "18446744073709551615"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--seconds"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
