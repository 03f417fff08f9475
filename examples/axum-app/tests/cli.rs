//! The binary refuses bad configuration: non-zero exit, and a message that
//! names the field and the value.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::process::Command;

fn run_with(config: &str) -> (bool, String) {
    let dir = std::env::temp_dir().join(format!("axum-app-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!(
        "{:x}.toml",
        config.len() * 31 + config.bytes().map(usize::from).sum::<usize>()
    ));
    std::fs::write(&path, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_axum-app"))
        .args(["--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_config_exits_non_zero_naming_the_field() {
    let route = "[[route]]\nmethod = \"GET\"\npath = \"/api/items\"\nname = \"n\"\nkey = \"user\"\nalgorithm = \"gcra\"\n";
    let cases = [
        (
            format!("{route}limits = [\"0/s\"]\n"),
            "field `limits`: invalid value \"0/s\"",
        ),
        (
            format!("{route}limits = [\"5/s\"]\nspeed = 3\n"),
            "unknown field `speed`",
        ),
        (
            format!("failure = \"sometimes\"\n{route}limits = [\"5/s\"]\n"),
            "field `failure`",
        ),
        (
            format!("{route}limits = [\"5/s\"]\n").replace("/api/items", "/admin"),
            "field `path`: invalid value \"/admin\"",
        ),
        (
            format!(
                "{route}limits = [\"5/s\"]\n{}limits = [\"9/s\"]\n",
                route.replace("GET", "POST")
            ),
            "route 2 (POST /api/items): field `name`: invalid value \"n\": route 1 (GET /api/items) has that name already",
        ),
        (
            format!("{route}limits = [\"5/s\"]\n[overload]\nmin = 50\nmax = 10\n"),
            "[overload] field `min` and `max`: invalid value 50, 10: the minimum is above the maximum",
        ),
        (
            format!("{route}limits = [\"5/s\"]\n[overload]\nreserve_default = 1.5\n"),
            "[overload] field `reserve_critical` and `reserve_default`: invalid value unset, 1.5",
        ),
    ];
    for (config, expected) in cases {
        let (ok, stderr) = run_with(&config);
        assert!(!ok, "exit status for {config:?}");
        assert!(stderr.contains(expected), "{expected:?} not in {stderr:?}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_axum-app"))
        .args(["--config", "/nonexistent/policies.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("cannot read the config file /nonexistent/policies.toml")
    );
}

/// Starts the demo with the bundled policies on `redis_url`, and returns
/// whether it exited successfully and what it wrote to stderr. A demo that
/// is still running after 30 s (it started instead of refusing) is killed
/// and the test fails.
fn run_on_redis(redis_url: &str) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_axum-app"))
        .args(["--listen", "127.0.0.1:0", "--redis-url", redis_url])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (send, exited) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut text).unwrap();
        let _ = send.send(());
        text
    });
    if exited
        .recv_timeout(std::time::Duration::from_secs(30))
        .is_err()
    {
        let _ = child.kill();
        panic!("the demo did not exit with --redis-url {redis_url}");
    }
    let status = child.wait().unwrap();
    (status.success(), reader.join().unwrap())
}

/// A Redis URL the store cannot use stops the demo, naming the reason.
#[test]
fn an_unusable_redis_url_exits_naming_the_cause() {
    let (ok, stderr) = run_on_redis("foo://x");
    assert!(!ok);
    assert_eq!(
        stderr.trim_end().lines().last().unwrap(),
        "error: cannot use Redis at foo://x: invalid Redis store configuration: invalid Redis URL \
         scheme \"foo\": unknown URL scheme: expected redis, rediss, redis+unix or unix (valkey, \
         valkeys and valkey+unix too)"
    );
    let (ok, stderr) = run_on_redis("redis+sentinel://127.0.0.1:26379");
    assert!(!ok);
    assert!(
        stderr.contains(
            "error: cannot use Redis through redis+sentinel://127.0.0.1:26379: invalid Redis \
             store configuration: invalid setting sentinel URL: no service name after the \
             sentinels' addresses"
        ),
        "{stderr}"
    );
}

/// A Redis or a sentinel with nothing listening: the demo, which connects
/// at start, stops with the operating system's reason. (When the store
/// boots without Redis, these become the warning it starts with.)
#[test]
fn an_unreachable_redis_or_sentinel_is_named_as_refused() {
    let closed = closed_port();
    for url in [
        format!("redis://127.0.0.1:{closed}"),
        format!("redis+sentinel://127.0.0.1:{closed}/mymaster"),
    ] {
        // The demo starts all the same, saying why Redis does not answer.
        let line = first_line_about_redis(&url);
        assert!(
            line.contains("Redis is not answering yet")
                && line.contains("Connection refused")
                && line.contains("Local"),
            "{url}: {line}"
        );
    }
}

/// Starts the demo on `redis_url`, and returns its line about Redis not
/// answering, then stops it.
fn first_line_about_redis(redis_url: &str) -> String {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_axum-app"))
        .args(["--listen", "127.0.0.1:0", "--redis-url", redis_url])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let (send, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let found = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains("not answering") => break Some(line),
            Ok(line) if line.starts_with("listening on") => break None,
            Ok(_) => {}
            Err(_) => break None,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    found.unwrap_or_else(|| panic!("the demo on {redis_url} did not say Redis is not answering"))
}

/// A local port with nothing listening: one the system gave out and took
/// back.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A header timeout of 0 would close every connection: refused at start.
#[test]
fn a_header_timeout_of_zero_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_axum-app"))
        .args(["--listen", "127.0.0.1:0", "--header-timeout-ms", "0"])
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--header-timeout-ms: 0 would close every connection at once"),
        "{stderr}"
    );
}
