//! Helpers for tollgate's end-to-end tests: the shared Redis on
//! 127.0.0.1:6379 (or `REDIS_URL`), and private `redis-server` processes
//! on free loopback ports for tests that need a server of their own.
//!
//! A test that needs Redis never passes without it: it fails with a message
//! that says what to install.
#![allow(clippy::panic)] // test helpers fail loudly, naming what is missing

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where the shared test Redis listens: `REDIS_URL`, or
/// `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

const INSTALL: &str = "install Redis (`apt-get install redis-server redis-tools`) \
                       and run the suite with ./scripts/test, which starts it";

/// Fails the test, saying what to install, unless the shared Redis answers.
///
/// # Panics
///
/// When Redis does not answer a `PING`.
pub async fn require_redis() -> String {
    let url = redis_url();
    let pong: Result<String, String> = async {
        let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
        let mut con = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        redis::cmd("PING")
            .query_async(&mut con)
            .await
            .map_err(|e| e.to_string())
    }
    .await;
    match pong {
        Ok(_) => url,
        Err(e) => panic!("Redis is not reachable at {url} ({e}): {INSTALL}"),
    }
}

/// A prefix no other test run uses, so tests can share one Redis.
pub fn unique_prefix(test: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::UNIX_EPOCH
        .elapsed()
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "tgtest-{test}-{}-{nanos}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// A `redis-server` of the test's own on a free loopback port, killed and
/// cleaned up on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server and waits until it answers.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed or does not start within 10 s.
    pub fn spawn() -> Self {
        Self::spawn_with(&[])
    }

    /// Starts a server with extra arguments, such as
    /// `["--cluster-enabled", "yes"]`.
    ///
    /// # Panics
    ///
    /// As [`RedisServer::spawn`].
    pub fn spawn_with(extra: &[&str]) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("tollgate-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {dir:?}: {e}"));
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        let child = start(port, &dir, &extra);
        let server = Self {
            child,
            port,
            dir,
            extra,
        };
        server.wait_until_up();
        server
    }

    fn wait_until_up(&self) {
        let started = Instant::now();
        while !self.answers() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server on port {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server with SIGKILL.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::create_dir_all(&self.dir);
        self.child = start(self.port, &self.dir, &self.extra);
        self.wait_until_up();
    }

    fn answers(&self) -> bool {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok()
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A blocking connection for test assertions.
    ///
    /// # Panics
    ///
    /// When the server does not answer.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .unwrap_or_else(|e| panic!("connecting to {}: {e}", self.url()))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(port: u16, dir: &std::path::Path, extra: &[String]) -> Child {
    Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start redis-server ({e}): {INSTALL}"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free loopback port: {e}"))
}

/// Reads one counter of `INFO commandstats`, such as the calls of `evalsha`.
pub fn command_calls(con: &mut redis::Connection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .unwrap_or_else(|e| panic!("INFO commandstats: {e}"));
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

pub use tollgate_core;
