//! The deny cache: a client hammering an exhausted key costs Redis (almost)
//! nothing, and every decision is the one Redis would have made.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::task::Poll;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use tollgate::{
    Algorithm, ExtensionKey, FailureMode, FakeClock, Key, MemoryStore, Policy, RateLimitLayer,
    Settlement, Store, StoreError, Timestamp, ToKey,
};
use tollgate_redis::RedisStore;
use tollgate_tests::{RedisServer, command_calls};
use tower::ServiceExt;

/// A store on Redis's clock with a short deadline, for outages.
async fn live_store(server: &RedisServer, deadline: Duration) -> RedisStore {
    RedisStore::builder()
        .deadline(deadline)
        .connect(server.url())
        .await
        .unwrap()
}

/// A store with a short deadline on `clock`, which the test does not move:
/// a cached denial answers for Redis for a second of it (see
/// `a_cached_denial_learns_of_another_servers_reset_and_block_within_a_second`),
/// so here only what the test is about can stop it.
async fn frozen_store(server: &RedisServer, deadline: Duration, clock: &FakeClock) -> RedisStore {
    RedisStore::builder()
        .deadline(deadline)
        .test_clock(clock.clone())
        .connect(server.url())
        .await
        .unwrap()
}

/// A route limited by `policy` per user on `store`, falling back to
/// `local` with `1 / divisor` of the limit.
fn local_app(store: &RedisStore, policy: &Policy, divisor: u64, local: MemoryStore) -> Router {
    Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(policy.clone(), ExtensionKey::<String>::new())
            .store(store.clone())
            .on_store_error(FailureMode::Local)
            .local_divisor(std::num::NonZeroU64::new(divisor).unwrap())
            .local_fallback(local),
    )
}

/// The status of a request by `user`.
async fn send(app: &Router, user: &str) -> u16 {
    let mut request = http::Request::new(Body::empty());
    request.extensions_mut().insert(user.to_owned());
    app.clone()
        .oneshot(request)
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn store(server: &RedisServer, clock: &FakeClock, deny_cache: usize) -> RedisStore {
    RedisStore::builder()
        .deny_cache(deny_cache)
        .deadline(Duration::from_secs(5))
        .test_clock(clock.clone())
        .connect(server.url())
        .await
        .unwrap()
}

#[tokio::test]
async fn hammering_an_exhausted_key_drops_redis_calls_by_over_90_percent() {
    let (with, without) = (RedisServer::spawn(), RedisServer::spawn());
    let clock = FakeClock::default();
    let cached = store(&with, &clock, 10_000).await;
    let uncached = store(&without, &clock, 0).await;
    for algorithm in Algorithm::ALL {
        let (mut c1, mut c2) = (with.connection(), without.connection());
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut c1)
            .unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut c2)
            .unwrap();
        let policy = Policy::new(format!("hammer-{algorithm}"), algorithm, "5/10s").unwrap();
        let key = Key::user("hammer");
        let mut denied = 0;
        // 2,000 requests, one every 10 ms: 20 s of a client at full speed.
        for _ in 0..2_000 {
            clock.advance(Duration::from_millis(10));
            let a = cached.check(&key, &policy, 1).await.unwrap();
            let b = uncached.check(&key, &policy, 1).await.unwrap();
            assert_eq!(a, b, "{algorithm}: the cache changed a decision");
            denied += usize::from(!a.is_allowed());
        }
        let (calls_with, calls_without) = (
            command_calls(&mut c1, "evalsha"),
            command_calls(&mut c2, "evalsha"),
        );
        assert_eq!(calls_without, 2_000);
        // 2,000 requests over 20 s of the fake clock.
        println!(
            "{algorithm}: {} Redis calls/s with the cache, {} without ({:.1}% fewer)",
            calls_with as f64 / 20.0,
            calls_without as f64 / 20.0,
            100.0 * (1.0 - calls_with as f64 / calls_without as f64)
        );
        assert!(
            denied > 1_900,
            "{algorithm}: the key was exhausted ({denied} denials)"
        );
        assert!(
            calls_with * 10 <= calls_without,
            "{algorithm}: {calls_with} Redis calls with the cache, {calls_without} without"
        );
    }
    assert!(cached.deny_cache_len() > 0);
}

