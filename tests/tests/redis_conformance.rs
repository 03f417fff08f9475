//! Memory and Redis give identical decisions: a property-based differential
//! test against real Redis, 1,000 random cases per algorithm, as many again
//! with two configurations of a policy served in turn, plus extremes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use tokio::runtime::Runtime;
use tollgate_core::{
    Algorithm, Decision, FakeClock, Key, Limit, MemoryStore, Outcome, Policy, Settlement, Store,
    Timestamp,
};
use tollgate_redis::RedisStore;
use tollgate_tests::{require_redis, unique_prefix};

static RT: LazyLock<Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
});

/// Redis stores per algorithm test, driven by their own fake clock: one as
/// the store runs by default, and one whose one-time script always reads
/// first (the default starts by writing first, and reads first once keys
/// are busy).
struct Harness {
    clock: FakeClock,
    redis: RedisStore,
    reading_first: RedisStore,
}

impl Harness {
    fn new(name: &str) -> Self {
        let clock = FakeClock::default();
        let connect = |prefix: String, read_first: bool| {
            RT.block_on(async {
                let url = require_redis().await;
                let builder = RedisStore::builder()
                    .prefix(prefix)
                    .deadline(Duration::from_secs(10))
                    .response_timeout(Duration::from_secs(10))
                    .connect_timeout(Duration::from_secs(2))
                    .test_clock(clock.clone());
                let builder = if read_first {
                    builder.test_write_first(false)
                } else {
                    builder
                };
                builder.connect(url.as_str()).await.unwrap()
            })
        };
        // Prefixes have at most 64 characters.
        let redis = connect(unique_prefix(&name[..name.len().min(24)]), false);
        let reading_first = connect(unique_prefix("read-first"), true);
        Self {
            clock,
            redis,
            reading_first,
        }
    }

    /// Runs `case` on a fresh memory store and on Redis, returning both
    /// decision sequences.
    fn run(&self, case: &Case) -> (Vec<Decision>, Vec<Decision>) {
        static KEY: AtomicU64 = AtomicU64::new(0);
        let key = Key::user(format!("k{}", KEY.fetch_add(1, Ordering::Relaxed)));
        let memory = MemoryStore::builder()
            .clock(self.clock.clone())
            .build()
            .unwrap();
        self.clock.set(Timestamp::from_micros(case.start));
        RT.block_on(async {
            let (mut from_memory, mut from_redis) = (Vec::new(), Vec::new());
            // The last admitted request: its cost and when.
            let mut reserved = None;
            for &(gap, op, which) in &case.arrivals {
                self.clock.advance(Duration::from_micros(gap));
                let policy = &case.policies[which];
                let now = tollgate_core::Clock::now(&self.clock);
                let (from_m, from_r, from_read_first) = match op {
                    Op::Check(cost) => (
                        memory.check(&key, policy, cost).await,
                        self.redis.check(&key, policy, cost).await,
                        self.reading_first.check(&key, policy, cost).await,
                    ),
                    Op::Settle(actual) => {
                        let (cost, at) = reserved.unwrap_or((0, now));
                        let settlement = Settlement::new(cost, actual, at);
                        (
                            memory.settle(&key, policy, settlement).await,
                            self.redis.settle(&key, policy, settlement).await,
                            self.reading_first.settle(&key, policy, settlement).await,
                        )
                    }
                    Op::Block(micros) => {
                        let duration = Duration::from_micros(micros);
                        memory.block(&key, policy, duration).await.unwrap();
                        self.redis.block(&key, policy, duration).await.unwrap();
                        self.reading_first
                            .block(&key, policy, duration)
                            .await
                            .unwrap();
                        (
                            memory.status(&key, policy).await,
                            self.redis.status(&key, policy).await,
                            self.reading_first.status(&key, policy).await,
                        )
                    }
                };
                let decision = from_r.unwrap();
                assert_eq!(
                    from_read_first.unwrap(),
                    decision,
                    "reading first decides as the default"
                );
                if let (Op::Check(cost), true) = (op, decision.is_allowed()) {
                    reserved = Some((cost, decision.now()));
                }
                from_memory.push(from_m.unwrap());
                from_redis.push(decision);
            }
            (from_memory, from_redis)
        })
    }
}

