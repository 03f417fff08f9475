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
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
        // A free port can be taken by another process before the server
        // binds it (test binaries run side by side): then the server exits,
        // and a fresh port is tried.
        let mut failures = Vec::new();
        for _ in 0..5 {
            match Self::try_spawn(free_port(), extra) {
                Ok(server) => return server,
                Err(why) => failures.push(why),
            }
        }
        panic!("redis-server did not start: {}", failures.join("; "))
    }

    /// Starts a server with extra arguments on `port`, one a store was
    /// already told to use, and waits until it answers.
    ///
    /// # Panics
    ///
    /// As [`RedisServer::spawn`], and when `port` is taken.
    pub fn spawn_on(port: u16, extra: &[&str]) -> Self {
        Self::try_spawn(port, extra)
            .unwrap_or_else(|why| panic!("redis-server did not start: {why}"))
    }

    fn try_spawn(port: u16, extra: &[&str]) -> Result<Self, String> {
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        let dir =
            std::env::temp_dir().join(format!("tollgate-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {dir:?}: {e}"));
        let mut server = Self {
            child: start(port, &dir, &extra),
            port,
            dir,
            extra,
        };
        server.wait_until_up().map(|()| server)
    }

    /// Waits until this server (not another on its port) answers.
    fn wait_until_up(&mut self) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "redis-server on port {} exited ({status}); the port may have been taken",
                    self.port
                ));
            }
            if self.answers() {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(10) {
                return Err(format!(
                    "redis-server on port {} did not answer within 10 s",
                    self.port
                ));
            }
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
        if let Err(why) = self.wait_until_up() {
            panic!("restarting: {why}");
        }
    }

    /// Whether the server answers, and is this one: its `process_id` is
    /// our child's.
    fn answers(&self) -> bool {
        let info = redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| redis::cmd("INFO").arg("server").query::<String>(&mut c));
        let pid = self.child.id().to_string();
        info.is_ok_and(|info| {
            info.lines()
                .any(|line| line.strip_prefix("process_id:").map(str::trim) == Some(pid.as_str()))
        })
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
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
    command_stat(con, command, "calls")
}

/// Reads one field of a command's line in `INFO commandstats`: `calls`,
/// or `usec`, the µs Redis spent running it.
pub fn command_stat(con: &mut redis::Connection, command: &str, field: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .unwrap_or_else(|e| panic!("INFO commandstats: {e}"));
    let prefix = format!("cmdstat_{command}:");
    let wanted = format!("{field}=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').find_map(|kv| kv.strip_prefix(&wanted)))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

pub use tollgate_core;

/// A Redis Cluster of 3 masters and 3 replicas on loopback, made with
/// `redis-cli --cluster create`; every node is killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    /// The nodes; which are masters is found with [`RedisCluster::masters`].
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// The cluster's node timeout: how long until a failed master's replica
    /// takes over.
    pub const NODE_TIMEOUT: Duration = Duration::from_millis(500);

    /// Starts the six nodes, creates the cluster and waits until every node
    /// reports `cluster_state:ok`.
    ///
    /// # Panics
    ///
    /// When `redis-server` or `redis-cli` is missing, or the cluster does
    /// not come up within 30 s.
    pub fn spawn() -> Self {
        Self::spawn_from(None)
    }

    /// As [`RedisCluster::spawn`], with the first node on `port`: one a
    /// store was already told to use as its seed.
    ///
    /// # Panics
    ///
    /// As [`RedisCluster::spawn`], and when `port` is taken.
    pub fn spawn_seeded_on(port: u16) -> Self {
        Self::spawn_from(Some(port))
    }

    fn spawn_from(first: Option<u16>) -> Self {
        let timeout = Self::NODE_TIMEOUT.as_millis().to_string();
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            timeout.as_str(),
            // Replicas sync at once (the default waits 5 s for more replicas),
            // and a replica that never synced cannot take over.
            "--repl-diskless-sync-delay",
            "0",
        ];
        let nodes: Vec<RedisServer> = (0..6)
            .map(|i| match first {
                Some(port) if i == 0 => RedisServer::spawn_on(port, &args),
                Some(_) | None => RedisServer::spawn_with(&args),
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}): {INSTALL}"));
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Self { nodes };
        let started = Instant::now();
        while !cluster
            .nodes
            .iter()
            .all(|n| n.cluster_ok() && n.replica_synced())
        {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the cluster did not come up"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    }

    /// The URLs of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The indexes of the nodes that are masters now.
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].role().as_deref() == Some("master"))
            .collect()
    }
}

impl RedisServer {
    fn cluster_ok(&self) -> bool {
        let info: Result<String, _> = redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query(&mut c));
        info.is_ok_and(|i| i.contains("cluster_state:ok"))
    }

    /// A master, or a replica whose link to its master is up.
    fn replica_synced(&self) -> bool {
        let info: Result<String, _> = redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| redis::cmd("INFO").arg("replication").query(&mut c));
        info.is_ok_and(|i| i.contains("role:master") || i.contains("master_link_status:up"))
    }

    /// `master` or `slave`, from `ROLE`; `None` if the node does not answer.
    pub fn role(&self) -> Option<String> {
        let role: Result<Vec<redis::Value>, _> = redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| redis::cmd("ROLE").query(&mut c));
        match role.ok()?.first()? {
            redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            redis::Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        }
    }

    /// How many keys the node holds.
    pub fn dbsize(&self) -> u64 {
        redis::cmd("DBSIZE")
            .query(&mut self.connection())
            .unwrap_or(0)
    }
}

