//! The cache's bounds, and lookups that hang, panic or never run.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

struct Everyone;

impl OverrideLookup for Everyone {
    type Error = std::convert::Infallible;

    async fn lookup(
        &self,
        _: &Key,
        _: &str,
    ) -> Result<Option<(Override, Option<Timestamp>)>, Self::Error> {
        Ok(Some((Override::Exempt, None)))
    }
}

/// Hangs on its first `hang` lookups, panics on the next `panic`, and
/// finds every key exempt after that. Counts its lookups, and the hung
/// ones dropped.
#[derive(Default)]
struct Flaky {
    calls: AtomicUsize,
    hang: usize,
    panic: usize,
    dropped: Arc<AtomicUsize>,
}

/// Counts a hung lookup when it is dropped.
struct Hung(Arc<AtomicUsize>);

impl Drop for Hung {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl OverrideLookup for Flaky {
    type Error = std::convert::Infallible;

    async fn lookup(
        &self,
        _: &Key,
        _: &str,
    ) -> Result<Option<(Override, Option<Timestamp>)>, Self::Error> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        if call < self.hang {
            let _hung = Hung(self.dropped.clone());
            std::future::pending::<()>().await;
        }
        assert!(call >= self.hang + self.panic, "the lookup's own bug");
        Ok(Some((Override::Exempt, None)))
    }
}

fn flaky(hang: usize, panic: usize, clock: &tollgate_core::FakeClock) -> CachedLookup<Flaky> {
    let lookup = Flaky {
        hang,
        panic,
        ..Flaky::default()
    };
    let cache_time = Duration::from_secs(10);
    // Requests never wait for a first answer here (see the tests of the
    // first wait below): every answer is the cache's own.
    let builder = CachedLookup::builder(lookup).cache_time(cache_time);
    let builder = builder.first_wait(Duration::ZERO);
    builder.clock(clock.clone()).build().unwrap()
}

/// Lets the lookups spawned so far run as far as they can, then counts
/// the lookups made.
async fn calls(cached: &CachedLookup<Flaky>) -> usize {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    cached.inner.lookup.calls.load(Ordering::SeqCst)
}

fn api() -> Policy {
    Policy::new("api", tollgate_core::Algorithm::Gcra, "1/s").unwrap()
}

/// `key`, after `made` lookups, is not asked again 9 s on (a second short
/// of the cache time), is asked once more at 10 s, and is exempt by its
/// answer.
async fn asked_again_at_the_cache_time(
    cached: &CachedLookup<Flaky>,
    clock: &tollgate_core::FakeClock,
    key: &Key,
    made: usize,
) {
    let api = api();
    clock.advance(Duration::from_secs(9));
    assert!(cached.applied(key, &api).is_none());
    assert_eq!(calls(cached).await, made, "not asked again yet");
    clock.advance(Duration::from_secs(1));
    assert!(cached.applied(key, &api).is_none());
    assert_eq!(calls(cached).await, made + 1);
    assert!(matches!(cached.applied(key, &api), Some(Applied::Exempt)));
}

// On a runtime without a timer: a cached lookup that never waits for a
// first answer needs none.
#[tokio::test(flavor = "current_thread")]
async fn a_lookup_that_never_answers_is_given_up_on_after_the_cache_time() {
    let clock = tollgate_core::FakeClock::default();
    let cached = flaky(1, 0, &clock);
    let (api, key) = (api(), Key::user("acme"));
    assert!(cached.applied(&key, &api).is_none());
    assert_eq!(calls(&cached).await, 1);
    // Still under way 9 s on; a cache time after it began, the next
    // request gives it up and asks again.
    asked_again_at_the_cache_time(&cached, &clock, &key, 1).await;
    let dropped = cached.inner.lookup.dropped.load(Ordering::SeqCst);
    assert_eq!(dropped, 1, "the hung lookup was aborted");
}

#[tokio::test(flavor = "current_thread")]
async fn a_lookup_that_panics_is_asked_again_after_the_cache_time() {
    let clock = tollgate_core::FakeClock::default();
    let cached = flaky(0, 1, &clock);
    let (api, key) = (api(), Key::user("acme"));
    assert!(cached.applied(&key, &api).is_none());
    assert_eq!(calls(&cached).await, 1);
    asked_again_at_the_cache_time(&cached, &clock, &key, 1).await;
}

#[test]
fn a_lookup_its_runtime_never_runs_is_asked_again_after_the_cache_time() {
    let clock = tollgate_core::FakeClock::default();
    let cached = flaky(0, 0, &clock);
    let (api, key) = (api(), Key::user("acme"));
    let dead = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let handle = dead.handle().clone();
    dead.shutdown_background();
    {
        let _inside = handle.enter();
        assert!(cached.applied(&key, &api).is_none());
    }
    let live = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    live.block_on(async {
        assert_eq!(calls(&cached).await, 0);
        asked_again_at_the_cache_time(&cached, &clock, &key, 0).await;
    });
}

