//! `RedisSentinel`: a private Redis Sentinel watching one master.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::server::free_port;
use crate::{INSTALL, RedisServer};

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