/// The rounds a bench runs: `TOLLGATE_BENCH_ROUNDS` if it is set to a
/// number, otherwise `default`.
pub fn bench_rounds(default: usize) -> usize {
    std::env::var("TOLLGATE_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(default)
}

/// A Redis Sentinel of the test's own (`redis-server <config> --sentinel`)
/// on a free loopback port, watching one master as `service`, with short
/// timeouts: the master is down after 1 s without an answer, and a
/// failover may take 3 s. Killed and cleaned up on drop.
#[derive(Debug)]
pub struct RedisSentinel {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl RedisSentinel {
    /// Starts a sentinel watching `master` as `service`, with a quorum of
    /// `quorum`, and waits until it answers.
    ///
    /// # Panics
    ///
    /// When `redis-server` cannot run as a sentinel, or does not start
    /// within 10 s.
    pub fn spawn(master: &RedisServer, service: &str, quorum: u32) -> Self {
        Self::spawn_from(master, service, quorum, None)
    }

    /// As [`RedisSentinel::spawn`], listening on `port`: one a store was
    /// already told to ask.
    ///
    /// # Panics
    ///
    /// As [`RedisSentinel::spawn`], and when `port` is taken.
    pub fn spawn_on(port: u16, master: &RedisServer, service: &str, quorum: u32) -> Self {
        Self::spawn_from(master, service, quorum, Some(port))
    }

    fn spawn_from(master: &RedisServer, service: &str, quorum: u32, fixed: Option<u16>) -> Self {
        let mut failures = Vec::new();
        for _ in 0..if fixed.is_some() { 1 } else { 5 } {
            let port = fixed.unwrap_or_else(free_port);
            let dir = std::env::temp_dir()
                .join(format!("tollgate-sentinel-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {dir:?}: {e}"));
            let config = dir.join("sentinel.conf");
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {service} 127.0.0.1 {master} {quorum}\n\
                 sentinel down-after-milliseconds {service} 1000\n\
                 sentinel failover-timeout {service} 3000\n\
                 sentinel parallel-syncs {service} 1\n",
                dir = dir.display(),
                master = master.port(),
            );
            std::fs::write(&config, text).unwrap_or_else(|e| panic!("writing {config:?}: {e}"));
            let child = Command::new("redis-server")
                .arg(&config)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot start redis-server --sentinel ({e}): {INSTALL}")
                });
            let mut sentinel = Self { child, port, dir };
            let started = Instant::now();
            loop {
                if let Ok(Some(status)) = sentinel.child.try_wait() {
                    failures.push(format!(
                        "redis-server --sentinel on port {port} exited ({status}); it needs a \
                         Redis built with Sentinel: {INSTALL}"
                    ));
                    break;
                }
                if sentinel.answers() {
                    return sentinel;
                }
                if started.elapsed() > Duration::from_secs(10) {
                    failures.push(format!(
                        "the sentinel on port {port} did not answer in 10 s"
                    ));
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("no sentinel started: {}", failures.join("; "))
    }

    fn answers(&self) -> bool {
        self.query::<String>(redis::cmd("PING").clone()).is_some()
    }

    fn query<T: redis::FromRedisValue>(&self, cmd: redis::Cmd) -> Option<T> {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| cmd.query(&mut c))
            .ok()
    }

    /// The sentinel's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port of the master the sentinel names for `service` now.
    pub fn master_port(&self, service: &str) -> Option<u16> {
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("get-master-addr-by-name").arg(service);
        let addr: Vec<String> = self.query(cmd)?;
        addr.get(1)?.parse().ok()
    }

    /// Whether the sentinel knows `replicas` replicas and `others` other
    /// sentinels of `service`: what a failover needs.
    pub fn sees(&self, service: &str, replicas: usize, others: usize) -> bool {
        let count = |what: &str| {
            let mut cmd = redis::cmd("SENTINEL");
            cmd.arg(what).arg(service);
            self.query::<Vec<redis::Value>>(cmd).map_or(0, |v| v.len())
        };
        count("replicas") >= replicas && count("sentinels") >= others
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl RedisServer {
    /// Whether this server is a replica whose link to its master is up.
    pub fn in_sync(&self) -> bool {
        let info: Result<String, _> = redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| redis::cmd("INFO").arg("replication").query(&mut c));
        info.is_ok_and(|i| i.contains("master_link_status:up"))
    }
}

/// The longest this process's threads were kept waiting by the machine
/// while a test ran: a plain thread sleeps 2 ms in a loop and records how
/// late it woke. On a loaded 2-core CI machine a whole process can stall
/// for a few hundred milliseconds, which no deadline of the store can
/// prevent, so latency bounds allow for it. A plain thread, not a task: a
/// runtime worker that the store blocked (a bug) stalls the requests, not
/// this thread, and is not excused.
#[derive(Debug)]
pub struct StallMeter {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Duration>,
}

impl StallMeter {
    /// Starts measuring.
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let mut worst = Duration::ZERO;
                while !stop.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    std::thread::sleep(Duration::from_millis(2));
                    let late = asked.elapsed().saturating_sub(Duration::from_millis(2));
                    worst = worst.max(late);
                }
                worst
            }
        });
        Self { stop, thread }
    }

    /// Stops, and returns the longest stall seen.
    pub fn stop(self) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(Duration::from_secs(3600))
    }
}
