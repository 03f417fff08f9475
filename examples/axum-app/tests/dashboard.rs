//! The operator dashboard in a real headless browser (Debian's Chromium,
//! driven through its ChromeDriver), against the running demo: the page
//! asks for the admin token; the test drives traffic; the page catches up
//! on its own, and then every number it shows equals the demo's
//! `/metrics`, and its top keys are the users the test refused. A
//! screenshot is saved for review.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::App;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

const TOKEN: &str = "dashboard-test-token";
const CHROMIUM: &str = "/usr/bin/chromium";

/// `count` reads of `/api/items` as `user` from `app`: how many were
/// admitted and how many refused.
fn items(app: &App, user: &str, count: usize) -> (u64, u64) {
    let auth = format!("Bearer demo-{user}");
    let mut seen = (0, 0);
    for _ in 0..count {
        match app.send("GET", "/api/items", Some(&auth)).0 {
            200 => seen.0 += 1,
            429 => seen.1 += 1,
            other => panic!("GET /api/items answered {other}"),
        }
    }
    seen
}

/// ChromeDriver on a free loopback port, killed when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Self {
        let chromedriver = find_on_path("chromedriver");
        let (Some(chromedriver), true) = (chromedriver, Path::new(CHROMIUM).exists()) else {
            panic!(
                "the dashboard test needs Debian's Chromium and its ChromeDriver \
                 (/usr/bin/chromium, chromedriver): apt-get install chromium chromium-driver, \
                 or run ./scripts/test, which installs them"
            );
        };
        // It picks a free port itself and says which: no port is chosen
        // here and freed for another process to take first.
        let mut child = Command::new(chromedriver)
            .arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let port: u16 = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|line| {
                let (_, port) = line.split_once("started successfully on port ")?;
                port.trim_end_matches('.').parse().ok()
            })
            .expect("chromedriver said its port");
        std::thread::spawn(move || lines.for_each(drop));
        Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    async fn browser(&self) -> Client {
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1400,2000"],
            },
        });
        let Value::Object(caps) = caps else {
            unreachable!()
        };
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("chromedriver started Chromium")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// The sum of the samples of `name` in Prometheus `text` whose labels
/// include `labels`.
fn metric(text: &str, name: &str, labels: &serde_json::Map<String, Value>) -> u64 {
    let mut sum = 0.0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (series_name, series_labels) = series.split_once('{').unwrap_or((series, ""));
        if series_name != name {
            continue;
        }
        let has = |(k, v): (&String, &Value)| {
            series_labels.contains(&format!("{k}=\"{}\"", v.as_str().unwrap()))
        };
        if labels.iter().all(has) {
            sum += value.parse::<f64>().unwrap();
        }
    }
    sum.round() as u64
}

/// Whether the page's `shown` value of `metric` agrees with `exported`,
/// read from `/metrics` after it: equal, except for the store latency
/// histogram, which the demo's own background calls to Redis (polling
/// overrides, flushing usage, publishing top keys: a few a second) keep
/// counting while no request comes. The page shows a rendering at most a
/// refresh or two old: behind by at most 50 calls, never ahead.
fn agrees(metric: &str, shown: u64, exported: u64) -> bool {
    if metric.starts_with("tollgate_store_latency_seconds") {
        shown <= exported && exported - shown <= 50
    } else {
        shown == exported
    }
}

/// Every number the page shows from `/metrics`: metric, labels, text.
async fn shown(browser: &Client) -> Vec<(String, serde_json::Map<String, Value>, u64)> {
    let script = "return Array.from(document.querySelectorAll('#main [data-metric]'))\
                  .map(e => [e.dataset.metric, e.dataset.labels, e.textContent]);";
    let numbers = browser.execute(script, vec![]).await.unwrap();
    numbers
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let labels = serde_json::from_str(n[1].as_str().unwrap()).unwrap();
            let text = n[2].as_str().unwrap().replace(',', "");
            (
                n[0].as_str().unwrap().to_owned(),
                labels,
                text.parse().unwrap(),
            )
        })
        .collect()
}

/// The text of the first rows of a policy card's top-keys table.
async fn top_rows(browser: &Client, policy: &str, ranking: &str) -> Vec<(String, u64)> {
    let script = format!(
        "const card = Array.from(document.querySelectorAll('.card')).find(c => c.dataset.policy === '{policy}');\
         const table = card && card.querySelector('table[data-ranking={ranking}]');\
         return table ? Array.from(table.querySelectorAll('tbody tr')).map(r => [r.cells[0].textContent, r.cells[1].textContent]) : [];"
    );
    let rows = browser.execute(&script, vec![]).await.unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let count = r[1].as_str().unwrap().replace(',', "").parse().unwrap();
            (r[0].as_str().unwrap().to_owned(), count)
        })
        .collect()
}

