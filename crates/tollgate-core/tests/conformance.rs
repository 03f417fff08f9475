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
    // Six algorithms, five cases each, every request compared, a status
    // every 40 requests and a reset in each case.
    assert_eq!(report.cases, 30);
    assert_eq!(report.decisions, 30 * 240);
    assert_eq!(report.statuses, 30 * 6);
    assert_eq!(report.resets, 30);
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

    async fn reset(
        &self,
        key: &tollgate_core::Key,
        policy: &tollgate_core::Policy,
    ) -> Result<(), tollgate_core::StoreError> {
        self.0.reset(key, policy).await
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

/// A store whose reset forgets nothing.
struct NoReset(MemoryStore);

impl tollgate_core::Store for NoReset {
    async fn check(
        &self,
        key: &tollgate_core::Key,
        policy: &tollgate_core::Policy,
        cost: u64,
    ) -> Result<tollgate_core::Decision, tollgate_core::StoreError> {
        self.0.check(key, policy, cost).await
    }

    async fn reset(
        &self,
        _key: &tollgate_core::Key,
        _policy: &tollgate_core::Policy,
    ) -> Result<(), tollgate_core::StoreError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_store_whose_reset_forgets_nothing_fails_it() {
    let clock = FakeClock::default();
    let store = NoReset(MemoryStore::builder().clock(clock.clone()).build().unwrap());
    let mismatch = check_store(&store, &clock).await.unwrap_err();
    // The first decision after the reset differs from a fresh key's.
    assert!(
        matches!(
            mismatch,
            tollgate_core::testing::Mismatch::Decision { request: 120, .. }
        ),
        "{mismatch}"
    );
}
