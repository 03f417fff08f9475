//! Leased stores for the lease tests.

use std::time::Duration;

use tollgate_core::FakeClock;
use tollgate_redis::{LeasedStore, RedisStore};

/// A leased store over a Redis store at `url` under `prefix`, both on
/// `clock`: leases of `interval` and `share`, a deny cache of
/// `deny_cache` keys (a cached denial stands until its own retry time,
/// whatever other instances give back meanwhile), and invalidations on
/// `<prefix>:leases`, shared by every store made with the same prefix.
///
/// The deadlines are generous: on a busy machine a slow answer must not
/// read as a Redis failure (a test that kills its Redis fails at once).
pub async fn leased_store(
    url: &str,
    prefix: &str,
    clock: &FakeClock,
    interval: Duration,
    share: u64,
    deny_cache: usize,
) -> LeasedStore<RedisStore> {
    let redis = RedisStore::builder()
        .prefix(prefix)
        .test_clock(clock.clone())
        .deny_cache(deny_cache)
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("Redis at {url}: {e}"));
    let leased = LeasedStore::builder()
        .interval(interval)
        .share(share)
        .channel(format!("{prefix}:leases"))
        .test_clock(clock.clone())
        .connect(redis, url)
        .await
        .unwrap_or_else(|e| panic!("subscribing at {url}: {e}"));
    assert!(leased.is_listening(), "subscribed to invalidations");
    leased
}
