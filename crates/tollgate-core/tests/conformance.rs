//! The memory store passes the conformance suite of the `testing` feature.
#![cfg(feature = "testing")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use tollgate_core::testing::check_store;
use tollgate_core::{FakeClock, MemoryStore};

#[tokio::test]
async fn the_memory_store_passes_the_conformance_suite() {
    let clock = FakeClock::default();
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let report = check_store(&store, &clock).await.unwrap();
    // Six algorithms, five cases each, every request compared.
    assert_eq!(report.cases, 30);
    assert_eq!(report.decisions, 30 * 240);
}

#[tokio::test]
async fn a_boxed_store_passes_the_conformance_suite() {
    let clock = FakeClock::default();
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let boxed = tollgate_core::BoxStore::new(store);
    let report = check_store(&boxed, &clock).await.unwrap();
    assert_eq!(report.decisions, 30 * 240);
}

/// A store that charges nothing for a single unit: it never denies one.
struct Lenient(MemoryStore);

impl tollgate_core::Store for Lenient {
    async fn check(
        &self,
        key: &tollgate_core::Key,
        policy: &tollgate_core::Policy,
        cost: u64,
    ) -> Result<tollgate_core::Decision, tollgate_core::StoreError> {
        let cost = if cost == 1 { 0 } else { cost };
        self.0.check(key, policy, cost).await
    }
}

#[tokio::test]
async fn a_store_that_departs_from_the_reference_fails_it() {
    let clock = FakeClock::default();
    let store = Lenient(MemoryStore::builder().clock(clock.clone()).build().unwrap());
    let mismatch = check_store(&store, &clock).await.unwrap_err();
    assert!(
        matches!(
            mismatch,
            tollgate_core::testing::Mismatch::Decision { cost: 1, .. }
        ),
        "{mismatch}"
    );
}
