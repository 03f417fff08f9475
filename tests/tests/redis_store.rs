//! The Redis store against real Redis servers: exact across instances, one
//! round trip, NOSCRIPT recovery, TTLs, hostile keys.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

#[path = "redis_store/expiry.rs"]
mod expiry;
#[path = "redis_store/keys_and_time.rs"]
mod keys_and_time;
#[path = "redis_store/layout.rs"]
mod layout;
#[path = "redis_store/scripts.rs"]
mod scripts;

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use tokio::sync::Barrier;
use tollgate_core::{FakeClock, Key, Policy, Store};
use tollgate_redis::RedisStore;
use tollgate_tests::unique_prefix;

async fn store(url: &str, prefix: &str, clock: Option<FakeClock>) -> RedisStore {
    let builder = RedisStore::builder()
        .prefix(prefix)
        .deadline(Duration::from_secs(10))
        .response_timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(2));
    let builder = match clock {
        Some(clock) => builder.test_clock(clock),
        None => builder,
    };
    builder.connect(url).await.unwrap()
}

/// A store on Redis `TIME`, as in production, without a deny cache (every
/// decision runs the script), whose one-time script always writes first
/// or always reads first.
async fn script_store(url: &str, prefix: &str, write_first: bool) -> RedisStore {
    RedisStore::builder()
        .prefix(unique_prefix(prefix))
        .deadline(Duration::from_secs(10))
        .deny_cache(0)
        .test_write_first(write_first)
        .connect(url)
        .await
        .unwrap()
}

/// Sends `n` checks of `key` at once (released together by a barrier),
/// spread over `stores` in turn, and returns how many were admitted.
async fn admitted_at_once(stores: &[RedisStore], policy: &Policy, key: &Key, n: usize) -> usize {
    let barrier = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (store, policy, key, barrier) = (
                stores[i % stores.len()].clone(),
                policy.clone(),
                key.clone(),
                barrier.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                store.check(&key, &policy, 1).await.unwrap().is_allowed()
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await.unwrap());
    }
    admitted
}

/// The time stored under `state_key` (µs) and its expiry (PEXPIRETIME, ms).
async fn time_and_expiry(
    con: &mut redis::aio::MultiplexedConnection,
    state_key: &str,
) -> (u64, u64) {
    let value: String = con.get(state_key).await.unwrap();
    let time = stored_time(&value);
    let expiry: u64 = redis::cmd("PEXPIRETIME")
        .arg(state_key)
        .query_async(con)
        .await
        .unwrap();
    (time, expiry)
}

/// The time (or window word) of a word script's value, "0x<time in
/// hexadecimal>|<descriptor>", or "<time in decimal>|<descriptor>" as
/// earlier versions wrote it.
fn stored_time(value: &str) -> u64 {
    let time = value.split('|').next().unwrap();
    match time.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).unwrap(),
        None => time.parse().unwrap(),
    }
}

/// Redis `TIME` in µs.
async fn redis_time(con: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (sec, usec): (u64, u64) = redis::cmd("TIME").query_async(con).await.unwrap();
    sec * 1_000_000 + usec
}
