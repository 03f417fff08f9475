//! The lease fence across separate OS processes, on the real clock: once
//! an operator's block returns, the instances that acknowledged it admit
//! nothing more, and an instance that was paused (SIGSTOP) through it
//! spends at most what it held (its two leases of the key), and only
//! until they end; one that never hears the block (subscribed through
//! another server) spends at most what its leases held when it landed.
//!
//! The instances are this test binary run again as children, each with
//! its own Redis connections and lease table, hammering one hot key and
//! noting when each admitted check began.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use tollgate::{Algorithm, Key, Policy, Store};
use tollgate_redis::{LeasedStore, RedisStore};
use tollgate_tests::{require_redis, unique_prefix};

/// Each instance's lease interval: a lease lives at most twice this.
const INTERVAL: Duration = Duration::from_millis(200);
/// Each lease holds at most the capacity over this share.
const SHARE: u64 = 16;
const LIMIT: &str = "600000/min";
const CAPACITY: u64 = 600_000;

fn policy() -> Policy {
    Policy::new("fence", Algorithm::Gcra, LIMIT).unwrap()
}

fn micros_now() -> u64 {
    u64::try_from(SystemTime::UNIX_EPOCH.elapsed().unwrap().as_micros()).unwrap()
}

/// A Redis store under `prefix`.
async fn redis(url: &str, prefix: &str) -> RedisStore {
    // A generous deadline: four busy processes share two cores here, and a
    // slow answer must not read as a failure.
    RedisStore::builder()
        .prefix(prefix)
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .unwrap()
}

/// The leases of every instance under `prefix`, of `interval`.
fn leases(prefix: &str, interval: Duration) -> tollgate_redis::LeasedStoreBuilder {
    LeasedStore::builder()
        .interval(interval)
        .share(SHARE)
        .ack_timeout(Duration::from_millis(500))
        .channel(format!("{prefix}:leases"))
}

async fn instance(url: &str, prefix: &str) -> LeasedStore<RedisStore> {
    // Subscribed through the store's own Redis, the URL not given again
    // (the other lease tests give it to `connect`).
    leases(prefix, INTERVAL)
        .wrap(redis(url, prefix).await)
        .await
}

