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
        let key = next_key();
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
                let (m, r) = self.apply(&memory, &key, policy, op, reserved).await;
                if let (Op::Check(cost), true) = (op, r.is_allowed()) {
                    reserved = Some((cost, r.now()));
                }
                from_memory.push(m);
                from_redis.push(r);
            }
            (from_memory, from_redis)
        })
    }

    /// Does `op` at `key` on `memory` and on Redis, now; a settlement
    /// settles `reserved` (the last admitted request's cost and time), or
    /// one of cost 0. Returns the decisions of memory and Redis, after
    /// checking that Redis decides alike in both script orders.
    async fn apply(
        &self,
        memory: &MemoryStore,
        key: &Key,
        policy: &Policy,
        op: Op,
        reserved: Option<(u64, Timestamp)>,
    ) -> (Decision, Decision) {
        let now = tollgate_core::Clock::now(&self.clock);
        let (from_m, from_r, from_read_first) = match op {
            Op::Check(cost) => (
                memory.check(key, policy, cost).await,
                self.redis.check(key, policy, cost).await,
                self.reading_first.check(key, policy, cost).await,
            ),
            Op::Settle(actual) => {
                let (cost, at) = reserved.unwrap_or((0, now));
                let settlement = Settlement::new(cost, actual, at);
                (
                    memory.settle(key, policy, settlement).await,
                    self.redis.settle(key, policy, settlement).await,
                    self.reading_first.settle(key, policy, settlement).await,
                )
            }
            Op::Block(micros) => {
                let duration = Duration::from_micros(micros);
                memory.block(key, policy, duration).await.unwrap();
                self.redis.block(key, policy, duration).await.unwrap();
                self.reading_first
                    .block(key, policy, duration)
                    .await
                    .unwrap();
                (
                    memory.status(key, policy).await,
                    self.redis.status(key, policy).await,
                    self.reading_first.status(key, policy).await,
                )
            }
        };
        let decision = from_r.unwrap();
        assert_eq!(
            from_read_first.unwrap(),
            decision,
            "reading first decides as the default"
        );
        (from_m.unwrap(), decision)
    }

    /// Runs the history of `case` at two keys alike, then settles its last
    /// admitted request at `a` on one key and `b` on the other, and decides
    /// the next request at each. Returns, per key, the memory store's and
    /// Redis's decisions of the settlement and of the next request.
    fn settle_two(&self, case: &SettleCase) -> [[(Decision, Decision); 2]; 2] {
        let keys = [next_key(), next_key()];
        let memory = MemoryStore::builder()
            .clock(self.clock.clone())
            .build()
            .unwrap();
        let policy = &case.history.policies[0];
        self.clock.set(Timestamp::from_micros(case.history.start));
        RT.block_on(async {
            let mut reserved = None;
            for &(gap, op, _) in &case.history.arrivals {
                self.clock.advance(Duration::from_micros(gap));
                let mut decided = Vec::new();
                for key in &keys {
                    decided.push(self.apply(&memory, key, policy, op, reserved).await);
                }
                assert_eq!(decided[0], decided[1], "the two keys share a history");
                let (m, r) = &decided[0];
                assert_eq!(m, r, "{op:?} in the history");
                if let (Op::Check(cost), true) = (op, r.is_allowed()) {
                    reserved = Some((cost, r.now()));
                }
            }
            self.clock.advance(Duration::from_micros(case.then));
            let (a, b) = case.costs;
            let settled = [
                self.apply(&memory, &keys[0], policy, Op::Settle(a), reserved)
                    .await,
                self.apply(&memory, &keys[1], policy, Op::Settle(b), reserved)
                    .await,
            ];
            let (gap, cost) = case.next;
            self.clock.advance(Duration::from_micros(gap));
            let next = [
                self.apply(&memory, &keys[0], policy, Op::Check(cost), None)
                    .await,
                self.apply(&memory, &keys[1], policy, Op::Check(cost), None)
                    .await,
            ];
            [settled, next]
        })
    }
}

