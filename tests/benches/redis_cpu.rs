//! Redis CPU per decision: `INFO commandstats` usec_per_call of EVALSHA for
//! every algorithm's script as `RedisStore` sends it, next to a
//! straightforward GCRA script (GET the TAT, compute, `SET ... PX`) in the
//! same run, against one private `redis-server`. The decisions are the
//! ones the store sends (same scripts, key names and arguments), built
//! beforehand and pipelined, so that the client's own work is the same for
//! every script and the figures are Redis's alone.
//!
//! Three workloads (see `Workload`): idle keys, busy keys and one key over
//! its limit. GCRA and the fixed window are measured once more with 16 and
//! with 64 decisions per call, as the store batches concurrent decisions. Five interleaved
//! rounds; each ratio is the median of the rounds' ratios to the reference
//! run just before.
//!
//! Run with: `cargo bench -p tollgate-tests --bench redis_cpu`
//! (`TOLLGATE_BENCH_ROUNDS` sets the rounds; `TOLLGATE_BENCH_ONLY='gcra, 1
//! limit|token'` keeps the rows whose policy names contain one of the
//! `|`-separated texts.)
//!
//! Time on a shared machine is noisy (a round's ratio can be 0.2 away from
//! the median). With `TOLLGATE_BENCH_CALLGRIND=1` the bench counts
//! instructions instead, which do not depend on the machine's load: it runs
//! the private `redis-server` under valgrind's callgrind and reports every
//! instruction the server executed (reading the command, the script,
//! writing the reply) per decision, for the word scripts, in one
//! round (`TOLLGATE_BENCH_GENERAL=1` adds the general scripts' rows). Needs
//! valgrind (`apt-get install valgrind`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_core::{Algorithm, Key, Policy};
use tollgate_redis::RedisStore;
use tollgate_redis::testing::{script_args, script_source};
use tollgate_tests::RedisServer;

/// The straightforward GCRA script a user would write first.
const STRAIGHTFORWARD_GCRA: &str = include_str!("straightforward_gcra.lua");

/// Decisions per measurement.
const CALLS: usize = 30_000;
const ROUNDS: usize = 5;

#[derive(Clone, Copy)]
enum Workload {
    /// 10,000 keys at random, 1000/s each: at every request the key's
    /// previous time has passed (the common case of a limiter).
    Idle,
    /// 10,000 keys at random, 1/min each with a burst of a million: every
    /// request is admitted while the key's time is still ahead of now
    /// (by a minute per request before it, so even under valgrind, which
    /// slows the server fifty-fold, no key's time passes during a run).
    Busy,
    /// One key, far over 100/s: nearly every request is denied.
    Hot,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Idle => "10,000 idle keys",
            Workload::Busy => "10,000 busy keys",
            Workload::Hot => "1 key over its limit",
        }
    }

    /// The policy of this workload, with `extra` further limits.
    fn policy(self, name: &str, algorithm: Algorithm, extra: &[&str]) -> Policy {
        let mut builder = Policy::builder(name).algorithm(algorithm);
        builder = match self {
            Workload::Idle => builder.limit("1000/s"),
            Workload::Hot => builder.limit("100/s"),
            Workload::Busy if algorithm.has_burst() => builder.limit("1/min").burst(1_000_000),
            Workload::Busy => builder.limit("1000000/h"),
        };
        for limit in extra {
            builder = builder.limit(*limit);
        }
        builder.build().unwrap()
    }

    fn key(self, n: u64) -> u64 {
        match self {
            Workload::Idle | Workload::Busy => {
                (n.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 33) % 10_000
            }
            Workload::Hot => 0,
        }
    }
}

/// EVALSHA's total µs in Redis, divided over `decisions`.
fn usec_per_decision(con: &mut redis::Connection, decisions: usize) -> f64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
    let usec: f64 = info
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("usec=")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no EVALSHA in commandstats: {info}"));
    usec / decisions as f64
}

fn reset(con: &mut redis::Connection) {
    let _: () = redis::cmd("FLUSHALL").query(con).unwrap();
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(con).unwrap();
}

/// Sends `commands` in pipelines of 64 over one connection, after a
/// FLUSHALL and a CONFIG RESETSTAT, and returns Redis's work per decision:
/// EVALSHA's µs, or the server's instructions under callgrind. The
/// commands are built beforehand, so the client does the same little work
/// for every script and competes as little as possible for the CPU.
fn run(server: &Server, commands: &[redis::Cmd], decisions: usize) -> f64 {
    let mut con = server.connection();
    reset(&mut con);
    if let Server::Callgrind(c) = server {
        c.control("-z");
    }
    for batch in commands.chunks(64) {
        let mut pipe = redis::pipe();
        for cmd in batch {
            pipe.add_command(cmd.clone());
        }
        let _: Vec<redis::Value> = pipe.query(&mut con).unwrap();
    }
    match server {
        Server::Plain(_) => usec_per_decision(&mut con, decisions),
        Server::Callgrind(c) => c.instructions() as f64 / decisions as f64,
    }
}

