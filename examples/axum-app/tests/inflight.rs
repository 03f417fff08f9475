//! `GET /api/export` runs at most 2 per user at once across app servers on
//! Redis, and the slots of a server that is SIGKILLed mid-export free
//! themselves when their leases run out. The binary runs as processes of
//! its own, on the shared test Redis (`REDIS_URL`, or 127.0.0.1:6379).
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LEASE_MS: u64 = 1_000;

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// The demo on Redis, with the bundled policies and a 1 s lease.
struct Demo {
    child: Child,
    addr: String,
}

impl Demo {
    fn start(config: &std::path::Path, prefix: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_axum-app"))
            .args(["--listen", "127.0.0.1:0", "--redis-url", &redis_url()])
            .args(["--redis-prefix", prefix, "--config"])
            .arg(config)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Read the demo's output for as long as it runs: a closed pipe
        // would fail its next line.
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (send, addr) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if let Some(a) = line.strip_prefix("listening on http://") {
                    let _ = send.send(a.trim().to_owned());
                }
            }
        });
        let addr = addr
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| {
                panic!(
                    "the demo did not start on Redis at {}: install and start Redis \
                 (`apt-get install redis-server`)",
                    redis_url()
                )
            });
        Self { child, addr }
    }

    /// Sends `GET /api/export` as `user` and reads the status line and
    /// headers; the connection stays open (the export streams on).
    fn export(&self, user: &str) -> (u16, String, TcpStream) {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        write!(
            stream,
            "GET /api/export?rows=1000 HTTP/1.1\r\nhost: demo\r\nauthorization: Bearer demo-{user}\r\n\r\n"
        )
        .unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).unwrap();
            head.push(byte[0]);
        }
        let head = String::from_utf8(head).unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head, stream)
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        self.kill();
    }
}

#[test]
fn two_exports_per_user_across_servers_and_a_dead_servers_slots_free_themselves() {
    let dir = std::env::temp_dir().join(format!("axum-app-inflight-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("policies.toml");
    let policies = include_str!("../policies.toml").replace(
        "in_flight = 2\n",
        &format!("in_flight = 2\nin_flight_lease_ms = {LEASE_MS}\n"),
    );
    std::fs::write(&config, policies).unwrap();
    // A pro user: exports cost 5 of 200 an hour, room for the polls below.
    let nanos = std::time::SystemTime::UNIX_EPOCH
        .elapsed()
        .unwrap()
        .subsec_nanos();
    let user = format!("pro-inflight-{}-{nanos}", std::process::id());

    // Keys of this run's own: the per-IP limit is not shared with others.
    let prefix = format!("demo-inflight-{}-{nanos}", std::process::id());
    let mut first = Demo::start(&config, &prefix);
    let second = Demo::start(&config, &prefix);
    // Two exports run on the first server; a third, on either, is refused.
    let (a, _, held_a) = first.export(&user);
    let (b, _, held_b) = first.export(&user);
    assert_eq!((a, b), (200, 200));
    for server in [&first, &second] {
        let (status, head, _) = server.export(&user);
        assert_eq!(status, 429, "{head}");
        assert!(head.contains("x-concurrency-limit: 2\r\n"), "{head}");
    }

    // The first server dies mid-export. Its leases were renewed up to a
    // third of a lease ago: the slots stay taken a while, then free
    // themselves within one lease.
    first.kill();
    let killed = Instant::now();
    drop((held_a, held_b));
    let (status, _, _) = second.export(&user);
    assert_eq!(status, 429, "still held just after the kill");
    let freed = loop {
        let (status, head, stream) = second.export(&user);
        if status == 200 {
            drop(stream);
            break killed.elapsed();
        }
        assert!(head.contains("x-concurrency-limit: 2\r\n"), "{head}");
        assert!(
            killed.elapsed() < Duration::from_millis(LEASE_MS + 1_000),
            "the dead server's slots were not freed within the lease"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    println!("the dead server's slots were free {freed:?} after the kill (lease {LEASE_MS} ms)");
    assert!(freed <= Duration::from_millis(LEASE_MS + 150), "{freed:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