/// A key no other case uses.
fn next_key() -> Key {
    static KEY: AtomicU64 = AtomicU64::new(0);
    Key::user(format!("k{}", KEY.fetch_add(1, Ordering::Relaxed)))
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

/// A history at a key, then two actual costs `a < b` of its last admitted
/// request: the gap before the settlement, and the gap to the next
/// request and its cost.
#[derive(Debug, Clone)]
struct SettleCase {
    history: Case,
    then: u64,
    costs: (u64, u64),
    next: (u64, u64),
}

/// The most a debt reaches: 2^50 µs, as `Settlement` documents.
const CAP_US: u64 = 1 << 50;

/// A cost anywhere in the `u64` range, most often near where arithmetic
/// could wrap or saturate: 2^50 units (the cap of an amount), `near` (the
/// units of the first limit's interval that make 2^50 µs), 2^53 (the
/// integers Lua holds exactly), 2^63 and `u64::MAX`; and small ones.
fn any_cost(near: u64) -> impl Strategy<Value = u64> {
    let around = |x: u64| x.saturating_sub(40)..=x.saturating_add(40);
    prop_oneof![
        3 => 0u64..24,
        3 => any::<u64>(),
        1 => around(u64::from(u32::MAX)),
        2 => around(near),
        2 => around(1 << 50),
        1 => around(1 << 53),
        1 => around(1 << 63),
        2 => around(u64::MAX),
    ]
}

fn settle_case(algorithm: Algorithm) -> impl Strategy<Value = SettleCase> {
    case(algorithm).prop_flat_map(|history| {
        let p = &history.policies[0].params()[0];
        let near = (CAP_US / p.interval_us.max(1)).max(1);
        let gap = || prop_oneof![3 => Just(0u64), 3 => 0u64..2_000_000, 1 => 0..DAY_US];
        let costs = (any_cost(near), any_cost(near))
            .prop_filter("two costs", |(a, b)| a != b)
            .prop_map(|(a, b)| (a.min(b), a.max(b)));
        let cost = prop_oneof![6 => Just(1u64), 1 => Just(0u64), 2 => 2u64..6];
        (Just(history), gap(), costs, (gap(), cost)).prop_map(|(history, then, costs, next)| {
            SettleCase {
                history,
                then,
                costs,
                next,
            }
        })
    })
}

/// `larger`, the settlement of more than `smaller` from the same state at
/// the same instant: no limit has more remaining.
fn no_more_remaining(smaller: &Decision, larger: &Decision) -> Result<(), String> {
    for (s, l) in smaller.limits().iter().zip(larger.limits()) {
        if l.remaining() > s.remaining() {
            return Err(format!(
                "limit {}: {} remaining after the larger cost, {} after the smaller",
                s.index(),
                l.remaining(),
                s.remaining()
            ));
        }
    }
    Ok(())
}

/// `larger`, the decision of the request after settling more than
/// `smaller` did: if it is admitted, so is `smaller`, with no longer a
/// delay; if it is denied, `smaller` is admitted or retried no later.
fn no_earlier(smaller: &Decision, larger: &Decision) -> Result<(), String> {
    match (smaller.is_allowed(), larger.is_allowed()) {
        (true, true) if larger.delay() < smaller.delay() => Err(format!(
            "delayed {:?} after the larger cost, {:?} after the smaller",
            larger.delay(),
            smaller.delay()
        )),
        (false, true) => Err("admitted after the larger cost, denied after the smaller".into()),
        (false, false) => match (smaller.retry_after(), larger.retry_after()) {
            (Some(s), Some(l)) if l < s => Err(format!(
                "retry in {l:?} after the larger cost, {s:?} after the smaller"
            )),
            (s, l) if s.is_some() != l.is_some() => Err(format!("retry {l:?} against {s:?}")),
            _ => Ok(()),
        },
        (true, false) | (true, true) => Ok(()),
    }
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

/// Per algorithm: two keys with one history, settled at two costs from the
/// whole `u64` range; memory and Redis agree on every decision, and on both
/// the larger cost leaves no more remaining and no earlier retry.
macro_rules! monotonic_settling {
    ($($test:ident => $algorithm:expr),* $(,)?) => {$(
        #[test]
        fn $test() {
            let harness = Harness::new(stringify!($test));
            let config = ProptestConfig { cases: 300, ..config(stringify!($test)) };
            proptest!(config, |(case in settle_case($algorithm))| {
                let [settled, next] = harness.settle_two(&case);
                let (a, b) = case.costs;
                for (i, (m, r)) in settled.iter().chain(&next).enumerate() {
                    prop_assert_eq!(m, r, "decision {} after settling {} and {}", i, a, b);
                }
                no_more_remaining(&settled[0].1, &settled[1].1)
                    .map_err(|e| TestCaseError::fail(format!("settled {a} then {b}: {e}")))?;
                no_earlier(&next[0].1, &next[1].1)
                    .map_err(|e| TestCaseError::fail(format!("next after {a} then {b}: {e}")))?;
            });
        }
    )*};
}

monotonic_settling! {
    fixed_window_larger_settled_costs_never_leave_more => Algorithm::FixedWindow,
    sliding_log_larger_settled_costs_never_leave_more => Algorithm::SlidingLog,
    sliding_window_larger_settled_costs_never_leave_more => Algorithm::SlidingWindow,
    token_bucket_larger_settled_costs_never_leave_more => Algorithm::TokenBucket,
    leaky_bucket_larger_settled_costs_never_leave_more => Algorithm::LeakyBucket,
    gcra_larger_settled_costs_never_leave_more => Algorithm::Gcra,
}

/// A key settled at `u64::MAX` is denied next: a bucket or GCRA until its
/// debt, saturated at 2^50 µs, is paid off; a window until the debt ages
/// out. On memory and Redis alike, in every compact form and the general
/// scripts (a policy of one limit, and of two).
#[test]
fn a_key_settled_at_u64_max_is_denied_next_with_a_retry_at_the_cap() {
    let harness = Harness::new("u64-max");
    // The start of a minute; 10 a minute is a unit every 6 s.
    let start = Timestamp::from_secs(1_700_000_040).as_micros();
    // With 2/s beside it, a unit every 0.5 s, a bucket's debt holds the
    // next request until all but 1 unit of it is paid off there; windows
    // still wait for the minute's.
    let at_cap = Duration::from_micros(CAP_US - 9 * 6_000_000);
    let at_cap_of_2_per_s = Duration::from_micros(CAP_US - 500_000);
    let (minute, two_minutes) = (Duration::from_secs(60), Duration::from_secs(120));
    let retries = [
        (Algorithm::Gcra, [at_cap, at_cap_of_2_per_s]),
        (Algorithm::TokenBucket, [at_cap, at_cap_of_2_per_s]),
        (Algorithm::LeakyBucket, [at_cap, at_cap_of_2_per_s]),
        (Algorithm::FixedWindow, [minute; 2]),
        (Algorithm::SlidingWindow, [two_minutes; 2]),
        (Algorithm::SlidingLog, [minute; 2]),
    ];
    for (algorithm, retries) in retries {
        let one = Policy::new("max", algorithm, "10/min").unwrap();
        let two = Policy::builder("max2")
            .algorithm(algorithm)
            .limit("10/min")
            .limit("2/s")
            .build()
            .unwrap();
        for (policy, retry) in [one, two].into_iter().zip(retries) {
            let case = Case {
                policies: vec![policy.clone()],
                start,
                arrivals: vec![
                    (0, Op::Check(1), 0),
                    (0, Op::Settle(u64::MAX), 0),
                    (0, Op::Check(1), 0),
                ],
            };
            let (memory, redis) = harness.run(&case);
            assert_eq!(memory, redis, "{policy}");
            assert_eq!(redis[1].remaining(), 0, "{policy}");
            assert_eq!(redis[2].retry_after(), Some(retry), "{policy}");
            assert!(!redis[2].is_allowed(), "{policy}");
        }
    }
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