/// The URL of the suite's Redis, which must answer.
fn redis_url() -> String {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let host = url.trim_start_matches("redis://").trim_end_matches('/');
    assert!(
        TcpStream::connect(host).is_ok(),
        "this test needs Redis at {url}: install redis-server, or run ./scripts/test, which starts it"
    );
    url
}

/// A prefix of Redis keys no other test uses.
fn unique_prefix() -> String {
    let nanos = std::time::SystemTime::UNIX_EPOCH
        .elapsed()
        .unwrap()
        .as_nanos();
    format!("tgtest-dashboard-{}-{nanos}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_live_what_metrics_says_on_the_memory_store() {
    let path = dashboard_agrees_with_metrics(&["--admin-token", TOKEN]).await;
    println!("screenshot: {}", path.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_live_what_metrics_says_on_redis() {
    let (url, prefix) = (redis_url(), unique_prefix());
    // Every decision is Redis's (asserted): a deadline that a machine busy
    // with a browser and other tests keeps, not the store's 50 ms.
    let args = [
        "--admin-token",
        TOKEN,
        "--redis-url",
        &url,
        "--redis-prefix",
        &prefix,
        "--redis-deadline-ms",
        "5000",
    ];
    let path = dashboard_agrees_with_metrics(&args).await;
    println!("screenshot: {}", path.display());
}

/// Opens the dashboard of the demo started with `args`, drives traffic,
/// and checks the page against `/metrics`; the screenshot's path.
async fn dashboard_agrees_with_metrics(args: &[&str]) -> PathBuf {
    let app = App::start_with(args);
    let redis = args.contains(&"--redis-url");
    // The page holds no data; its data is behind the token.
    let (status, page) = app.send("GET", "/admin/dashboard", None);
    assert_eq!(status, 200);
    assert!(page.contains("Tollgate · operator dashboard"));
    assert_eq!(app.send("GET", "/admin/dashboard/data", None).0, 401);
    let wrong = Some("Bearer wrong");
    assert_eq!(app.send("GET", "/admin/dashboard/data", wrong).0, 403);
    let admin = format!("Bearer {TOKEN}");
    let overriding = "/admin/rate_limit/items-read/dave/override?seconds=3600";
    assert_eq!(
        app.send_body("PUT", overriding, Some(&admin), "50/s").0,
        204
    );

    let driver = Driver::start();
    let browser = driver.browser().await;
    let url = format!("http://{}/admin/dashboard", app.addr);
    browser.goto(&url).await.unwrap();
    let token = browser
        .wait()
        .for_element(Locator::Id("token"))
        .await
        .unwrap();
    token.send_keys(TOKEN).await.unwrap();
    browser
        .find(Locator::Id("login-submit"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css(".card[data-policy='items-read']"))
        .await
        .expect("the page shows the policies once given the token");

    // Traffic, with the page open: alice is refused most, then bob.
    let alice = items(&app, "alice", 30);
    let bob = items(&app, "bob", 13);
    let carol = items(&app, "carol", 3);
    for _ in 0..4 {
        assert_eq!(app.send("GET", "/work", None).0, 200);
    }
    assert!(alice.1 > bob.1 && bob.1 > 0, "alice {alice:?}, bob {bob:?}");
    let admitted = alice.0 + bob.0 + carol.0;

    // The page catches up by itself; then it agrees with /metrics.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (numbers, metrics) = loop {
        let numbers = shown(&browser).await;
        let metrics = app.send("GET", "/metrics", None).1;
        let items = json!({ "policy": "items-read", "outcome": "allowed" });
        let items = items.as_object().unwrap();
        let caught_up = numbers
            .iter()
            .any(|(m, l, n)| m == "tollgate_decisions_total" && l == items && *n == admitted);
        let agree = numbers
            .iter()
            .all(|(m, l, n)| agrees(m, *n, metric(&metrics, m, l)));
        if caught_up && agree {
            break (numbers, metrics);
        }
        let differ: Vec<_> = numbers
            .iter()
            .filter(|(m, l, n)| !agrees(m, *n, metric(&metrics, m, l)))
            .map(|(m, l, n)| format!("{m} {l:?}: page {n}, /metrics {}", metric(&metrics, m, l)))
            .collect();
        assert!(
            Instant::now() < deadline,
            "the page did not catch up with /metrics within 30 s: {differ:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for (name, labels, shown) in &numbers {
        let exported = metric(&metrics, name, labels);
        assert!(
            agrees(name, *shown, exported),
            "{name} {labels:?}: {shown} {exported}"
        );
    }
    let names: std::collections::BTreeSet<&str> = numbers.iter().map(|n| n.0.as_str()).collect();
    for expected in [
        "tollgate_decisions_total",
        "tollgate_near_limit_total",
        "tollgate_circuits_open",
        "tollgate_store_errors_total",
        "tollgate_fallback_decisions_total",
        "tollgate_inflight_slots",
        "tollgate_adaptive_limit",
        "tollgate_adaptive_shed_total",
        "tollgate_leases_held",
        "tollgate_waits_total",
    ] {
        assert!(names.contains(expected), "the page shows no {expected}");
    }
    let limited = |policy: &str| {
        numbers.iter().find(|(m, l, _)| {
            m == "tollgate_decisions_total"
                && l.get("policy") == Some(&json!(policy))
                && l.get("outcome") == Some(&json!("limited"))
        })
    };
    assert_eq!(limited("items-read").unwrap().2, alice.1 + bob.1 + carol.1);
    assert_eq!(limited("api-ip").unwrap().2, 0);

    // The top keys are the users refused, in order, counted exactly
    // (fewer keys than counters: the sketch holds them all). They count
    // what the store decided: on a busy machine a Redis call can miss its
    // deadline, and the local fallback's decisions are not counted there.
    let local = |outcome| {
        let labels = json!({ "policy": "items-read", "outcome": outcome });
        metric(
            &metrics,
            "tollgate_fallback_decisions_total",
            labels.as_object().unwrap(),
        )
    };
    let (local_allowed, local_limited) = (local("local_allowed"), local("local_limited"));
    let top = top_rows(&browser, "items-read", "limited").await;
    let active = top_rows(&browser, "items-read", "active").await;
    if local_allowed + local_limited == 0 {
        let expected = [
            ("user:alice".to_owned(), alice.1),
            ("user:bob".to_owned(), bob.1),
        ];
        assert_eq!(top[..2], expected);
        assert_eq!(active[0], ("user:alice".to_owned(), 30));
    } else {
        let sum = |rows: &[(String, u64)]| rows.iter().map(|r| r.1).sum::<u64>();
        assert_eq!(
            sum(&top),
            alice.1 + bob.1 + carol.1 - local_limited,
            "{top:?}"
        );
        assert_eq!(
            sum(&active),
            46 - local_allowed - local_limited,
            "{active:?}"
        );
    }
    // The per-second chart of the policy has its lines.
    let lines = browser
        .find_all(Locator::Css(".card[data-policy='items-read'] polyline"))
        .await
        .unwrap();
    assert_eq!(lines.len(), 3);
    // Overrides and usage.
    let overrides = browser.find(Locator::Id("overrides")).await.unwrap();
    let text = overrides.text().await.unwrap();
    assert!(
        text.contains("user:dave") && text.contains("50/s"),
        "{text}"
    );
    let usage = browser
        .find(Locator::Id("usage"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(usage.contains("alice"), "{usage}");

    if redis {
        // Every decision was a Redis call, timed in the histogram.
        let calls = numbers
            .iter()
            .find(|(m, _, _)| m == "tollgate_store_latency_seconds_count");
        assert!(calls.is_some_and(|c| c.2 >= 2 * admitted), "{numbers:?}");
    }

    let png = browser.screenshot().await.unwrap();
    let name = if redis {
        "dashboard-redis.png"
    } else {
        "dashboard.png"
    };
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, png).unwrap();
    browser.close().await.unwrap();
    path
}

/// Two instances on one Redis prefix: each one's top keys hold the
/// other's refusals once it has published them (every second).
#[test]
fn two_instances_merge_their_top_keys_through_redis() {
    let (url, prefix) = (redis_url(), unique_prefix());
    let args = [
        "--admin-token",
        TOKEN,
        "--redis-url",
        &url,
        "--redis-prefix",
        &prefix,
    ];
    let (a, b) = (App::start_with(&args), App::start_with(&args));
    let alice = items(&a, "alice", 25);
    let bob = items(&b, "bob", 14);
    assert!(alice.1 > bob.1 && bob.1 > 0, "alice {alice:?}, bob {bob:?}");

    let admin = format!("Bearer {TOKEN}");
    let path = "/admin/top_keys/items-read?ranking=limited&n=5";
    assert_eq!(a.send("GET", path, None).0, 401);
    let mistyped = a.send(
        "GET",
        "/admin/top_keys/items-raed",
        Some(&format!("Bearer {TOKEN}")),
    );
    assert_eq!(mistyped.0, 404, "{}", mistyped.1);
    let deadline = Instant::now() + Duration::from_secs(15);
    for app in [&a, &b] {
        let top = loop {
            let (status, body) = app.send("GET", path, Some(&admin));
            assert_eq!(status, 200, "{body}");
            let top: Value = serde_json::from_str(&body).unwrap();
            if top["keys"].as_array().unwrap().len() >= 2 {
                break top;
            }
            assert!(Instant::now() < deadline, "no merged top keys: {top}");
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(top["total"], alice.1 + bob.1, "{top}");
        assert_eq!(
            top["keys"],
            json!([
                { "label": "user:alice", "count": alice.1, "error": 0 },
                { "label": "user:bob", "count": bob.1, "error": 0 },
            ])
        );
    }
}
