//! A `PolicyFamily`'s block, reset and status act on every member, with
//! exact figures, on the memory store, on Redis, through `LeasedStore`, and
//! from a `RateLimiter` (through its `FallbackStore`); a family of one acts
//! as its policy alone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use tollgate::{
    Algorithm, FakeClock, Key, MemoryStore, Policy, PolicyFamily, RateLimiter, Store, Timestamp,
};
use tollgate_redis::{LeasedStore, RedisStore};
use tollgate_tests::{require_redis, unique_prefix};

const T0: u64 = 1_700_000_040;

/// A route's policy and two plans', of three shapes: a token bucket (one
/// time), a fixed window (a window word) and a sliding log of two limits
/// (the full state).
fn family() -> PolicyFamily {
    let free = Policy::new("export", Algorithm::TokenBucket, "50/h").unwrap();
    let pro = Policy::new("export-pro", Algorithm::FixedWindow, "200/h").unwrap();
    let team = Policy::builder("export-team")
        .algorithm(Algorithm::SlidingLog)
        .limit("10/s")
        .limit("1000/h")
        .build()
        .unwrap();
    PolicyFamily::new("export", [free, pro, team]).unwrap()
}

/// Each member's (remaining, retry-after) for `key`, by a request of cost 1.
async fn checked(store: &impl Store, family: &PolicyFamily, key: &Key) -> Vec<(u64, Option<u64>)> {
    let mut seen = Vec::new();
    for policy in family.members() {
        let d = store.check(key, policy, 1).await.unwrap();
        seen.push((d.remaining(), d.retry_after().map(|r| r.as_micros() as u64)));
    }
    seen
}

/// Block, reset and status of a family, and a family of one against its
/// policy; returns every figure seen, for comparing stores.
async fn scenario(store: impl Store, clock: &FakeClock) -> Vec<Vec<(u64, Option<u64>)>> {
    clock.set(Timestamp::from_secs(T0));
    let family = family();
    let bob = Key::user("bob");
    let ada = Key::user("ada");
    let mut out = Vec::new();

    // Spent on every member: 1 used of each.
    let spent = checked(&store, &family, &bob).await;
    assert_eq!(spent, [(49, None), (199, None), (9, None)]);
    out.push(spent);

    // Blocked for 90 s: every member denies with exactly the rest of the
    // block, and shows nothing left.
    let ninety = 90_000_000;
    family
        .block(&store, &bob, Duration::from_secs(90))
        .await
        .unwrap();
    let blocked = checked(&store, &family, &bob).await;
    assert_eq!(blocked, [(0, Some(ninety)); 3]);
    out.push(blocked);
    clock.advance(Duration::from_secs(30));
    let later = checked(&store, &family, &bob).await;
    assert_eq!(later, [(0, Some(60_000_000)); 3]);
    out.push(later);
    let status = family.status(&store, &bob).await.unwrap();
    let names: Vec<&str> = status.iter().map(|(p, _)| p.name()).collect();
    assert_eq!(names, ["export", "export-pro", "export-team"]);
    for (policy, d) in &status {
        assert_eq!(d.remaining(), 0, "{}", policy.name());
        assert_eq!(d.reset(), Duration::from_secs(60), "{}", policy.name());
    }
    // Another key is untouched.
    assert_eq!(
        checked(&store, &family, &ada).await,
        [(49, None), (199, None), (9, None)]
    );

    // Reset lifts the block on every member: each starts afresh.
    family.reset(&store, &bob).await.unwrap();
    let status = family.status(&store, &bob).await.unwrap();
    let left: Vec<u64> = status.iter().map(|(_, d)| d.remaining()).collect();
    assert_eq!(left, [50, 200, 10]);
    // And forgets what was used on every member.
    family.reset(&store, &ada).await.unwrap();
    let fresh = checked(&store, &family, &ada).await;
    assert_eq!(fresh, [(49, None), (199, None), (9, None)]);
    out.push(fresh);

    // A family of one acts as its policy: the same figures as the store's
    // own block and reset, on two keys.
    let pro = family.member("export-pro").unwrap().clone();
    let one = PolicyFamily::from(pro.clone());
    let (cleo, dan) = (Key::user("cleo"), Key::user("dan"));
    one.block(&store, &cleo, Duration::from_secs(45))
        .await
        .unwrap();
    store
        .block(&dan, &pro, Duration::from_secs(45))
        .await
        .unwrap();
    let by_family = store.check(&cleo, &pro, 1).await.unwrap();
    let by_store = store.check(&dan, &pro, 1).await.unwrap();
    assert_eq!(by_family.retry_after(), Some(Duration::from_secs(45)));
    assert_eq!(by_family.retry_after(), by_store.retry_after());
    assert_eq!(
        one.status(&store, &cleo).await.unwrap()[0].1.remaining(),
        store.status(&dan, &pro).await.unwrap().remaining()
    );
    // Only its member: cleo is not blocked on the free plan.
    let free = family.member("export").unwrap();
    assert!(store.check(&cleo, free, 1).await.unwrap().is_allowed());
    one.reset(&store, &cleo).await.unwrap();
    store.reset(&dan, &pro).await.unwrap();
    assert_eq!(store.check(&cleo, &pro, 1).await.unwrap().remaining(), 199);
    assert_eq!(store.check(&dan, &pro, 1).await.unwrap().remaining(), 199);
    out
}

