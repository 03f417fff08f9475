//! Exact across instances, one `EVALSHA` per decision, recovery from a
//! flushed script cache, and when the store writes or reads first.

use std::time::Duration;

use tollgate_core::{Algorithm, FakeClock, Key, Policy, Store};
use tollgate_redis::RedisStore;
use tollgate_tests::{RedisServer, command_calls, require_redis, unique_prefix};

use super::{admitted_at_once, store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_instances_admit_exactly_the_limit() {
    let url = require_redis().await;
    let prefix = unique_prefix("exact");
    let clock = FakeClock::default();
    let mut stores = Vec::new();
    for _ in 0..8 {
        stores.push(store(&url, &prefix, Some(clock.clone())).await);
    }
    for algorithm in Algorithm::ALL {
        let policy = Policy::new("exact", algorithm, "100/min").unwrap();
        for round in 0..3 {
            let key = Key::user(format!("{algorithm}-{round}"));
            let allowed = admitted_at_once(&stores, &policy, &key, 1_000).await;
            assert_eq!(allowed, 100, "{algorithm}, round {round}");
        }
    }
}

async fn count_round_trips<C: tollgate_redis::RedisConnection>(
    server: &RedisServer,
    store: RedisStore<C>,
) {
    let mut con = server.connection();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    let mut decisions = 0;
    for algorithm in Algorithm::ALL {
        let three = Policy::builder("three")
            .algorithm(algorithm)
            .limit("10/s")
            .limit("100/min")
            .limit("1000/h")
            .build()
            .unwrap();
        for i in 0..20 {
            store
                .check(&Key::user(format!("u{}", i % 3)), &three, 1)
                .await
                .unwrap();
            decisions += 1;
        }
    }
    assert_eq!(command_calls(&mut con, "evalsha"), decisions);
    assert_eq!(command_calls(&mut con, "eval"), 0);
    assert_eq!(
        command_calls(&mut con, "script|load"),
        0,
        "scripts were loaded at start-up"
    );
}

#[tokio::test]
async fn one_evalsha_per_decision_even_with_three_limits() {
    let server = RedisServer::spawn();
    count_round_trips(&server, store(&server.url(), "rt", None).await).await;
    let pooled = RedisStore::builder()
        .prefix("rt-pool")
        .deadline(Duration::from_secs(10))
        .pool_checkout_timeout(Duration::from_secs(2))
        .connect_pool(server.url())
        .await
        .unwrap();
    count_round_trips(&server, pooled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_mid_run_surfaces_no_error() {
    let server = RedisServer::spawn();
    let store = store(&server.url(), "flush", None).await;
    let policy = Policy::new("flush", Algorithm::SlidingWindow, "1000000/min").unwrap();
    let flusher = {
        let url = server.url();
        tokio::spawn(async move {
            let client = redis::Client::open(url).unwrap();
            let mut con = client.get_multiplexed_async_connection().await.unwrap();
            for _ in 0..20 {
                let _: () = redis::cmd("SCRIPT")
                    .arg("FLUSH")
                    .query_async(&mut con)
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let mut ok = 0;
    while !flusher.is_finished() {
        let d = store
            .check(&Key::user("f"), &policy, 1)
            .await
            .expect("no error reaches the caller");
        assert!(d.is_allowed());
        ok += 1;
    }
    flusher.await.unwrap();
    let mut con = server.connection();
    assert_eq!(command_calls(&mut con, "script|flush"), 20);
    assert!(ok > 20, "{ok} decisions ran during the flushes");
    // Every NOSCRIPT was answered by one EVAL with the source.
    assert!(
        command_calls(&mut con, "eval") > 0,
        "the flushes were noticed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_writes_first_while_keys_are_idle_and_reads_first_once_they_are_busy() {
    let server = RedisServer::spawn();
    let mut con = server.connection();
    let store = RedisStore::builder()
        .deadline(Duration::from_secs(10))
        .deny_cache(0)
        .connect(server.url())
        .await
        .unwrap();
    let policy = Policy::new("order", Algorithm::Gcra, "10/min").unwrap();
    let reset = |con: &mut redis::Connection| {
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(con).unwrap();
    };
    // 100 keys, once each: every key is absent, and one SET ... NX GET
    // decides it.
    reset(&mut con);
    for i in 0..100 {
        let d = store
            .check(&Key::user(format!("idle-{i}")), &policy, 1)
            .await;
        assert!(d.unwrap().is_allowed());
    }
    assert_eq!(command_calls(&mut con, "set"), 100);
    assert_eq!(command_calls(&mut con, "get"), 0);
    // One key, 100 times: the first request finds it absent, every later
    // one finds it holding a time. The share of such requests, a moving
    // average over about 32, first reaches a quarter with the tenth of
    // them (2,048 per 65,536 each, less 1/32 of the share): requests 1 to
    // 11 write first, 12 to 100 read first.
    reset(&mut con);
    let mut allowed = 0;
    for _ in 0..100 {
        allowed += usize::from(
            store
                .check(&Key::user("busy"), &policy, 1)
                .await
                .unwrap()
                .is_allowed(),
        );
    }
    assert_eq!(allowed, 10);
    // Eleven SET ... NX GET, then a SET for each of the nine admitted after
    // the first, which wrote the key; a denial writes nothing.
    assert_eq!(command_calls(&mut con, "set"), 11 + 9);
    assert_eq!(command_calls(&mut con, "get"), 89);
    assert_eq!(command_calls(&mut con, "incrby"), 0);
}

/// A blocked key's decisions say so ([`Decision::is_blocked`]), from
/// every script (the word scripts' and the general one's, of one limit
/// and of two), from the deny cache, and in its status; a denial over
/// the limit does not.
#[tokio::test]
async fn a_blocked_keys_decisions_say_it_is_blocked_from_every_script() {
    let url = require_redis().await;
    let clock = FakeClock::default();
    let redis = store(&url, &unique_prefix("blocked"), Some(clock.clone())).await;
    for algorithm in Algorithm::ALL {
        for limits in [&["2/min"][..], &["2/min", "100/h"][..]] {
            let mut builder = Policy::builder("blocked").algorithm(algorithm);
            for limit in limits {
                builder = builder.limit(*limit);
            }
            let policy = builder.build().unwrap();
            let case = format!("{algorithm:?} {limits:?}");
            let (over, blocked) = (Key::user(format!("over {case}")), Key::user(case.clone()));
            // Checks until one is denied over the limit (a leaky bucket's
            // second limit queues, and denies sooner).
            let mut denials = 0;
            for _ in 0..6 {
                let decided = redis.check(&over, &policy, 1).await.unwrap();
                assert!(!decided.is_blocked(), "{case}: {decided:?}");
                denials += usize::from(!decided.is_allowed());
            }
            assert!(denials >= 2, "{case}");
            redis
                .block(&blocked, &policy, Duration::from_secs(600))
                .await
                .unwrap();
            // The second check of one limit is the deny cache's answer.
            for _ in 0..2 {
                let denied = redis.check(&blocked, &policy, 1).await.unwrap();
                assert!(denied.is_blocked(), "{case}: {denied:?}");
                assert_eq!(denied.retry_after(), Some(Duration::from_secs(600)));
            }
            assert!(redis.status(&blocked, &policy).await.unwrap().is_blocked());
        }
    }
}
