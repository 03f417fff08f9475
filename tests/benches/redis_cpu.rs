//! Redis CPU per decision: `INFO commandstats` usec_per_call of EVALSHA for
//! every algorithm's script as `RedisStore` sends it, next to a
//! straightforward GCRA script (GET the TAT, compute, `SET ... PX`) in the
//! same run, against one private `redis-server`. The decisions are the
//! ones the store sends (same scripts, key names and arguments), built
//! beforehand and pipelined, so that the client's own work is the same for
//! every script and the figures are Redis's alone.
//!
//! Three workloads (see `Workload`): idle keys, busy keys and one key over
//! its limit. GCRA is measured once more with 16 and with 64 decisions per
//! call, as the store batches concurrent decisions. Five interleaved rounds; each ratio is the median of the
//! rounds' ratios to the reference run just before.
//!
//! Run with: `cargo bench -p tollgate-tests --bench redis_cpu`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use tollgate_core::{Algorithm, Key, Policy};
use tollgate_redis::{RedisStore, script_args, script_source};
use tollgate_tests::RedisServer;

/// The straightforward GCRA script a user would write first.
const STRAIGHTFORWARD_GCRA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new_tat = tat + cost * interval
local allow_at = new_tat - burst * interval
if allow_at > now then
  return { 0, 0, allow_at - now }
end
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', math.ceil((new_tat - now) / 1000))
return { 1, math.floor((now - allow_at) / interval), 0 }
";

/// Decisions per measurement.
const CALLS: usize = 30_000;
const ROUNDS: usize = 5;

#[derive(Clone, Copy)]
enum Workload {
    /// 10,000 keys at random, 1000/s each: at every request the key's
    /// previous time has passed (the common case of a limiter).
    Idle,
    /// 10,000 keys at random, 1/s each with a burst of a million: every
    /// request is admitted while the key's time is still ahead of now.
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
            Workload::Busy if algorithm.has_burst() => builder.limit("1/s").burst(1_000_000),
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
/// FLUSHALL and a CONFIG RESETSTAT, and returns EVALSHA's µs per decision.
/// The commands are built beforehand, so the client does the same little
/// work for every script and competes as little as possible for the CPU.
fn run(server: &RedisServer, commands: &[redis::Cmd], decisions: usize) -> f64 {
    let mut con = server.connection();
    reset(&mut con);
    for batch in commands.chunks(64) {
        let mut pipe = redis::pipe();
        for cmd in batch {
            pipe.add_command(cmd.clone());
        }
        let _: Vec<redis::Value> = pipe.query(&mut con).unwrap();
    }
    usec_per_decision(&mut con, decisions)
}

fn load(server: &RedisServer, source: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(source)
        .query(&mut server.connection())
        .unwrap()
}

/// The decisions `RedisStore` sends for `policy`: the same script, keys and
/// arguments (on Redis's clock, one unit each), `per_call` decisions per
/// call as the store batches them under concurrent load (1: one each, as
/// an idle store sends them; only single-limit GCRA, token-bucket and
/// leaky-bucket policies are ever batched).
fn tollgate(
    server: &RedisServer,
    store: &RedisStore,
    policy: &Policy,
    w: Workload,
    per_call: usize,
) -> Vec<redis::Cmd> {
    let sha = load(server, script_source(policy).unwrap());
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
fn straightforward(server: &RedisServer, policy: &Policy, w: Workload) -> Vec<redis::Cmd> {
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
    let server = RedisServer::spawn();
    let store = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(RedisStore::connect(&server.url()))
        .unwrap();
    println!(
        "EVALSHA µs in Redis per decision (INFO commandstats): medians of {ROUNDS} interleaved rounds of {CALLS} decisions\n"
    );
    println!(
        "| workload | tollgate policy | straightforward GCRA (µs) | tollgate (µs) | ratio, median of rounds | rounds, straightforward / tollgate |"
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
            &["100000000/min", "1000000000/h"],
        );
        policies.push(("gcra, 3 limits".to_owned(), three));
        let batched = [16, 64].map(|n| {
            (
                format!("gcra, 1 limit, {n} per call"),
                w.policy(&format!("cpu-gcra-{n}"), Algorithm::Gcra, &[]),
                n,
            )
        });
        let mut policies: Vec<(String, Policy, usize)> =
            policies.into_iter().map(|(n, p)| (n, p, 1)).collect();
        policies.extend(batched);
        let reference = w.policy("plain", Algorithm::Gcra, &[]);
        let plain_cmds = straightforward(&server, &reference, w);
        let our_cmds: Vec<_> = policies
            .iter()
            .map(|(_, p, per_call)| tollgate(&server, &store, p, w, *per_call))
            .collect();
        let mut plain = Vec::new();
        let mut ours: Vec<Vec<f64>> = vec![Vec::new(); policies.len()];
        for _ in 0..ROUNDS {
            for (i, cmds) in our_cmds.iter().enumerate() {
                // The reference next to each script, for paired ratios.
                plain.push(run(&server, &plain_cmds, CALLS));
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
        for (i, ((name, _, _), rounds)) in policies.iter().zip(ours).enumerate() {
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