/// The private server: plain, or under callgrind.
enum Server {
    Plain(RedisServer),
    Callgrind(Callgrind),
}

impl Server {
    fn url(&self) -> String {
        match self {
            Server::Plain(s) => s.url(),
            Server::Callgrind(c) => format!("redis://127.0.0.1:{}", c.port),
        }
    }

    fn connection(&self) -> redis::Connection {
        match self {
            Server::Plain(s) => s.connection(),
            Server::Callgrind(_) => redis::Client::open(self.url())
                .and_then(|c| c.get_connection())
                .unwrap(),
        }
    }
}

/// `redis-server` under `valgrind --tool=callgrind`, counting instructions
/// between a zeroing and a dump; killed on drop.
struct Callgrind {
    child: Child,
    port: u16,
    dir: PathBuf,
    dumps: std::cell::Cell<usize>,
}

impl Callgrind {
    fn spawn() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("tollgate-callgrind-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", dir.join("cg").display()))
            .args(["redis-server", "--port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start valgrind ({e}): apt-get install valgrind"));
        let server = Self {
            child,
            port,
            dir,
            dumps: std::cell::Cell::new(0),
        };
        let started = Instant::now();
        while redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
            .is_err()
        {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "redis-server under callgrind did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    fn control(&self, option: &str) {
        let ok = Command::new("callgrind_control")
            .arg(option)
            .arg(self.child.id().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "callgrind_control {option} failed");
    }

    /// Dumps the count since the last zeroing and returns it.
    fn instructions(&self) -> u64 {
        self.control("-d");
        self.dumps.set(self.dumps.get() + 1);
        let file = self.dir.join(format!("cg.{}", self.dumps.get()));
        let text = std::fs::read_to_string(&file).unwrap();
        std::fs::remove_file(&file).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("summary:").or(l.strip_prefix("totals:")))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no totals in {file:?}"))
    }
}

impl Drop for Callgrind {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn load(server: &Server, source: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(source)
        .query(&mut server.connection())
        .unwrap()
}

/// The decisions `RedisStore` sends for `policy`: the same script, keys and
/// arguments (on Redis's clock, one unit each), `per_call` decisions per
/// call as the store batches them under concurrent load (1: one each, as
/// an idle store sends them; only single-limit GCRA, token-bucket,
/// leaky-bucket and fixed-window policies are ever batched). A one-word policy's script
/// writes first or reads first (`write_first`); `None` takes the order the
/// store settles on under `w`'s traffic: it writes first while fewer than a
/// quarter of requests find their key holding a time, on idle keys.
fn tollgate(
    server: &Server,
    store: &RedisStore,
    policy: &Policy,
    w: Workload,
    per_call: usize,
    write_first: Option<bool>,
) -> Vec<redis::Cmd> {
    let mut source = script_source(policy).to_owned();
    let one_word = policy.shape() == tollgate_core::Shape::Tat;
    if one_word && !write_first.unwrap_or(matches!(w, Workload::Idle)) {
        // The variant that reads first (see `script_source`).
        source = source.replacen("local write_first = true", "local write_first = false", 1);
        assert!(source.starts_with("local write_first = false\n"));
    }
    let sha = load(server, &source);
    let args = script_args(policy, 1);
    let keys: Vec<String> = (0..CALLS as u64)
        .map(|i| store.state_key(policy, &Key::user(w.key(i).to_be_bytes())))
        .collect();
    keys.chunks(per_call)
        .map(|batch| {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&sha);
            if policy.algorithm() == Algorithm::SlidingLog {
                let key = &batch[0];
                cmd.arg(1 + policy.limits().len()).arg(key);
                for l in 0..policy.limits().len() {
                    cmd.arg(format!("{key}:{l}"));
                }
            } else {
                cmd.arg(batch.len()).arg(batch);
            }
            for _ in batch {
                cmd.arg(&args);
            }
            cmd
        })
        .collect()
}

