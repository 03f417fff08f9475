//! The demo's binary, run for a test: started on a free port, spoken to
//! over TCP, killed when dropped.
#![allow(dead_code)] // each test file uses its own part

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

/// The app, killed when dropped.
pub(crate) struct App {
    child: Child,
    pub(crate) addr: String,
}

impl App {
    /// The app on the in-memory store, with the bundled policy file.
    pub(crate) fn start() -> Self {
        Self::start_with(&[])
    }

    /// The app with `args` after `--listen`.
    pub(crate) fn start_with(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_axum-app"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("REDIS_URL")
            .env_remove("TOLLGATE_CONFIG")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|line| line.strip_prefix("listening on http://").map(str::to_owned))
            .expect("the app printed its address");
        // Keep draining stdout: the app must not die of a closed pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Self { child, addr }
    }

    /// Sends one HTTP/1.1 request without a body; returns the status and
    /// the body.
    pub(crate) fn send(&self, method: &str, path: &str, auth: Option<&str>) -> (u16, String) {
        self.send_body(method, path, auth, "")
    }

    /// Sends one HTTP/1.1 request with `body`; returns the status and the
    /// body.
    pub(crate) fn send_body(
        &self,
        method: &str,
        path: &str,
        auth: Option<&str>,
        body: &str,
    ) -> (u16, String) {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        let auth = auth.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response[9..12].parse().unwrap();
        let body = response
            .split_once("\r\n\r\n")
            .map_or(String::new(), |(_, b)| b.to_owned());
        (status, body)
    }
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
