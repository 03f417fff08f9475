//! Real access logs, read line by line: the common and combined log
//! formats of Apache and nginx, and JSON lines.
//!
//! [`AccessLog`] streams a log: it holds one line at a time (at most
//! [`MAX_LINE`] bytes of it), so a log of any length is read in bounded
//! memory. A malformed line is counted ([`AccessLog::malformed`]) and
//! skipped, never a panic: a log is client input.
//!
//! ```
//! use tollgate_sim::access::{AccessFormat, AccessLog};
//!
//! let text = "\
//! 203.0.113.9 - ada [10/Oct/2026:13:55:36 +0000] \"GET /api/items?page=2 HTTP/1.1\" 200 512 \"-\" \"curl/8.5\"
//! not a log line
//! ";
//! let mut log = AccessLog::new(text.as_bytes(), AccessFormat::Combined);
//! let record = log.next().unwrap()?;
//! assert_eq!(record.method(), "GET");
//! assert_eq!(record.target(), "/api/items?page=2");
//! assert_eq!(record.user(), Some("ada"));
//! assert_eq!(record.ip().to_string(), "203.0.113.9");
//! assert_eq!(record.time().as_micros(), 1_791_640_536_000_000);
//! assert_eq!(record.header("user-agent"), Some("curl/8.5"));
//! assert!(log.next().is_none());
//! assert_eq!((log.lines(), log.malformed()), (2, 1));
//! # Ok::<(), std::io::Error>(())
//! ```

mod clf;
mod json;
mod reader;

use std::net::IpAddr;
use std::str::FromStr;

use tollgate_core::Timestamp;

pub use reader::{AccessLog, MAX_LINE};

/// The format of an access log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessFormat {
    /// The Common Log Format: `host ident user [time] "request" status
    /// bytes`. Anything after the bytes is ignored.
    Common,
    /// The Combined Log Format: the common format and `"referer"
    /// "user-agent"`, kept as the `referer` and `user-agent` headers.
    Combined,
    /// One JSON object per line: `time` (RFC 3339, or epoch seconds as a
    /// number), `method`, `path`, `ip`, and optionally `user`, `status`
    /// and `headers` (an object of strings). `timestamp`, `uri`,
    /// `client_ip`, `remote_addr` and `remote_user` are read as aliases.
    JsonLines,
}

impl FromStr for AccessFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "common" | "clf" => Ok(AccessFormat::Common),
            "combined" => Ok(AccessFormat::Combined),
            "json" | "jsonl" | "json-lines" => Ok(AccessFormat::JsonLines),
            other => Err(format!(
                "unknown log format {other:?}: use common, combined or json"
            )),
        }
    }
}

/// One request of an access log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessRecord {
    time: Timestamp,
    method: String,
    target: String,
    ip: IpAddr,
    user: Option<String>,
    status: Option<u16>,
    headers: Vec<(String, String)>,
}

impl AccessRecord {
    /// When the request was logged.
    pub fn time(&self) -> Timestamp {
        self.time
    }

    /// Its method, as logged (`GET`).
    pub fn method(&self) -> &str {
        &self.method
    }

    /// Its path and query (`/api/items?page=2`).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The client's address.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The authenticated user the server logged, if any (`-` is none).
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The status the server answered, if logged.
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    /// The logged request headers, names in lowercase.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &str)> {
        self.headers.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// The value of the logged header `name` (lowercase), if any.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a line is not a request of the log's format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct MalformedLine {
    line: u64,
    reason: &'static str,
}

impl MalformedLine {
    /// The 1-based line number.
    pub fn line(&self) -> u64 {
        self.line
    }

    /// What is wrong with it.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

/// A method is an HTTP token: letters, at most 16 of them.
fn valid_method(method: &str) -> bool {
    !method.is_empty() && method.len() <= 16 && method.bytes().all(|b| b.is_ascii_alphabetic())
}

/// A target is an origin-form path: it starts with `/`, has no space or
/// control character.
fn valid_target(target: &str) -> bool {
    target.starts_with('/') && !target.bytes().any(|b| b.is_ascii_control() || b == b' ')
}