/// The same decisions through the straightforward script.
fn straightforward(server: &Server, policy: &Policy, w: Workload) -> Vec<redis::Cmd> {
    let sha = load(server, STRAIGHTFORWARD_GCRA);
    let p = policy.params()[0];
    (0..CALLS as u64)
        .map(|i| {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&sha)
                .arg(1)
                .arg(format!("plain:{{{}}}", w.key(i)))
                .arg(p.interval_us)
                .arg(p.capacity)
                .arg(1);
            cmd
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let counting = std::env::var_os("TOLLGATE_BENCH_CALLGRIND").is_some();
    let (server, rounds, unit) = if counting {
        (Server::Callgrind(Callgrind::spawn()), 1, "instructions")
    } else {
        (
            Server::Plain(RedisServer::spawn()),
            tollgate_tests::bench_rounds(ROUNDS),
            "µs",
        )
    };
    // The store only names keys here; generous timeouts for a server
    // slowed down by valgrind.
    let store = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(
            RedisStore::builder()
                .connect_timeout(Duration::from_secs(10))
                .response_timeout(Duration::from_secs(10))
                .deadline(Duration::from_secs(10))
                .connect(server.url()),
        )
        .unwrap();
    if counting {
        let scripts = if std::env::var_os("TOLLGATE_BENCH_GENERAL").is_some() {
            "word and general scripts"
        } else {
            "word scripts"
        };
        println!(
            "Instructions redis-server executed per decision (callgrind), {CALLS} decisions, {scripts}\n"
        );
    } else {
        println!(
            "EVALSHA µs in Redis per decision (INFO commandstats): medians of {rounds} interleaved rounds of {CALLS} decisions\n"
        );
    }
    println!(
        "| workload | tollgate policy | straightforward GCRA ({unit}) | tollgate ({unit}) | ratio, median of rounds | rounds, straightforward / tollgate |"
    );
    println!("|---|---|---:|---:|---:|---|");
    for w in [Workload::Idle, Workload::Busy, Workload::Hot] {
        let mut policies: Vec<(String, Policy)> = Algorithm::ALL
            .into_iter()
            .map(|a| {
                (
                    format!("{a}, 1 limit"),
                    w.policy(&format!("cpu-{a}"), a, &[]),
                )
            })
            .collect();
        let three = w.policy(
            "cpu-gcra-3",
            Algorithm::Gcra,
            // Periods no workload uses: a policy holds one limit per period.
            &["100000000/2min", "1000000000/3h"],
        );
        policies.push(("gcra, 3 limits".to_owned(), three));
        let batched = [Algorithm::Gcra, Algorithm::FixedWindow]
            .into_iter()
            .flat_map(|a| {
                [16, 64].map(|n| {
                    (
                        format!("{a}, 1 limit, {n} per call"),
                        w.policy(&format!("cpu-{a}-{n}"), a, &[]),
                        n,
                    )
                })
            })
            .collect::<Vec<_>>();
        // The order the store settles on for this workload, and GCRA once
        // more in the other order.
        let settled = matches!(w, Workload::Idle);
        let other = if settled {
            "gcra, 1 limit, reading first"
        } else {
            "gcra, 1 limit, writing first"
        };
        let mut policies: Vec<(String, Policy, usize, Option<bool>)> =
            policies.into_iter().map(|(n, p)| (n, p, 1, None)).collect();
        policies.push((
            other.to_owned(),
            w.policy("cpu-gcra-other", Algorithm::Gcra, &[]),
            1,
            Some(!settled),
        ));
        policies.extend(batched.into_iter().map(|(n, p, k)| (n, p, k, None)));
        if let Ok(only) = std::env::var("TOLLGATE_BENCH_ONLY") {
            policies.retain(|(name, _, _, _)| only.split('|').any(|w| name.contains(w)));
        }
        if counting && std::env::var_os("TOLLGATE_BENCH_GENERAL").is_none() {
            // Under valgrind a run takes seconds: the word scripts only,
            // unless `TOLLGATE_BENCH_GENERAL` is set.
            policies.retain(|(_, p, _, _)| p.shape() != tollgate_core::Shape::Full);
        }
        let reference = w.policy("plain", Algorithm::Gcra, &[]);
        let plain_cmds = straightforward(&server, &reference, w);
        let our_cmds: Vec<_> = policies
            .iter()
            .map(|(_, p, per_call, order)| tollgate(&server, &store, p, w, *per_call, *order))
            .collect();
        let mut plain = Vec::new();
        let mut ours: Vec<Vec<f64>> = vec![Vec::new(); policies.len()];
        // Instructions do not vary from run to run: one reference count.
        let counted = counting.then(|| run(&server, &plain_cmds, CALLS));
        for _ in 0..rounds {
            for (i, cmds) in our_cmds.iter().enumerate() {
                // The reference next to each script, for paired ratios.
                plain.push(counted.unwrap_or_else(|| run(&server, &plain_cmds, CALLS)));
                ours[i].push(run(&server, cmds, CALLS));
            }
        }
        let workload = w.name();
        let fmt = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        for (i, ((name, _, _, _), rounds)) in policies.iter().zip(ours).enumerate() {
            let paired: Vec<f64> = plain
                .iter()
                .skip(i)
                .step_by(policies.len())
                .copied()
                .collect();
            let ratios = rounds.iter().zip(&paired).map(|(a, b)| a / b).collect();
            println!(
                "| {workload} | {name} | {:.2} | {:.2} | {:.2} | {} / {} |",
                median(paired.clone()),
                median(rounds.clone()),
                median(ratios),
                fmt(&paired),
                fmt(&rounds)
            );
        }
    }
}