/// What a case does at a key.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// Decides a request of this cost.
    Check(u64),
    /// Settles the last admitted request (or, before any, one of cost 0)
    /// at this actual cost.
    Settle(u64),
    /// Blocks the key for this many µs, then peeks.
    Block(u64),
}

/// Arrivals at one key under one or more configurations of one policy.
#[derive(Debug, Clone)]
struct Case {
    policies: Vec<Policy>,
    start: u64,
    /// `(gap before the request in µs, what it does, which policy)`.
    arrivals: Vec<(u64, Op, usize)>,
}

const DAY_US: u64 = 86_400_000_000;

fn limit() -> impl Strategy<Value = (u64, u64)> {
    let count = prop_oneof![
        6 => 1u64..12,
        1 => 12u64..1_000,
        1 => Just(u64::from(u32::MAX)),
        1 => (1u64 << 31)..=u64::from(u32::MAX),
    ];
    let period = prop_oneof![
        2 => Just(1_000u64),
        2 => 1_000u64..3_000_000,
        2 => Just(60_000_000u64),
        1 => Just(30 * DAY_US),
        1 => 1_000u64..=(366 * DAY_US),
    ];
    (count, period)
}

/// A policy named "conf" with `limits` (one per period: later ones of a
/// period already taken are left out) and, if it fits the supported span,
/// `burst`.
fn conf(algorithm: Algorithm, limits: &[(u64, u64)], burst: Option<u64>) -> Policy {
    let mut periods = Vec::new();
    let mut builder = Policy::builder("conf").algorithm(algorithm);
    for &(count, period) in limits {
        if !periods.contains(&period) {
            periods.push(period);
            builder = builder.limit(Limit::new(count, Duration::from_micros(period)));
        }
    }
    let with_burst = match burst {
        Some(burst) if algorithm.has_burst() => builder.clone().burst(burst).build().ok(),
        _ => None,
    };
    // Some generated rate policies overflow the supported span; fall back
    // to the same limits without the burst.
    with_burst.unwrap_or_else(|| builder.build().unwrap())
}

fn arrivals(shortest: u64, configs: usize) -> impl Strategy<Value = Vec<(u64, Op, usize)>> {
    let gap = prop_oneof![
        3 => Just(0u64),
        4 => 0..shortest / 3 + 2,
        2 => 0..shortest * 2 + 2,
        1 => 0..DAY_US,
    ];
    let cost = prop_oneof![
        8 => Just(1u64),
        1 => Just(0u64),
        2 => 2u64..6,
        1 => Just(u64::from(u32::MAX)),
        1 => (1u64 << 31)..(1u64 << 33),
    ];
    let actual = prop_oneof![
        6 => 0u64..12,
        1 => Just(u64::from(u32::MAX)),
        1 => (1u64 << 31)..(1u64 << 52),
    ];
    let block = prop_oneof![
        3 => 0..shortest * 2 + 2,
        1 => 0..DAY_US,
    ];
    let op = prop_oneof![
        12 => cost.prop_map(Op::Check),
        3 => actual.prop_map(Op::Settle),
        1 => block.prop_map(Op::Block),
    ];
    prop::collection::vec((gap, op, 0..configs), 1..25)
}

fn case(algorithm: Algorithm) -> impl Strategy<Value = Case> {
    let limits = prop::collection::vec(limit(), 1..=3);
    let burst = prop::option::of(prop_oneof![1u64..20, Just(u64::from(u32::MAX))]);
    // Start anywhere from 2001 to 2100 (2040 is 2_208_988_800 s).
    let start = 1_000_000_000_000_000u64..4_102_444_800_000_000;
    (limits, burst, start)
        .prop_flat_map(move |(limits, burst, start)| {
            let policy = conf(algorithm, &limits, burst);
            let shortest = limits.iter().map(|l| l.1).min().unwrap_or(1_000);
            (Just(vec![policy]), Just(start), arrivals(shortest, 1))
        })
        .prop_map(|(policies, start, arrivals)| Case {
            policies,
            start,
            arrivals,
        })
}