/// One child instance: hammers the key until told `stop <T>` on stdin,
/// then prints how many admitted checks began after T, and when the last
/// one began.
#[tokio::test]
#[ignore = "a child process of a_paused_instance_spends_at_most_what_it_held"]
async fn lease_fence_child() {
    let (Ok(url), Ok(prefix)) = (
        std::env::var("TOLLGATE_FENCE_URL"),
        std::env::var("TOLLGATE_FENCE_PREFIX"),
    ) else {
        panic!("run by a_paused_instance_spends_at_most_what_it_held, which sets its variables");
    };
    let store = instance(&url, &prefix).await;
    let stop = Arc::new(AtomicBool::new(false));
    let fence = Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
    {
        let (stop, fence) = (stop.clone(), fence.clone());
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let line = line.unwrap_or_default();
                if let Some(t) = line.strip_prefix("stop ") {
                    fence.store(t.trim().parse().unwrap(), Ordering::Release);
                    stop.store(true, Ordering::Release);
                    return;
                }
            }
        });
    }
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let (store, stop) = (store.clone(), stop.clone());
            tokio::spawn(async move {
                let (key, policy) = (Key::user("hot"), policy());
                let mut began = Vec::with_capacity(1 << 20);
                while !stop.load(Ordering::Acquire) {
                    let at = micros_now();
                    // A failure admits nothing (no failure policy here).
                    if store
                        .check(&key, &policy, 1)
                        .await
                        .is_ok_and(|d| d.is_allowed())
                    {
                        began.push(at);
                    }
                    tokio::task::yield_now().await;
                }
                began
            })
        })
        .collect();
    let mut said_ready = false;
    while !stop.load(Ordering::Acquire) {
        if !said_ready && store.outstanding().0 > 0 {
            // On a line of its own: the harness has begun one.
            println!("\nready");
            std::io::stdout().flush().unwrap();
            said_ready = true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let fence = fence.load(Ordering::Acquire);
    let mut after = 0u64;
    let mut last = 0u64;
    for task in tasks {
        for at in task.await.unwrap() {
            if at > fence {
                after += 1;
                last = last.max(at);
            }
        }
    }
    println!("\nafter {after} last {last}");
    std::io::stdout().flush().unwrap();
}

struct Instance {
    child: Child,
    stdin: ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Instance {
    fn spawn(url: &str, prefix: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "lease_fence_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("TOLLGATE_FENCE_URL", url)
            .env("TOLLGATE_FENCE_PREFIX", prefix)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            stdin,
            lines,
        }
    }

    /// The next line the child prints that starts with `word`, within
    /// 60 s.
    fn expect(&mut self, word: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(word) => return line,
                Ok(_) => {}
                Err(error) => panic!("child {} did not say {word:?}: {error}", self.child.id()),
            }
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal}");
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_instance_spends_at_most_what_it_held() {
    let url = require_redis().await;
    let prefix = unique_prefix("lease-fence-procs");
    let mut children: Vec<Instance> = (0..3).map(|_| Instance::spawn(&url, &prefix)).collect();
    for child in &mut children {
        child.expect("ready");
    }
    let operator = instance(&url, &prefix).await;
    let (key, policy) = (Key::user("hot"), policy());

    // The first child stops answering, leases and all; the operator blocks
    // the key while it is stopped, and gives up waiting for its
    // acknowledgement after ack_timeout.
    children[0].signal("-STOP");
    operator
        .block(&key, &policy, Duration::from_secs(60))
        .await
        .unwrap();
    let fence = micros_now();
    children[0].signal("-CONT");
    // Past every lease's end: each was asked for before the fence and
    // lives at most twice the interval.
    tokio::time::sleep(INTERVAL * 3).await;
    let lifetime = u64::try_from((INTERVAL * 2).as_micros()).unwrap();

    let mut results = Vec::new();
    for child in &mut children {
        writeln!(child.stdin, "stop {fence}").unwrap();
        let line = child.expect("after");
        let fields: Vec<u64> = line
            .split(' ')
            .filter_map(|field| field.parse().ok())
            .collect();
        results.push((fields[0], fields[1]));
    }
    eprintln!("fence results: {results:?}");
    let cap = CAPACITY / SHARE;
    let (paused_after, paused_last) = results[0];
    assert!(
        paused_after <= 2 * cap,
        "the paused instance admitted {paused_after}, more than its two leases ({})",
        2 * cap
    );
    assert!(
        paused_after == 0 || paused_last <= fence + lifetime,
        "the paused instance admitted {} µs after the fence, past its leases' lifetime",
        paused_last - fence
    );
    for (i, &(after, _)) in results.iter().enumerate().skip(1) {
        assert_eq!(
            after, 0,
            "instance {i} acknowledged, yet admitted after the fence"
        );
    }
    let denied = operator.check(&key, &policy, 1).await.unwrap();
    assert!(!denied.is_allowed());
}

/// An instance that never hears the invalidation (subscribed elsewhere,
/// as one on another node of a cluster would be, or whose subscription
/// stalls) is the bound's worst case: once the block is in the store it
/// admits at most what its leases held, at most two leases of the key,
/// and only until they end, twice the interval after they were sent.
/// Then the store's block answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_never_hears_the_block_spends_at_most_what_it_held() {
    let url = require_redis().await;
    let elsewhere = tollgate_tests::RedisServer::spawn();
    let prefix = unique_prefix("lease-fence-silent");
    // A lease lives two intervals: long enough that the silent instance's
    // leases outlive the block on a loaded machine.
    let interval = Duration::from_secs(1);
    let leased = |bus: String| {
        let (url, prefix) = (url.clone(), prefix.clone());
        async move {
            let redis = redis(&url, &prefix).await;
            leases(&prefix, interval)
                .connect(redis, &bus)
                .await
                .unwrap()
        }
    };
    let operator = leased(url.clone()).await;
    let silent = leased(elsewhere.url()).await;
    let (key, policy) = (Key::user("hot"), policy());
    // Both subscribed, each on its own server. The silent instance takes
    // the key's traffic until its leases are sized to it: a thousand
    // units or more.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while silent.outstanding().1 < 1_000 {
        assert!(std::time::Instant::now() < deadline, "no lease within 10 s");
        assert!(silent.check(&key, &policy, 1).await.unwrap().is_allowed());
    }
    operator
        .block(&key, &policy, Duration::from_secs(60))
        .await
        .unwrap();
    let blocked = std::time::Instant::now();
    // What it holds now, every lease it asked for granted or refused.
    silent.wait_for_grants().await;
    let (leases, held) = silent.outstanding();
    assert!(
        held > 0,
        "the silent instance held no lease when the block landed"
    );
    assert!(leases <= 2, "{leases} leases of one key");
    let mut admitted = 0;
    let mut last = blocked;
    loop {
        let decision = silent.check(&key, &policy, 1).await.unwrap();
        if !decision.is_allowed() {
            assert!(decision.is_blocked(), "denied by the block: {decision:?}");
            break;
        }
        admitted += 1;
        last = std::time::Instant::now();
        assert!(
            admitted <= held,
            "the silent instance admitted more than the {held} units it held"
        );
    }
    eprintln!("silent instance: held {held} in {leases} leases, admitted {admitted}");
    assert!(admitted > 0, "its leases were spent after the block");
    assert!(admitted <= 2 * (CAPACITY / SHARE));
    assert!(
        last <= blocked + interval * 2,
        "admitted {:?} after the block, past its leases' lifetime",
        last - blocked
    );
    // Then the block answers for it, as for everyone.
    assert!(operator.check(&key, &policy, 1).await.unwrap().is_blocked());
    assert!(silent.check(&key, &policy, 1).await.unwrap().is_blocked());
}
