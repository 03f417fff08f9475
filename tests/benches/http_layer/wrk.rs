//! One run of `wrk` against a served variant, and what it cost: requests
//! per second, latency, CPU time of the server, `redis-server` and `wrk`
//! (from `/proc`), and Redis's script calls.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use tollgate_tests::{RedisServer, command_calls, command_stat};

const SECONDS: u64 = 3;
const CONNECTIONS: usize = 32;

pub(crate) struct Run {
    pub(crate) per_sec: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    /// CPU time per request of this process (the server) and of
    /// redis-server, in µs.
    pub(crate) server_cpu_us: f64,
    pub(crate) redis_cpu_us: f64,
    /// CPU time per request of wrk itself, in µs.
    pub(crate) wrk_cpu_us: f64,
    /// Share of the machine's CPU time that no process used.
    pub(crate) idle: f64,
    /// Requests per `EVALSHA` Redis received (0 without Redis).
    pub(crate) per_call: f64,
    /// Redis's µs running `EVALSHA` per request.
    pub(crate) script_us: f64,
}

/// The fields of `/proc/{pid}/stat` after the command name (which is in
/// parentheses): the state first, then the parent's pid, and so on.
fn stat_fields(pid: u32) -> Vec<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// User plus system CPU time of process `pid`, in µs.
fn cpu_us(pid: u32) -> f64 {
    cpu_of(&stat_fields(pid))
}

/// User plus system CPU time in µs, from a process's [`stat_fields`].
fn cpu_of(fields: &[String]) -> f64 {
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, in ticks of 1/100 s.
    (ticks(11) + ticks(12)) * 10_000.0
}

/// The machine's idle and total CPU time so far, in ticks, from the first
/// line of `/proc/stat` (idle and iowait count as idle).
fn machine_ticks() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let idle = ticks.iter().skip(3).take(2).sum();
    (idle, ticks.iter().sum())
}

fn micros(text: &str) -> f64 {
    let (number, unit) = text
        .find(|c: char| c.is_ascii_alphabetic())
        .map(|i| text.split_at(i))
        .unwrap();
    let n: f64 = number.parse().unwrap();
    match unit {
        "us" => n,
        "ms" => n * 1_000.0,
        "s" => n * 1_000_000.0,
        other => panic!("unknown unit {other} in {text}"),
    }
}

/// Seconds per run: `TOLLGATE_BENCH_SECONDS`, or [`SECONDS`].
pub(crate) fn seconds() -> u64 {
    std::env::var("TOLLGATE_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SECONDS)
}

/// Connections wrk keeps open: `TOLLGATE_BENCH_CONNECTIONS`, or
/// [`CONNECTIONS`].
pub(crate) fn connections() -> usize {
    std::env::var("TOLLGATE_BENCH_CONNECTIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(CONNECTIONS)
}

/// Seconds of unmeasured load before each measured run of a leased
/// variant: `TOLLGATE_BENCH_WARMUP`, or none.
pub(crate) fn warm_up() -> u64 {
    std::env::var("TOLLGATE_BENCH_WARMUP")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Runs wrk against `addr` for `seconds`, unmeasured.
pub(crate) fn wrk_for(addr: SocketAddr, script: &str, seconds: u64) {
    let path = script_file(script);
    let status = Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{}", connections()),
            &format!("-d{seconds}s"),
        ])
        .arg("-s")
        .arg(&path)
        .arg(format!("http://{addr}/"))
        .stdout(Stdio::null())
        .status()
        .expect("wrk is needed: apt-get install wrk");
    assert!(status.success(), "wrk failed");
}

/// `script` in a file wrk can read.
fn script_file(script: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("tollgate-bench-{}.lua", std::process::id()));
    std::fs::File::create(&path)
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    path
}

pub(crate) fn wrk(addr: SocketAddr, script: &str, redis: &RedisServer) -> Run {
    let redis_pid = redis.pid();
    let mut con = redis.connection();
    let calls_before = command_calls(&mut con, "evalsha");
    let usec_before = command_stat(&mut con, "evalsha", "usec");
    let path = script_file(script);
    let cpu_before = (cpu_us(std::process::id()), cpu_us(redis_pid));
    let machine_before = machine_ticks();
    let mut child = Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{}", connections()),
            &format!("-d{}s", seconds()),
            "--latency",
            "-s",
        ])
        .arg(&path)
        .arg(format!("http://{addr}/"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("wrk is needed: apt-get install wrk");
    let mut text = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    let cpu_after = (cpu_us(std::process::id()), cpu_us(redis_pid));
    let machine_after = machine_ticks();
    // wrk has closed its output; once it has exited, and until it is
    // reaped, /proc still holds its final CPU times.
    let mut wrk_cpu = 0.0;
    for _ in 0..1_000 {
        let fields = stat_fields(child.id());
        wrk_cpu = cpu_of(&fields);
        if fields.first().is_none_or(|state| state == "Z") {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let status = child.wait().unwrap();
    let calls = command_calls(&mut con, "evalsha") - calls_before;
    let usec = command_stat(&mut con, "evalsha", "usec") - usec_before;
    assert!(status.success(), "wrk failed: {text}");
    assert!(
        !text.contains("Non-2xx"),
        "some requests were not admitted:\n{text}"
    );
    let field = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix).map(|v| v.trim().to_owned()))
            .unwrap_or_else(|| panic!("no '{prefix}' in:\n{text}"))
    };
    let per_sec: f64 = field("Requests/sec:").parse().unwrap();
    let requests = per_sec * seconds() as f64;
    Run {
        per_sec,
        p50_us: micros(&field("50%")),
        p99_us: micros(&field("99%")),
        server_cpu_us: (cpu_after.0 - cpu_before.0) / requests,
        redis_cpu_us: (cpu_after.1 - cpu_before.1) / requests,
        wrk_cpu_us: wrk_cpu / requests,
        idle: (machine_after.0 - machine_before.0) / (machine_after.1 - machine_before.1),
        per_call: if calls == 0 {
            0.0
        } else {
            requests / calls as f64
        },
        script_us: usec as f64 / requests,
    }
}
