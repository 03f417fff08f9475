//! Live per-key overrides on Redis (`RedisOverrides`): set on one
//! instance, enforced by another within 1 s; an expiry restores the plan
//! (fake clock) and is cleaned up in Redis; a restart finds the override
//! in force; raising a limit mid-window keeps what the key used; exempt
//! and deny through the layer and the limiter; every key has a TTL; a
//! source started while Redis is down loads the overrides once it answers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::convert::Infallible;
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use tollgate::{
    Algorithm, FakeClock, HeaderKey, Key, Outcome, Override, OverrideStore, Policy, PolicyFamily,
    RateLimitLayer, RateLimiter, Timestamp,
};
use tollgate_redis::{RedisOverrides, RedisStore};
use tollgate_tests::{require_redis, unique_prefix};
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

const T0: u64 = 1_700_000_040;

/// One app instance: its store, its overrides, its layer, on `prefix`.
struct Instance {
    store: RedisStore,
    overrides: RedisOverrides,
}

impl Instance {
    async fn start(prefix: &str, clock: &FakeClock) -> Self {
        let url = require_redis().await;
        let store = RedisStore::builder()
            .prefix(prefix)
            .deadline(Duration::from_secs(5))
            .test_clock(clock.clone())
            .connect(url.as_str())
            .await
            .unwrap();
        // Kept a minute after the test, not the default 30 days.
        let overrides = RedisOverrides::builder()
            .retention(Duration::from_secs(60))
            .clock(clock.clone())
            .start(&store)
            .await
            .unwrap();
        Self { store, overrides }
    }

    /// One request of `key` through a layer of `policy` on this instance:
    /// its status and `x-ratelimit-limit` and `-remaining` (empty when
    /// absent).
    async fn request(&self, policy: &Policy, key: &str) -> (StatusCode, String, String) {
        let layer = RateLimitLayer::new(
            policy.clone(),
            HeaderKey::new(http::HeaderName::from_static("x-api-key")),
        )
        .store(self.store.clone())
        .overrides(self.overrides.clone());
        let mut svc =
            ServiceBuilder::new()
                .layer(layer)
                .service(service_fn(|_: Request<()>| async {
                    Ok::<_, Infallible>(Response::new(String::new()))
                }));
        let request = Request::get("/").header("x-api-key", key).body(()).unwrap();
        let response = svc.ready().await.unwrap().call(request).await.unwrap();
        let header = |name: &str| {
            let value = response.headers().get(name);
            value.map_or(String::new(), |v| v.to_str().unwrap().to_owned())
        };
        let (limit, remaining) = (header("x-ratelimit-limit"), header("x-ratelimit-remaining"));
        (response.status(), limit, remaining)
    }
}

fn api() -> Policy {
    Policy::new("api", Algorithm::FixedWindow, "10/min").unwrap()
}

