//! Logs are throttled: a flood of requests the demo answers 503 (the
//! service shedding load, a store failing closed) writes a line a second
//! at most, not a line each, as tower-http's default failure log did.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum_app::{AppConfig, Overload, app, serve_layers};
use http::{Request, StatusCode};
use tollgate::{BoxStore, MemoryStore};
use tower::ServiceExt;

/// A log's output, kept.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `work` on a current-thread runtime under an `INFO` log: its
/// output and the log's lines.
fn logged<T>(work: impl Future<Output = T>) -> (T, Vec<String>) {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let out = tracing::subscriber::with_default(subscriber, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(work)
    });
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    (out, text.lines().map(str::to_owned).collect())
}

/// 200 requests at once to a service of one worker that sheds the rest:
/// at least 150 are shed with 503, and the log has a line for the first
/// and at most one more a second after it. (One line each before.)
#[test]
fn a_flood_of_shed_requests_logs_a_line_a_second() {
    let config = AppConfig::parse(
        r#"
[[route]]
method = "GET"
path = "/health"
name = "health"
key = "ip"
algorithm = "gcra"
limits = ["5/s"]

[overload]
workers = 1
service_ms = 500
min = 1
max = 1
"#,
    )
    .unwrap();
    let start = std::time::Instant::now();
    let (shed, lines) = logged(async {
        let overload = Overload::new(&config.overload).unwrap();
        let router = serve_layers(overload.routes(None));
        let requests = (0..200).map(|_| {
            let router = router.clone();
            async move {
                let request = Request::get("/work").body(Body::empty()).unwrap();
                router.oneshot(request).await.unwrap().status()
            }
        });
        let statuses = futures::future::join_all(requests).await;
        let shed = statuses
            .iter()
            .filter(|&&s| s == StatusCode::SERVICE_UNAVAILABLE);
        shed.count()
    });
    assert!(shed >= 150, "{shed} shed");
    assert!(lines[0].contains("failures=1"), "{}", lines[0]);
    assert_within_a_line_a_second(&lines, start);
}

/// At most a line for each second begun since `start`, and one more.
fn assert_within_a_line_a_second(lines: &[String], start: std::time::Instant) {
    let seconds = usize::try_from(start.elapsed().as_secs()).unwrap() + 1;
    assert!(
        (1..=seconds + 1).contains(&lines.len()),
        "{} lines in {seconds} s: {lines:#?}",
        lines.len()
    );
}

/// A memory store full of keys under `failure = "closed"` answers each new
/// key 503: 500 such requests log a line a second (and tollgate's own
/// warning of the store's failure, throttled too).
#[test]
fn a_full_store_failing_closed_logs_a_line_a_second() {
    let config = AppConfig::parse(
        r#"
failure = "closed"

[[route]]
method = "GET"
path = "/api/search"
name = "search"
key = "user"
algorithm = "sliding_log"
limits = ["2/s", "100/h"]
"#,
    )
    .unwrap();
    let start = std::time::Instant::now();
    let (failed, lines) = logged(async {
        let store = MemoryStore::builder()
            .max_keys(16)
            .shards(1)
            .build()
            .unwrap();
        let router = serve_layers(app(&config, BoxStore::with_slots(store)));
        let mut failed = 0;
        for i in 0..500 {
            let request = Request::get("/api/search")
                .header("authorization", format!("Bearer demo-user{i}"))
                .extension(ConnectInfo(SocketAddr::from(([192, 0, 2, 7], 4000))))
                .body(Body::empty())
                .unwrap();
            let status = router.clone().oneshot(request).await.unwrap().status();
            failed += usize::from(status == StatusCode::SERVICE_UNAVAILABLE);
        }
        failed
    });
    assert!(failed > 400, "{failed} failed");
    // Tollgate's own warning of the store's failure, throttled, and ours.
    assert_within_a_line_a_second(&lines, start);
}
