//! JSON lines: one object per request.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Deserialize;
use tollgate_core::Timestamp;

use super::{AccessRecord, valid_method, valid_target};

#[derive(Deserialize)]
struct Line {
    #[serde(alias = "timestamp", alias = "ts")]
    time: Time,
    method: String,
    #[serde(alias = "uri", alias = "url")]
    path: String,
    #[serde(alias = "client_ip", alias = "remote_addr")]
    ip: String,
    #[serde(default, alias = "remote_user")]
    user: Option<String>,
    #[serde(default)]
    status: Option<u16>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Time {
    Epoch(f64),
    Text(String),
}

/// Parses one line.
pub(super) fn parse(line: &str) -> Result<AccessRecord, &'static str> {
    let line: Line = serde_json::from_str(line)
        .map_err(|_| "not a JSON object with time, method, path and ip")?;
    let time = match line.time {
        Time::Epoch(secs) if (0.0..1e11).contains(&secs) => {
            // Whole microseconds: the cast is in range by the check above.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Timestamp::from_micros((secs * 1e6).round() as u64)
        }
        Time::Epoch(_) => return Err("an epoch time out of range"),
        Time::Text(text) => {
            let t: jiff::Timestamp = text.parse().map_err(|_| "a time that is not RFC 3339")?;
            Timestamp::from_micros(
                u64::try_from(t.as_microsecond()).map_err(|_| "a time before 1970")?,
            )
        }
    };
    if !valid_method(&line.method) || !valid_target(&line.path) {
        return Err("a request that is not METHOD /path");
    }
    let ip: IpAddr = line
        .ip
        .parse()
        .map_err(|_| "a client that is not an IP address")?;
    Ok(AccessRecord {
        time,
        method: line.method,
        target: line.path,
        ip,
        user: line.user.filter(|u| !u.is_empty() && u != "-"),
        status: line.status,
        headers: line
            .headers
            .into_iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), v))
            .collect(),
    })
}
