//! Issue 33's acceptance, end to end over HTTP: the demo's `GET /work`
//! (a stand-in backend of 40 workers × 20 ms, capacity C = 2,000/s)
//! behind its adaptive concurrency limit, and the same backend bare, in
//! one run.
//!
//! Run: `cargo bench -p tollgate-tests --bench overload_http`
//!
//! It builds the demo (`cargo build --release -p axum-app`), starts two
//! instances of it on free loopback ports (one with `protect = false`),
//! and offers open-loop load over HTTP/2 (so that a client that gives up
//! resets its stream and the connection lives on), each request of class
//! critical, default or sheddable (20/50/30 %) in `x-priority`, with a
//! deadline of 1 s. A response within the deadline with 200 is goodput.
//!
//! Phases, protected: 0.5 C for 5 s (the unloaded latency), 3 C for 15 s,
//! then the backend halved to 20 workers for 15 s (6× its capacity), then
//! 40 again for 15 s; the limit is read from `GET /admin/overload` every
//! 100 ms. Bare: 0.5 C for 5 s and 3 C for 15 s.
//!
//! Settle: the first moment after which the limit's median over the
//! second before stays within ±20 % of its median over the phase's last
//! 5 s. Order: 100 ms windows (by send time) in which a critical request
//! was shed (503) and a sheddable one admitted (200).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};

const TOKEN: &str = "overload-bench";
const CAPACITY: f64 = 2_000.0;
const DEADLINE: Duration = Duration::from_secs(1);
const CONNECTIONS: usize = 48;

type Fail = Box<dyn std::error::Error + Send + Sync>;

/// A demo process, killed when dropped.
struct Demo {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn free_port() -> Result<SocketAddr, Fail> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

fn start(binary: &Path, protect: bool) -> Result<Demo, Fail> {
    let policies = std::fs::read_to_string(workspace().join("examples/axum-app/policies.toml"))?;
    let policies = policies.replace("protect = true", &format!("protect = {protect}"));
    let file = std::env::temp_dir().join(format!(
        "tollgate-overload-{}-{protect}.toml",
        std::process::id()
    ));
    std::fs::write(&file, policies)?;
    let addr = free_port()?;
    let child = Command::new(binary)
        .args(["--listen", &addr.to_string(), "--config"])
        .arg(&file)
        .args(["--admin-token", TOKEN])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()?;
    let demo = Demo { child, addr };
    for _ in 0..100 {
        if std::net::TcpStream::connect(addr).is_ok() {
            return Ok(demo);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("the demo did not listen on {addr}").into())
}

/// HTTP/2 connections to one demo, used in turn.
#[derive(Clone)]
struct Client {
    senders: Arc<Vec<SendRequest<Empty<Bytes>>>>,
    addr: SocketAddr,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Result<Self, Fail> {
        let mut senders = Vec::new();
        for _ in 0..CONNECTIONS {
            let stream = tokio::net::TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            let (sender, connection) =
                hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                    .max_concurrent_reset_streams(100_000)
                    .handshake(TokioIo::new(stream))
                    .await?;
            tokio::spawn(connection);
            senders.push(sender);
        }
        Ok(Self {
            senders: Arc::new(senders),
            addr,
        })
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        class: Option<&str>,
    ) -> http::Request<Empty<Bytes>> {
        let mut request = http::Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr))
            .header("authorization", format!("Bearer {TOKEN}"));
        if let Some(class) = class {
            request = request.header("x-priority", class);
        }
        request.body(Empty::new()).unwrap_or_default()
    }

    /// Sends `request` on connection `n`: its status, or `None` if it
    /// failed or passed its deadline.
    async fn send(&self, n: usize, request: http::Request<Empty<Bytes>>) -> Option<u16> {
        let mut sender = self.senders[n % self.senders.len()].clone();
        let call = async {
            let response = sender.send_request(request).await.ok()?;
            let status = response.status().as_u16();
            response.into_body().collect().await.ok()?;
            Some(status)
        };
        tokio::time::timeout(DEADLINE, call).await.ok().flatten()
    }

    async fn admin(&self, method: &str, path: &str) -> Result<serde_json::Value, Fail> {
        let mut sender = self.senders[0].clone();
        let response = sender
            .send_request(self.request(method, path, None))
            .await?;
        let body = response.into_body().collect().await?.to_bytes();
        if body.is_empty() {
            return Ok(serde_json::Value::Null);
        }
        Ok(serde_json::from_slice(&body)?)
    }
}

/// One request as the client saw it.
#[derive(Clone, Copy)]
struct Outcome {
    /// When it was sent, from the start of its phase.
    sent: Duration,
    class: usize,
    /// Its status, `None` past the deadline.
    status: Option<u16>,
    latency: Duration,
}

const CLASSES: [&str; 3] = ["critical", "default", "sheddable"];

/// The class of the `n`th request: 20 % critical, 50 % default, 30 %
/// sheddable, interleaved.
fn class_of(n: u64) -> usize {
    match n % 10 {
        0 | 5 => 0,
        1 | 3 | 6 | 8 | 9 => 1,
        _ => 2,
    }
}