/// Two configurations of one policy, served in turn: the second keeps some
/// of the first's periods with other counts and bursts, adds and drops
/// others (so the key also moves between layouts), and now and then uses
/// another algorithm.
fn change_case(algorithm: Algorithm) -> impl Strategy<Value = Case> {
    let limits = prop::collection::vec(limit(), 1..=3);
    let others = prop::collection::vec((limit(), any::<bool>()), 1..=3);
    let burst = || prop::option::of(prop_oneof![1u64..20, Just(u64::from(u32::MAX))]);
    let other_algorithm = prop_oneof![
        6 => Just(algorithm),
        1 => prop::sample::select(Algorithm::ALL.to_vec()),
    ];
    let start = 1_000_000_000_000_000u64..4_102_444_800_000_000;
    (limits, others, burst(), burst(), other_algorithm, start)
        .prop_flat_map(move |(limits, others, b1, b2, algorithm2, start)| {
            let second: Vec<(u64, u64)> = others
                .iter()
                .enumerate()
                .map(|(i, &((count, period), keep))| match limits.get(i) {
                    Some(&(_, kept)) if keep => (count, kept),
                    _ => (count, period),
                })
                .collect();
            let policies = vec![conf(algorithm, &limits, b1), conf(algorithm2, &second, b2)];
            let shortest = limits
                .iter()
                .chain(&second)
                .map(|l| l.1)
                .min()
                .unwrap_or(1_000);
            (Just(policies), Just(start), arrivals(shortest, 2))
        })
        .prop_map(|(policies, start, arrivals)| Case {
            policies,
            start,
            arrivals,
        })
}

fn config(name: &str) -> ProptestConfig {
    ProptestConfig {
        cases: 1_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            // Relative to the tests crate.
            Box::leak(format!("tests/proptest-regressions/{name}.txt").into_boxed_str()),
        ))),
        ..ProptestConfig::default()
    }
}

macro_rules! conformance {
    ($($test:ident => $cases:expr),* $(,)?) => {$(
        #[test]
        fn $test() {
            let harness = Harness::new(stringify!($test));
            proptest!(config(stringify!($test)), |(case in $cases)| {
                let (memory, redis) = harness.run(&case);
                for (i, (m, r)) in memory.iter().zip(&redis).enumerate() {
                    prop_assert_eq!(m, r, "request {} of {:?}", i, case.arrivals);
                }
            });
        }
    )*};
}

conformance! {
    fixed_window_memory_and_redis_agree => case(Algorithm::FixedWindow),
    sliding_log_memory_and_redis_agree => case(Algorithm::SlidingLog),
    sliding_window_memory_and_redis_agree => case(Algorithm::SlidingWindow),
    token_bucket_memory_and_redis_agree => case(Algorithm::TokenBucket),
    leaky_bucket_memory_and_redis_agree => case(Algorithm::LeakyBucket),
    gcra_memory_and_redis_agree => case(Algorithm::Gcra),
    fixed_window_agrees_across_configurations => change_case(Algorithm::FixedWindow),
    sliding_log_agrees_across_configurations => change_case(Algorithm::SlidingLog),
    sliding_window_agrees_across_configurations => change_case(Algorithm::SlidingWindow),
    token_bucket_agrees_across_configurations => change_case(Algorithm::TokenBucket),
    leaky_bucket_agrees_across_configurations => change_case(Algorithm::LeakyBucket),
    gcra_agrees_across_configurations => change_case(Algorithm::Gcra),
}

