//! The deny cache's own tests.

use super::*;
use tollgate_core::{Algorithm, Key, MemoryStore, Store};

/// A denial of one request under `policy` (spent), by the memory store
/// on a still clock.
fn denial(policy: &Policy) -> Decision {
    let clock = tollgate_core::FakeClock::new(Timestamp::from_secs(1_700_000_000));
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    let key = Key::user("k");
    let decide = || {
        store
            .try_check_now(&key, policy, 1)
            .and_then(Result::ok)
            .unwrap_or_else(|| unreachable!("the memory store decides at once"))
    };
    assert!(decide().is_allowed());
    let denied = decide();
    assert!(!denied.is_allowed());
    denied
}

/// Whether `cache` answers for Redis with a denial of a cost-1 request
/// for `key` at `now`.
fn answers(cache: &DenyCache, key: &str, policy: &Policy, now: u64) -> bool {
    matches!(cache.lookup(key, policy, 1, now), Cached::Denial(_))
}

/// A cached denial tells a wait counted from when its reply came back,
/// not from when its call was sent: Redis measured it in between, and
/// counted from the sending it was early by the queue and the round
/// trip (300 ms here), so a client came back to a second refusal. It
/// still stops answering for Redis a wait after the sending.
#[test]
fn a_cached_denial_tells_its_wait_from_its_reply() {
    let policy = Policy::new("api", Algorithm::Gcra, "1/h").unwrap();
    let denied = denial(&policy);
    let hour: u64 = 3_600_000_000;
    let cache = DenyCache::new(10);
    cache.insert("k", &policy, 1, (0, 300_000, cache.sent("k")), &denied);
    let Cached::Denial(cached) = cache.lookup("k", &policy, 1, 500_000) else {
        panic!("a denial answers within a second of its call");
    };
    let told = cached.retry_after().map(|r| r.as_micros());
    assert_eq!(told, Some(u128::from(hour + 300_000 - 500_000)));
    assert!(cache.lookup_on_failure("k", &policy, 1, hour - 1).is_some());
    assert!(cache.lookup_on_failure("k", &policy, 1, hour).is_none());
}

/// While Redis cannot answer, a cached denial of one unit denies two
/// until the limit is fully back (two an hour: one back in 30 min, both
/// in an hour), and three for good. It told two the half hour of one.
#[test]
fn a_standing_denial_tells_a_larger_cost_when_it_fits() {
    let policy = Policy::new("api", Algorithm::Gcra, "2/h").unwrap();
    let clock = tollgate_core::FakeClock::new(Timestamp::from_secs(1_700_000_000));
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    let check = || {
        store
            .try_check_now(&Key::user("k"), &policy, 1)
            .and_then(Result::ok)
    };
    let denied = [check(), check(), check()][2].clone().unwrap();
    let cache = DenyCache::new(10);
    cache.insert("k", &policy, 1, (0, 0, cache.sent("k")), &denied);
    let wait = |cost| {
        let denial = cache
            .lookup_on_failure("k", &policy, cost, 60_000_000)
            .unwrap();
        (denial.retry_after().map(|w| w.as_secs()), denial.outcome())
    };
    assert_eq!(wait(1).0, Some(1_740));
    assert_eq!(wait(2).0, Some(3_540));
    let exceeds = Outcome::CostExceedsCapacity {
        cost: 3,
        capacity: 2,
    };
    assert_eq!(wait(3), (None, exceeds));
}

/// Under every algorithm, with a minute's limit spent beside a day's with
/// room, a standing denial of one unit tells a larger cost the memory
/// store's own wait for it: exactly for the rate-based algorithms and the
/// fixed window, never sooner for the sliding ones. The day's limit, which
/// has room, counted: it told the day's end.
#[test]
fn a_standing_denial_tells_a_larger_cost_the_stores_own_wait() {
    for algorithm in Algorithm::ALL {
        let policy = Policy::builder("api")
            .algorithm(algorithm)
            .limit("4/min")
            .limit("1000/d")
            .build()
            .unwrap();
        let clock = tollgate_core::FakeClock::new(Timestamp::from_secs(1_700_000_010));
        let store = MemoryStore::builder().clock(clock).build().unwrap();
        let check = |cost| {
            let checked = store.try_check_now(&Key::user("k"), &policy, cost);
            checked.and_then(Result::ok).unwrap()
        };
        let denied = std::iter::repeat_with(|| check(1))
            .find(|d| !d.is_allowed())
            .unwrap();
        let cache = DenyCache::new(10);
        cache.insert("k", &policy, 1, (0, 0, cache.sent("k")), &denied);
        for cost in 2..=4 {
            let told = cache.lookup_on_failure("k", &policy, cost, 0).unwrap();
            let (told, exact) = (
                told.retry_after().unwrap(),
                check(cost).retry_after().unwrap(),
            );
            match algorithm {
                Algorithm::SlidingWindow | Algorithm::SlidingLog => {
                    assert!(told >= exact, "{algorithm}, {cost}: {told:?} < {exact:?}")
                }
                Algorithm::Gcra
                | Algorithm::TokenBucket
                | Algorithm::LeakyBucket
                | Algorithm::FixedWindow => assert_eq!(told, exact, "{algorithm}, {cost}"),
            }
            // Never the day's end: at most when the minute is fully back.
            let minute = denied.limits()[0];
            assert!(told <= minute.reset(), "{algorithm}, {cost}");
            assert!(minute.reset() < std::time::Duration::from_secs(120));
        }
    }
}