/// Requests `key` on `instance` every 10 ms until `applied` holds of the
/// answer; how long that took. Fails after 3 s.
async fn until_applied(
    instance: &Instance,
    policy: &Policy,
    key: &str,
    applied: impl Fn(&(StatusCode, String, String)) -> bool,
) -> (Duration, (StatusCode, String, String)) {
    let start = Instant::now();
    loop {
        let answer = instance.request(policy, key).await;
        if applied(&answer) {
            return (start.elapsed(), answer);
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "never applied: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn an_override_set_on_one_instance_is_enforced_by_another_within_a_second() {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let prefix = unique_prefix("overrides-two");
    let (a, b) = (
        Instance::start(&prefix, &clock).await,
        Instance::start(&prefix, &clock).await,
    );
    let api = api();

    // acme spends its 10 on B; the 11th is refused.
    for left in (0..10).rev() {
        let answer = b.request(&api, "acme").await;
        assert_eq!(answer, (StatusCode::OK, "10".into(), left.to_string()));
    }
    assert_eq!(
        b.request(&api, "acme").await.0,
        StatusCode::TOO_MANY_REQUESTS
    );

    // Raised to 1000/min through A: B enforces it within 1 s, and acme
    // keeps what it used (room, not a fresh quota): 10 used, plus this one.
    let raised = Override::limit("1000/min").unwrap();
    a.overrides
        .set(&Key::header("acme"), &api, raised, None)
        .await
        .unwrap();
    let (took, answer) = until_applied(&b, &api, "acme", |a| a.1 == "1000").await;
    println!("raised on B after {took:?}");
    assert!(took <= Duration::from_secs(1), "took {took:?}");
    assert_eq!(answer, (StatusCode::OK, "1000".into(), "989".into()));
    // Other keys keep the plan.
    assert_eq!(b.request(&api, "bob").await.1, "10");

    // Denied through A: B answers 403 within 1 s, consuming nothing.
    a.overrides
        .set(&Key::header("acme"), &api, Override::Deny, None)
        .await
        .unwrap();
    let denied = |a: &(StatusCode, String, String)| a.0 == StatusCode::FORBIDDEN;
    let (took, _) = until_applied(&b, &api, "acme", denied).await;
    assert!(took <= Duration::from_secs(1), "took {took:?}");

    // Cleared through A: B is back on the plan (and acme over it) within 1 s.
    a.overrides.clear(&Key::header("acme"), &api).await.unwrap();
    let plan = |a: &(StatusCode, String, String)| a.0 == StatusCode::TOO_MANY_REQUESTS;
    let (took, answer) = until_applied(&b, &api, "acme", plan).await;
    assert!(took <= Duration::from_secs(1), "took {took:?}");
    assert_eq!((answer.1, answer.2), ("10".into(), "0".into()));
}

#[tokio::test]
async fn an_expiry_restores_the_plan_by_the_clock_and_is_cleaned_up_in_redis() {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let prefix = unique_prefix("overrides-expiry");
    let (a, b) = (
        Instance::start(&prefix, &clock).await,
        Instance::start(&prefix, &clock).await,
    );
    let api = api();
    let week = Duration::from_secs(7 * 86_400);
    let raised = Override::limit("1000/min").unwrap();
    a.overrides
        .set(&Key::header("acme"), &api, raised, Some(week))
        .await
        .unwrap();
    b.overrides.refresh().await.unwrap();
    assert_eq!(b.request(&api, "acme").await.1, "1000");

    // One µs before the expiry: still in force; at it: the plan, on both
    // instances, without a poll.
    clock.advance(week - Duration::from_micros(1));
    assert_eq!(b.request(&api, "acme").await.1, "1000");
    clock.advance(Duration::from_micros(1));
    assert_eq!(b.request(&api, "acme").await.1, "10");
    assert_eq!(a.request(&api, "acme").await.1, "10");

    // The hash outlives the override: its TTL is past the week.
    let mut redis = admin().await;
    let hash = a.overrides.hash_key().to_owned();
    let ttl: i64 = redis::cmd("PTTL").arg(&hash).query(&mut redis).unwrap();
    assert!(ttl > week.as_millis() as i64, "ttl {ttl}");
    // A new instance sweeps it out of Redis when it starts.
    let c = Instance::start(&prefix, &clock).await;
    let left: u64 = redis::cmd("HLEN").arg(&hash).query(&mut redis).unwrap();
    assert_eq!(left, 0);
    assert!(c.overrides.table().is_empty());
    every_key_has_a_ttl(&mut redis, &prefix);
}

/// An expiry as far as a caller can ask (an admin API's `seconds` of
/// 2^64 - 1) is an override in force, not a panic (the key's TTL added
/// past `Duration::MAX`) nor a half-written one (Redis refused the TTL
/// after the script had set the override): the keys are kept a hundred
/// years.
#[tokio::test]
async fn an_expiry_at_the_end_of_time_is_in_force_and_kept_a_hundred_years() {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let prefix = unique_prefix("overrides-far");
    let (a, b) = (
        Instance::start(&prefix, &clock).await,
        Instance::start(&prefix, &clock).await,
    );
    let api = api();
    let raised = Override::limit("1000/min").unwrap();
    for far in [Duration::MAX, Duration::from_secs(u64::MAX / 1_000)] {
        a.overrides
            .set(&Key::header("acme"), &api, raised.clone(), Some(far))
            .await
            .unwrap();
    }
    b.overrides.refresh().await.unwrap();
    assert_eq!(b.request(&api, "acme").await.1, "1000");
    let mut redis = admin().await;
    let hash = a.overrides.hash_key().to_owned();
    let ttl: i64 = redis::cmd("PTTL").arg(&hash).query(&mut redis).unwrap();
    let century = 100 * 365 * 86_400 * 1_000;
    assert!((century - 60_000..=century).contains(&ttl), "ttl {ttl}");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(&mut redis)
        .unwrap();
    let _: () = redis::cmd("DEL").arg(&keys).query(&mut redis).unwrap();
}

/// A retention past what Redis can set as a TTL is refused when the
/// source starts; one of a hundred years, the longest, sweeps (renews the
/// keys' TTL) like any other. Before, `Duration::MAX` was accepted and
/// every sweep failed: the source never loaded.
#[tokio::test]
async fn a_retention_past_a_hundred_years_is_refused_and_a_hundred_years_sweeps() {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let prefix = unique_prefix("overrides-retention");
    let a = Instance::start(&prefix, &clock).await;
    let api = api();
    let raised = Override::limit("1000/min").unwrap();
    a.overrides
        .set(&Key::header("acme"), &api, raised, None)
        .await
        .unwrap();
    let century = Duration::from_secs(100 * 365 * 86_400);
    let refused = RedisOverrides::builder()
        .retention(Duration::MAX)
        .start(&a.store)
        .await
        .err();
    assert!(
        matches!(
            refused,
            Some(tollgate::ConfigError::InvalidSetting {
                setting: "retention",
                ..
            })
        ),
        "{refused:?}"
    );
    let longest = RedisOverrides::builder()
        .retention(century)
        .clock(clock.clone())
        .start(&a.store)
        .await
        .unwrap();
    // Its first poll, a sweep, runs on its own task: bounded real time.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !longest.is_loaded() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(longest.is_loaded(), "the sweep failed");
    let mut redis = admin().await;
    let ttl: i64 = redis::cmd("PTTL")
        .arg(a.overrides.hash_key())
        .query(&mut redis)
        .unwrap();
    let century_ms = i64::try_from(century.as_millis()).unwrap();
    assert!(
        (century_ms - 60_000..=century_ms).contains(&ttl),
        "ttl {ttl}"
    );
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(&mut redis)
        .unwrap();
    let _: () = redis::cmd("DEL").arg(&keys).query(&mut redis).unwrap();
}

#[tokio::test]
async fn after_a_restart_the_override_is_still_in_force() {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let prefix = unique_prefix("overrides-restart");
    let api = api();
    let first = Instance::start(&prefix, &clock).await;
    let raised = Override::limit("1000/min").unwrap();
    first
        .overrides
        .set(&Key::header("acme"), &api, raised, None)
        .await
        .unwrap();
    assert_eq!(first.request(&api, "acme").await.2, "999");
    drop(first);

    // Fresh store, source and layer on the same prefix: in force from the
    // first request, with the use kept.
    let second = Instance::start(&prefix, &clock).await;
    assert_eq!(
        second.request(&api, "acme").await,
        (StatusCode::OK, "1000".into(), "998".into())
    );
    let mut redis = admin().await;
    every_key_has_a_ttl(&mut redis, &prefix);
}

#[tokio::test]
async fn exempt_and_deny_through_a_family_and_a_limiter() {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let prefix = unique_prefix("overrides-family");
    let a = Instance::start(&prefix, &clock).await;
    let free = api();
    let pro = Policy::new("api-pro", Algorithm::Gcra, "100/min").unwrap();
    let family = PolicyFamily::new("api", [free.clone(), pro.clone()]).unwrap();
    let acme = Key::header("acme");

    // Exempt on every plan: never refused, not counted, no headers.
    family
        .set_override(&a.overrides, &acme, Override::Exempt, None)
        .await
        .unwrap();
    for _ in 0..20 {
        assert_eq!(
            a.request(&free, "acme").await,
            (StatusCode::OK, String::new(), String::new())
        );
    }
    assert_eq!(a.store.clone().status_of(&acme, &free).await, 10);
    let on_pro =
        RateLimiter::with_store(pro.clone(), a.store.clone()).overrides(a.overrides.clone());
    assert!(on_pro.check(&acme).await.unwrap().is_allowed());
    assert_eq!(on_pro.status(&acme).await.unwrap().remaining(), 100);
    let shown = family.overrides(&a.overrides, &acme);
    assert_eq!(shown.len(), 2);
    assert_eq!(shown[1].1, Override::Exempt);

    // Denied for an hour: 403 with the rest as Retry-After; the limiter
    // refuses with it as the retry time.
    let hour = Duration::from_secs(3600);
    family
        .set_override(&a.overrides, &acme, Override::Deny, Some(hour))
        .await
        .unwrap();
    assert_eq!(a.request(&free, "acme").await.0, StatusCode::FORBIDDEN);
    let refused = on_pro.check(&acme).await.unwrap();
    assert_eq!(refused.outcome(), Outcome::Limited { retry_after: hour });
    // Denied for good: never admitted.
    family
        .set_override(&a.overrides, &acme, Override::Deny, None)
        .await
        .unwrap();
    let never = on_pro.check(&acme).await.unwrap();
    assert_eq!(
        never.outcome(),
        Outcome::CostExceedsCapacity {
            cost: 1,
            capacity: 0
        }
    );

    family.clear_override(&a.overrides, &acme).await.unwrap();
    assert_eq!(on_pro.check(&acme).await.unwrap().remaining(), 99);
}

trait StatusOf {
    /// What `key` has left under `policy`.
    async fn status_of(self, key: &Key, policy: &Policy) -> u64;
}

impl StatusOf for RedisStore {
    async fn status_of(self, key: &Key, policy: &Policy) -> u64 {
        tollgate::Store::status(&self, key, policy)
            .await
            .unwrap()
            .remaining()
    }
}

/// A connection of the test's own to the suite's Redis.
async fn admin() -> redis::Connection {
    redis::Client::open(require_redis().await)
        .unwrap()
        .get_connection()
        .unwrap()
}

/// Every key under `prefix` has a TTL.
fn every_key_has_a_ttl(redis: &mut redis::Connection, prefix: &str) {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(redis)
        .unwrap();
    assert!(!keys.is_empty());
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(redis).unwrap();
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }
}

/// A store on `url` under `prefix` that may be built while Redis is down,
/// and gives up on it quickly.
async fn booting_store(url: &str, prefix: &str, clock: &FakeClock) -> RedisStore {
    RedisStore::builder()
        .prefix(prefix)
        .deadline(Duration::from_secs(2))
        .connect_timeout(Duration::from_millis(200))
        .circuit_breaker(1_000, Duration::from_millis(50))
        .test_clock(clock.clone())
        .connect(url)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_started_while_redis_is_down_loads_the_overrides_once_it_answers() {
    let mut server = tollgate_tests::RedisServer::spawn();
    let url = server.url();
    server.kill();
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let prefix = unique_prefix("overrides-boot");
    let store = || booting_store(&url, &prefix, &clock);
    let source = |store: RedisStore| {
        let clock = clock.clone();
        async move {
            let builder = RedisOverrides::builder().clock(clock);
            builder.start(&store).await.unwrap()
        }
    };
    // Started while Redis is down: no error, no override.
    let early = source(store().await).await;
    assert!(early.table().is_empty());

    server.restart();
    let late = source(store().await).await;
    let (api, acme) = (api(), Key::header("acme"));
    let start = Instant::now();
    while late.set(&acme, &api, Override::Deny, None).await.is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "Redis never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The early source polls on, and loads it.
    while early.get(&acme, &api).is_none() {
        assert!(start.elapsed() < Duration::from_secs(10), "never loaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(early.get(&acme, &api), Some((Override::Deny, None)));
}

/// A source started while Redis was down knows no key's override until it
/// loads them. Its requests decided in Redis once Redis answers again
/// (before its next poll, a second apart here) were decided under their
/// plans, which carried a key with limits of its own over to its plan's
/// limits: the hour of `acme`'s own "10/min 3/h", spent through another
/// instance, started afresh. Now a request asks for a poll and waits for
/// it, and is decided under the key's own limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_started_while_redis_is_down_gives_no_fresh_quota_once_it_answers() {
    use tollgate::Store;
    let mut server = tollgate_tests::RedisServer::spawn();
    let url = server.url();
    server.kill();
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let prefix = unique_prefix("overrides-boot-quota");
    let store = || booting_store(&url, &prefix, &clock);
    let source = |store: RedisStore| {
        let clock = clock.clone();
        async move {
            let builder = RedisOverrides::builder().clock(clock);
            // A first wait long enough for a loaded machine.
            let builder = builder.poll_interval(Duration::from_secs(1));
            let builder = builder.first_wait(Duration::from_secs(5));
            builder.start(&store).await.unwrap()
        }
    };
    let early_store = store().await;
    let too_long = RedisOverrides::builder().first_wait(Duration::from_millis(5_001));
    assert_eq!(
        too_long.start(&early_store).await.unwrap_err().to_string(),
        "invalid setting first_wait: must not exceed 5 s: requests are held for it"
    );
    let early = source(early_store.clone()).await;
    let (api, acme) = (api(), Key::header("acme"));
    assert!(!early.is_loaded());
    assert!(matches!(
        tollgate::OverrideSource::applied(&early, &acme, &api),
        Some(tollgate::Applied::Pending)
    ));

    server.restart();
    let late_store = store().await;
    let late = source(late_store.clone()).await;
    let start = Instant::now();
    let own: Override = "10/min 3/h".parse().unwrap();
    while late.set(&acme, &api, own.clone(), None).await.is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "Redis never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let spend = RateLimiter::with_store(api.clone(), late_store).overrides(late);
    for _ in 0..3 {
        assert!(spend.check(&acme).await.unwrap().is_allowed());
    }
    // The early instance's store decides in Redis again.
    let probe = Key::header("probe");
    while early_store.check(&probe, &api, 0).await.is_err() {
        assert!(start.elapsed() < Duration::from_secs(10), "never answered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let limiter = RateLimiter::with_store(api.clone(), early_store).overrides(early.clone());
    let decision = limiter.check(&acme).await.unwrap();
    assert!(!decision.is_allowed(), "{decision:?}");
    let hour_left = Duration::from_secs(3600 - T0 % 3600);
    assert_eq!(decision.retry_after(), Some(hour_left));
    assert!(early.is_loaded());
}

/// After Redis loses the overrides (a restart without persistence, a
/// failover to a replica that missed writes), a new override is seen by
/// an instance that saw an older one: the version starts again from
/// Redis's clock, not from 0, where it repeated the version the instance
/// had seen, and the instance kept its old table (the old override in
/// force, the new one never).
#[tokio::test]
async fn overrides_set_after_redis_lost_them_are_seen_by_every_instance() {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let prefix = unique_prefix("overrides-lost");
    let (a, b) = (
        Instance::start(&prefix, &clock).await,
        Instance::start(&prefix, &clock).await,
    );
    let api = api();
    let raised = Override::limit("1000/min").unwrap();
    a.overrides
        .set(&Key::header("old"), &api, raised.clone(), None)
        .await
        .unwrap();
    b.overrides.refresh().await.unwrap();
    assert_eq!(b.request(&api, "old").await.1, "1000");
    // Redis loses the overrides, and its version goes back to what it was
    // before the first (a replica that missed the write); then both are
    // lost.
    let mut redis = admin().await;
    let hash = a.overrides.hash_key().to_owned();
    let version = format!("{hash}:version");
    let seen: i64 = redis::cmd("GET").arg(&version).query(&mut redis).unwrap();
    for lost in [Some(seen - 1), None] {
        let () = redis::cmd("DEL")
            .arg(&hash)
            .arg(&version)
            .query(&mut redis)
            .unwrap();
        if let Some(before) = lost {
            let () = redis::cmd("SET")
                .arg(&version)
                .arg(before)
                .query(&mut redis)
                .unwrap();
        }
        let new = format!("new-{lost:?}");
        a.overrides
            .set(&Key::header(new.clone()), &api, raised.clone(), None)
            .await
            .unwrap();
        b.overrides.refresh().await.unwrap();
        assert_eq!(b.request(&api, &new).await.1, "1000", "{lost:?}");
        assert_eq!(b.request(&api, "old").await.1, "10", "{lost:?}");
    }
    every_key_has_a_ttl(&mut redis, &prefix);
}
