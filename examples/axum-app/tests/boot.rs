//! The demo started while its Redis is down serves by its failure policy,
//! and once that Redis starts, it shares one exact count with a demo
//! started after it. The demos and the Redis server (on a free loopback
//! port) run as processes of their own.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A process killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The demo on `url`, with `config`; where it listens.
fn demo(config: &std::path::Path, url: &str, prefix: &str) -> (Process, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_axum-app"))
        .args(["--listen", "127.0.0.1:0", "--redis-url", url])
        .args(["--redis-prefix", prefix, "--config"])
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (send, addr) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Read for as long as the demo runs: a closed pipe would fail it.
        for line in stdout.lines().map_while(Result::ok) {
            if let Some(a) = line.strip_prefix("listening on http://") {
                let _ = send.send(a.trim().to_owned());
            }
        }
    });
    let addr = addr
        .recv_timeout(Duration::from_secs(30))
        .expect("the demo did not start");
    (Process(child), addr)
}

/// `GET /api/items` as `user`: the status.
fn get(addr: &str, user: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET /api/items HTTP/1.1\r\nhost: demo\r\nauthorization: Bearer demo-{user}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response.split(' ').nth(1).unwrap().parse().unwrap()
}

fn redis_server(port: u16, dir: &std::path::Path) -> Process {
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server: install Redis (`apt-get install redis-server`)");
    Process(child)
}

fn dbsize(port: u16) -> Option<u64> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "DBSIZE"])
        .output()
        .ok()?;
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
}

#[test]
fn a_demo_started_while_redis_is_down_serves_then_shares_one_exact_count() {
    let dir = std::env::temp_dir().join(format!("axum-app-boot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("policies.toml");
    std::fs::write(
        &config,
        "failure = \"local\"\n[[route]]\nmethod = \"GET\"\npath = \"/api/items\"\n\
         name = \"boot-items\"\nkey = \"user\"\nalgorithm = \"gcra\"\nlimits = [\"10/h\"]\n",
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let prefix = format!("tgtest-boot-{}", std::process::id());

    // Redis is down: the demo starts and serves, by failure = "local".
    let (_early, early) = demo(&config, &url, &prefix);
    let statuses: Vec<u16> = (0..12).map(|_| get(&early, "ada")).collect();
    assert_eq!(statuses, [[200; 10].as_slice(), &[429; 2]].concat());

    // Redis starts; the early demo reaches it within a bounded time (its
    // requests write keys there).
    let _redis = redis_server(port, &dir);
    let deadline = Instant::now() + Duration::from_secs(20);
    while dbsize(port).unwrap_or(0) == 0 {
        assert!(Instant::now() < deadline, "the demo never reached Redis");
        get(&early, "probe");
        std::thread::sleep(Duration::from_millis(50));
    }

    // A demo started after Redis: both share one count, exactly.
    let (_late, late) = demo(&config, &url, &prefix);
    let admitted = (0..30)
        .map(|i| get(if i % 2 == 0 { &early } else { &late }, "bob"))
        .filter(|&status| status == 200)
        .count();
    assert_eq!(admitted, 10);
}
