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