#[tokio::test(flavor = "current_thread")]
async fn hostile_keys_cannot_grow_the_cache_past_max_keys() {
    let cached = CachedLookup::builder(Everyone).max_keys(2).build().unwrap();
    let api = Policy::new("api", tollgate_core::Algorithm::Gcra, "1/s").unwrap();
    for i in 0..100 {
        cached
            .load(&Key::user(format!("k{i}")), &api)
            .await
            .unwrap();
        let asked = cached.inner.asked.lock();
        assert!(asked.len <= 2);
        assert_eq!(
            asked.by_key.values().map(Vec::len).sum::<usize>(),
            asked.len
        );
        drop(asked);
        assert!(cached.inner.table.len() <= 2);
    }
    // A second policy of a cached key is a second entry.
    let other = Policy::new("other", tollgate_core::Algorithm::Gcra, "1/s").unwrap();
    cached.load(&Key::user("k99"), &other).await.unwrap();
    assert!(cached.inner.asked.lock().len <= 2);
}

/// Hostile keys met while the source hangs: each starts a lookup, and a
/// key forgotten to make room for a new one (past `max_keys`) takes its
/// lookup with it. Of 1,000 keys, the lookups of the 10 cached are still
/// under way; the other 990 were dropped.
#[tokio::test(flavor = "current_thread")]
async fn hung_lookups_of_forgotten_keys_end_with_them() {
    let lookup = Flaky {
        hang: usize::MAX,
        ..Flaky::default()
    };
    let builder = CachedLookup::builder(lookup).first_wait(Duration::ZERO);
    let cached = builder.max_keys(10).build().unwrap();
    let api = api();
    for i in 0..1_000 {
        assert!(cached.applied(&Key::user(format!("k{i}")), &api).is_none());
        // Each lookup starts before the next key comes.
        tokio::task::yield_now().await;
    }
    assert_eq!(calls(&cached).await, 1_000);
    let dropped = cached.inner.lookup.dropped.load(Ordering::SeqCst);
    assert_eq!(dropped, 990, "the lookups of the forgotten keys");
    assert_eq!(cached.inner.asked.lock().len, 10);
}

/// A key forgotten and met again at the same time starts a new lookup;
/// the drop of the old one, aborted, must not take the new one's mark.
/// Here (room for one key, the source hanging, the clock still) A's first
/// lookup is aborted when B takes its place, and is dropped only after A
/// came back and began its second. A third key then takes A's place, and
/// A's second lookup goes with it.
#[tokio::test(flavor = "current_thread")]
async fn a_key_met_again_at_the_same_time_keeps_its_new_lookup() {
    let lookup = Flaky {
        hang: usize::MAX,
        ..Flaky::default()
    };
    let clock = tollgate_core::FakeClock::default();
    let cached = CachedLookup::builder(lookup)
        .first_wait(Duration::ZERO)
        .max_keys(1)
        .clock(clock)
        .build()
        .unwrap();
    let api = api();
    let dropped = || cached.inner.lookup.dropped.load(Ordering::SeqCst);
    assert!(cached.applied(&Key::user("a"), &api).is_none());
    assert_eq!(calls(&cached).await, 1, "a's first lookup hangs");
    // B forgets A, and A forgets B, before A's first lookup is dropped
    // (and before B's ever ran).
    assert!(cached.applied(&Key::user("b"), &api).is_none());
    assert!(cached.applied(&Key::user("a"), &api).is_none());
    assert_eq!(calls(&cached).await, 2, "a's second lookup hangs");
    assert_eq!(dropped(), 1, "a's first");
    assert!(cached.applied(&Key::user("c"), &api).is_none());
    assert_eq!(calls(&cached).await, 3);
    assert_eq!(dropped(), 2, "a's second went with a");
}

/// Answers every key exempt after `delay`, or never (`None`).
struct Slow {
    delay: Option<Duration>,
}

impl OverrideLookup for Slow {
    type Error = std::convert::Infallible;

    async fn lookup(
        &self,
        _: &Key,
        _: &str,
    ) -> Result<Option<(Override, Option<Timestamp>)>, Self::Error> {
        match self.delay {
            Some(delay) => tokio::time::sleep(delay).await,
            None => std::future::pending().await,
        }
        Ok(Some((Override::Exempt, None)))
    }
}

fn pending(applied: Option<Applied>) -> bool {
    matches!(applied, Some(Applied::Pending))
}

/// Waits for `key`'s first answer, if the cache has one to wait for, and
/// says how long that took.
async fn first_answer(cached: &CachedLookup<Slow>, key: &Key) -> Option<Duration> {
    let first = cached.first_answer(key, &api())?;
    let start = tokio::time::Instant::now();
    first.await;
    Some(start.elapsed())
}

/// A key's first requests are told to wait, and wait until its first
/// answer comes (30 ms here), after which it is answered at once.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_keys_first_requests_wait_for_its_first_answer() {
    let slow = Slow {
        delay: Some(Duration::from_millis(30)),
    };
    let cached = CachedLookup::builder(slow).build().unwrap();
    let (api, key) = (api(), Key::user("acme"));
    assert!(pending(cached.applied(&key, &api)));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(pending(cached.applied(&key, &api)), "a second request");
    let waited = first_answer(&cached, &key).await;
    assert_eq!(waited, Some(Duration::from_millis(20)));
    assert!(matches!(cached.applied(&key, &api), Some(Applied::Exempt)));
    assert_eq!(first_answer(&cached, &key).await, None);
}