/// A denied key, then Redis restarted with no data: the same store notices
/// (its connection failed, or Redis's `run_id` changed) and asks Redis
/// again within 2.5 s of the restart, and Redis admits the key. On a test
/// clock that stands still, so that the denial's one second as an answer
/// for Redis never passes.
#[tokio::test]
async fn a_denial_does_not_outlive_a_restarted_redis() {
    let mut server = RedisServer::spawn();
    let clock = FakeClock::default();
    let store = frozen_store(&server, Duration::from_secs(2), &clock).await;
    let policy = Policy::new("restart", Algorithm::FixedWindow, "1/h").unwrap();
    let key = Key::user("denied");
    assert!(store.check(&key, &policy, 1).await.unwrap().is_allowed());
    let denied = store.check(&key, &policy, 1).await.unwrap();
    assert!(!denied.is_allowed());
    assert!(denied.retry_after().unwrap() > Duration::from_secs(1));
    assert_eq!(store.deny_cache_len(), 1);
    // Answered from the cache: no call reaches Redis.
    let mut con = server.connection();
    let before = command_calls(&mut con, "evalsha");
    assert!(!store.check(&key, &policy, 1).await.unwrap().is_allowed());
    assert_eq!(command_calls(&mut con, "evalsha"), before);
    drop(con);

    server.restart();
    let restarted = std::time::Instant::now();
    let mut admitted = None;
    while restarted.elapsed() < Duration::from_secs(5) {
        // Store errors while the connection is made anew are fine here.
        if let Ok(decision) = store.check(&key, &policy, 1).await
            && decision.is_allowed()
        {
            admitted = Some(restarted.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let admitted = admitted.expect("the key was denied from the cache for 5 s after the restart");
    println!("decided by the restarted Redis after {admitted:?}");
    assert!(
        admitted < Duration::from_millis(2_500),
        "{admitted:?} after the restart"
    );
    // Redis decided it: the new server holds the key's state.
    assert!(!store.check(&key, &policy, 1).await.unwrap().is_allowed());
}

/// A key Redis cut off stays cut off while Redis is down, whatever the
/// failure policy: its denial stands rather than a fresh local quota.
#[tokio::test]
async fn a_key_redis_denied_stays_denied_while_redis_is_down() {
    let mut server = RedisServer::spawn();
    let store = live_store(&server, Duration::from_millis(200)).await;
    // Three limits: the general script, whose denials the cache does not
    // answer for Redis.
    let policy = Policy::builder("outage")
        .limit("3/h")
        .limit("10/d")
        .limit("20/7d")
        .build()
        .unwrap();
    let app = local_app(&store, &policy, 1, MemoryStore::new());
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(send(&app, "cut-off").await);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    assert_eq!(send(&app, "other").await, 200);

    server.kill();
    // Redis fails every call now: the cut-off key's denial stands, on the
    // store and through the layer's local fallback.
    for _ in 0..3 {
        // The key the layer made of the user's id.
        let decision = store.check(&"cut-off".to_key(), &policy, 1).await;
        let decision = decision.expect("a denial in force answers");
        assert!(!decision.is_allowed());
        assert_eq!(send(&app, "cut-off").await, 429);
    }
    // A key Redis had not cut off gets the store's error, and the local
    // fallback decides it.
    assert!(
        store
            .check(&Key::user("never-seen"), &policy, 1)
            .await
            .is_err()
    );
    assert_eq!(send(&app, "other").await, 200);
}

/// Every algorithm but the leaky bucket, which admits with delays that
/// the layer waits out.
fn all_but_the_leaky_bucket() -> impl Iterator<Item = Algorithm> {
    (Algorithm::ALL.into_iter()).filter(|&a| a != Algorithm::LeakyBucket)
}

/// A Redis server of its own, a store there with a deadline of 200 ms,
/// and a memory store for the local fallback, both on one clock that
/// stands still: on real time, an hour ending between Redis's decisions
/// and the fallback's would give a key a fresh window.
async fn on_a_still_clock() -> (RedisServer, RedisStore, MemoryStore) {
    let server = RedisServer::spawn();
    let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
    let store = frozen_store(&server, Duration::from_millis(200), &clock).await;
    let local = MemoryStore::builder().clock(clock).build().unwrap();
    (server, store, local)
}

/// A key Redis had not cut off, when Redis goes down, carries the use
/// Redis last reported into the local fallback (scaled to the local share)
/// instead of starting afresh there.
#[tokio::test]
async fn the_local_fallback_takes_over_a_keys_use_from_redis() {
    // A leaky bucket admits with a delay (minutes here, at 5 an hour),
    // which the layer waits out; the unit tests of `PolicyState::seeded`
    // cover it. (Nothing is denied before the kill, so no cached denial
    // outlives it.)
    for algorithm in all_but_the_leaky_bucket() {
        let (mut server, store, local) = on_a_still_clock().await;
        let policy = Policy::builder(format!("takeover-{algorithm}"))
            .algorithm(algorithm)
            .limit("10/h")
            .limit("100/d")
            .build()
            .unwrap();
        // Two servers share the limit: each has half of it while Redis is down.
        let app = local_app(&store, &policy, 2, local);
        for _ in 0..8 {
            assert_eq!(send(&app, "partial").await, 200, "{algorithm}");
        }
        server.kill();
        let mut after = Vec::new();
        for _ in 0..6 {
            after.push(send(&app, "partial").await);
        }
        let mut fresh = Vec::new();
        for _ in 0..6 {
            fresh.push(send(&app, "unseen").await);
        }
        // The local share is 5 an hour: 8 of 10 used leaves 1 of it (4 of
        // 5 used). A key Redis never saw gets all 5.
        assert_eq!(after, [200, 429, 429, 429, 429, 429], "{algorithm}");
        assert_eq!(fresh, [200, 200, 200, 200, 200, 429], "{algorithm}");
    }
}

/// A key whose limits change while Redis is down (an override set, lifted
/// or expired, a deploy) keeps its use in the local fallback, carried to
/// the new limits as Redis would carry it: lowered below what it used, it
/// is refused; raised, it gets what the raise leaves it. The fallback
/// found no record of the key under its new limits, and gave it a fresh
/// share: 3 requests of a key that had used 8 of 10 an hour, lowered to 5.
#[tokio::test]
async fn a_key_whose_limits_change_while_redis_is_down_keeps_its_use_locally() {
    for algorithm in all_but_the_leaky_bucket() {
        let (mut server, store, local) = on_a_still_clock().await;
        let limits = |hourly: &str| {
            Policy::builder(format!("changed-{algorithm}"))
                .algorithm(algorithm)
                .limit(hourly)
                .limit("100/d")
                .build()
                .unwrap()
        };
        let app = local_app(&store, &limits("10/h"), 1, local.clone());
        for _ in 0..8 {
            assert_eq!(send(&app, "lowered").await, 200, "{algorithm}");
            assert_eq!(send(&app, "raised").await, 200, "{algorithm}");
        }
        server.kill();
        let lowered = local_app(&store, &limits("5/h"), 1, local.clone());
        let mut after = Vec::new();
        for _ in 0..3 {
            after.push(send(&lowered, "lowered").await);
        }
        assert_eq!(after, [429, 429, 429], "{algorithm}");
        // Raised to 20: 12 more.
        let raised = local_app(&store, &limits("20/h"), 1, local);
        let mut after = Vec::new();
        for _ in 0..13 {
            after.push(send(&raised, "raised").await);
        }
        let admitted = after.iter().filter(|&&s| s == 200).count();
        assert_eq!(admitted, 12, "{algorithm}: {after:?}");
        assert_eq!(after[12], 429, "{algorithm}");
    }
}

/// A refund whose call missed its deadline may still have run in Redis:
/// the key's denial here stops answering for Redis, so that the room the
/// refund made is not denied locally until the denial's retry time; it
/// still stands while Redis cannot answer.
#[tokio::test]
async fn a_refund_whose_call_missed_its_deadline_lifts_the_denial() {
    let server = RedisServer::spawn();
    let clock = FakeClock::default();
    let store = frozen_store(&server, Duration::from_millis(200), &clock).await;
    let policy = Policy::new("late-refund", Algorithm::FixedWindow, "2/day").unwrap();
    let key = Key::user("refunded");
    assert!(store.check(&key, &policy, 1).await.unwrap().is_allowed());
    let second = store.check(&key, &policy, 1).await.unwrap();
    assert_eq!(second.remaining(), 0);
    assert!(!store.check(&key, &policy, 1).await.unwrap().is_allowed());
    assert_eq!(store.deny_cache_len(), 1);
    // Redis holds writes for a second, past the call's ceiling (four
    // deadlines): the refund fails, and runs once the pause ends.
    server.pause_writes(1_000);
    let refund = store
        .settle(&key, &policy, Settlement::of(&second, 1, 0))
        .await;
    assert!(matches!(refund, Err(StoreError::Timeout(_))), "{refund:?}");
    assert_eq!(store.deny_cache_len(), 1, "kept, for an outage");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    // Redis decides, with the refunded unit: one more is admitted.
    let after = store.check(&key, &policy, 1).await.unwrap();
    assert!(after.is_allowed(), "{after:?}");
    assert_eq!(after.remaining(), 0);

    // A refund whose call is dropped on its way (its caller went away)
    // lifts the denial as well.
    assert!(!store.check(&key, &policy, 1).await.unwrap().is_allowed());
    server.pause_writes(1_000);
    let dropped = tokio::time::timeout(
        Duration::from_millis(50),
        store.settle(&key, &policy, Settlement::of(&after, 1, 0)),
    )
    .await;
    assert!(dropped.is_err(), "still on its way: {dropped:?}");
    assert_eq!(store.deny_cache_len(), 1, "kept, for an outage");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let after = store.check(&key, &policy, 1).await.unwrap();
    assert!(after.is_allowed(), "{after:?}");
}

/// A reset whose call missed its deadline, or was dropped on its way, but
/// ran in Redis, lifts the key's cached denial as one that came back does:
/// before, the key stayed denied here (a day-long block's denial
/// included) while Redis admitted it, and through an outage after.
#[tokio::test]
async fn a_reset_whose_call_missed_its_deadline_or_was_dropped_lifts_the_denial() {
    let server = RedisServer::spawn();
    let clock = FakeClock::default();
    let store = frozen_store(&server, Duration::from_millis(200), &clock).await;
    let policy = Policy::new("late-reset", Algorithm::FixedWindow, "2/day").unwrap();
    let key = Key::user("reset");
    for _ in 0..2 {
        assert!(store.check(&key, &policy, 1).await.unwrap().is_allowed());
    }
    assert!(!store.check(&key, &policy, 1).await.unwrap().is_allowed());
    assert_eq!(store.deny_cache_len(), 1);
    server.pause_writes(1_000);
    let reset = store.reset(&key, &policy).await;
    assert!(matches!(reset, Err(StoreError::Timeout(_))), "{reset:?}");
    assert_eq!(store.deny_cache_len(), 0);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let after = store.check(&key, &policy, 1).await.unwrap();
    assert_eq!(
        (after.is_allowed(), after.remaining()),
        (true, 1),
        "{after:?}"
    );

    // Blocked for a day, then a reset dropped on its way.
    let day = Duration::from_secs(86_400);
    store.block(&key, &policy, day).await.unwrap();
    assert!(store.check(&key, &policy, 1).await.unwrap().is_blocked());
    assert_eq!(store.deny_cache_len(), 1);
    server.pause_writes(500);
    let dropped = tokio::time::timeout(Duration::from_millis(50), store.reset(&key, &policy)).await;
    assert!(dropped.is_err(), "still on its way: {dropped:?}");
    assert_eq!(store.deny_cache_len(), 0);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let after = store.check(&key, &policy, 1).await.unwrap();
    assert!(
        after.is_allowed(),
        "the block was lifted in Redis: {after:?}"
    );
}

/// A denial of a larger cost leaves a key's standing denial of cost 1 in
/// place: it still answers while Redis is down. Before, it replaced it,
/// and the cost-1 request went to the failure policy (a client choosing
/// its cost could end its own denial just before an outage).
#[tokio::test]
async fn a_costlier_denial_leaves_the_standing_denial_of_cost_one() {
    let mut server = RedisServer::spawn();
    let store = live_store(&server, Duration::from_millis(200)).await;
    let policy = Policy::builder("outage-cost")
        .limit("3/h")
        .limit("10/d")
        .build()
        .unwrap();
    let key = Key::user("cut-off");
    for _ in 0..3 {
        assert!(store.check(&key, &policy, 1).await.unwrap().is_allowed());
    }
    assert!(!store.check(&key, &policy, 1).await.unwrap().is_allowed());
    assert!(!store.check(&key, &policy, 2).await.unwrap().is_allowed());
    server.kill();
    for cost in [1, 2] {
        let decision = store.check(&key, &policy, cost).await;
        assert!(
            decision.as_ref().is_ok_and(|d| !d.is_allowed()),
            "cost {cost}: {decision:?}"
        );
    }
}

/// A costlier denial whose own numbers leave room for cost 1 (another
/// server reset the key) ends the key's cost-1 denial: it no longer
/// stands while Redis is down.
#[tokio::test]
async fn a_costlier_denial_with_room_for_one_ends_the_cost_one_denial() {
    let mut server = RedisServer::spawn();
    let prefix = tollgate_tests::unique_prefix("stale-denial");
    let connect = || {
        RedisStore::builder()
            .prefix(prefix.clone())
            .deadline(Duration::from_millis(200))
            .connect(server.url())
    };
    let (a, b) = (connect().await.unwrap(), connect().await.unwrap());
    let policy = Policy::new("stale", Algorithm::Gcra, "10/h").unwrap();
    let key = Key::user("k");
    for _ in 0..10 {
        assert!(a.check(&key, &policy, 1).await.unwrap().is_allowed());
    }
    assert!(!a.check(&key, &policy, 1).await.unwrap().is_allowed());
    assert_eq!(a.deny_cache_len(), 1);
    // Another app server resets the key and spends 7: 3 remain.
    b.reset(&key, &policy).await.unwrap();
    for _ in 0..7 {
        assert!(b.check(&key, &policy, 1).await.unwrap().is_allowed());
    }
    // Redis tells A, in a fresh denial of cost 5, that 3 remain.
    let five = a.check(&key, &policy, 5).await.unwrap();
    assert!(!five.is_allowed());
    assert_eq!(five.remaining(), 3, "{five:?}");
    server.kill();
    // Redis's last word is that a cost-1 request fits; A still denies it
    // from the old cost-1 denial (until its end, ~6 min away).
    let one = a.check(&key, &policy, 1).await;
    assert!(
        !one.as_ref().is_ok_and(|d| !d.is_allowed()),
        "denied from a stale cost-1 denial Redis contradicted: {one:?}"
    );
}

/// What another app server does to a key reaches this one's cached denial
/// within a second: a reset lifts it, and a block replaces it, with the
/// block's own retry time. Before, the denial answered until its own retry
/// time: a key reset elsewhere was denied here for up to an hour, and a
/// blocked client was told to come back far too early.
#[tokio::test]
async fn a_cached_denial_learns_of_another_servers_reset_and_block_within_a_second() {
    let mut server = RedisServer::spawn();
    let clock = FakeClock::default();
    let (here, there) = (
        store(&server, &clock, 10_000).await,
        store(&server, &clock, 10_000).await,
    );
    let policy = Policy::new("elsewhere", Algorithm::Gcra, "2/h").unwrap();
    let key = Key::user("ada");
    let mut con = server.connection();
    for _ in 0..2 {
        assert!(here.check(&key, &policy, 1).await.unwrap().is_allowed());
    }
    let denied = here.check(&key, &policy, 1).await.unwrap();
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(1_800)));

    // Reset elsewhere: for under a second the cache still answers...
    there.reset(&key, &policy).await.unwrap();
    clock.advance(Duration::from_millis(999));
    let before = command_calls(&mut con, "evalsha");
    assert!(!here.check(&key, &policy, 1).await.unwrap().is_allowed());
    assert_eq!(command_calls(&mut con, "evalsha"), before, "from the cache");
    // ...then Redis does: the fresh allowance, all of it.
    clock.advance(Duration::from_millis(1));
    for _ in 0..2 {
        assert!(here.check(&key, &policy, 1).await.unwrap().is_allowed());
    }
    let denied = here.check(&key, &policy, 1).await.unwrap();
    assert!(!denied.is_allowed());

    // Blocked elsewhere for a day: within a second, the client is told so.
    there
        .block(&key, &policy, Duration::from_secs(86_400))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(1));
    let blocked = here.check(&key, &policy, 1).await.unwrap();
    assert_eq!(blocked.retry_after(), Some(Duration::from_secs(86_399)));
    // And a block lifted elsewhere (a reset) is lifted here within a second.
    there.reset(&key, &policy).await.unwrap();
    clock.advance(Duration::from_secs(1));
    assert!(here.check(&key, &policy, 1).await.unwrap().is_allowed());
    // For good: Redis's admission ended the cached block, which no longer
    // stands when Redis fails (the failure policy decides).
    server.kill();
    let failed = here.check(&key, &policy, 1).await;
    assert!(failed.is_err(), "{failed:?}");
}