/// Offers `rate` requests per second for `span`, sampling the limit every
/// 100 ms if `limits` is given.
async fn offer(
    client: &Client,
    rate: f64,
    span: Duration,
    sample_limit: bool,
) -> (Vec<Outcome>, Vec<(Duration, u64)>) {
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let sampler = sample_limit.then(|| {
        let client = client.clone();
        tokio::spawn(async move {
            let mut limits = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while start.elapsed() < span {
                tick.tick().await;
                if let Ok(state) = client.admin("GET", "/admin/overload").await {
                    limits.push((start.elapsed(), state["limit"].as_u64().unwrap_or(0)));
                }
            }
            limits
        })
    });
    let mut tasks = Vec::new();
    let mut sent = 0u64;
    let interval = Duration::from_secs_f64(1.0 / rate);
    while start.elapsed() < span {
        // Open loop: as many requests as the rate says by now.
        let due = (start.elapsed().as_secs_f64() * rate) as u64;
        while sent < due {
            let client = client.clone();
            let outcomes = outcomes.clone();
            let class = class_of(sent);
            let n = sent as usize;
            tasks.push(tokio::spawn(async move {
                let at = Instant::now();
                let request = client.request("GET", "/work", Some(CLASSES[class]));
                let status = client.send(n, request).await;
                let outcome = Outcome {
                    sent: at - start,
                    class,
                    status,
                    latency: at.elapsed(),
                };
                if let Ok(mut outcomes) = outcomes.lock() {
                    outcomes.push(outcome);
                }
            }));
            sent += 1;
        }
        tokio::time::sleep(interval.max(Duration::from_micros(500))).await;
    }
    for task in tasks {
        let _ = task.await;
    }
    let limits = match sampler {
        Some(sampler) => sampler.await.unwrap_or_default(),
        None => Vec::new(),
    };
    let outcomes = outcomes.lock().map(|o| o.clone()).unwrap_or_default();
    (outcomes, limits)
}

/// What a span of a phase measured.
struct Measure {
    offered: f64,
    goodput: f64,
    critical_p50: Duration,
    critical_p99: Duration,
    shed: [f64; 3],
    order_windows: usize,
}

fn percentile(mut values: Vec<Duration>, p: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    values.sort_unstable();
    let index = ((values.len() as f64 * p).ceil() as usize).clamp(1, values.len()) - 1;
    values[index]
}

/// Measures the outcomes sent from `from` on, over `span`, against the
/// capacity `capacity`.
fn measure(outcomes: &[Outcome], from: Duration, span: Duration, capacity: f64) -> Measure {
    let within: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.sent >= from && o.sent < from + span)
        .collect();
    let secs = span.as_secs_f64();
    let good = within
        .iter()
        .filter(|o| o.status == Some(200) && o.latency <= DEADLINE)
        .count();
    let critical = within
        .iter()
        .filter(|o| o.class == 0 && o.status == Some(200))
        .map(|o| o.latency)
        .collect::<Vec<_>>();
    let shed = [0, 1, 2].map(|class| {
        let all = within.iter().filter(|o| o.class == class).count().max(1);
        let refused = within
            .iter()
            .filter(|o| o.class == class && o.status == Some(503))
            .count();
        refused as f64 / all as f64
    });
    let mut windows = std::collections::BTreeMap::<u128, (bool, bool)>::new();
    for o in &within {
        let window = windows.entry(o.sent.as_millis() / 100).or_default();
        if o.class == 0 && o.status == Some(503) {
            window.0 = true;
        }
        if o.class == 2 && o.status == Some(200) {
            window.1 = true;
        }
    }
    Measure {
        offered: within.len() as f64 / secs / capacity,
        goodput: good as f64 / secs / capacity,
        critical_p50: percentile(critical.clone(), 0.5),
        critical_p99: percentile(critical, 0.99),
        shed,
        order_windows: windows.values().filter(|(a, b)| *a && *b).count(),
    }
}

fn median(mut values: Vec<u64>) -> Option<u64> {
    values.sort_unstable();
    values.get(values.len() / 2).copied()
}

/// When the limit settled: the first sample after which its median over
/// the second before stays within ±20 % of its median over the last 5 s.
fn settle(limits: &[(Duration, u64)]) -> (Option<Duration>, Option<u64>) {
    let Some(&(end, _)) = limits.last() else {
        return (None, None);
    };
    let tail = median(
        limits
            .iter()
            .filter(|(at, _)| *at + Duration::from_secs(5) >= end)
            .map(|&(_, limit)| limit)
            .collect(),
    );
    let Some(target) = tail else {
        return (None, None);
    };
    let smoothed: Vec<(Duration, u64)> = limits
        .iter()
        .filter_map(|&(at, _)| {
            let before = limits
                .iter()
                .filter(|(t, _)| *t <= at && *t + Duration::from_secs(1) > at)
                .map(|&(_, limit)| limit)
                .collect();
            median(before).map(|m| (at, m))
        })
        .collect();
    let inside = |m: u64| (m as f64 - target as f64).abs() <= 0.2 * target as f64;
    let mut settled = None;
    for &(at, m) in &smoothed {
        match (inside(m), settled) {
            (true, None) => settled = Some(at),
            (false, _) => settled = None,
            (true, Some(_)) => {}
        }
    }
    (settled, Some(target))
}

