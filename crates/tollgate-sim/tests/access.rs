//! Reading real access logs: each format, and hostile lines counted and
//! skipped, never a panic.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::io::Read;
use std::net::IpAddr;

use tollgate_sim::access::{AccessFormat, AccessLog, AccessRecord, MAX_LINE};

/// Every record of `text`, and (lines, malformed).
fn read(text: &[u8], format: AccessFormat) -> (Vec<AccessRecord>, (u64, u64)) {
    let mut log = AccessLog::new(text, format);
    let records = log.by_ref().map(Result::unwrap).collect();
    (records, (log.lines(), log.malformed()))
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

#[test]
fn common_format() {
    let text = b"127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] \"GET /apache_pb.gif HTTP/1.0\" 200 2326\n\
2001:db8::7 - - [01/Jan/2026:00:00:00 +0100] \"POST /login HTTP/2.0\" 401 -\n";
    let (records, counts) = read(text, AccessFormat::Common);
    assert_eq!(counts, (2, 0));
    let [frank, anon] = records.as_slice() else {
        panic!("{records:?}")
    };
    // 2000-10-10 20:55:36 UTC.
    assert_eq!(frank.time().as_micros(), 971_211_336_000_000);
    assert_eq!(
        (frank.method(), frank.target(), frank.user(), frank.status()),
        ("GET", "/apache_pb.gif", Some("frank"), Some(200))
    );
    assert_eq!(frank.ip(), ip("127.0.0.1"));
    assert_eq!(frank.headers().count(), 0);
    // 2025-12-31 23:00:00 UTC.
    assert_eq!(anon.time().as_micros(), 1_767_222_000_000_000);
    assert_eq!(
        (anon.method(), anon.target(), anon.user(), anon.status()),
        ("POST", "/login", None, Some(401))
    );
    assert_eq!(anon.ip(), ip("2001:db8::7"));
}

#[test]
fn combined_format_with_escapes() {
    let text = br#"203.0.113.9 - ada [20/Nov/2026:00:00:01 +0000] "GET /api/search?q=a%20b HTTP/1.1" 200 12 "https://example.com/\"x\"" "Mozilla/5.0 \x22quoted\x22"
203.0.113.9 - - [20/Nov/2026:00:00:02 +0000] "GET /health HTTP/1.1" 200 3 "-" "-"
"#;
    let (records, counts) = read(text, AccessFormat::Combined);
    assert_eq!(counts, (2, 0));
    assert_eq!(records[0].time().as_micros(), 1_795_132_801_000_000);
    assert_eq!(records[0].target(), "/api/search?q=a%20b");
    assert_eq!(
        records[0].header("referer"),
        Some("https://example.com/\"x\"")
    );
    assert_eq!(
        records[0].header("user-agent"),
        Some("Mozilla/5.0 \"quoted\"")
    );
    assert_eq!(records[1].headers().count(), 0);
    assert_eq!(records[1].user(), None);
    // A common-format line is not a combined one.
    let (records, counts) = read(
        b"10.0.0.1 - - [20/Nov/2026:00:00:02 +0000] \"GET / HTTP/1.1\" 200 3\n",
        AccessFormat::Combined,
    );
    assert_eq!((records.len(), counts), (0, (1, 1)));
}

#[test]
fn json_lines() {
    let text = br#"{"time":"2026-11-20T00:00:01.250Z","method":"GET","path":"/api/items","ip":"198.51.100.7","user":"ada","status":200,"headers":{"X-Api-Key":"k1"}}
{"ts":1795132802,"method":"POST","uri":"/api/items","remote_addr":"198.51.100.8","remote_user":"-"}
{"timestamp":1795132803.5,"method":"GET","url":"/health","client_ip":"::1","extra":[1,2,3]}
"#;
    let (records, counts) = read(text, AccessFormat::JsonLines);
    assert_eq!(counts, (3, 0));
    assert_eq!(records[0].time().as_micros(), 1_795_132_801_250_000);
    assert_eq!(records[0].user(), Some("ada"));
    assert_eq!(records[0].header("x-api-key"), Some("k1"));
    assert_eq!(records[0].status(), Some(200));
    assert_eq!(records[1].time().as_micros(), 1_795_132_802_000_000);
    assert_eq!((records[1].method(), records[1].user()), ("POST", None));
    assert_eq!(records[1].ip(), ip("198.51.100.8"));
    assert_eq!(records[2].time().as_micros(), 1_795_132_803_500_000);
    assert_eq!(
        (records[2].target(), records[2].status()),
        ("/health", None)
    );
}

#[test]
fn hostile_lines_are_counted_and_skipped() {
    let good = "10.0.0.1 - u [20/Nov/2026:00:00:00 +0000] \"GET /a HTTP/1.1\" 200 1 \"-\" \"-\"\n";
    let hostile: Vec<&[u8]> = vec![
        b"",
        b"garbage",
        b"10.0.0.1",
        b"not-an-ip - - [20/Nov/2026:00:00:00 +0000] \"GET /a HTTP/1.1\" 200 1 \"-\" \"-\"",
        b"10.0.0.1 - - [32/Nov/2026:00:00:00 +0000] \"GET /a HTTP/1.1\" 200 1 \"-\" \"-\"",
        b"10.0.0.1 - - [20/Nov/2026:00:00:00 +0000 \"GET /a HTTP/1.1\" 200 1 \"-\" \"-\"",
        b"10.0.0.1 - - [20/Nov/2026:00:00:00 +0000] \"GET /a HTTP/1.1 200 1",
        b"10.0.0.1 - - [20/Nov/2026:00:00:00 +0000] \"\" 200 1 \"-\" \"-\"",
        b"10.0.0.1 - - [20/Nov/2026:00:00:00 +0000] \"GET http://evil HTTP/1.1\" 200 1 \"-\" \"-\"",
        b"10.0.0.1 - - [20/Nov/2026:00:00:00 +0000] \"G\xc3T /a HTTP/1.1\" 200 1 \"-\" \"-\"",
        b"10.0.0.1 - - [20/Nov/2026:00:00:00 +0000] \"GET /a HTTP/1.1\" 99999 1 \"-\" \"-\"",
        b"10.0.0.1 - - [20/Nov/2026:00:00:00 +0000] \"GET /a HTTP/1.1\" 200 1 \"\\x4\" \"-\"",
        b"10.0.0.1 - - [20/Nov/2026:00:00:00 +0000] \"GET /a HTTP/1.1\" 200 1 \"-\" \"unterminated\\",
        b"\xff\xfe\x00\x01 binary",
        b"\x00\x00\x00",
    ];
    let mut text = Vec::new();
    for line in &hostile {
        text.extend_from_slice(line);
        text.push(b'\n');
        text.extend_from_slice(good.as_bytes());
    }
    // A line far longer than the longest read, with no end of line.
    text.extend(std::iter::repeat_n(b'x', MAX_LINE * 3));
    let (records, (lines, malformed)) = read(&text, AccessFormat::Combined);
    assert_eq!(records.len(), hostile.len());
    // The empty line is skipped, not malformed.
    assert_eq!(
        (lines, malformed),
        (2 * hostile.len() as u64 + 1, hostile.len() as u64)
    );
    assert!(
        records
            .iter()
            .all(|r| r.target() == "/a" && r.user() == Some("u"))
    );

    // The same garbage as JSON lines, and JSON that is not a request.
    let mut text = Vec::new();
    for line in &hostile {
        text.extend_from_slice(line);
        text.push(b'\n');
    }
    text.extend_from_slice(
        br#"{"time":"yesterday","method":"GET","path":"/a","ip":"10.0.0.1"}
{"time":-5,"method":"GET","path":"/a","ip":"10.0.0.1"}
{"time":1e300,"method":"GET","path":"/a","ip":"10.0.0.1"}
{"time":1,"method":"GET /a","path":"/a","ip":"10.0.0.1"}
{"time":1,"method":"GET","path":"/a","ip":"10.0.0.1","headers":{"a":1}}
{"time":1,"method":"GET","path":"/a"}
[1,2,3]
"#,
    );
    let (records, (_, malformed)) = read(&text, AccessFormat::JsonLines);
    assert_eq!(
        (records.len(), malformed),
        (0, hostile.len() as u64 - 1 + 7)
    );
}

/// A reader that fails after its first bytes.
struct Broken(bool);

impl Read for Broken {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if std::mem::replace(&mut self.0, true) {
            return Err(std::io::Error::other("disk on fire"));
        }
        let line = b"10.0.0.1 - - [20/Nov/2026:00:00:00 +0000] \"GET /a HTTP/1.1\" 200 1\n";
        buf[..line.len()].copy_from_slice(line);
        Ok(line.len())
    }
}

#[test]
fn a_read_error_is_an_error() {
    let mut log = AccessLog::new(std::io::BufReader::new(Broken(false)), AccessFormat::Common);
    assert_eq!(log.next().unwrap().unwrap().target(), "/a");
    assert_eq!(log.next().unwrap().unwrap_err().to_string(), "disk on fire");
}

#[test]
fn formats_by_name() {
    assert_eq!("combined".parse(), Ok(AccessFormat::Combined));
    assert_eq!("clf".parse(), Ok(AccessFormat::Common));
    assert_eq!("jsonl".parse(), Ok(AccessFormat::JsonLines));
    assert!("xml".parse::<AccessFormat>().is_err());
}