/// A key hammered while other keys settle their costs: each settlement
/// removes its own key's denial, and a denial decided while one was
/// removed was turned away if it was of any key, so that an app whose
/// requests settle (one store call each) sent nearly every request of an
/// exhausted key to Redis. Each check of the hammered key here that goes
/// to Redis has another key's refund answered while it is on its way, ten
/// times a second for 20 s. A cached denial answers for a second: 20
/// calls at least. Before, every denial was turned away: 200 calls. Now
/// only a removal of the same stripe (one key in 64) turns one away.
#[tokio::test]
async fn other_keys_settlements_leave_a_hammered_keys_denial_cached() {
    let server = RedisServer::spawn();
    let clock = FakeClock::default();
    let store = RedisStore::builder()
        .batch_size(1)
        .deadline(Duration::from_secs(5))
        .test_clock(clock.clone())
        .connect(server.url())
        .await
        .unwrap();
    let policy = Policy::new("settled", Algorithm::Gcra, "5/h").unwrap();
    let hammered = Key::user("hammered");
    for _ in 0..5 {
        assert!(
            store
                .check(&hammered, &policy, 1)
                .await
                .unwrap()
                .is_allowed()
        );
    }
    let mut connection = server.connection();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut connection)
        .unwrap();
    let rounds = 200;
    for i in 0..rounds {
        clock.advance(Duration::from_millis(100));
        let other = Key::user(format!("other-{i}"));
        let reserved = store.check(&other, &policy, 1).await.unwrap();
        assert!(reserved.is_allowed());
        let refund = store.settle(&other, &policy, Settlement::of(&reserved, 1, 0));
        // The hammered key's check, on its way to Redis unless the cache
        // answers; the refund is answered while it is.
        let check = store.check(&hammered, &policy, 1);
        tokio::pin!(check);
        let first = futures::poll!(&mut check);
        refund.await.unwrap();
        let denied = match first {
            Poll::Ready(cached) => cached,
            Poll::Pending => check.await,
        };
        assert!(!denied.unwrap().is_allowed());
    }
    // Each round: the other key's check and refund, one call each; what
    // is left asked Redis about the hammered key.
    let hammered_calls = command_calls(&mut connection, "evalsha") - 2 * rounds;
    println!("{hammered_calls} of {rounds} checks of the hammered key went to Redis");
    assert!(
        (20..=25).contains(&hammered_calls),
        "{hammered_calls} of {rounds} checks of the hammered key went to Redis"
    );
}
