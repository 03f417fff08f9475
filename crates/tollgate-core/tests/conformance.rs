//! The memory store passes the conformance suite of the `testing` feature,
//! and stores that depart from the reference in one operation fail it.
#![cfg(feature = "testing")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use tollgate_core::testing::{Mismatch, check_store};
use tollgate_core::{Decision, FakeClock, Key, MemoryStore, Policy, Settlement, Store, StoreError};

#[tokio::test]
async fn the_memory_store_passes_the_conformance_suite() {
    let clock = FakeClock::default();
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let report = check_store(&store, &clock).await.unwrap();
    // Six algorithms, five cases each, eight cases of calendar periods
    // and three of calendars changed: every request compared, a status every 40 requests, a reset
    // and a block in each case; nine calendar boundaries checked exactly.
    assert_eq!(report.cases, 41);
    assert_eq!(report.decisions, 41 * 240);
    assert_eq!(report.statuses, 41 * 6);
    assert_eq!(report.resets, 41);
    assert_eq!(report.blocks, 41);
    assert_eq!(report.boundaries, 9);
    // About one admitted request in four is settled (the sequence is fixed).
    assert_eq!(report.settlements, 827);
}

#[tokio::test]
async fn a_boxed_store_passes_the_conformance_suite() {
    let clock = FakeClock::default();
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let boxed = tollgate_core::BoxStore::new(store);
    let report = check_store(&boxed, &clock).await.unwrap();
    assert_eq!(report.decisions, 41 * 240);
}

/// What a store gets wrong.
#[derive(Clone, Copy)]
enum Fault {
    /// Charges nothing for a single unit: never denies one.
    Lenient,
    /// Its reset forgets nothing.
    NoReset,
    /// Its settlement changes nothing, though it reports the state.
    NoSettle,
    /// Its block blocks nothing.
    NoBlock,
}

/// The memory store with one fault.
struct Faulty(MemoryStore, Fault);

impl Store for Faulty {
    async fn check(&self, key: &Key, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        let cost = match self.1 {
            Fault::Lenient if cost == 1 => 0,
            _ => cost,
        };
        self.0.check(key, policy, cost).await
    }

    async fn reset(&self, key: &Key, policy: &Policy) -> Result<(), StoreError> {
        match self.1 {
            Fault::NoReset => Ok(()),
            _ => self.0.reset(key, policy).await,
        }
    }

    async fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: Settlement,
    ) -> Result<Decision, StoreError> {
        match self.1 {
            Fault::NoSettle => self.0.status(key, policy).await,
            _ => self.0.settle(key, policy, settlement).await,
        }
    }

    async fn block(
        &self,
        key: &Key,
        policy: &Policy,
        duration: Duration,
    ) -> Result<(), StoreError> {
        match self.1 {
            Fault::NoBlock => Ok(()),
            _ => self.0.block(key, policy, duration).await,
        }
    }
}

async fn mismatch(fault: Fault) -> Mismatch {
    let clock = FakeClock::default();
    let store = Faulty(
        MemoryStore::builder().clock(clock.clone()).build().unwrap(),
        fault,
    );
    check_store(&store, &clock).await.unwrap_err()
}

#[tokio::test]
async fn a_store_that_departs_from_the_reference_fails_it() {
    let mismatch = mismatch(Fault::Lenient).await;
    assert!(
        matches!(mismatch, Mismatch::Decision { cost: 1, .. }),
        "{mismatch}"
    );
}

#[tokio::test]
async fn a_store_whose_reset_forgets_nothing_fails_it() {
    let mismatch = mismatch(Fault::NoReset).await;
    // The first decision after the reset differs from a fresh key's.
    assert!(
        matches!(mismatch, Mismatch::Decision { request: 120, .. }),
        "{mismatch}"
    );
}

#[tokio::test]
async fn a_store_whose_settlement_changes_nothing_fails_it() {
    let mismatch = mismatch(Fault::NoSettle).await;
    assert!(
        matches!(&mismatch, Mismatch::Decision { store, .. } if store.contains("settling")),
        "{mismatch}"
    );
}

#[tokio::test]
async fn a_store_whose_block_blocks_nothing_fails_it() {
    let mismatch = mismatch(Fault::NoBlock).await;
    // The first request after the block is admitted rather than denied.
    assert!(
        matches!(mismatch, Mismatch::Decision { request: 180, .. }),
        "{mismatch}"
    );
}
