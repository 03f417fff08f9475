//! Top keys on real Redis: 10,000 keys under Zipf traffic (s = 1.1, a
//! seeded random sequence) through 2 instances, each with its own
//! sketches, publishing to one prefix. The merged top 10 limited keys are
//! the true top 10, in order wherever the true counts differ by more than
//! the stated error, and every reported count is within its error of the
//! truth. Every Redis key it writes has a TTL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::topkeys::{HashedLabel, KeyLabel, Ranking, TopKeys, WatchedStore};
use tollgate_core::{Algorithm, FakeClock, Key, Policy, Store, Timestamp};
use tollgate_redis::{RedisStore, RedisTopKeys};
use tollgate_tests::{require_redis, unique_prefix};

const KEYS: usize = 10_000;
const REQUESTS: usize = 40_000;
const COUNTERS: usize = 64;
const SHARDS: usize = 4;

/// SplitMix64: a seeded random sequence.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) as f64 / u64::MAX as f64
    }
}

/// `REQUESTS` draws of key ranks from Zipf(s = 1.1) over `KEYS` keys.
fn zipf_traffic(seed: u64) -> Vec<usize> {
    let weights: Vec<f64> = (1..=KEYS).map(|k| 1.0 / (k as f64).powf(1.1)).collect();
    let sum: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(KEYS);
    let mut acc = 0.0;
    for w in weights {
        acc += w / sum;
        cdf.push(acc);
    }
    let mut rng = Rng(seed);
    (0..REQUESTS)
        .map(|_| {
            let u = rng.unit();
            cdf.partition_point(|&c| c < u).min(KEYS - 1)
        })
        .collect()
}

async fn instance(
    url: &str,
    prefix: &str,
    clock: &FakeClock,
) -> (WatchedStore<RedisStore>, RedisTopKeys) {
    instance_publishing(url, prefix, clock, Duration::from_secs(3_600)).await
}