async fn redis(clock: &FakeClock, name: &str) -> RedisStore {
    let url = require_redis().await;
    RedisStore::builder()
        .prefix(unique_prefix(name))
        .deadline(Duration::from_secs(5))
        .test_clock(clock.clone())
        .connect(url.as_str())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_family_blocks_and_resets_every_member_on_memory_and_the_same_on_redis() {
    let clock = FakeClock::default();
    let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let on_memory = scenario(memory, &clock).await;
    let on_redis = scenario(redis(&clock, "family").await, &clock).await;
    assert_eq!(on_memory, on_redis);
}

#[tokio::test]
async fn a_family_blocks_and_resets_every_member_through_leases() {
    let clock = FakeClock::default();
    let url = require_redis().await;
    let prefix = unique_prefix("family-leased");
    let inner = RedisStore::builder()
        .prefix(prefix.clone())
        .deadline(Duration::from_secs(5))
        .test_clock(clock.clone())
        .connect(url.as_str())
        .await
        .unwrap();
    let leased = LeasedStore::builder()
        .channel(format!("{prefix}:leases"))
        .test_clock(clock.clone())
        .connect(inner, url.as_str())
        .await
        .unwrap();
    let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let on_memory = scenario(memory, &clock).await;
    assert_eq!(scenario(leased, &clock).await, on_memory);
}

#[tokio::test]
async fn a_limiter_in_a_family_blocks_the_key_on_every_plan() {
    let clock = FakeClock::default();
    clock.set(Timestamp::from_secs(T0));
    let store = redis(&clock, "family-limiter").await;
    let family = family();
    let free = family.member("export").unwrap().clone();
    let pro = family.member("export-pro").unwrap().clone();
    let on_free = RateLimiter::with_store(free, store.clone())
        .local_fallback(MemoryStore::builder().clock(clock.clone()).build().unwrap())
        .in_family(family.clone())
        .unwrap();
    let on_pro = RateLimiter::with_store(pro, store)
        .in_family(family.clone())
        .unwrap();
    let bob = Key::user("bob");
    assert!(on_pro.check(&bob).await.unwrap().is_allowed());

    on_free.block(&bob, Duration::from_secs(90)).await.unwrap();
    let denied = on_pro.check(&bob).await.unwrap();
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(90)));
    let status = on_free.family_status(&bob).await.unwrap();
    let left: Vec<u64> = status.iter().map(|(_, d)| d.remaining()).collect();
    assert_eq!(left, [0, 0, 0]);

    on_free.reset(&bob).await.unwrap();
    assert_eq!(on_pro.check(&bob).await.unwrap().remaining(), 199);

    // The limiter's own policy must be a member, by name.
    let stranger = Policy::new("other", Algorithm::Gcra, "1/s").unwrap();
    let err = RateLimiter::new(stranger).in_family(family).unwrap_err();
    assert_eq!(
        err.to_string(),
        "policy \"other\" is not a member of policy family \"export\""
    );
}
