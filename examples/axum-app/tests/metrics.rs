//! `/metrics` of the running binary: after real traffic over TCP, the
//! decision counters equal the numbers of allowed and limited responses;
//! every metric it prints has its `# HELP` line, the store latency its
//! buckets; and the exporter prints the `# HELP` of every metric tollgate
//! names.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;
use common::App;

/// The value of the sample `name{labels}` in Prometheus text (0 if absent).
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> u64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .filter(|(series, _)| {
            (*series == name || series.starts_with(&format!("{name}{{")))
                && labels
                    .iter()
                    .all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")))
                && series.matches('=').count() == labels.len()
        })
        .map(|(_, value)| value.parse::<f64>().unwrap() as u64)
        .sum()
}

#[test]
fn metrics_count_exactly_the_allowed_and_limited_requests_sent() {
    let app = App::start();
    let mut seen = std::collections::HashMap::<(&str, u16), u64>::new();
    // Login: 5 failed logins per minute per IP, fixed window; 12 attempts
    // without the password, each a failure.
    for _ in 0..12 {
        let (status, _) = app.send("POST", "/login", None);
        *seen.entry(("login-failures", status)).or_default() += 1;
    }
    // Items: GCRA 5/s with bursts of 10 per user, behind 120/min per IP; 15 reads.
    for _ in 0..15 {
        let (status, _) = app.send("GET", "/api/items", Some("Bearer demo-ada"));
        *seen.entry(("items-read", status)).or_default() += 1;
    }
    let (status, text) = app.send("GET", "/metrics", None);
    assert_eq!(status, 200);

    let count = |policy, outcome| {
        sample(
            &text,
            "tollgate_decisions_total",
            &[("policy", policy), ("outcome", outcome)],
        )
    };
    let login_ok = seen.get(&("login-failures", 401)).copied().unwrap_or(0);
    let login_429 = seen.get(&("login-failures", 429)).copied().unwrap_or(0);
    assert_eq!(login_ok + login_429, 12, "{seen:?}");
    // At least one window's worth is refused, even across a minute boundary.
    assert!(login_429 >= 2, "{seen:?}");
    assert_eq!(count("login-failures", "allowed"), login_ok, "{text}");
    assert_eq!(count("login-failures", "limited"), login_429, "{text}");

    let items_ok = seen.get(&("items-read", 200)).copied().unwrap_or(0);
    let items_429 = seen.get(&("items-read", 429)).copied().unwrap_or(0);
    assert_eq!(items_ok + items_429, 15, "{seen:?}");
    assert!(items_429 >= 1, "{seen:?}");
    assert_eq!(count("items-read", "allowed"), items_ok, "{text}");
    assert_eq!(count("items-read", "limited"), items_429, "{text}");
    // Every items request passed the per-IP limit first.
    assert_eq!(count("api-ip", "allowed"), 15, "{text}");
    assert_eq!(count("api-ip", "limited"), 0, "{text}");
    assert_eq!(count("login-failures", "shadow_limited"), 0, "{text}");
    // Keys are not labels: no client address or user name in the output
    // (ada's name as a label's value: `tollgate_adaptive_*` holds "ada").
    assert!(
        !text.contains("127.0.0.1") && !text.contains("\"ada\""),
        "{text}"
    );
    // The memory store's gauge counts the keys: login's IP, api-ip's IP, ada.
    assert_eq!(
        sample(&text, "tollgate_memory_store_keys", &[]),
        3,
        "{text}"
    );
}

/// The `# HELP` text of each metric family in Prometheus text.
fn help_lines(text: &str) -> std::collections::BTreeMap<&str, &str> {
    text.lines()
        .filter_map(|line| line.strip_prefix("# HELP "))
        .filter_map(|rest| rest.split_once(' '))
        .collect()
}

/// On Redis, after traffic: every tollgate family the demo prints has a
/// `# HELP` line, tollgate's own text, and the store latency is a
/// histogram with tollgate's buckets.
#[test]
fn every_metric_the_demo_prints_has_its_help_line() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let nanos = std::time::SystemTime::UNIX_EPOCH
        .elapsed()
        .unwrap()
        .as_nanos();
    let prefix = format!("tollgate-test-demo-metrics-{}-{nanos}", std::process::id());
    let app = App::start_with(&["--redis-url", &url, "--redis-prefix", &prefix]);
    for _ in 0..12 {
        app.send("POST", "/login", None);
    }
    for _ in 0..15 {
        app.send("GET", "/api/items", Some("Bearer demo-ada"));
    }
    let (status, text) = app.send("GET", "/metrics", None);
    assert_eq!(status, 200);
    let helps = help_lines(&text);
    let families: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|line| !line.starts_with('#') && line.starts_with("tollgate_"))
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(|series| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| series.strip_suffix(suffix))
                .filter(|base| helps.contains_key(base))
                .unwrap_or(series)
        })
        .collect();
    for family in &families {
        let metric = tollgate::telemetry::ALL
            .iter()
            .find(|m| m.name() == *family)
            .unwrap_or_else(|| panic!("{family} is not in telemetry::ALL"));
        assert_eq!(helps.get(family), Some(&metric.help()), "{text}");
    }
    use tollgate::telemetry::{DECISIONS, NEAR_LIMIT, STORE_LATENCY};
    for expected in [DECISIONS, NEAR_LIMIT, STORE_LATENCY] {
        assert!(families.contains(expected), "{expected} missing: {text}");
    }
    assert!(
        text.contains(&format!("# TYPE {STORE_LATENCY} histogram"))
            && text.contains(&format!("{STORE_LATENCY}_bucket{{le=\"0.001\"}}")),
        "{text}"
    );
}

/// The exporter the demo installs prints the `# HELP` line of every
/// metric in `telemetry::ALL`, once each is registered.
#[test]
fn the_exporter_prints_the_help_of_every_metric_tollgate_names() {
    use tollgate::telemetry::{ALL, MetricKind};
    let recorder = axum_app::metrics_builder().unwrap().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        tollgate::telemetry::describe();
        for metric in ALL {
            let name = metric.name();
            match metric.kind() {
                MetricKind::Counter => metrics::counter!(name).increment(1),
                MetricKind::Gauge => metrics::gauge!(name).set(1.0),
                MetricKind::Histogram => metrics::histogram!(name).record(0.002),
            }
        }
    });
    let text = handle.render();
    let helps = help_lines(&text);
    assert_eq!(helps.len(), ALL.len(), "{text}");
    for metric in ALL {
        assert_eq!(helps.get(metric.name()), Some(&metric.help()), "{text}");
    }
}

/// Every layer is built once, when the app starts: before any request,
/// `/metrics` holds the series of the export route's in-flight limit
/// (axum would otherwise build a route's layers for each request it
/// serves, and the series would appear only with the first export).
#[test]
fn every_layer_is_built_at_start_not_per_request() {
    let app = App::start();
    let (status, text) = app.send("GET", "/metrics", None);
    assert_eq!(status, 200);
    let export = |name: &str| {
        text.lines()
            .any(|l| l.starts_with(&format!("{name}{{policy=\"export\"}} ")))
    };
    assert!(export("tollgate_inflight_slots"), "{text}");
    assert!(export("tollgate_inflight_rejected_total"), "{text}");
}