/// A denial decided while a key was reset (its reply on its way when
/// the reset removed the key's denial) is not taken in: it may be of
/// the state before the reset, and would deny the key here until it
/// ended. One decided after is.
#[test]
fn a_denial_sent_before_a_reset_is_not_cached_after_it() {
    let policy = Policy::new("api", Algorithm::Gcra, "1/h").unwrap();
    let denied = denial(&policy);
    let cache = DenyCache::new(10);
    let sent = (10, 10, cache.sent("k"));
    cache.remove("k");
    cache.insert("k", &policy, 1, sent, &denied);
    assert!(!answers(&cache, "k", &policy, 20));
    cache.insert("k", &policy, 1, (30, 30, cache.sent("k")), &denied);
    assert!(answers(&cache, "k", &policy, 40));
}

/// A denial sent before the cache forgot its denials (Redis restarted,
/// or the connection failed) and answered after is cached as of the
/// epoch it was sent in: it stands while Redis cannot answer, and does
/// not answer for Redis. It was cached as current, and denied the key
/// here for up to a second of Redis's new state.
#[test]
fn a_denial_sent_before_the_cache_forgot_does_not_answer_for_redis() {
    let policy = Policy::new("api", Algorithm::Gcra, "1/h").unwrap();
    let denied = denial(&policy);
    let cache = DenyCache::new(10);
    let sent = (10, 10, cache.sent("k"));
    cache.forget();
    cache.insert("k", &policy, 1, sent, &denied);
    assert!(matches!(
        cache.lookup("k", &policy, 1, 20),
        Cached::Standing
    ));
    assert!(cache.lookup_on_failure("k", &policy, 1, 20).is_some());
    cache.insert("k", &policy, 1, (30, 30, cache.sent("k")), &denied);
    assert!(answers(&cache, "k", &policy, 40));
}

/// Removals of other keys' denials (a settlement removes one) do not
/// turn away a denial decided meanwhile, but for a key of the same
/// stripe: a hammered key stays cached beside other keys' settlements.
#[test]
fn other_keys_removals_do_not_turn_away_a_denial() {
    let policy = Policy::new("api", Algorithm::Gcra, "1/h").unwrap();
    let denied = denial(&policy);
    let cache = DenyCache::new(10);
    let sent = (10, 10, cache.sent("k"));
    let others: Vec<String> = (0..1_000).map(|i| format!("other-{i}")).collect();
    let elsewhere: Vec<&String> = others.iter().filter(|o| stripe(o) != stripe("k")).collect();
    // The stripes spread keys: about 1 in 64 shares k's.
    assert!(elsewhere.len() > 950, "{}", elsewhere.len());
    for other in &elsewhere {
        cache.remove(other);
    }
    cache.insert("k", &policy, 1, sent, &denied);
    assert!(answers(&cache, "k", &policy, 20));
    // A removal in k's stripe still turns a denial away, as k's own
    // would.
    let same = others.iter().find(|o| stripe(o) == stripe("k")).unwrap();
    cache.remove("k");
    let sent = (30, 30, cache.sent("k"));
    cache.remove(same);
    cache.insert("k", &policy, 1, sent, &denied);
    assert!(!answers(&cache, "k", &policy, 40));
}

/// A cache full of denials in force turns new keys away until the
/// first of them ends, then takes one in its place; a key that leaves
/// (reset) makes room at once.
#[test]
fn a_full_cache_takes_a_new_key_once_a_denial_ends() {
    // One an hour: the second request is denied for an hour.
    let policy = Policy::new("api", Algorithm::Gcra, "1/h").unwrap();
    let denied = denial(&policy);
    let retry = u64::try_from(denied.retry_after().unwrap().as_micros()).unwrap();
    assert_eq!(retry, 3_600_000_000);
    let cache = DenyCache::new(3);
    for (i, sent_at) in [0, 10, 20].into_iter().enumerate() {
        cache.insert(
            &format!("k{i}"),
            &policy,
            1,
            (sent_at, sent_at, cache.sent(&format!("k{i}"))),
            &denied,
        );
    }
    assert_eq!(cache.len(), 3);
    // Every denial in force: turned away, again and again.
    for sent_at in [30, 40, retry - 1] {
        cache.insert(
            "new",
            &policy,
            1,
            (sent_at, sent_at, cache.sent("new")),
            &denied,
        );
        assert!(!answers(&cache, "new", &policy, sent_at));
    }
    // k0's denial ended at `retry`: its room goes to the new key.
    cache.insert(
        "new",
        &policy,
        1,
        (retry, retry, cache.sent("new")),
        &denied,
    );
    assert!(answers(&cache, "new", &policy, retry));
    assert_eq!(cache.len(), 3);
    // Full again until k1's denial ends; a reset of k2 makes room.
    cache.insert(
        "other",
        &policy,
        1,
        (retry + 1, retry + 1, cache.sent("other")),
        &denied,
    );
    assert!(!answers(&cache, "other", &policy, retry + 1));
    cache.remove("k2");
    cache.insert(
        "other",
        &policy,
        1,
        (retry + 2, retry + 2, cache.sent("other")),
        &denied,
    );
    assert!(answers(&cache, "other", &policy, retry + 2));
    // Full again. A denial that ends sooner than every other, put in
    // k1's place (its key denied anew, as by a clock behind the
    // others): once it ends, its room is taken before k1's old end.
    cache.insert("k1", &policy, 1, (0, 0, cache.sent("k1")), &denied);
    cache.insert(
        "late",
        &policy,
        1,
        (retry + 3, retry + 3, cache.sent("late")),
        &denied,
    );
    assert!(answers(&cache, "late", &policy, retry + 3));
}
