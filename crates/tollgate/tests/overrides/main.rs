//! Overrides through the layer and the limiter on the memory store, on a
//! fake clock: a raise keeps what the key used, an expiry restores the
//! plan at its instant, exempt is neither refused nor counted, deny is a
//! 403 that says so, a cached lookup answers without waiting once it has
//! an answer, and a key's first requests wait for its first answer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod first_answer;
mod settle;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{HeaderName, Request, Response, StatusCode};
use tollgate::{
    Algorithm, Applied, CachedLookup, FakeClock, HeaderKey, Key, MemoryOverrides, MemoryStore,
    Override, OverrideLookup, OverrideSource, OverrideStore, Policy, RateLimitLayer, Store,
    Timestamp,
};
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

const T0: u64 = 1_700_000_040;

struct App {
    clock: FakeClock,
    store: MemoryStore,
    overrides: MemoryOverrides,
    policy: Policy,
}

impl App {
    fn new() -> Self {
        let clock = FakeClock::new(Timestamp::from_secs(T0));
        Self {
            store: MemoryStore::builder().clock(clock.clone()).build().unwrap(),
            overrides: MemoryOverrides::with_clock(clock.clone()),
            policy: Policy::new("api", Algorithm::FixedWindow, "10/min").unwrap(),
            clock,
        }
    }

    /// One request of `key`: status, the rate-limit and Retry-After
    /// headers (empty when absent), and the body.
    async fn request(&self, key: &str) -> (StatusCode, [String; 3], String) {
        let layer = layer(&self.policy, &self.store).overrides(self.overrides.clone());
        let response = send(layer, key).await;
        let header = |name: &str| {
            let value = response.headers().get(name);
            value.map_or(String::new(), |v| v.to_str().unwrap().to_owned())
        };
        let headers = [
            header("x-ratelimit-limit"),
            header("x-ratelimit-remaining"),
            header("retry-after"),
        ];
        let status = response.status();
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap();
        let body = String::from_utf8(body.to_bytes().to_vec()).unwrap();
        (status, headers, body)
    }

    async fn set(&self, key: &str, rule: &str, expires_in: Option<Duration>) {
        let rule: Override = rule.parse().unwrap();
        let key = Key::header(key);
        self.overrides
            .set(&key, &self.policy, rule, expires_in)
            .await
            .unwrap();
    }
}

/// A layer of `policy` on `store`, keyed by `x-api-key`.
fn layer(policy: &Policy, store: &MemoryStore) -> RateLimitLayer<HeaderKey, MemoryStore> {
    let key = HeaderKey::new(HeaderName::from_static("x-api-key"));
    RateLimitLayer::new(policy.clone(), key).store(store.clone())
}

/// One request of `key` through `layer`, to a service that answers 200.
async fn send<M>(layer: RateLimitLayer<HeaderKey, MemoryStore, M>, key: &str) -> Response<M::Body>
where
    M: tollgate::BodyKind<String>,
{
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
    let request = Request::get("/").header("x-api-key", key).body(()).unwrap();
    svc.ready().await.unwrap().call(request).await.unwrap()
}

fn headers(limit: &str, remaining: &str) -> [String; 3] {
    [limit.into(), remaining.into(), String::new()]
}

#[tokio::test]
async fn a_raise_mid_window_gives_room_not_a_fresh_quota_and_a_lower_limit_holds_at_once() {
    let app = App::new();
    for _ in 0..8 {
        app.request("acme").await;
    }
    app.set("acme", "100/min", None).await;
    assert_eq!(app.request("acme").await.1, headers("100", "91"));
    // Lowered below what it used: refused until the window ends.
    app.set("acme", "5/min", None).await;
    let (status, [limit, remaining, _], _) = app.request("acme").await;
    assert_eq!(
        (status, limit, remaining),
        (StatusCode::TOO_MANY_REQUESTS, "5".into(), "0".into())
    );
    // Cleared: the plan's 10, with the 9 used.
    app.overrides
        .clear(&Key::header("acme"), &app.policy)
        .await
        .unwrap();
    assert_eq!(app.request("acme").await.1, headers("10", "0"));
}

