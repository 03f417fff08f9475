//! Automatic batching: concurrent decisions of single-limit GCRA,
//! token-bucket and leaky-bucket policies share script calls, and so do
//! those of single fixed-window limits; every decision stays exactly what
//! it would be alone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Barrier;
use tollgate_core::{
    Algorithm, Decision, FakeClock, Key, MemoryStore, Outcome, Policy, Store, Timestamp,
};
use tollgate_redis::{RedisStore, RedisStoreError};
use tollgate_tests::{RedisServer, StallMeter, command_calls};

/// The algorithms whose single limits are batched: three one-word ones and
/// the fixed window (window words).
const BATCHED: [Algorithm; 4] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
    Algorithm::FixedWindow,
];

/// The tests that bound how long requests wait take turns: side by side,
/// one test's thousands of tasks would be another's queue.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn builder(prefix: &str) -> tollgate_redis::RedisStoreBuilder {
    RedisStore::builder()
        .prefix(prefix)
        .deadline(Duration::from_secs(10))
        .response_timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(2))
        .deny_cache(0)
}

/// Sends one decision per entry of `keys` at once (released together by a
/// barrier) and returns each result with how long it took.
async fn timed_at_once(
    store: &RedisStore,
    policy: &Policy,
    keys: &[Key],
    cost: u64,
) -> Vec<(Result<Decision, RedisStoreError>, Duration)> {
    let barrier = Arc::new(Barrier::new(keys.len()));
    let tasks: Vec<_> = keys
        .iter()
        .map(|key| {
            let (store, policy, key, barrier) =
                (store.clone(), policy.clone(), key.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let asked = Instant::now();
                let result = store.decide(&key, &policy, cost).await;
                (result, asked.elapsed())
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    results
}

/// [`timed_at_once`], every decision made.
async fn at_once(store: &RedisStore, policy: &Policy, keys: &[Key], cost: u64) -> Vec<Decision> {
    let results = timed_at_once(store, policy, keys, cost).await;
    results.into_iter().map(|(r, _)| r.unwrap()).collect()
}

fn reset(con: &mut redis::Connection) {
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(con).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_checks_share_calls_and_admit_exactly_the_limit() {
    let server = RedisServer::spawn();
    let mut con = server.connection();
    let batched = builder("batch").connect(server.url()).await.unwrap();
    let alone = builder("alone")
        .batch_size(1)
        .connect(server.url())
        .await
        .unwrap();
    for algorithm in BATCHED {
        let policy = Policy::new("exact", algorithm, "100/d").unwrap();
        let keys = vec![Key::user(format!("{algorithm}")); 1_000];
        for (name, store) in [("batched", &batched), ("alone", &alone)] {
            reset(&mut con);
            let decisions = at_once(store, &policy, &keys, 1).await;
            let day = |d: &Decision| d.now().as_micros() / 86_400_000_000;
            if algorithm == Algorithm::FixedWindow
                && decisions.iter().any(|d| day(d) != day(&decisions[0]))
            {
                // Midnight UTC passed during the test (by Redis's clock):
                // two windows' counts, which the other tests cover.
                continue;
            }
            let allowed = decisions.iter().filter(|d| d.is_allowed()).count();
            assert_eq!(allowed, 100, "{algorithm}, {name}");
            // Each admitted request left a different remaining count.
            let mut remaining: Vec<u64> = decisions
                .iter()
                .filter(|d| d.is_allowed())
                .map(Decision::remaining)
                .collect();
            remaining.sort_unstable();
            assert_eq!(
                remaining,
                (0..100).collect::<Vec<_>>(),
                "{algorithm}, {name}"
            );
            let calls = command_calls(&mut con, "evalsha");
            println!("{algorithm}, {name}: 1000 decisions in {calls} calls");
            if name == "alone" {
                assert_eq!(calls, 1_000, "{algorithm}: batching off, one call each");
            } else {
                // 1,000 requests queue behind the first calls and go 64 at a
                // time: about 20 calls, never one per request.
                assert!(
                    calls <= 250,
                    "{algorithm}: {calls} calls for 1,000 decisions"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_mixed_policies_keys_and_costs_decides_as_the_memory_store() {
    let server = RedisServer::spawn();
    let mut con = server.connection();
    let clock = FakeClock::new(Timestamp::from_secs(1_800_000_000));
    let redis = builder("mixed")
        .test_clock(clock.clone())
        .connect(server.url())
        .await
        .unwrap();
    let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let policies = [
        Policy::new("gcra", Algorithm::Gcra, "5/s").unwrap(),
        Policy::builder("tokens")
            .algorithm(Algorithm::TokenBucket)
            .limit("10/min")
            .burst(4)
            .build()
            .unwrap(),
        Policy::new("queue", Algorithm::LeakyBucket, "3/s").unwrap(),
        Policy::new("window", Algorithm::FixedWindow, "7/s").unwrap(),
    ];
    // 20 keys of each policy; per key 12 requests at once of cost 1, one
    // peek (cost 0) and one request above capacity, all in flight together.
    let mut tasks = Vec::new();
    let barrier = Arc::new(Barrier::new(policies.len() * 20 * 14));
    for policy in &policies {
        for k in 0..20 {
            let key = Key::user(format!("{}-{k}", policy.name()));
            for cost in std::iter::repeat_n(1, 12).chain([0, 1_000]) {
                let (store, policy, key, barrier) =
                    (redis.clone(), policy.clone(), key.clone(), barrier.clone());
                tasks.push(tokio::spawn(async move {
                    barrier.wait().await;
                    let decision = store.check(&key, &policy, cost).await.unwrap();
                    (policy.name().to_owned(), key, cost, decision)
                }));
            }
        }
    }
    reset(&mut con);
    let mut admitted: HashMap<(String, Key), u64> = HashMap::new();
    for task in tasks {
        let (policy, key, cost, decision) = task.await.unwrap();
        match cost {
            0 => assert!(decision.is_allowed(), "a peek is allowed: {decision:?}"),
            1 => *admitted.entry((policy, key)).or_default() += u64::from(decision.is_allowed()),
            _ => assert!(
                matches!(decision.outcome(), Outcome::CostExceedsCapacity { .. }),
                "{decision:?}"
            ),
        }
    }
    let calls = command_calls(&mut con, "evalsha");
    assert!(calls < 1_120 / 4, "{calls} calls for 1,120 decisions");
    for policy in &policies {
        for k in 0..20 {
            let key = Key::user(format!("{}-{k}", policy.name()));
            // All at one instant: a key admits its whole burst and no more.
            let count = admitted[&(policy.name().to_owned(), key.clone())];
            let burst = policy.params()[0].capacity;
            assert_eq!(count, burst.min(12), "{} {k}", policy.name());
            // Bring the memory store to the same state, then the next
            // decisions, a moment later, must be equal.
            for _ in 0..count {
                assert!(memory.check(&key, policy, 1).await.unwrap().is_allowed());
            }
        }
    }
    clock.advance(Duration::from_millis(250));
    for policy in &policies {
        for k in 0..20 {
            let key = Key::user(format!("{}-{k}", policy.name()));
            for cost in [0, 1, 1] {
                assert_eq!(
                    redis.check(&key, policy, cost).await.unwrap(),
                    memory.check(&key, policy, cost).await.unwrap(),
                    "{} {k}, cost {cost}",
                    policy.name()
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_whose_deadline_passed_in_the_queue_are_dropped_not_sent_late() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::spawn();
    let mut con = server.connection();
    let store = RedisStore::builder()
        .prefix("paused")
        .deadline(Duration::from_millis(50))
        .response_timeout(Duration::from_secs(2))
        .circuit_breaker(1_000_000, Duration::from_secs(1))
        .deny_cache(0)
        .connect(server.url())
        .await
        .unwrap();
    // Keys live 6 s, so the keys written after the pause can be counted.
    let policy = Policy::new("paused", Algorithm::Gcra, "10/min").unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1_000)
        .arg("ALL")
        .query(&mut con)
        .unwrap();
    let started = Instant::now();
    let keys: Vec<Key> = (0..1_000).map(|i| Key::user(format!("p{i}"))).collect();
    let stalls = StallMeter::start();
    let results = timed_at_once(&store, &policy, &keys, 1).await;
    let stall = stalls.stop();
    for (result, took) in results {
        assert!(
            matches!(result, Err(RedisStoreError::Deadline(_))),
            "{result:?}"
        );
        // A request gives up by its ceiling (four deadlines) in the queue,
        // or is taken into a call within a deadline of queueing and waits
        // for that call, up to its ceiling: five deadlines. Then
        // scheduling 1,000 requests on two workers, plus how long the
        // machine stalled the process. (When a request could be taken late
        // into a call, it waited up to two ceilings: 354 ms was seen. Since,
        // 215 ms at most in 12 runs, 6 of them beside two busy loops.)
        let bound = Duration::from_millis(5 * 50 + 100) + stall;
        assert!(took < bound, "a request took {took:?}, bound {bound:?}");
    }
    assert!(started.elapsed() < Duration::from_millis(1_000));
    // Once Redis runs again, the calls that were on their way run: the
    // first two requests, sent alone, then a batch (of at most 64) on each
    // of the two places whenever the call holding it gave up. A call gives
    // up after one deadline, or (when our own runtime was late: see
    // `patience`) after at most four, and a queued request gives up on the
    // same terms; so a place frees at most once a deadline while a queued
    // request still waits, four times and (at the ceiling's edge) a fifth.
    // Every request queued behind those had given up by the time a place
    // was free, and was dropped, not sent late (without that, all 1,000
    // would be decided after the pause). A batch takes only the requests
    // that queued less than a deadline before: on an idle machine, where
    // they all queue within a deadline, it is 4 calls and 130 keys.
    tokio::time::sleep(Duration::from_millis(1_200).saturating_sub(started.elapsed())).await;
    let written: u64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    let calls = command_calls(&mut con, "evalsha");
    println!("after the pause: {calls} calls, {written} keys");
    const CEILING: u64 = 4;
    assert!(
        calls <= 2 + 2 * (CEILING + 1) && written <= 2 + (calls.saturating_sub(2)) * 64,
        "{calls} calls ran and {written} keys were written after the pause"
    );
    // The store has its places back: 1,000 checks at once are all decided.
    let decisions = at_once(&store, &policy, &keys, 1).await;
    assert!(decisions.iter().all(Decision::is_allowed));
}

/// A queue longer than a few deadlines' worth of calls is our own
/// queueing, not Redis's lateness: while the calls ahead come back, every
/// queued request waits its turn and is decided, and the breaker stays
/// closed. (Before, a request that had queued for a deadline gave up with
/// `Deadline`, and the failure policy answered it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_longer_than_the_deadline_is_served_while_calls_come_back() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::spawn();
    let mut con = server.connection();
    let deadline = Duration::from_millis(150);
    // Two requests per call, two calls on their way: 4,000 requests at
    // once take 1,000 round trips one after the other, a few deadlines on
    // an idle machine, and many on a loaded one.
    let store = RedisStore::builder()
        .prefix("long-queue")
        .deadline(deadline)
        .batch_size(2)
        .deny_cache(0)
        .connect(server.url())
        .await
        .unwrap();
    let policy = Policy::new("long-queue", Algorithm::Gcra, "10/min").unwrap();
    let keys: Vec<Key> = (0..4_000).map(|i| Key::user(format!("q{i}"))).collect();
    reset(&mut con);
    let started = Instant::now();
    let results = timed_at_once(&store, &policy, &keys, 1).await;
    let took = started.elapsed();
    let failed: Vec<_> = results
        .iter()
        .filter_map(|(r, _)| r.as_ref().err())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 4,000 failed in {took:?}, first {:?}",
        failed.len(),
        failed[0]
    );
    assert!(
        results
            .iter()
            .all(|(r, _)| r.as_ref().is_ok_and(Decision::is_allowed))
    );
    let calls = command_calls(&mut con, "evalsha");
    println!("4,000 queued decisions in {calls} calls, {took:?}");
    assert!(calls >= 2_000, "{calls} calls of at most 2 requests");
    assert_eq!(store.breaker_state(), tollgate_redis::BreakerState::Closed);
}

/// The queue's bound: it holds at most 4,096 requests, and one that finds
/// it full fails at once with `QueueFull`, which the breaker does not
/// count. Once the queue has room again, requests queue as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_holds_at_most_4096_requests() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::spawn();
    let mut con = server.connection();
    let store = RedisStore::builder()
        .prefix("capped-queue")
        // No call gives up before every request has arrived.
        .deadline(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(10))
        .deny_cache(0)
        .circuit_breaker(1_000_000, Duration::from_secs(1))
        .connect(server.url())
        .await
        .unwrap();
    let policy = Policy::new("capped-queue", Algorithm::Gcra, "10/min").unwrap();
    // While Redis is paused, nothing comes back, so nothing leaves the
    // queue: of 5,000 requests at once, 2 are sent, 4,096 queue, and the
    // other 902 find the queue full.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(3_000)
        .arg("ALL")
        .query(&mut con)
        .unwrap();
    let keys: Vec<Key> = (0..5_000).map(|i| Key::user(format!("c{i}"))).collect();
    let mut full = 0;
    for (result, _) in timed_at_once(&store, &policy, &keys, 1).await {
        match result {
            Ok(decision) => assert!(decision.is_allowed()),
            Err(RedisStoreError::QueueFull) => full += 1,
            // No call was answered for a deadline: Redis was paused.
            Err(RedisStoreError::Deadline(_)) => {}
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(full, 5_000 - 2 - 4_096);
    assert_eq!(store.breaker_state(), tollgate_redis::BreakerState::Closed);
    // The queue has room again: 300 requests at once are all decided.
    let again: Vec<Key> = (0..300).map(|i| Key::user(format!("again{i}"))).collect();
    let decisions = at_once(&store, &policy, &again, 1).await;
    assert!(decisions.iter().all(Decision::is_allowed));
}

/// A request that finds the queue full was never sent: it is the app's
/// own load, not a failure of Redis, so no failure policy decides it. It
/// is refused (`StoreError::Overloaded`) under every mode, where `Open`
/// let it through and `Local` handed it local quota. The queued requests,
/// which miss their deadline while Redis is paused, are the failure
/// policy's as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_is_refused_under_every_failure_mode() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::spawn();
    let mut con = server.connection();
    let store = RedisStore::builder()
        .prefix("refused-queue")
        // No call gives up before every request has arrived.
        .deadline(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(10))
        .deny_cache(0)
        .circuit_breaker(1_000_000, Duration::from_secs(1))
        .connect(server.url())
        .await
        .unwrap();
    let policy = Policy::new("refused-queue", Algorithm::Gcra, "10/min").unwrap();
    let limiter = |mode| {
        tollgate::RateLimiter::with_store(policy.clone(), store.clone()).on_store_error(mode)
    };
    let limiters = [
        limiter(tollgate::FailureMode::Open),
        limiter(tollgate::FailureMode::Local),
    ];
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(3_000)
        .arg("ALL")
        .query(&mut con)
        .unwrap();
    let barrier = Arc::new(Barrier::new(5_000));
    let tasks: Vec<_> = (0..5_000)
        .map(|i| {
            let limiter = limiters[i % 2].clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                limiter.check(&Key::user(format!("c{i}"))).await
            })
        })
        .collect();
    let (mut decided, mut refused) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            // Let through, or decided locally, after the deadline.
            Ok(decision) => {
                assert!(decision.is_allowed());
                decided += 1;
            }
            Err(tollgate_core::StoreError::Overloaded) => refused += 1,
            Err(other) => panic!("{other:?}"),
        }
    }
    // 2 sent, 4,096 queued, 902 turned away.
    assert_eq!((decided, refused), (2 + 4_096, 5_000 - 2 - 4_096));
    assert_eq!(store.breaker_state(), tollgate_redis::BreakerState::Closed);
}

/// The lane of one key (requests of a policy decided by the general
/// script, which each key's requests share in turn) holds at most 4,096
/// requests behind its call; one that finds it full fails at once with
/// `QueueFull`. Waiting in the lane has no deadline of its own, but each
/// call has the store's: while Redis is paused, the call on its way fails,
/// then each batch of 1,024 is sent and fails in turn, so no request
/// waits longer than five calls, each within the store's ceiling (four
/// deadlines). Then the lane is closed and the key is decided again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lane_of_one_key_holds_at_most_4096_and_waits_at_most_five_calls() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::spawn();
    let deadline = Duration::from_millis(400);
    let store = RedisStore::builder()
        .prefix("capped-lane")
        .deadline(deadline)
        // The store's deadline and ceiling, not the connection's timeout,
        // end each call, however late our runtime runs.
        .response_timeout(Duration::from_secs(30))
        .deny_cache(0)
        .circuit_breaker(1_000_000, Duration::from_secs(1))
        .connect(server.url())
        .await
        .unwrap();
    // Two limits: the general script, one lane per key.
    let policy = Policy::builder("capped-lane")
        .algorithm(Algorithm::SlidingLog)
        .limit("100/min")
        .limit("1000/h")
        .build()
        .unwrap();
    let key = Key::user("one");
    // Connected, and the script loaded, before the pause.
    assert!(store.decide(&key, &policy, 1).await.unwrap().is_allowed());
    // Long enough for all five calls to fail: at most five ceilings.
    server.pause_writes(10_000);
    let keys = vec![key.clone(); 5_000];
    let mut full = 0;
    let mut failed = 0;
    let mut longest = Duration::ZERO;
    for (result, took) in timed_at_once(&store, &policy, &keys, 1).await {
        match result {
            Err(RedisStoreError::QueueFull) => {
                full += 1;
                assert!(took < deadline, "QueueFull at once, not after {took:?}");
            }
            Err(RedisStoreError::Deadline(_)) => {
                failed += 1;
                longest = longest.max(took);
            }
            other => panic!("Redis is paused: {other:?}"),
        }
    }
    // One sent, 4,096 behind it, the rest turned away.
    assert_eq!(full, 5_000 - 1 - 4_096);
    assert_eq!(failed, 1 + 4_096);
    // Five calls, each within the ceiling, and a second for the gaps
    // between them on a loaded machine.
    let ceiling = deadline * 4;
    assert!(
        longest <= ceiling * 5 + Duration::from_secs(1),
        "the longest wait, {longest:?}, is within five calls' ceilings"
    );
    println!("the longest wait in the lane: {longest:?}");
    assert_eq!(store.breaker_state(), tollgate_redis::BreakerState::Closed);
    // The lane is closed: once Redis is back, the key is decided again.
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut server.connection())
        .unwrap();
    let decision = store.decide(&key, &policy, 1).await.unwrap();
    assert_eq!(decision.limit(), 100);
}