async fn instance_publishing(
    url: &str,
    prefix: &str,
    clock: &FakeClock,
    interval: Duration,
) -> (WatchedStore<RedisStore>, RedisTopKeys) {
    let store = RedisStore::builder()
        // A busy machine (CI beside two busy loops) may take longer than
        // the default 100 ms to connect: slowness, not what is tested.
        .connect_timeout(Duration::from_secs(5))
        .prefix(prefix)
        .deadline(Duration::from_secs(10))
        .response_timeout(Duration::from_secs(10))
        .test_clock(clock.clone())
        .connect(url)
        .await
        .unwrap();
    let top = TopKeys::builder()
        .counters(COUNTERS)
        .shards(SHARDS)
        .build()
        .unwrap();
    let published = RedisTopKeys::builder(&store, top.clone())
        .publish_interval(interval)
        .unwrap()
        .build()
        .unwrap();
    (WatchedStore::new(store, top), published)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_report_the_true_top_ten_limited_keys_within_the_error() {
    let url = require_redis().await;
    let prefix = unique_prefix("topkeys");
    let clock = FakeClock::new(Timestamp::from_secs(1_767_225_600));
    let a = instance(&url, &prefix, &clock).await;
    let b = instance(&url, &prefix, &clock).await;
    // Time stands still: each key is admitted 5 times, then limited.
    let policy = Arc::new(Policy::new("zipf", Algorithm::FixedWindow, "5/h").unwrap());
    let traffic = zipf_traffic(0x5eed);
    let stores = [Arc::new(a.0), Arc::new(b.0)];

    // 8 workers a instance, each its own slice of the traffic.
    let workers = 16;
    let mut tasks = Vec::new();
    for w in 0..workers {
        let store = stores[w % 2].clone();
        let policy = policy.clone();
        let ranks: Vec<usize> = traffic.iter().skip(w).step_by(workers).copied().collect();
        tasks.push(tokio::spawn(async move {
            let mut limited = HashMap::<usize, u64>::new();
            for rank in ranks {
                let key = Key::user(format!("user-{rank}"));
                if !store.check(&key, &policy, 1).await.unwrap().is_allowed() {
                    *limited.entry(rank).or_default() += 1;
                }
            }
            limited
        }));
    }
    // The truth, exactly: each key's denials, from every decision.
    let mut truth = HashMap::<String, u64>::new();
    let mut n = 0;
    for task in tasks {
        for (rank, count) in task.await.unwrap() {
            *truth
                .entry(HashedLabel::new().label(&Key::user(format!("user-{rank}"))))
                .or_default() += count;
            n += count;
        }
    }
    let mut true_top: Vec<(String, u64)> = truth.clone().into_iter().collect();
    true_top.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));

    // Instance b publishes; a merges it with its own counts.
    b.1.publish().await.unwrap();
    let merged = a.1.top("zipf", Ranking::Limited).await.unwrap();
    assert_eq!(merged.total(), n);
    let bound = merged.floor();
    // The stated bound: the sum of the instances' floors, each at most
    // N_i / m.
    let local = |t: &RedisTopKeys| t.local().summary("zipf", Ranking::Limited);
    let (sa, sb) = (local(&a.1), local(&b.1));
    assert_eq!(bound, sa.floor() + sb.floor());
    assert!(sa.floor() <= sa.total() / COUNTERS as u64);
    assert!(sb.floor() <= sb.total() / COUNTERS as u64);
    assert!(bound <= n / COUNTERS as u64);
    println!(
        "N = {n} limited decisions, bound {bound}; true top 10: {:?}",
        true_top.iter().take(11).map(|t| t.1).collect::<Vec<_>>()
    );
    println!(
        "reported: {:?}",
        merged
            .keys()
            .iter()
            .take(10)
            .map(|k| (k.count(), k.error()))
            .collect::<Vec<_>>()
    );

    // Every reported count within its error of the truth, every error
    // within the bound.
    for key in merged.keys() {
        let t = truth.get(key.label()).copied().unwrap_or(0);
        assert!(
            key.guaranteed() <= t && t <= key.count(),
            "{key:?}: true {t}"
        );
        assert!(key.error() <= bound, "{key:?}");
    }
    // Every key counted more than the bound is reported.
    for (label, &t) in &truth {
        if t > bound {
            assert!(
                merged.keys().iter().any(|k| k.label() == label),
                "{label} {t}"
            );
        }
    }
    // The top 10: the true set, and the true order at every place whose
    // true count is more than the bound away from its neighbours'.
    let reported: Vec<&str> = merged.keys().iter().take(10).map(|k| k.label()).collect();
    let (mut ordered, mut in_set) = (0, 0);
    for (i, (label, count)) in true_top.iter().take(10).enumerate() {
        let apart = |j: Option<usize>| {
            j.and_then(|j| true_top.get(j))
                .is_none_or(|(_, c)| c.abs_diff(*count) > bound)
        };
        if apart(i.checked_sub(1)) && apart(Some(i + 1)) {
            assert_eq!(reported[i], label, "place {i}");
            ordered += 1;
        }
        if count.abs_diff(true_top[10].1) > bound {
            assert!(reported.contains(&label.as_str()), "{label}");
            in_set += 1;
        }
    }
    println!("{ordered} places of the top 10 checked in order, {in_set} keys in the set");
    // The true counts of this seed's first seven keys are 150 or more
    // apart, far beyond the bound (about 40 here, at most N / m): the
    // check above is no empty one.
    assert!(
        ordered >= 6 && in_set >= 9,
        "{ordered} {in_set} (bound {bound})"
    );

    // Every key it wrote has a TTL.
    a.1.publish().await.unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:{{topkeys}}:*"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(keys.len(), 3, "{keys:?}"); // the index and two hashes
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }
    assert_eq!(a.1.policies().await.unwrap(), ["zipf"]);
}

/// The Redis keys of the top keys under `prefix`, sorted.
async fn written(url: &str, prefix: &str) -> Vec<String> {
    let client = redis::Client::open(url).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:{{topkeys}}:*"))
        .query_async(&mut con)
        .await
        .unwrap();
    keys.sort();
    keys
}

