//! A key's first requests on an instance wait for a cached lookup's first
//! answer, within its bound, so that a restart gives no fresh quota.

use super::*;

/// Finds `acme`'s own limits, `rule`, after `delay` (a database's round
/// trip), and no override for any other key.
#[derive(Clone)]
struct Tenants {
    delay: Duration,
    rule: Override,
}

impl OverrideLookup for Tenants {
    type Error = Infallible;

    async fn lookup(
        &self,
        key: &Key,
        _: &str,
    ) -> Result<Option<(Override, Option<Timestamp>)>, Infallible> {
        tokio::time::sleep(self.delay).await;
        Ok((*key == Key::header("acme")).then(|| (self.rule.clone(), None)))
    }
}

/// One request of `key` through a layer on `app`'s store with `source`:
/// its status, its Retry-After, and how long it took.
async fn through(
    app: &App,
    source: &CachedLookup<Tenants>,
    key: &str,
) -> (StatusCode, String, Duration) {
    let layer = layer(&app.policy, &app.store).overrides(source.clone());
    let start = tokio::time::Instant::now();
    let response = send(layer, key).await;
    let retry = response.headers().get("retry-after");
    let retry = retry.map_or(String::new(), |v| v.to_str().unwrap().to_owned());
    (response.status(), retry, start.elapsed())
}

/// A restarted instance does not give a key with limits of its own a
/// fresh quota. `acme`'s own limits add an hour (3/h) to its plan's
/// minute (10/min). Decided under the plan, as a restarted instance
/// decided a key's first request before its lookup returned, the key was
/// carried over to the plan's limits, and its hour started afresh: the
/// restarted instance admitted 3 more in the hour. Now the first requests
/// wait for the lookup (5 ms) and are decided under the key's own limits;
/// a key without an override waits as long, then goes by the plan.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_restarted_instance_waits_for_a_keys_override_and_gives_no_fresh_quota() {
    let app = App::new();
    let lookup = Tenants {
        delay: Duration::from_millis(5),
        rule: "10/min 3/h".parse().unwrap(),
    };
    let instance = || {
        let builder = CachedLookup::builder(lookup.clone()).clock(app.clock.clone());
        builder.build().unwrap()
    };
    let (ok, limited) = (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS);
    let before = instance();
    let waited = Duration::from_millis(5);
    assert_eq!(through(&app, &before, "acme").await.2, waited);
    for _ in 0..2 {
        let (status, _, took) = through(&app, &before, "acme").await;
        assert_eq!((status, took), (ok, Duration::ZERO));
    }
    assert_eq!(through(&app, &before, "acme").await.0, limited);

    // A minute on, the plan's minute has room again; the hour has none.
    app.clock.advance(Duration::from_secs(60));
    let restarted = instance();
    // The hour is a fixed window: it ends on the hour.
    let hour_left = 3600 - (T0 + 60) % 3600;
    let hour_left = hour_left.to_string();
    assert_eq!(
        through(&app, &restarted, "acme").await,
        (limited, hour_left.clone(), waited)
    );
    for _ in 0..5 {
        let answer = through(&app, &restarted, "acme").await;
        assert_eq!(answer, (limited, hour_left.clone(), Duration::ZERO));
    }
    // A key without an override waits for its lookup too, once.
    assert_eq!(through(&app, &restarted, "ada").await.2, waited);
    assert_eq!(through(&app, &restarted, "ada").await.2, Duration::ZERO);

    // So does a job's limiter on a restarted instance.
    let limiter = tollgate::RateLimiter::with_store(app.policy.clone(), app.store.clone())
        .overrides(instance());
    let start = tokio::time::Instant::now();
    let decision = limiter.check(&Key::header("acme")).await.unwrap();
    assert!(!decision.is_allowed());
    let hour_left = Duration::from_secs(3600 - (T0 + 60) % 3600);
    assert_eq!(decision.retry_after(), Some(hour_left));
    assert_eq!(start.elapsed(), waited);
}

/// A lookup that hangs a key's first lookup holds its requests back for
/// the first wait (100 ms) and no longer: they are decided under the
/// plan, once the first wait is over without waiting again, and with a
/// first wait of zero never wait.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_hung_first_lookup_holds_a_keys_requests_back_for_the_first_wait_only() {
    let app = App::new();
    let hung = Tenants {
        delay: Duration::from_secs(3_600),
        rule: "10/min 3/h".parse().unwrap(),
    };
    let cached = CachedLookup::builder(hung.clone()).clock(app.clock.clone());
    let cached = cached.build().unwrap();
    let first_wait = Duration::from_millis(100);
    let plan = (StatusCode::OK, String::new());
    let (status, retry, took) = through(&app, &cached, "acme").await;
    assert_eq!(((status, retry), took), (plan.clone(), first_wait));
    let (status, retry, took) = through(&app, &cached, "acme").await;
    assert_eq!(((status, retry), took), (plan.clone(), Duration::ZERO));

    let never = CachedLookup::builder(hung).first_wait(Duration::ZERO);
    let never = never.clock(app.clock.clone()).build().unwrap();
    let (status, retry, took) = through(&app, &never, "ada").await;
    assert_eq!(((status, retry), took), (plan, Duration::ZERO));
}

/// A source whose first answer about a key comes in between its
/// `Pending` and the caller's `first_answer` (`None` then): the caller
/// asks again, and decides under the answer, not the plan.
struct AnsweredMeanwhile {
    asked: AtomicUsize,
    own: Policy,
}

