//! The differential property test of the usage ledger: the same random
//! requests (gaps across hours, days and months, costs from 0, refunds
//! and charges, resets and blocks) through a metered memory store and two
//! instances of a metered Redis store on one fake clock leave identical
//! buckets. Each request is admitted by the first instance and settled by
//! either, and either flushes between requests: a refund or a charge may
//! reach Redis before the record it settles.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
use tollgate_core::ledger::{Granularity, Ledger, MemoryLedger, MeteredStore, UsageQuery};
use tollgate_core::{
    Algorithm, Clock, FakeClock, Key, MemoryStore, Policy, Settlement, Store, Timestamp,
};
use tollgate_redis::{RedisLedger, RedisStore};
use tollgate_tests::{require_redis, unique_prefix};

/// One request: the gap before it (ms), its cost, its actual cost if it
/// settles, 0 for a reset before it and 1 for a block, whether the second
/// instance settles it, and which instance flushes after it (0 or 1, or
/// neither).
type Op = (u64, u64, Option<u64>, u8, bool, u8);

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let gap = prop_oneof![0u64..2_000, 0u64..(6 * 3_600_000)];
    let op = (
        gap,
        0u64..30,
        prop::option::of(0u64..80),
        0u8..25,
        any::<bool>(),
        0u8..4,
    );
    prop::collection::vec(op, 1..40)
}

#[test]
fn memory_and_redis_ledgers_agree() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let url = runtime.block_on(require_redis());
    // 2026-01-31 20:00 UTC: the first cases cross a month's end.
    let clock = FakeClock::new(Timestamp::from_secs(1_769_889_600));
    let prefix = unique_prefix("ledger-props");
    let instance = || async {
        let store = RedisStore::builder()
            .prefix(prefix.as_str())
            .deadline(Duration::from_secs(10))
            .response_timeout(Duration::from_secs(10))
            .test_clock(clock.clone())
            .connect(url.as_str())
            .await
            .unwrap();
        let ledger = RedisLedger::builder(&store)
            .flush_interval(Duration::from_secs(3_600))
            .unwrap()
            .build()
            .unwrap();
        MeteredStore::new(store, ledger)
    };
    let (redis, other) = runtime.block_on(async { (instance().await, instance().await) });
    let policies = [
        Policy::new("ledger-gcra", Algorithm::Gcra, "60/h").unwrap(),
        Policy::new("ledger-window", Algorithm::FixedWindow, "40/h").unwrap(),
    ];
    let mut runner = TestRunner::new(Config {
        cases: 300,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/proptest-regressions/ledger_memory_and_redis_agree.txt",
        ))),
        ..Config::default()
    });
    static CASE: AtomicU64 = AtomicU64::new(0);
    let result = runner.run(&(ops(), 0..policies.len()), |(ops, p)| {
        let policy = &policies[p];
        let key = Key::user(format!("case-{}", CASE.fetch_add(1, Ordering::Relaxed)));
        let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        let memory = MeteredStore::new(memory, MemoryLedger::new());
        let from = clock.now();
        runtime.block_on(async {
            for &(gap, cost, actual, action, elsewhere, flush) in &ops {
                clock.advance(Duration::from_millis(gap));
                for store in [&memory as &dyn Dispatch, &redis] {
                    store.act(&key, policy, action).await;
                }
                let m = memory.check(&key, policy, cost).await.unwrap();
                let r = redis.check(&key, policy, cost).await.unwrap();
                prop_assert_eq!(m.is_allowed(), r.is_allowed());
                if let (Some(actual), true) = (actual, m.is_allowed()) {
                    memory
                        .settle(&key, policy, Settlement::of(&m, cost, actual))
                        .await
                        .unwrap();
                    let settles = if elsewhere { &other } else { &redis };
                    settles
                        .settle(&key, policy, Settlement::of(&r, cost, actual))
                        .await
                        .unwrap();
                }
                match flush {
                    0 => redis.ledger().flush().await.unwrap(),
                    1 => other.ledger().flush().await.unwrap(),
                    _ => {}
                }
            }
            other.ledger().flush().await.unwrap();
            redis.ledger().flush().await.unwrap();
            let to = Timestamp::from_micros(clock.now().as_micros() + 3_600_000_000);
            for g in Granularity::ALL {
                let query = UsageQuery::new(g, from, to).unwrap();
                let m = memory
                    .ledger()
                    .usage(&key, policy.name(), query)
                    .await
                    .unwrap();
                let r = redis
                    .ledger()
                    .usage(&key, policy.name(), query)
                    .await
                    .unwrap();
                prop_assert_eq!(m, r, "{} buckets", g);
            }
            Ok(())
        })
    });
    result.unwrap();
}

/// A reset or a block through either store, as a case asks.
trait Dispatch: Sync {
    fn act<'a>(
        &'a self,
        key: &'a Key,
        policy: &'a Policy,
        action: u8,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;
}

impl<S: Store, L: Ledger> Dispatch for MeteredStore<S, L> {
    fn act<'a>(
        &'a self,
        key: &'a Key,
        policy: &'a Policy,
        action: u8,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
        Box::pin(async move {
            match action {
                0 => self.reset(key, policy).await.unwrap(),
                1 => self
                    .block(key, policy, Duration::from_secs(600))
                    .await
                    .unwrap(),
                _ => {}
            }
        })
    }
}
