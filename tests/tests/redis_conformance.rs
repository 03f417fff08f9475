//! Memory and Redis give identical decisions: a property-based differential
//! test against real Redis, 1,000 random cases per algorithm, plus extremes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use tokio::runtime::Runtime;
use tollgate_core::{
    Algorithm, Decision, FakeClock, Key, Limit, MemoryStore, Outcome, Policy, Store, Timestamp,
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
/// the store runs by default, and one whose one-word script always reads
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
        let redis = connect(unique_prefix(name), false);
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
            for &(gap, cost) in &case.arrivals {
                self.clock.advance(Duration::from_micros(gap));
                from_memory.push(memory.check(&key, &case.policy, cost).await.unwrap());
                let decision = self.redis.check(&key, &case.policy, cost).await.unwrap();
                let read_first = self.reading_first.check(&key, &case.policy, cost);
                assert_eq!(
                    read_first.await.unwrap(),
                    decision,
                    "reading first decides as the default"
                );
                from_redis.push(decision);
            }
            (from_memory, from_redis)
        })
    }
}

#[derive(Debug, Clone)]
struct Case {
    policy: Policy,
    start: u64,
    arrivals: Vec<(u64, u64)>,
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

fn case(algorithm: Algorithm) -> impl Strategy<Value = Case> {
    let limits = prop::collection::vec(limit(), 1..=3);
    let burst = prop::option::of(prop_oneof![1u64..20, Just(u64::from(u32::MAX))]);
    // Start anywhere from 2001 to 2100 (2040 is 2_208_988_800 s).
    let start = 1_000_000_000_000_000u64..4_102_444_800_000_000;
    (limits, burst, start)
        .prop_flat_map(move |(limits, burst, start)| {
            let mut builder = Policy::builder("conf").algorithm(algorithm);
            for (count, period) in &limits {
                builder = builder.limit(Limit::new(*count, Duration::from_micros(*period)));
            }
            if algorithm.has_burst()
                && let Some(burst) = burst
            {
                builder = builder.burst(burst);
            }
            // Some generated rate policies overflow the supported span; fall
            // back to the same limits without the burst.
            let policy = builder.build().unwrap_or_else(|_| {
                let mut b = Policy::builder("conf").algorithm(algorithm);
                for (count, period) in &limits {
                    b = b.limit(Limit::new(*count, Duration::from_micros(*period)));
                }
                b.build().unwrap()
            });
            let shortest = limits.iter().map(|l| l.1).min().unwrap_or(1_000);
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
            (
                Just(policy),
                Just(start),
                prop::collection::vec((gap, cost), 1..25),
            )
        })
        .prop_map(|(policy, start, arrivals)| Case {
            policy,
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
    ($($test:ident => $algorithm:expr),* $(,)?) => {$(
        #[test]
        fn $test() {
            let harness = Harness::new(stringify!($test));
            proptest!(config(stringify!($test)), |(case in case($algorithm))| {
                let (memory, redis) = harness.run(&case);
                for (i, (m, r)) in memory.iter().zip(&redis).enumerate() {
                    prop_assert_eq!(m, r, "request {} of {:?}", i, case.arrivals);
                }
            });
        }
    )*};
}

conformance! {
    fixed_window_memory_and_redis_agree => Algorithm::FixedWindow,
    sliding_log_memory_and_redis_agree => Algorithm::SlidingLog,
    sliding_window_memory_and_redis_agree => Algorithm::SlidingWindow,
    token_bucket_memory_and_redis_agree => Algorithm::TokenBucket,
    leaky_bucket_memory_and_redis_agree => Algorithm::LeakyBucket,
    gcra_memory_and_redis_agree => Algorithm::Gcra,
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
                policy: policy.clone(),
                start,
                arrivals: vec![
                    (0, max - 1),
                    (0, 1),
                    (0, 0),
                    (0, max + 1),
                    (1, max),
                    (17 * DAY_US, 1 << 31),
                    (1_000_003, 2),
                    (29 * DAY_US, max),
                    (0, 0),
                ],
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
