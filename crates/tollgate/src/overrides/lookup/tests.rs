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
    let builder = CachedLookup::builder(lookup).cache_time(cache_time);
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

// On a runtime without a timer: a cached lookup needs none.
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
    let cached = CachedLookup::builder(lookup).max_keys(10).build().unwrap();
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