#[tokio::test]
async fn an_expiry_restores_the_plan_at_its_instant() {
    let app = App::new();
    app.set("acme", "100/min", Some(Duration::from_secs(30)))
        .await;
    assert_eq!(app.request("acme").await.1, headers("100", "99"));
    app.clock
        .advance(Duration::from_secs(30) - Duration::from_micros(1));
    assert_eq!(app.request("acme").await.1, headers("100", "98"));
    app.clock.advance(Duration::from_micros(1));
    assert_eq!(app.request("acme").await.1, headers("10", "7"));
    assert!(
        app.overrides
            .get(&Key::header("acme"), &app.policy)
            .is_none()
    );
}

#[tokio::test]
async fn exempt_is_neither_refused_nor_counted_and_has_no_headers() {
    let app = App::new();
    app.set("ci-bot", "exempt", None).await;
    for _ in 0..50 {
        let (status, headers, _) = app.request("ci-bot").await;
        assert_eq!((status, headers), (StatusCode::OK, Default::default()));
    }
    let status = app
        .store
        .status(&Key::header("ci-bot"), &app.policy)
        .await
        .unwrap();
    assert_eq!(status.remaining(), 10);
}

/// An exempt key is let through without the store, so an operator's
/// block in the store does not hold against it, as documented; a deny set
/// in the exemption's place shuts it out, and once the exemption is gone
/// the block holds.
#[tokio::test]
async fn a_block_holds_against_an_exempt_key_only_once_the_exemption_is_replaced() {
    let app = App::new();
    app.set("ci-bot", "exempt", None).await;
    let key = Key::header("ci-bot");
    app.store
        .block(&key, &app.policy, Duration::from_secs(900))
        .await
        .unwrap();
    assert_eq!(app.request("ci-bot").await.0, StatusCode::OK);
    app.set("ci-bot", "deny", None).await;
    assert_eq!(app.request("ci-bot").await.0, StatusCode::FORBIDDEN);
    app.overrides.clear(&key, &app.policy).await.unwrap();
    let (status, [_, _, retry], _) = app.request("ci-bot").await;
    assert_eq!(
        (status, retry.as_str()),
        (StatusCode::TOO_MANY_REQUESTS, "900")
    );
}

#[tokio::test]
async fn deny_is_a_403_that_says_so_with_the_rest_as_retry_after() {
    let app = App::new();
    app.set("mallory", "deny", Some(Duration::from_secs(90)))
        .await;
    let (status, headers, body) = app.request("mallory").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(headers, [String::new(), String::new(), "90".into()]);
    assert_eq!(
        body,
        r#"{"type":"about:blank","title":"Forbidden","status":403,"detail":"access under 'api' is denied to this key by an operator, for 90 s more"}"#
    );
    app.set("mallory", "deny", None).await;
    let (status, headers, body) = app.request("mallory").await;
    assert_eq!(
        (status, &headers[2]),
        (StatusCode::FORBIDDEN, &String::new())
    );
    assert!(
        body.contains("denied to this key by an operator, until lifted"),
        "{body}"
    );
    // Nothing consumed.
    let state = app
        .store
        .status(&Key::header("mallory"), &app.policy)
        .await
        .unwrap();
    assert_eq!(state.remaining(), 10);
}

#[tokio::test]
async fn a_grpc_layer_denies_with_permission_denied() {
    let app = App::new();
    app.set("mallory", "deny", None).await;
    let layer = RateLimitLayer::new(
        app.policy.clone(),
        HeaderKey::new(HeaderName::from_static("x-api-key")),
    )
    .overrides(app.overrides.clone())
    .grpc();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
    let request = Request::get("/")
        .header("x-api-key", "mallory")
        .body(())
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["grpc-status"], "7");
    assert_eq!(
        response.headers()["grpc-message"],
        "access under 'api' is denied to this key by an operator, until lifted"
    );
}

