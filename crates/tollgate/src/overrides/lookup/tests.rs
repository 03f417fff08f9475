//! The cache's bounds, and lookups that hang, panic or never run.

use super::*;
use std::sync::atomic::Ordering;

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

/// Hangs on its first lookup of each run of `hang`, panics on those
/// of `panic`, and finds every key exempt otherwise.
#[derive(Default)]
struct Flaky {
    calls: std::sync::atomic::AtomicUsize,
    hang: usize,
    panic: usize,
}

impl OverrideLookup for Flaky {
    type Error = std::convert::Infallible;

    async fn lookup(
        &self,
        _: &Key,
        _: &str,
    ) -> Result<Option<(Override, Option<Timestamp>)>, Self::Error> {
        let call = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if call < self.hang {
            std::future::pending::<()>().await;
        }
        assert!(call >= self.panic, "the lookup's own bug");
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

/// Lets the lookups spawned so far run as far as they can.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_lookup_that_never_answers_is_given_up_on_and_asked_again() {
    let clock = tollgate_core::FakeClock::default();
    let cached = flaky(1, 0, &clock);
    let api = Policy::new("api", tollgate_core::Algorithm::Gcra, "1/s").unwrap();
    let key = Key::user("acme");
    assert!(cached.applied(&key, &api).is_none());
    settle().await;
    assert_eq!(cached.inner.lookup.calls.load(Ordering::SeqCst), 1);
    // Past the cache time the hung lookup is given up on; the key is
    // asked again a cache time later, and answered.
    tokio::time::advance(Duration::from_secs(10)).await;
    settle().await;
    clock.advance(Duration::from_secs(10));
    assert!(cached.applied(&key, &api).is_none(), "not asked again yet");
    assert_eq!(cached.inner.lookup.calls.load(Ordering::SeqCst), 1);
    clock.advance(Duration::from_secs(10));
    assert!(cached.applied(&key, &api).is_none());
    settle().await;
    assert_eq!(cached.inner.lookup.calls.load(Ordering::SeqCst), 2);
    assert!(matches!(cached.applied(&key, &api), Some(Applied::Exempt)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_lookup_that_panics_is_asked_again_after_the_cache_time() {
    let clock = tollgate_core::FakeClock::default();
    let cached = flaky(0, 1, &clock);
    let api = Policy::new("api", tollgate_core::Algorithm::Gcra, "1/s").unwrap();
    let key = Key::user("acme");
    assert!(cached.applied(&key, &api).is_none());
    settle().await;
    assert_eq!(cached.inner.lookup.calls.load(Ordering::SeqCst), 1);
    clock.advance(Duration::from_secs(9));
    assert!(cached.applied(&key, &api).is_none(), "not asked again yet");
    clock.advance(Duration::from_secs(1));
    assert!(cached.applied(&key, &api).is_none());
    settle().await;
    assert_eq!(cached.inner.lookup.calls.load(Ordering::SeqCst), 2);
    assert!(matches!(cached.applied(&key, &api), Some(Applied::Exempt)));
}

#[test]
fn a_lookup_its_runtime_never_runs_is_asked_again_after_the_cache_time() {
    let clock = tollgate_core::FakeClock::default();
    let cached = flaky(0, 0, &clock);
    let api = Policy::new("api", tollgate_core::Algorithm::Gcra, "1/s").unwrap();
    let key = Key::user("acme");
    let dead = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let handle = dead.handle().clone();
    dead.shutdown_background();
    {
        let _inside = handle.enter();
        assert!(cached.applied(&key, &api).is_none());
    }
    assert_eq!(cached.inner.lookup.calls.load(Ordering::SeqCst), 0);
    let live = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    live.block_on(async {
        clock.advance(Duration::from_secs(10));
        assert!(cached.applied(&key, &api).is_none());
        settle().await;
        assert_eq!(cached.inner.lookup.calls.load(Ordering::SeqCst), 1);
        assert!(matches!(cached.applied(&key, &api), Some(Applied::Exempt)));
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
