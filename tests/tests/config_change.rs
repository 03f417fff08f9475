//! A deploy that changes a limit: the old and the new configuration of one
//! policy serve side by side, each on its own instance, and a client
//! alternates between them. What was used under one counts under the
//! other, so together they admit exactly what the larger configuration
//! alone admits, for every algorithm, with one limit and with two, on Redis
//! (two store instances with their own connections) and in memory.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use tollgate::{Algorithm, FakeClock, Key, MemoryStore, Policy, Store, Timestamp};
use tollgate_redis::RedisStore;
use tollgate_tests::{require_redis, unique_prefix};

/// The start of an hour, so that every window is whole.
const T0: u64 = 1_700_002_800;

fn policy(algorithm: Algorithm, limits: &[&str]) -> Policy {
    let mut builder = Policy::builder("search").algorithm(algorithm);
    for limit in limits {
        builder = builder.limit(*limit);
    }
    builder.build().unwrap()
}

/// The configurations before and after the deploy: a per-minute limit
/// raised from 20 to 25, alone or under an hourly one.
fn configs(algorithm: Algorithm, multi: bool) -> [Policy; 2] {
    if multi {
        [
            policy(algorithm, &["100/h", "20/min"]),
            policy(algorithm, &["100/h", "25/min"]),
        ]
    } else {
        [
            policy(algorithm, &["20/min"]),
            policy(algorithm, &["25/min"]),
        ]
    }
}

/// `before` requests under the old configuration, then `alternating`
/// requests alternating between the new and the old, all at one instant;
/// how many each admitted.
async fn side_by_side(
    old: (&dyn Probe, &Policy),
    new: (&dyn Probe, &Policy),
    key: &Key,
    before: usize,
    alternating: usize,
) -> (usize, usize) {
    let (mut by_old, mut by_new) = (0, 0);
    for _ in 0..before {
        by_old += usize::from(old.0.admits(key, old.1).await);
    }
    for i in 0..alternating {
        if i % 2 == 0 {
            by_new += usize::from(new.0.admits(key, new.1).await);
        } else {
            by_old += usize::from(old.0.admits(key, old.1).await);
        }
    }
    (by_old, by_new)
}

/// How many of `requests` the configuration alone admits at one instant.
async fn alone<S: Store>(store: &S, policy: &Policy, key: &Key, requests: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..requests {
        admitted += usize::from(store.check(key, policy, 1).await.unwrap().is_allowed());
    }
    admitted
}

async fn redis_store(prefix: &str, clock: &FakeClock) -> RedisStore {
    let url = require_redis().await;
    RedisStore::builder()
        .prefix(prefix)
        .test_clock(clock.clone())
        .deadline(Duration::from_secs(5))
        .connect(url.as_str())
        .await
        .unwrap()
}

#[tokio::test]
async fn old_and_new_limits_side_by_side_admit_what_the_larger_admits_alone() {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let prefix = unique_prefix("change");
    // Two app servers on one Redis: one still on the old configuration,
    // one already on the new.
    let (old_server, new_server) = (
        redis_store(&prefix, &clock).await,
        redis_store(&prefix, &clock).await,
    );
    // Two layers with one name in one process, on the memory store.
    let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    for algorithm in Algorithm::ALL {
        for multi in [false, true] {
            let [old, new] = configs(algorithm, multi);
            let case = format!(
                "{algorithm}, {}",
                if multi { "two limits" } else { "one limit" }
            );
            let key = |n: &str| Key::user(format!("{algorithm}-{multi}-{n}"));
            // Each configuration alone, on a fresh key. (A leaky bucket
            // under two limits lets requests leave at the slower rate, so
            // its queue holds fewer.)
            let larger = alone(&new_server, &new, &key("new-alone"), 60).await;
            let smaller = alone(&old_server, &old, &key("old-alone"), 60).await;
            if !(multi && algorithm == Algorithm::LeakyBucket) {
                assert_eq!((smaller, larger), (20, 25), "{case}");
            }

            // All the old limit allows (20), then 40 alternating requests:
            // the new limit admits what it has left (5), the old none.
            for (name, old_store, new_store) in [
                (
                    "Redis",
                    &old_server as &dyn Probe,
                    &new_server as &dyn Probe,
                ),
                ("memory", &memory, &memory),
            ] {
                let key = key(name);
                let (by_old, by_new) =
                    side_by_side((old_store, &old), (new_store, &new), &key, smaller, 40).await;
                assert_eq!(by_old, smaller, "{name}, {case}");
                assert_eq!(by_old + by_new, larger, "{name}, {case}");
            }

            // Alternating from the start: together exactly the larger.
            for (name, store_old, store_new) in [
                (
                    "Redis",
                    &old_server as &dyn Probe,
                    &new_server as &dyn Probe,
                ),
                ("memory", &memory, &memory),
            ] {
                let key = key(&format!("{name}-alternating"));
                let mut admitted = 0;
                for i in 0..60 {
                    let (store, policy) = if i % 2 == 0 {
                        (store_new, &new)
                    } else {
                        (store_old, &old)
                    };
                    admitted += usize::from(store.admits(&key, policy).await);
                }
                assert_eq!(admitted, larger, "{name}, alternating, {case}");
            }

            // The other way round: everything the new limit allows, then
            // the old one admits nothing more.
            let (by_new, by_old) = side_by_side(
                (&new_server, &new),
                (&old_server, &old),
                &key("back"),
                larger,
                20,
            )
            .await;
            assert_eq!((by_new, by_old), (larger, 0), "Redis, back, {case}");
        }
    }
}