/// A lookup that never answers holds a key's requests back for the first
/// wait, counted from when it began, and no longer: a request 60 ms in
/// waits 40 ms, and one after 100 ms is decided under the policy as it
/// is, without waiting. A first wait of zero never waits.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_hung_first_lookup_holds_requests_back_for_the_first_wait_only() {
    let cached = CachedLookup::builder(Slow { delay: None }).build().unwrap();
    let (api, key) = (api(), Key::user("acme"));
    assert!(pending(cached.applied(&key, &api)));
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(pending(cached.applied(&key, &api)));
    let waited = first_answer(&cached, &key).await;
    assert_eq!(waited, Some(Duration::from_millis(40)));
    assert!(cached.applied(&key, &api).is_none());
    assert_eq!(first_answer(&cached, &key).await, None);

    let never = CachedLookup::builder(Slow { delay: None });
    let never = never.first_wait(Duration::ZERO).build().unwrap();
    assert!(never.applied(&key, &api).is_none());
    assert!(never.first_answer(&key, &api).is_none());
}

/// A key forgotten (past `max_keys`) while its requests wait for its first
/// answer takes its lookup with it: they stop waiting at once.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn requests_waiting_for_a_forgotten_key_stop_waiting() {
    let slow = CachedLookup::builder(Slow { delay: None }).max_keys(1);
    let cached = slow.build().unwrap();
    let (api, a) = (api(), Key::user("a"));
    assert!(pending(cached.applied(&a, &api)));
    let first = cached.first_answer(&a, &api).unwrap();
    tokio::task::yield_now().await;
    let start = tokio::time::Instant::now();
    let waiting = tokio::spawn(first);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(pending(cached.applied(&Key::user("b"), &api)));
    waiting.await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(10));
}

/// A first lookup that panics ends its requests' wait at once, and leaves
/// the key to the policy as it is, without a wait again.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_first_lookup_that_panics_ends_the_wait_at_once() {
    let lookup = Flaky {
        panic: 1,
        ..Flaky::default()
    };
    let cached = CachedLookup::builder(lookup).build().unwrap();
    let (api, key) = (api(), Key::user("acme"));
    assert!(pending(cached.applied(&key, &api)));
    let first = cached.first_answer(&key, &api).unwrap();
    let start = tokio::time::Instant::now();
    first.await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(cached.applied(&key, &api).is_none());
    assert!(cached.first_answer(&key, &api).is_none());
}

/// The lookup that replaces a hung first one, a cache time on, is not
/// waited for: the key's requests waited their first wait already.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_first_lookup_given_up_on_is_not_waited_for_again() {
    let clock = tollgate_core::FakeClock::default();
    let hung = CachedLookup::builder(Slow { delay: None }).clock(clock.clone());
    let cached = hung.build().unwrap();
    let (api, key) = (api(), Key::user("acme"));
    assert!(pending(cached.applied(&key, &api)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(cached.applied(&key, &api).is_none());
    clock.advance(Duration::from_secs(10));
    assert!(cached.applied(&key, &api).is_none(), "asked again");
    assert_eq!(first_answer(&cached, &key).await, None);
}

#[test]
fn a_first_wait_longer_than_the_cache_time_is_refused() {
    let builder = CachedLookup::builder(Everyone).cache_time(Duration::from_secs(1));
    let error = builder.first_wait(Duration::MAX).build().unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid setting first_wait: must not exceed the cache time, after which a lookup is given up on"
    );
    let builder = CachedLookup::builder(Everyone).first_wait(Duration::from_millis(5_001));
    assert_eq!(
        builder.build().unwrap_err().to_string(),
        "invalid setting first_wait: must not exceed 5 s: requests are held for it"
    );
    let most = CachedLookup::builder(Everyone).first_wait(Duration::from_secs(5));
    assert!(most.build().is_ok());
}

/// Finds no override for any key.
struct Nobody;

impl OverrideLookup for Nobody {
    type Error = std::convert::Infallible;

    async fn lookup(
        &self,
        _: &Key,
        _: &str,
    ) -> Result<Option<(Override, Option<Timestamp>)>, Self::Error> {
        Ok(None)
    }
}

/// A key whose first answer was "no override" is decided by that answer
/// while it is looked up again a cache time on: a refresh is never waited
/// for.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_refresh_is_not_waited_for() {
    let clock = tollgate_core::FakeClock::default();
    let cached = CachedLookup::builder(Nobody).clock(clock.clone());
    let cached = cached.build().unwrap();
    let (api, key) = (api(), Key::user("ada"));
    assert!(pending(cached.applied(&key, &api)));
    cached.first_answer(&key, &api).unwrap().await;
    assert!(cached.applied(&key, &api).is_none());
    clock.advance(Duration::from_secs(10));
    assert!(cached.applied(&key, &api).is_none(), "asked again");
    assert!(cached.first_answer(&key, &api).is_none());
}