/// A lookup that counts its calls and answers what `answer` holds.
#[derive(Clone, Default)]
struct Db {
    calls: Arc<AtomicUsize>,
    answer: Arc<std::sync::Mutex<Option<Override>>>,
}

impl OverrideLookup for Db {
    type Error = Infallible;

    async fn lookup(
        &self,
        _: &Key,
        _: &str,
    ) -> Result<Option<(Override, Option<Timestamp>)>, Infallible> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(self.answer.lock().unwrap().clone().map(|rule| (rule, None)))
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_cached_lookup_answers_at_once_and_asks_again_after_its_cache_time() {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let db = Db::default();
    *db.answer.lock().unwrap() = Some(Override::Exempt);
    let cached = CachedLookup::builder(db.clone())
        .cache_time(Duration::from_secs(10))
        .clock(clock.clone())
        .build()
        .unwrap();
    let api = Policy::new("api", Algorithm::Gcra, "10/s").unwrap();
    let acme = Key::user("acme");

    // The first requests are told the answer is under way (they wait for
    // it, see below); the lookup runs in the background, once however many
    // requests come meanwhile.
    assert!(matches!(
        cached.applied(&acme, &api),
        Some(Applied::Pending)
    ));
    assert!(matches!(
        cached.applied(&acme, &api),
        Some(Applied::Pending)
    ));
    tokio::task::yield_now().await;
    assert_eq!(db.calls.load(Ordering::SeqCst), 1);
    assert!(matches!(cached.applied(&acme, &api), Some(Applied::Exempt)));

    // Changed in the database: the cached answer holds for the cache time.
    *db.answer.lock().unwrap() = None;
    clock.advance(Duration::from_secs(10) - Duration::from_micros(1));
    assert!(matches!(cached.applied(&acme, &api), Some(Applied::Exempt)));
    assert_eq!(db.calls.load(Ordering::SeqCst), 1);
    // Then it is asked again, the stale answer used until it returns.
    clock.advance(Duration::from_micros(1));
    assert!(matches!(cached.applied(&acme, &api), Some(Applied::Exempt)));
    tokio::task::yield_now().await;
    assert_eq!(db.calls.load(Ordering::SeqCst), 2);
    assert!(cached.applied(&acme, &api).is_none());

    let zero = CachedLookup::builder(db).cache_time(Duration::ZERO).build();
    assert_eq!(
        zero.unwrap_err().to_string(),
        "invalid setting cache_time: must be above zero"
    );
}

/// A lookup that denies the keys named `denied-0` to `denied-99` and
/// knows no other.
#[derive(Clone, Default)]
struct DeniesSome {
    calls: Arc<AtomicUsize>,
}

impl OverrideLookup for DeniesSome {
    type Error = Infallible;

