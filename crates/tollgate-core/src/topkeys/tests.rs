#![allow(clippy::unwrap_used)]

use crate::ConfigError;
use crate::key::Key;

use super::{Ranking, RawLabel, TopKey, TopKeys};

#[test]
fn counts_per_policy_and_ranking_exactly_under_capacity() {
    let top = TopKeys::builder().label(RawLabel).build().unwrap();
    for (user, limited) in [("ada", false), ("ada", true), ("bob", false), ("ada", true)] {
        top.record(&Key::user(user), "api", limited);
    }
    top.record(&Key::user("bob"), "other", true);
    let limited = top.summary("api", Ranking::Limited);
    assert_eq!(limited.keys(), [TopKey::new("user:ada", 2, 0)]);
    assert_eq!((limited.total(), limited.floor()), (2, 0));
    let active = top.summary("api", Ranking::Active);
    assert_eq!(
        active.keys(),
        [TopKey::new("user:ada", 3, 0), TopKey::new("user:bob", 1, 0)]
    );
    assert_eq!(top.summary("other", Ranking::Limited).total(), 1);
    assert_eq!(top.summary("none", Ranking::Active), Default::default());
    assert_eq!(top.policies(), ["api", "other"]);
    top.clear();
    assert_eq!(top.summary("api", Ranking::Active).total(), 0);
}

#[test]
fn policies_beyond_the_bound_are_dropped_and_counted() {
    let top = TopKeys::builder().max_policies(1).build().unwrap();
    top.record(&Key::user("a"), "one", false);
    top.record(&Key::user("b"), "one", false);
    top.record(&Key::user("a"), "two", false);
    assert_eq!(top.policies(), ["one"]);
    assert_eq!(top.dropped(), 1);
    assert_eq!(top.summary("one", Ranking::Active).total(), 2);
}

#[test]
fn a_full_sketch_stays_within_n_over_m_across_shards() {
    let (shards, m) = (4, 8);
    let top = TopKeys::builder()
        .shards(shards)
        .counters(m)
        .label(RawLabel)
        .build()
        .unwrap();
    let mut exact = std::collections::HashMap::new();
    for i in 0..5_000u64 {
        // Key j appears about 5000 / (j + 1) times over 0..60.
        let j = (i * 7919) % 60;
        let j = j * j / 60;
        top.record(&Key::user(j.to_string()), "api", false);
        *exact.entry(format!("user:{j}")).or_insert(0u64) += 1;
    }
    let s = top.summary("api", Ranking::Active);
    assert_eq!(s.total(), 5_000);
    assert!(s.floor() <= 5_000 / m as u64, "{}", s.floor());
    assert!(s.keys().len() <= shards * m);
    for k in s.keys() {
        let truth = exact[k.label()];
        assert!(
            k.guaranteed() <= truth && truth <= k.count(),
            "{k:?} {truth}"
        );
        assert!(k.error() <= s.floor());
    }
    for (label, count) in &exact {
        if *count > s.floor() {
            assert!(s.keys().iter().any(|k| k.label() == label), "{label}");
        }
    }
}

#[test]
fn settings_out_of_range_are_named() {
    let named = |r: Result<TopKeys, ConfigError>| match r {
        Err(ConfigError::InvalidSetting { setting, .. }) => setting,
        other => panic!("{other:?}"),
    };
    assert_eq!(named(TopKeys::builder().counters(0).build()), "counters");
    assert_eq!(
        named(TopKeys::builder().counters(65_537).build()),
        "counters"
    );
    assert_eq!(named(TopKeys::builder().shards(0).build()), "shards");
    assert_eq!(named(TopKeys::builder().shards(257).build()), "shards");
    assert_eq!(
        named(TopKeys::builder().max_policies(0).build()),
        "max_policies"
    );
}

proptest::proptest! {
    /// Any stream, split over any number of instances of any size: each
    /// instance's summary and their merge hold their bounds against the
    /// exact counts (true count between `guaranteed` and `count`, errors
    /// and unlisted keys at most the floor, each floor at most N / m).
    #[test]
    fn summaries_and_their_merge_hold_their_bounds(
        stream in proptest::collection::vec((0u8..40, 0usize..3), 0..600),
        counters in 1usize..12,
        shards in 1usize..4,
    ) {
        let instances: Vec<TopKeys> = (0..3)
            .map(|_| TopKeys::builder().counters(counters).shards(shards).label(RawLabel).build().unwrap())
            .collect();
        let mut exact = std::collections::HashMap::<String, u64>::new();
        let mut each = vec![std::collections::HashMap::<String, u64>::new(); 3];
        for (id, at) in &stream {
            let key = Key::user(id.to_string());
            instances[*at].record(&key, "p", id % 3 == 0);
            if id % 3 == 0 {
                *exact.entry(format!("user:{id}")).or_default() += 1;
                *each[*at].entry(format!("user:{id}")).or_default() += 1;
            }
        }
        let check = |s: &super::Summary, exact: &std::collections::HashMap<String, u64>| {
            for k in s.keys() {
                let t = exact.get(k.label()).copied().unwrap_or(0);
                proptest::prop_assert!(k.guaranteed() <= t && t <= k.count(), "{:?} {}", k, t);
                proptest::prop_assert!(k.error() <= s.floor());
            }
            Ok(())
        };
        let summaries: Vec<_> = instances.iter().map(|t| t.summary("p", Ranking::Limited)).collect();
        for (s, exact) in summaries.iter().zip(&each) {
            proptest::prop_assert!(s.floor() <= s.total() / counters as u64);
            check(s, exact)?;
        }
        let merged = super::Summary::merge(summaries.clone());
        check(&merged, &exact)?;
        let n: u64 = exact.values().sum();
        proptest::prop_assert_eq!(merged.total(), n);
        proptest::prop_assert_eq!(merged.floor(), summaries.iter().map(|s| s.floor()).sum::<u64>());
        for (label, t) in &exact {
            if *t > merged.floor() {
                proptest::prop_assert!(merged.keys().iter().any(|k| k.label() == label), "{}", label);
            }
        }
    }
}

/// A key's id depends on a seed of the instance's own: two instances
/// give one key two ids, so no id can be known, or a key crafted to
/// match one, from outside the instance.
#[test]
fn ids_are_seeded_per_instance() {
    use std::hash::BuildHasher;
    let (a, b) = (TopKeys::new(), TopKeys::new());
    let key = Key::user("ada");
    assert_ne!(a.shared.ids.hash_one(&key), b.shared.ids.hash_one(&key));
}