fn row(name: &str, m: &Measure, unloaded_p99: Duration) {
    println!(
        "| {name} | {:.2} | {:.3} | {:.1} | {:.1} | {:.2}× | {:.1} / {:.1} / {:.1} | {} |",
        m.offered,
        m.goodput,
        m.critical_p50.as_secs_f64() * 1e3,
        m.critical_p99.as_secs_f64() * 1e3,
        m.critical_p99.as_secs_f64() / unloaded_p99.as_secs_f64().max(1e-9),
        m.shed[0] * 100.0,
        m.shed[1] * 100.0,
        m.shed[2] * 100.0,
        m.order_windows,
    );
}

fn main() -> Result<(), Fail> {
    let status = Command::new(env!("CARGO"))
        .args(["build", "--release", "-q", "-p", "axum-app"])
        .current_dir(workspace())
        .status()?;
    if !status.success() {
        return Err("cannot build the demo".into());
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    let binary = target.join("release/axum-app");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(&binary))
}

async fn run(binary: &Path) -> Result<(), Fail> {
    let second = Duration::from_secs(1);
    println!(
        "offered and goodput in multiples of C = 2,000/s (40 workers × 20 ms); p50/p99 of admitted critical requests; shed % critical / default / sheddable; order: 100 ms windows with a critical request shed and a sheddable one admitted"
    );
    println!();
    println!(
        "| run | offered | goodput | crit p50 ms | crit p99 ms | ×unloaded | shed % c/d/s | order |"
    );
    println!("|---|---|---|---|---|---|---|---|");

    let bare = start(binary, false)?;
    let client = Client::connect(bare.addr).await?;
    let (warm, _) = offer(&client, 0.5 * CAPACITY, 5 * second, false).await;
    let bare_unloaded = measure(&warm, second, 4 * second, CAPACITY);
    row("bare, 0.5 C", &bare_unloaded, bare_unloaded.critical_p99);
    let (hot, _) = offer(&client, 3.0 * CAPACITY, 15 * second, false).await;
    let bare_first = measure(&hot, Duration::ZERO, 5 * second, CAPACITY);
    let bare_hot = measure(&hot, 5 * second, 10 * second, CAPACITY);
    row("bare, 3 C, 0–5 s", &bare_first, bare_unloaded.critical_p99);
    row("bare, 3 C, 5–15 s", &bare_hot, bare_unloaded.critical_p99);
    drop(client);
    drop(bare);

    let demo = start(binary, true)?;
    let client = Client::connect(demo.addr).await?;
    let (warm, _) = offer(&client, 0.5 * CAPACITY, 5 * second, false).await;
    let unloaded = measure(&warm, second, 4 * second, CAPACITY);
    row("protected, 0.5 C", &unloaded, unloaded.critical_p99);
    let (hot, full_limits) = offer(&client, 3.0 * CAPACITY, 15 * second, true).await;
    let protected = measure(&hot, 5 * second, 10 * second, CAPACITY);
    row("protected, 3 C, 5–15 s", &protected, unloaded.critical_p99);

    client.admin("POST", "/admin/backend?workers=20").await?;
    let (halved, halved_limits) = offer(&client, 3.0 * CAPACITY, 15 * second, true).await;
    let halved_m = measure(&halved, 5 * second, 10 * second, CAPACITY / 2.0);
    row(
        "protected, halved (C/2), 5–15 s",
        &halved_m,
        unloaded.critical_p99,
    );

    client.admin("POST", "/admin/backend?workers=40").await?;
    let (restored, restored_limits) = offer(&client, 3.0 * CAPACITY, 15 * second, true).await;
    let restored_m = measure(&restored, 5 * second, 10 * second, CAPACITY);
    row(
        "protected, restored, 5–15 s",
        &restored_m,
        unloaded.critical_p99,
    );

    println!();
    let full = settle(&full_limits);
    let down = settle(&halved_limits);
    let up = settle(&restored_limits);
    let secs =
        |d: Option<Duration>| d.map_or("never".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()));
    println!(
        "limit (median of the last 5 s): full {:?}, halved {:?} (settled {} after the halving), restored {:?} (recovered {} after)",
        full.1,
        down.1,
        secs(down.0),
        up.1,
        secs(up.0)
    );
    println!(
        "goodput at 3 C: protected {:.3} C, bare {:.3} C (5–15 s): the bare backend keeps {:.1} % of the protected goodput",
        protected.goodput,
        bare_hot.goodput,
        100.0 * bare_hot.goodput / protected.goodput.max(1e-9)
    );
    Ok(())
}