    async fn lookup(
        &self,
        key: &Key,
        _: &str,
    ) -> Result<Option<(Override, Option<Timestamp>)>, Infallible> {
        let denied = (0..DENIED).any(|i| *key == Key::user(format!("denied-{i}")));
        self.calls.fetch_add(usize::from(denied), Ordering::SeqCst);
        Ok(denied.then_some((Override::Deny, None)))
    }
}

/// The keys `DeniesSome` denies.
const DENIED: usize = 100;

/// A flood of new keys through a full cache does not evict the denied
/// keys' entries: each stays denied at every request, and is looked up
/// once. (The cache forgot whichever key its map yielded first, a deny
/// with it a hundred times in a hundred and one here, and the denied key
/// was admitted until its lookup came back.)
#[tokio::test(flavor = "current_thread")]
async fn a_flood_of_keys_through_a_full_cache_keeps_its_denies() {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let db = DeniesSome::default();
    // Room for the denied keys and one more: each new key forgets one.
    let cached = CachedLookup::builder(db.clone())
        .max_keys(DENIED + 1)
        .clock(clock)
        .build()
        .unwrap();
    let api = Policy::new("api", Algorithm::Gcra, "10/s").unwrap();
    let denied: Vec<Key> = (0..DENIED)
        .map(|i| Key::user(format!("denied-{i}")))
        .collect();
    for key in &denied {
        assert!(matches!(cached.applied(key, &api), Some(Applied::Pending)));
    }
    while db.calls.load(Ordering::SeqCst) < DENIED {
        tokio::task::yield_now().await;
    }
    for i in 0..1_000 {
        for key in &denied {
            assert!(
                matches!(cached.applied(key, &api), Some(Applied::Deny { .. })),
                "{key:?} denied before flood key {i}"
            );
        }
        let flood = cached.applied(&Key::user(format!("flood-{i}")), &api);
        assert!(matches!(flood, Some(Applied::Pending)));
        tokio::task::yield_now().await;
    }
    assert_eq!(db.calls.load(Ordering::SeqCst), DENIED);
}

/// An override of a calendar quota is a quota of the same calendar: a
/// month in Berlin stays a month in Berlin, and the key keeps the month's
/// use.
#[tokio::test]
async fn an_override_of_a_calendar_quota_keeps_its_calendar_and_its_use() {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let overrides = MemoryOverrides::with_clock(clock.clone());
    let policy = Policy::builder("reports")
        .algorithm(Algorithm::FixedWindow)
        .limit("100/month")
        .calendar(tollgate::Calendar::new("Europe/Berlin").unwrap())
        .build()
        .unwrap();
    let key = Key::user("zoe");
    let mut plan_reset = None;
    for _ in 0..3 {
        plan_reset = Some(store.check(&key, &policy, 1).await.unwrap().reset_at());
    }
    let rule: Override = "500/month".parse().unwrap();
    overrides.set(&key, &policy, rule, None).await.unwrap();
    let Some(Applied::Limits(own)) = overrides.applied(&key, &policy) else {
        panic!("own limits apply");
    };
    assert_eq!(own.calendar(), policy.calendar());
    let decision = store.check(&key, &own, 1).await.unwrap();
    assert_eq!((decision.limit(), decision.remaining()), (500, 496));
    assert_eq!(Some(decision.reset_at()), plan_reset, "the 1st in Berlin");
    // A period the calendar does not have is refused when it is set.
    let rule: Override = "500/2d".parse().unwrap();
    assert!(overrides.set(&key, &policy, rule, None).await.is_err());

    // A reloaded configuration moves the quota to another zone: the
    // override's month moves with it (it kept Berlin's, found by an
    // audit).
    let moved = Policy::builder("reports")
        .algorithm(Algorithm::FixedWindow)
        .limit("100/month")
        .calendar(tollgate::Calendar::new("Pacific/Kiritimati").unwrap())
        .build()
        .unwrap();
    let Some(Applied::Limits(own)) = overrides.applied(&key, &moved) else {
        panic!("own limits apply");
    };
    assert_eq!(own.calendar(), moved.calendar());
    assert_eq!(own.limits()[0].count(), 500);
}

/// A deny set for longer than any policy holds is told as a block of that
/// length is: at most 2^50 µs (it told clients to come back in half a
/// million years, found by an audit).
#[tokio::test]
async fn a_deny_for_ever_longer_is_told_as_the_longest_block() {
    let clock = FakeClock::new(Timestamp::from_secs(T0));
    let overrides = MemoryOverrides::with_clock(clock);
    let policy = Policy::new("api", Algorithm::Gcra, "10/s").unwrap();
    let key = Key::user("mallory");
    let deny: Override = "deny".parse().unwrap();
    let forever = Duration::from_secs(u64::MAX);
    overrides
        .set(&key, &policy, deny, Some(forever))
        .await
        .unwrap();
    let Some(Applied::Deny { ends_in }) = overrides.applied(&key, &policy) else {
        panic!("denied");
    };
    assert_eq!(ends_in, Some(Duration::from_micros(1 << 50)));
}