/// Each label's count, highest first.
fn counts(summary: &tollgate_core::topkeys::Summary) -> Vec<(String, u64)> {
    let keys = summary.keys().iter();
    keys.map(|k| (k.label().to_owned(), k.count())).collect()
}

/// A read merges the other instances' publications with this one's counts
/// as they are, and writes nothing: each read published this instance's
/// summaries first, and a dashboard asking for every policy's every second
/// made Redis rewrite them all as many times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_writes_nothing_and_counts_this_instance_as_it_is_now() {
    let url = require_redis().await;
    let prefix = unique_prefix("topkeys-read");
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
    let (a, b) = (
        instance(&url, &prefix, &clock).await,
        instance(&url, &prefix, &clock).await,
    );
    let label = |user: &str| HashedLabel::new().label(&Key::user(user));
    check(&b.0, "bob", 4).await;
    b.1.publish().await.unwrap();
    check(&a.0, "ada", 3).await;
    let before = written(&url, &prefix).await;
    assert_eq!(before.len(), 2, "the index and b's hash: {before:?}");

    let top = a.1.top("reads", Ranking::Limited).await.unwrap();
    assert_eq!(counts(&top), [(label("bob"), 3), (label("ada"), 2)]);
    check(&a.0, "ada", 2).await;
    let top = a.1.top("reads", Ranking::Limited).await.unwrap();
    assert_eq!(counts(&top), [(label("ada"), 4), (label("bob"), 3)]);
    assert_eq!(a.1.policies().await.unwrap(), ["reads"]);
    assert_eq!(written(&url, &prefix).await, before, "a wrote nothing");
}

/// An instance that publishes less often than another stays in the index
/// while its publication lives: one publishing every 100 ms dropped from
/// the index every instance whose last publication was older than its own
/// TTL, and their counts went missing from every merged read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_publishing_less_often_stays_in_the_index() {
    let url = require_redis().await;
    let prefix = unique_prefix("topkeys-intervals");
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
    let slow = instance(&url, &prefix, &clock).await;
    check(&slow.0, "ada", 3).await;
    slow.1.publish().await.unwrap();
    // Its publication was made ten seconds ago, by Redis's time: within
    // its TTL of three hours, past the fast one's of 300 ms.
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let index = slow.1.index_key().to_owned();
    let members = async |con: &mut redis::aio::MultiplexedConnection| -> Vec<String> {
        let zrange = redis::cmd("ZRANGE").arg(&index).arg(0).arg(-1).clone();
        zrange.query_async(con).await.unwrap()
    };
    let slow_member = members(&mut con).await;
    assert_eq!(slow_member.len(), 1);
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
    let ten_seconds_ago = secs * 1_000 + micros / 1_000 - 10_000;
    let () = redis::cmd("ZADD")
        .arg(&index)
        .arg("XX")
        .arg(ten_seconds_ago)
        .arg(&slow_member[0])
        .query_async(&mut con)
        .await
        .unwrap();

    let fast = instance_publishing(&url, &prefix, &clock, Duration::from_millis(100)).await;
    fast.1.publish().await.unwrap();
    let both = members(&mut con).await;
    assert_eq!(both.len(), 2, "{both:?}");
    let top = fast.1.top("reads", Ranking::Limited).await.unwrap();
    assert_eq!(top.keys().len(), 1);
    assert_eq!(top.keys()[0].count(), 2);
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&index)
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(
        ttl > 3_600_000,
        "the index lives as long as the slow publication: {ttl}"
    );
}

/// `n` checks of `user` under a policy of 1 a minute: `n - 1` limited.
async fn check(store: &WatchedStore<RedisStore>, user: &str, n: usize) {
    let policy = Policy::new("reads", Algorithm::FixedWindow, "1/min").unwrap();
    for _ in 0..n {
        store.check(&Key::user(user), &policy, 1).await.unwrap();
    }
}
