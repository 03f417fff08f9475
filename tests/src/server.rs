//! `RedisServer`: a private `redis-server` on a free loopback port, and
//! what tests ask of one (its role, its keys, its replication link).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::INSTALL;

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

    /// Stops the server with SIGSTOP: it holds its connections open and
    /// answers nothing, as a hung server does, until it is killed.
    pub fn hang(&self) {
        let stopped = Command::new("kill")
            .args(["-STOP", &self.pid().to_string()])
            .status();
        if !stopped.as_ref().is_ok_and(|s| s.success()) {
            panic!("kill -STOP {}: {stopped:?}", self.pid());
        }
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

    /// Starts the server again on the same port with `keys` keys saved,
    /// loading them slowly: it answers `INFO` at once but turns other
    /// commands away with `LOADING` until [`RedisServer::finish_loading`].
    ///
    /// # Panics
    ///
    /// When the server does not answer, or does not come back loading.
    pub fn restart_loading(&mut self, keys: u64) {
        let mut con = self.connection();
        let mut fill = redis::pipe();
        for i in 0..keys {
            fill.cmd("SET").arg(format!("filler:{i}")).arg(i).ignore();
        }
        fill.cmd("SAVE").ignore();
        fill.query::<()>(&mut con)
            .unwrap_or_else(|e| panic!("filling {}: {e}", self.url()));
        self.kill();
        let mut extra = self.extra.clone();
        // A millisecond a key (about a minute for 60,000), checking for
        // clients every kilobyte: until loading ends, each is answered.
        extra.extend(
            [
                "--key-load-delay",
                "1000",
                "--loading-process-events-interval-bytes",
                "1024",
            ]
            .map(str::to_owned),
        );
        self.child = start(self.port, &self.dir, &extra);
        if let Err(why) = self.wait_until_up() {
            panic!("restarting to load: {why}");
        }
        assert!(self.loading(), "{} is not loading", self.url());
    }

    /// Whether the server is loading its data.
    ///
    /// # Panics
    ///
    /// When the server does not answer.
    pub fn loading(&self) -> bool {
        let info: String = redis::cmd("INFO")
            .arg("persistence")
            .query(&mut self.connection())
            .unwrap_or_else(|e| panic!("INFO of {}: {e}", self.url()));
        info.lines().any(|line| line.trim() == "loading:1")
    }

    /// Ends a slow load begun by [`RedisServer::restart_loading`] at full
    /// speed.
    ///
    /// # Panics
    ///
    /// When the server does not answer.
    pub fn finish_loading(&self) {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("key-load-delay")
            .arg(0)
            .query::<()>(&mut self.connection())
            .unwrap_or_else(|e| panic!("ending the load of {}: {e}", self.url()));
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

    /// Holds every client's writes and scripts for `ms` (`CLIENT PAUSE
    /// WRITE`): a request sent meanwhile is surely still waiting for its
    /// answer, however the machine schedules the test.
    ///
    /// # Panics
    ///
    /// When the server does not answer.
    pub fn pause_writes(&self, ms: u64) {
        redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(ms)
            .arg("WRITE")
            .query::<()>(&mut self.connection())
            .unwrap_or_else(|e| panic!("pausing {}: {e}", self.url()));
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

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free loopback port: {e}"))
}

impl RedisServer {
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

    /// Whether this server is a replica whose link to its master is up.
    pub fn in_sync(&self) -> bool {
        let info: Result<String, _> = redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| redis::cmd("INFO").arg("replication").query(&mut c));
        info.is_ok_and(|i| i.contains("master_link_status:up"))
    }
}