#[test]
fn extremes_agree_for_every_algorithm() {
    let harness = Harness::new("extremes");
    // 2040-01-01T00:00:00Z through the test hook.
    let start = Timestamp::from_secs(2_208_988_800).as_micros() + 123_457;
    let max = u64::from(u32::MAX);
    for algorithm in Algorithm::ALL {
        let policy = Policy::builder("extreme")
            .algorithm(algorithm)
            .limit(Limit::new(max, Duration::from_secs(30 * 86_400)))
            .limit("3/s")
            .build()
            .unwrap();
        let huge = Policy::new(
            "huge",
            algorithm,
            Limit::new(max, Duration::from_secs(30 * 86_400)),
        )
        .unwrap();
        for policy in [policy, huge] {
            let case = Case {
                policies: vec![policy.clone()],
                start,
                arrivals: [
                    (0, max - 1),
                    (0, 1),
                    (0, 0),
                    (0, max + 1),
                    (1, max),
                    (17 * DAY_US, 1 << 31),
                    (1_000_003, 2),
                    (29 * DAY_US, max),
                    (0, 0),
                ]
                .map(|(gap, cost)| (gap, Op::Check(cost), 0))
                .to_vec(),
            };
            let (memory, redis) = harness.run(&case);
            assert_eq!(memory, redis, "{algorithm}, {policy}");
            // A cost above capacity is never satisfiable, on both stores.
            assert!(
                matches!(redis[3].outcome(), Outcome::CostExceedsCapacity { cost, .. } if cost == max + 1),
                "{algorithm}: {:?}",
                redis[3].outcome()
            );
            // A peek consumes nothing.
            assert_eq!(
                redis[2].limits(),
                redis[1].limits(),
                "{algorithm}: peek after an admit"
            );
        }
    }
}

#[test]
fn identical_responses_and_headers_through_the_layer() {
    use axum::Router;
    use axum::body::Body;
    use axum::routing::get;
    use tollgate::{GlobalKey, RateLimitLayer};
    use tower::ServiceExt;

    let harness = Harness::new("headers");
    let mut statuses = Vec::new();
    harness
        .clock
        .set(Timestamp::from_micros(1_700_000_012_345_678));
    RT.block_on(async {
        for algorithm in Algorithm::ALL {
            let policy = Policy::builder(format!("hdr-{algorithm}"))
                .algorithm(algorithm)
                .limit("3/2s")
                .limit("5/min")
                .build()
                .unwrap();
            let memory = MemoryStore::builder()
                .clock(harness.clock.clone())
                .build()
                .unwrap();
            let route = || Router::new().route("/", get(|| async { "ok" }));
            let on_memory =
                route().layer(RateLimitLayer::new(policy.clone(), GlobalKey).store(memory));
            let on_redis = route()
                .layer(RateLimitLayer::new(policy.clone(), GlobalKey).store(harness.redis.clone()));
            for step in 0..12u64 {
                harness.clock.advance(Duration::from_millis(step * 137));
                let mut replies = Vec::new();
                for app in [&on_memory, &on_redis] {
                    let res = app
                        .clone()
                        .oneshot(http::Request::new(Body::empty()))
                        .await
                        .unwrap();
                    let status = res.status().as_u16();
                    let headers: Vec<(String, String)> = res
                        .headers()
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
                        .collect();
                    let body = axum::body::to_bytes(Body::new(res.into_body()), 4096)
                        .await
                        .unwrap();
                    replies.push((status, headers, body));
                }
                assert_eq!(replies[0], replies[1], "{algorithm}, step {step}");
                statuses.push(replies[0].0);
            }
        }
    });
    // The scenario exercises both outcomes.
    assert!(
        statuses.contains(&200) && statuses.contains(&429),
        "{statuses:?}"
    );
}

/// The conformance suite of `tollgate-core`'s `testing` feature, as any
/// third-party store would run it: on both script orders.
#[test]
fn the_redis_store_passes_the_conformance_suite() {
    let harness = Harness::new("suite");
    for store in [&harness.redis, &harness.reading_first] {
        let report = RT
            .block_on(tollgate_core::testing::check_store(store, &harness.clock))
            .unwrap();
        assert_eq!((report.cases, report.decisions), (30, 30 * 240));
        // As many settlements and blocks as the memory store's run.
        assert_eq!((report.settlements, report.blocks), (572, 30));
    }
    // Boxed, as a service that picks its store at run time holds it; what
    // the store last knew of a key passes through too.
    let boxed = tollgate_core::BoxStore::new(harness.redis.clone());
    let report = RT
        .block_on(tollgate_core::testing::check_store(&boxed, &harness.clock))
        .unwrap();
    assert_eq!(report.decisions, 30 * 240);
    let policy = Policy::new("boxed", Algorithm::FixedWindow, "5/h").unwrap();
    let key = Key::user("boxed");
    let decided = RT.block_on(boxed.check(&key, &policy, 2)).unwrap();
    assert_eq!(boxed.last_known(&key, &policy), Some(decided));
}