/// A store behind a trait object, for the loop over both kinds.
trait Probe {
    fn admits<'a>(
        &'a self,
        key: &'a Key,
        policy: &'a Policy,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + 'a>>;
}

impl<S: Store> Probe for S {
    fn admits<'a>(
        &'a self,
        key: &'a Key,
        policy: &'a Policy,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + 'a>> {
        Box::pin(async move { self.check(key, policy, 1).await.unwrap().is_allowed() })
    }
}

#[tokio::test]
async fn a_removed_limit_is_dropped_and_an_added_one_starts_empty() {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let prefix = unique_prefix("change-limits");
    let store = redis_store(&prefix, &clock).await;
    // A leaky bucket under two limits queues at the slower one's pace and
    // holds one request here; the differential property test covers it.
    for algorithm in Algorithm::ALL
        .into_iter()
        .filter(|&a| a != Algorithm::LeakyBucket)
    {
        let key = Key::user(format!("{algorithm}"));
        let hourly_and_minute = policy(algorithm, &["30/h", "10/min"]);
        let minute_and_second = policy(algorithm, &["10/min", "4/s"]);
        // 6 used under 30/h and 10/min.
        assert_eq!(alone(&store, &hourly_and_minute, &key, 6).await, 6);
        // The hourly limit is removed and a per-second one added: the
        // minute's 6 carry over, the second starts empty (4 of its 4).
        assert_eq!(
            alone(&store, &minute_and_second, &key, 10).await,
            4,
            "{algorithm}"
        );
        // The minute has none left: its 10 are used, 6 of them before.
        let minute = store.check(&key, &minute_and_second, 0).await.unwrap();
        assert_eq!(minute.limits()[0].remaining(), 0, "{algorithm}");
        // Back on the old configuration, the hourly limit was dropped: it
        // starts empty, and the minute's 10 used still deny.
        let back = store.check(&key, &hourly_and_minute, 0).await.unwrap();
        assert_eq!(
            (back.limits()[0].remaining(), back.limits()[1].remaining()),
            (30, 0),
            "{algorithm}"
        );
    }
}

/// A deploy that changes a limit's period (10 a minute to 100 an hour),
/// with old and new servers side by side. Made in one deploy, a key whose
/// requests alternate between them is limited by neither: each finds the
/// other's limit where its own should be, and its own starts empty. Made
/// in two (the new limit added beside the old, then the old removed),
/// every request is decided under a limit the configuration before it
/// also had, and each step admits what the looser of its two
/// configurations admits alone: the minute's 10, then the hour's 100 (the
/// hour counts from the first step's end). The guide's "When a policy
/// changes" says so; this holds it, on Redis and in memory.
#[tokio::test]
async fn a_period_changed_in_two_deploys_stays_limited_and_in_one_does_not() {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let prefix = unique_prefix("change-period");
    let (old_server, new_server) = (
        redis_store(&prefix, &clock).await,
        redis_store(&prefix, &clock).await,
    );
    let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let alternate = async |a: (&dyn Probe, &Policy), b: (&dyn Probe, &Policy), key: &Key, n| {
        let mut admitted = 0;
        for i in 0..n {
            let (store, policy) = if i % 2 == 0 { a } else { b };
            admitted += usize::from(store.admits(key, policy).await);
        }
        admitted
    };
    for algorithm in Algorithm::ALL {
        let old = policy(algorithm, &["10/min"]);
        let both = policy(algorithm, &["10/min", "100/h"]);
        let new = policy(algorithm, &["100/h"]);
        for (name, old_store, new_store) in [
            (
                "Redis",
                &old_server as &dyn Probe,
                &new_server as &dyn Probe,
            ),
            ("memory", &memory, &memory),
        ] {
            let case = format!("{name}, {algorithm}");
            let key = Key::user(format!("{algorithm}-one-deploy"));
            let one = alternate((old_store, &old), (new_store, &new), &key, 300).await;
            assert_eq!(one, 300, "{case}: one deploy, limited by neither");

            let key = Key::user(format!("{algorithm}-two-deploys"));
            let first = alternate((old_store, &old), (new_store, &both), &key, 300).await;
            let second = alternate((old_store, &both), (new_store, &new), &key, 300).await;
            assert_eq!((first, second), (10, 100), "{case}: two deploys");
        }
    }
}