impl OverrideSource for AnsweredMeanwhile {
    fn applied(&self, _: &Key, _: &Policy) -> Option<Applied> {
        match self.asked.fetch_add(1, Ordering::SeqCst) {
            0 => Some(Applied::Pending),
            _ => Some(Applied::Limits(self.own.clone())),
        }
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_answer_that_came_in_before_the_wait_began_is_asked_for_again() {
    let app = App::new();
    let own = Policy::new("api", Algorithm::FixedWindow, "3/min").unwrap();
    let source = Arc::new(AnsweredMeanwhile {
        asked: AtomicUsize::new(0),
        own: own.clone(),
    });
    let layer = layer(&app.policy, &app.store).overrides(source.clone());
    let response = send(layer, "acme").await;
    let limit = response.headers().get("x-ratelimit-limit").unwrap();
    assert_eq!(limit, "3", "the key's own limit, not the plan's 10");
    assert_eq!(source.asked.load(Ordering::SeqCst), 2);

    source.asked.store(0, Ordering::SeqCst);
    let limiter = tollgate::RateLimiter::with_store(app.policy.clone(), app.store.clone())
        .overrides(source.clone());
    let decision = limiter.check(&Key::header("acme")).await.unwrap();
    assert_eq!((decision.limit(), decision.remaining()), (3, 1));
}

/// A layer in waiting mode counts the wait for a key's first answer in
/// its `max_wait`. With 50 ms to wait, a request arriving 70 ms before
/// its key has room, whose lookup takes 30 ms, is refused once the answer
/// is in: 40 ms more would take it past 50 ms from its arrival. (Counted
/// from the answer instead, it was held and admitted 70 ms after it
/// arrived.)
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_waiting_layer_counts_the_first_wait_in_its_max_wait() {
    let clock = tollgate::TokioClock::starting_at(Timestamp::from_secs(T0));
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    let policy = Policy::new("api", Algorithm::Gcra, "10/s").unwrap();
    let lookup = Tenants {
        delay: Duration::from_millis(30),
        rule: "10/s".parse().unwrap(),
    };
    let cached = CachedLookup::builder(lookup).build().unwrap();
    let layer = layer(&policy, &store).overrides(cached);
    let layer = layer.wait(Duration::from_millis(50));
    let key = Key::header("acme");
    while store.check(&key, &policy, 1).await.unwrap().is_allowed() {}
    tokio::time::sleep(Duration::from_millis(30)).await;
    let start = tokio::time::Instant::now();
    let response = send(layer, "acme").await;
    assert_eq!(
        (response.status(), start.elapsed()),
        (StatusCode::TOO_MANY_REQUESTS, Duration::from_millis(30))
    );
}

/// A job's limiter reads a key's status under its own limits on an
/// instance that has yet to look the key up: it waits for the answer.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_limiters_status_of_a_key_not_looked_up_yet_waits_for_its_own_limits() {
    let app = App::new();
    let lookup = Tenants {
        delay: Duration::from_millis(5),
        rule: "10/min 3/h".parse().unwrap(),
    };
    let limiter = tollgate::RateLimiter::with_store(app.policy.clone(), app.store.clone())
        .overrides(
            CachedLookup::builder(lookup)
                .clock(app.clock.clone())
                .build()
                .unwrap(),
        );
    let start = tokio::time::Instant::now();
    let status = limiter.status(&Key::header("acme")).await.unwrap();
    assert_eq!(
        (status.limit(), start.elapsed()),
        (3, Duration::from_millis(5))
    );
}

/// A key whose first answer is an exemption or a deny waits for it, then
/// is exempt (no headers) or denied (403), as a key with an answer is.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_exemption_or_a_deny_found_by_the_first_lookup_applies_to_the_first_request() {
    let app = App::new();
    let waited = Duration::from_millis(5);
    for (rule, status) in [("exempt", StatusCode::OK), ("deny", StatusCode::FORBIDDEN)] {
        let lookup = Tenants {
            delay: waited,
            rule: rule.parse().unwrap(),
        };
        let cached = CachedLookup::builder(lookup).clock(app.clock.clone());
        let cached = cached.build().unwrap();
        assert_eq!(
            through(&app, &cached, "acme").await,
            (status, String::new(), waited),
            "{rule}"
        );
    }
    // Nothing was counted: an exempt key is not, a denied one is refused.
    let status = app.store.status(&Key::header("acme"), &app.policy).await;
    assert_eq!(status.unwrap().remaining(), 10);
}

/// `until_ready` waits for a key's first answer whatever its own maximum
/// wait: with 1 ms to wait, the restarted instance's limiter finds the
/// key's hour spent (after the 5 ms lookup) and gives up, where a check
/// cut short at 1 ms decided the key under its plan and admitted it.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn until_ready_waits_for_a_keys_first_answer_whatever_its_max_wait() {
    let app = App::new();
    let lookup = Tenants {
        delay: Duration::from_millis(5),
        rule: "10/min 3/h".parse().unwrap(),
    };
    let limiter = || {
        let cached = CachedLookup::builder(lookup.clone()).clock(app.clock.clone());
        let policy = app.policy.clone();
        tollgate::RateLimiter::with_store(policy, app.store.clone())
            .overrides(cached.build().unwrap())
    };
    let acme = Key::header("acme");
    let before = limiter();
    for _ in 0..3 {
        assert!(before.check(&acme).await.unwrap().is_allowed());
    }
    let restarted = limiter();
    let start = tokio::time::Instant::now();
    let answer = restarted.until_ready(&acme, Duration::from_millis(1)).await;
    let Err(tollgate::WaitError::TooLong { needed, .. }) = answer else {
        panic!("{answer:?}");
    };
    let hour_left = Duration::from_secs(3600 - T0 % 3600);
    assert_eq!(
        (needed, start.elapsed()),
        (hour_left, Duration::from_millis(5))
    );
}
