//! The Redis store on a real Redis Cluster: 3 masters and 3 replicas
//! started by the test. Real time, bounded. The usage ledger on it: the
//! ledger suite, and exact usage for keys on every master.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tollgate::{Algorithm, DecidedBy, FailureMode, Key, Policy, RateLimiter, Store};
use tollgate_core::ledger::{Granularity, Ledger, MeteredStore, UsageQuery};
use tollgate_core::testing::check_ledger;
use tollgate_core::{Clock, FakeClock, Settlement, Timestamp};
use tollgate_redis::{BreakerState, RedisLedger, RedisStore};
use tollgate_tests::{RedisCluster, RedisServer, stalled, unique_prefix};

async fn store(
    cluster: &RedisCluster,
    deadline: Duration,
) -> RedisStore<tollgate_redis::ClusterConnection> {
    RedisStore::builder()
        // The response timeout is the default, past the deadline's
        // ceiling: a tighter one failed requests to healthy masters that a
        // busy machine's runtime was slow to read, which is our own load,
        // not Redis failing. A dead master fails its requests at once (the
        // connection drops, or is refused), a hung one at their deadline.
        .deadline(deadline)
        // A failed master's slot ranges are probed again soon after its
        // replica takes over.
        .circuit_breaker(5, Duration::from_millis(100))
        .connect_cluster(cluster.urls())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_keys_each_admit_exactly_their_limit_across_all_masters() {
    let cluster = RedisCluster::spawn();
    let store = store(&cluster, Duration::from_secs(5)).await;
    let policy = Arc::new(Policy::new("cluster", Algorithm::Gcra, "5/h").unwrap());
    let allowed: Arc<Vec<AtomicU32>> = Arc::new((0..1_000).map(|_| AtomicU32::new(0)).collect());
    const TASKS: usize = 64;
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (store, policy, allowed) = (store.clone(), policy.clone(), allowed.clone());
            tokio::spawn(async move {
                // 10 requests per key, interleaved over the tasks.
                for r in (t..10_000).step_by(TASKS) {
                    let key = r % 1_000;
                    let d = store
                        .check(&Key::user(format!("k{key}")), &policy, 1)
                        .await
                        .unwrap();
                    if d.is_allowed() {
                        allowed[key].fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("no CROSSSLOT or MOVED error surfaced");
    }
    for (key, n) in allowed.iter().enumerate() {
        assert_eq!(n.load(Ordering::Relaxed), 5, "key k{key}");
    }
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    let spread: Vec<u64> = masters.iter().map(|&m| cluster.nodes[m].dbsize()).collect();
    assert!(
        spread.iter().all(|&n| n > 200),
        "keys per master: {spread:?}"
    );
    assert_eq!(spread.iter().sum::<u64>(), 1_000);
}

/// In-flight slots on a cluster: a give-back that arrived before its
/// acquire is remembered in a set beside the key's slots, which a script
/// reads with them: both in one hash slot, on every master (no CROSSSLOT).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_slots_given_back_before_their_acquire_take_nothing_on_every_master() {
    use tollgate::{InFlightLimit, SlotStore, Slots};
    let cluster = RedisCluster::spawn();
    let store = store(&cluster, Duration::from_secs(5)).await;
    let limit = InFlightLimit::new("cluster-slots", 1).unwrap();
    for k in 0..60u64 {
        let key = Key::user(format!("k{k}"));
        store.release(&key, &limit, 2 * k).await.unwrap();
        let late = store.acquire(&key, &limit, 2 * k).await.unwrap();
        assert_eq!(
            late,
            Slots {
                acquired: false,
                held: 0
            },
            "key k{k}"
        );
        let next = store.acquire(&key, &limit, 2 * k + 1).await.unwrap();
        assert_eq!(
            next,
            Slots {
                acquired: true,
                held: 1
            },
            "key k{k}"
        );
        store.release(&key, &limit, 2 * k + 1).await.unwrap();
    }
    // Each key left its set of holders given back, on every master.
    let masters = cluster.masters();
    let spread: Vec<u64> = masters.iter().map(|&m| cluster.nodes[m].dbsize()).collect();
    assert!(spread.iter().all(|&n| n > 5), "keys per master: {spread:?}");
    assert_eq!(spread.iter().sum::<u64>(), 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_failover_spares_healthy_keys_and_heals_affected_ones() {
    fails_over(RedisServer::kill).await;
}

/// A master that hangs (SIGSTOP: its connections stay open, and nothing
/// answers) fails its calls at their deadline, and its replica is found
/// once promoted, as when it dies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_master_spares_healthy_keys_and_its_replica_heals_them() {
    fails_over(|master| master.hang()).await;
}

/// One of a cluster's masters fails by `fail` under 300 keys' requests:
/// keys on the healthy masters see no error, the failed master's keys are
/// served again within a second of its replica's promotion, and no key is
/// admitted more than one limit past its own.
async fn fails_over(fail: impl FnOnce(&mut RedisServer)) {
    let mut cluster = RedisCluster::spawn();
    let store = store(&cluster, Duration::from_millis(500)).await;
    let policy = Policy::new("failover", Algorithm::Gcra, "5/h").unwrap();
    let keys: Vec<Key> = (0..300).map(|i| Key::user(format!("f{i}"))).collect();
    // Three admits per key before the failure.
    for key in &keys {
        for _ in 0..3 {
            assert!(store.check(key, &policy, 1).await.unwrap().is_allowed());
        }
    }
    let victim = cluster.masters()[0];
    let on_victim: Vec<bool> = {
        let mut con = cluster.nodes[victim].connection();
        keys.iter()
            // A master answers MOVED for keys it does not own.
            .map(|k| {
                redis::cmd("EXISTS")
                    .arg(store.state_key(&policy, k))
                    .query::<bool>(&mut con)
                    .unwrap_or(false)
            })
            .collect()
    };
    let affected = on_victim.iter().filter(|&&a| a).count();
    assert!(
        affected > 50 && affected < 250,
        "{affected} keys on the victim"
    );
    // Let the replicas catch up, then fail the master.
    tokio::time::sleep(Duration::from_millis(200)).await;
    fail(&mut cluster.nodes[victim]);
    let killed = Instant::now();

    let mut admitted = vec![3u32; keys.len()];
    let mut healthy_errors = 0;
    let mut healed_at: Vec<Option<Duration>> = vec![None; keys.len()];
    let mut promoted: Option<Duration> = None;
    while killed.elapsed() < RedisCluster::NODE_TIMEOUT + Duration::from_secs(4) {
        let round: Vec<_> = keys
            .iter()
            .map(|key| {
                let (store, policy, key) = (store.clone(), policy.clone(), key.clone());
                tokio::spawn(async move { store.check(&key, &policy, 1).await })
            })
            .collect();
        for (i, task) in round.into_iter().enumerate() {
            match task.await.unwrap() {
                Ok(d) => {
                    admitted[i] += u32::from(d.is_allowed());
                    if on_victim[i] && healed_at[i].is_none() {
                        healed_at[i] = Some(killed.elapsed());
                    }
                }
                Err(e) => {
                    if !on_victim[i] {
                        healthy_errors += 1;
                        eprintln!("healthy key f{i} at {:?}: {e}", killed.elapsed());
                    }
                }
            }
        }
        // (Asking every node blocks: a hung one holds this worker until its
        // timeout, and the store's calls must not take that for our own
        // runtime's load.)
        if promoted.is_none() && tokio::task::block_in_place(|| cluster.masters().len()) == 3 {
            promoted = Some(killed.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let promoted = promoted.expect("the victim's replica took over");
    eprintln!(
        "the replica was promoted by {promoted:?}; its keys all served again by {:?}",
        healed_at.iter().flatten().max()
    );
    assert_eq!(healthy_errors, 0, "keys on healthy masters saw errors");
    // Within a second of the promotion, which a busy machine delays (the
    // cluster's own failure detection, not the store's).
    let limit = promoted + Duration::from_secs(1);
    for (i, healed) in healed_at.iter().enumerate().filter(|(i, _)| on_victim[*i]) {
        assert!(
            healed.is_some_and(|t| t <= limit),
            "key f{i} served again at {healed:?}"
        );
    }
    // At most one limit's worth more than the limit, per key.
    for (i, n) in admitted.iter().enumerate() {
        assert!(*n <= 10, "key f{i} admitted {n} times");
    }
}

/// Our own overload is not a store failure on a cluster either. Each
/// request's runtime is blocked, once it is sent, past the store's
/// deadline and well under its ceiling (four deadlines): it waits on for
/// its reply, as on a single server. The cluster's connections failed
/// such a call by their own response timeout, which defaulted to the
/// deadline: the breaker opened and the failure policy decided locally.
#[test]
fn a_starved_runtime_on_a_cluster_neither_opens_the_breaker_nor_decides_locally() {
    // The store's default deadline, and a stall past it and its slack.
    const DEADLINE: Duration = Duration::from_millis(50);
    const STALL: Duration = Duration::from_millis(70);
    let cluster = RedisCluster::spawn();
    let runtime = tollgate_tests::thread_runtime();
    runtime.block_on(async {
        let store = RedisStore::builder()
            .prefix(unique_prefix("cluster-starved"))
            .deadline(DEADLINE)
            .circuit_breaker(5, Duration::from_secs(60))
            .connect_cluster(cluster.urls())
            .await
            .unwrap();
        let policy = Policy::new("starved", Algorithm::Gcra, "5/h").unwrap();
        let limiter =
            RateLimiter::with_store(policy, store.clone()).on_store_error(FailureMode::Local);
        let keys: Vec<Key> = (0..9).map(|i| Key::user(format!("busy-{i}"))).collect();
        // A first round unstalled: every master's connection is made.
        for key in &keys {
            assert!(limiter.check(key).await.unwrap().is_allowed());
        }
        let (mut admitted, mut stalls) = (keys.len(), 0);
        for _ in 0..6 {
            for key in &keys {
                let (decision, stalled_request) = stalled(limiter.check(key), STALL).await;
                let decision = decision.unwrap();
                assert_eq!(decision.decided_by(), DecidedBy::Store, "{decision:?}");
                assert_eq!(store.breaker_state(), BreakerState::Closed);
                admitted += usize::from(decision.is_allowed());
                stalls += usize::from(stalled_request);
            }
        }
        // Exactly the limit of each key, every admission decided by Redis
        // through a stall past its deadline.
        assert_eq!(admitted, 5 * keys.len());
        assert!(stalls >= 4 * keys.len(), "{stalls} stalled");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_usage_ledger_bills_exactly_on_a_cluster() {
    let cluster = RedisCluster::spawn();
    let clock = FakeClock::new(Timestamp::from_secs(1_769_900_400));
    let metered = |clock: &FakeClock| {
        let clock = clock.clone();
        let urls = cluster.urls();
        async move {
            let store = RedisStore::builder()
                .deadline(Duration::from_secs(5))
                .response_timeout(Duration::from_secs(1))
                .test_clock(clock)
                .connect_cluster(urls)
                .await
                .unwrap();
            let ledger = RedisLedger::builder(&store)
                .flush_interval(Duration::from_secs(3_600))
                .unwrap()
                .build()
                .unwrap();
            MeteredStore::new(store, ledger)
        }
    };
    let suite = metered(&clock).await;
    let report = check_ledger(&suite, &clock).await.unwrap();
    assert!(report.admitted > 200 && report.buckets > 50, "{report:?}");

    // 300 keys, spread over the three masters, each charged and settled.
    let store = metered(&clock).await;
    let policy = Policy::new("billed", Algorithm::Gcra, "1000000/h").unwrap();
    let mut expected = vec![0_u64; 300];
    let from = clock.now();
    for round in 0..4_u64 {
        for (k, billed) in expected.iter_mut().enumerate() {
            let key = Key::user(format!("tenant-{k}"));
            let cost = 1 + (k as u64 + round) % 7;
            let decision = store.check(&key, &policy, cost).await.unwrap();
            assert!(decision.is_allowed(), "{decision:?}");
            let used = if (k as u64 + round).is_multiple_of(3) {
                let actual = (k as u64 * 5 + round) % 12;
                let settled = Settlement::of(&decision, cost, actual);
                store.settle(&key, &policy, settled).await.unwrap();
                actual
            } else {
                cost
            };
            *billed += used;
        }
        clock.advance(Duration::from_secs(1_200));
    }
    store.ledger().flush().await.unwrap();
    let query = UsageQuery::new(Granularity::Hour, from, clock.now()).unwrap();
    for (k, billed) in expected.iter().enumerate() {
        let key = Key::user(format!("tenant-{k}"));
        let usage = store
            .ledger()
            .usage(&key, policy.name(), query)
            .await
            .unwrap();
        assert_eq!(usage.total(), *billed, "tenant-{k}");
    }
    let masters = cluster.masters();
    let spread: Vec<u64> = masters.iter().map(|&m| cluster.nodes[m].dbsize()).collect();
    assert!(
        spread.iter().all(|&n| n > 100),
        "keys per master: {spread:?}"
    );
}

/// The fence of a reset and of a block on a cluster: keys on every
/// master, in each script (one-time, window word, and the general script
/// with a sliding log's sets), whose fence key shares the state key's
/// slot. A refund of a request reserved before the reset or block changes
/// nothing; one reserved after it lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_or_a_block_fences_refunds_on_every_master() {
    let cluster = RedisCluster::spawn();
    let clock = FakeClock::new(Timestamp::from_secs(1_769_900_400));
    let store = RedisStore::builder()
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(1))
        .test_clock(clock.clone())
        .connect_cluster(cluster.urls())
        .await
        .unwrap();
    let policies = [
        Policy::new("fenced-tat", Algorithm::Gcra, "10/min").unwrap(),
        Policy::new("fenced-word", Algorithm::FixedWindow, "10/min").unwrap(),
        Policy::builder("fenced-log")
            .algorithm(Algorithm::SlidingLog)
            .limit("10/min")
            .limit("100/h")
            .build()
            .unwrap(),
    ];
    for block in [false, true] {
        for policy in &policies {
            for k in 0..30 {
                let key = Key::user(format!("tenant-{k}-{block}"));
                let a = store.check(&key, policy, 5).await.unwrap();
                if block {
                    store
                        .block(&key, policy, Duration::from_secs(1))
                        .await
                        .unwrap();
                } else {
                    store.reset(&key, policy).await.unwrap();
                }
                // Past the block.
                clock.advance(Duration::from_secs(2));
                let b = store.check(&key, policy, 4).await.unwrap();
                assert_eq!(b.remaining(), 6, "{policy}");
                let settled = store
                    .settle(&key, policy, Settlement::of(&a, 5, 1))
                    .await
                    .unwrap();
                assert_eq!(settled.remaining(), 6, "{policy}: fenced");
                let settled = store
                    .settle(&key, policy, Settlement::of(&b, 4, 1))
                    .await
                    .unwrap();
                assert_eq!(settled.remaining(), 9, "{policy}: landed");
            }
        }
    }
    // Each master holds state keys and fences.
    let masters = cluster.masters();
    let spread: Vec<u64> = masters.iter().map(|&m| cluster.nodes[m].dbsize()).collect();
    assert!(
        spread.iter().all(|&keys| keys >= 10),
        "keys per master: {spread:?}"
    );
}

/// A cluster that asks for a password is reached with the one in the
/// seeds' URLs, on every node: only each seed's address was kept, and
/// every node was asked without it, so the store never knew a master
/// and every decision failed (found by an audit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_password_opens_every_node() {
    let cluster = RedisCluster::spawn();
    for node in &cluster.nodes {
        let mut con = redis::Client::open(node.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg("s3cret")
            .query(&mut con)
            .unwrap();
    }
    let urls = cluster
        .nodes
        .iter()
        .map(|n| format!("redis://:s3cret@127.0.0.1:{}", n.port()));
    let store = RedisStore::builder()
        .deadline(Duration::from_secs(5))
        .connect_cluster(urls)
        .await
        .unwrap();
    let policy = Policy::new("guarded", Algorithm::Gcra, "5/h").unwrap();
    for key in 0..30 {
        let decision = store.check(&Key::user(format!("k{key}")), &policy, 1).await;
        assert!(decision.unwrap().is_allowed(), "k{key}");
    }
}
