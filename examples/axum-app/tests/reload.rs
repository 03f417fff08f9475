//! SIGHUP reloads the policy file: new limits apply, each key's use
//! carries over, and a bad file is refused with the field named while the
//! old policies stay. The binary runs as a process of its own.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn login_route(limit: &str) -> String {
    format!(
        "[[route]]\nmethod = \"POST\"\npath = \"/login\"\nname = \"login\"\nkey = \"ip\"\nalgorithm = \"sliding_log\"\nlimits = [\"{limit}\"]\n"
    )
}

/// The demo, and the lines of its output as they come.
struct Demo {
    child: Child,
    lines: mpsc::Receiver<String>,
    addr: String,
}

impl Demo {
    fn start(config: &std::path::Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_axum-app"))
            .args(["--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .env_remove("REDIS_URL")
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let (send, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        let mut demo = Self {
            child,
            lines,
            addr: String::new(),
        };
        let line = demo.wait_for("listening on http://");
        demo.addr = line.rsplit("http://").next().unwrap().trim().to_owned();
        demo
    }

    /// The first line from now on that contains `text`, within 10 s.
    fn wait_for(&self, text: &str) -> String {
        loop {
            match self.lines.recv_timeout(Duration::from_secs(10)) {
                Ok(line) if line.contains(text) => return line,
                Ok(_) => {}
                Err(e) => panic!("no line with {text:?}: {e}"),
            }
        }
    }

    fn hang_up(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// The status of one `POST /login`.
    fn login(&self) -> u16 {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        stream
            .write_all(b"POST /login HTTP/1.1\r\nhost: demo\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response.split(' ').nth(1).unwrap().parse().unwrap()
    }

    /// How many of `n` logins the limiter let through (without a password
    /// each is answered 401), rather than 429.
    fn admitted(&self, n: usize) -> usize {
        (0..n).filter(|_| self.login() != 429).count()
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn sighup_reloads_the_policies_and_refuses_a_bad_file() {
    let dir = std::env::temp_dir().join(format!("axum-app-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("policies.toml");
    std::fs::write(&config, login_route("2/h")).unwrap();
    let demo = Demo::start(&config);
    assert_eq!(demo.admitted(4), 2);

    // A larger limit: the 2 used count under it, 3 more are admitted.
    std::fs::write(&config, login_route("5/h")).unwrap();
    demo.hang_up();
    demo.wait_for("reloaded the policy file");
    assert_eq!(demo.admitted(6), 3);

    // A bad file: refused, naming the field; the old policies stay.
    std::fs::write(&config, login_route("0/h")).unwrap();
    demo.hang_up();
    let refused = demo.wait_for("refused the new policy file");
    assert!(refused.contains("field `limits`"), "{refused}");
    assert_eq!(demo.admitted(2), 0);
    std::fs::write(&config, login_route("7/h")).unwrap();
    demo.hang_up();
    demo.wait_for("reloaded the policy file");
    assert_eq!(demo.admitted(4), 2);
    let _ = std::fs::remove_dir_all(&dir);
}
