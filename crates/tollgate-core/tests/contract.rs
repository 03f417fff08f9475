//! A new backend needs no code in core: a store over nothing but a map of
//! bytes, built on the public contract alone ([`KeyState`] and its saved
//! form), passes the conformance suite: six algorithms, two configurations
//! of one policy served in turn, settlements, statuses, resets and blocks.
#![cfg(feature = "testing")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tollgate_core::state::KeyState;
use tollgate_core::testing::check_store;
use tollgate_core::{
    Clock, Decision, FakeClock, Key, Policy, Settlement, Store, StoreError, Timestamp,
};

/// Bytes under a policy's name and a key: what a key-value database, a
/// SQL table or a file would keep.
struct BytesStore {
    clock: FakeClock,
    map: Mutex<HashMap<(String, Key), Vec<u8>>>,
}

impl BytesStore {
    /// Loads the key's state, applies `f`, and keeps what it left, under
    /// one lock: a database would do the same in a transaction or with a
    /// compare-and-swap.
    fn with_state(
        &self,
        key: &Key,
        policy: &Policy,
        f: impl FnOnce(&mut KeyState, Timestamp) -> Decision,
    ) -> Result<Decision, StoreError> {
        let now = self.clock.now();
        let mut map = self.map.lock().unwrap();
        let slot = (policy.name().to_owned(), key.clone());
        let mut state = match map.get(&slot) {
            Some(bytes) => KeyState::from_bytes(policy, bytes).map_err(StoreError::backend)?,
            None => KeyState::new(policy, now),
        };
        let decision = f(&mut state, now);
        if state.expires_at(policy) > now {
            map.insert(slot, state.to_bytes());
        } else {
            map.remove(&slot);
        }
        Ok(decision)
    }
}

impl Store for BytesStore {
    async fn check(&self, key: &Key, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        self.with_state(key, policy, |state, now| state.decide(policy, now, cost))
    }

    async fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: Settlement,
    ) -> Result<Decision, StoreError> {
        self.with_state(key, policy, |state, now| {
            state.settle(policy, now, &settlement)
        })
    }

    async fn reset(&self, key: &Key, policy: &Policy) -> Result<(), StoreError> {
        let slot = (policy.name().to_owned(), key.clone());
        self.map.lock().unwrap().remove(&slot);
        Ok(())
    }

    async fn block(
        &self,
        key: &Key,
        policy: &Policy,
        duration: Duration,
    ) -> Result<(), StoreError> {
        let slot = (policy.name().to_owned(), key.clone());
        let state = KeyState::blocked_for(self.clock.now(), duration);
        self.map.lock().unwrap().insert(slot, state.to_bytes());
        Ok(())
    }
}

#[tokio::test]
async fn a_store_over_bytes_passes_the_conformance_suite() {
    let clock = FakeClock::default();
    let store = BytesStore {
        clock: clock.clone(),
        map: Mutex::default(),
    };
    let report = check_store(&store, &clock).await.unwrap();
    // The same counts as the memory store's run: every case ran in full.
    assert_eq!(report.cases, 30);
    assert_eq!(report.decisions, 30 * 240);
    assert_eq!(report.statuses, 30 * 6);
    assert_eq!(report.resets, 30);
    assert_eq!(report.blocks, 30);
    assert_eq!(report.settlements, 572);
    // It kept bytes and nothing else: every key still held decodes.
    for ((name, _), bytes) in store.map.lock().unwrap().iter() {
        assert!(!bytes.is_empty(), "{name}");
    }
}

#[test]
fn bytes_that_are_not_a_saved_state_are_an_error_not_a_panic() {
    let policy = Policy::new("api", tollgate_core::Algorithm::SlidingLog, "5/s").unwrap();
    let now = Timestamp::from_secs(1_700_000_000);
    let mut state = KeyState::new(&policy, now);
    state.decide(&policy, now, 3);
    let saved = state.to_bytes();
    // Every prefix, and every single flipped byte, either loads or is an
    // error that names the problem.
    for end in 0..saved.len() {
        let err = KeyState::from_bytes(&policy, &saved[..end]).unwrap_err();
        assert!(err.to_string().starts_with("not a saved rate-limit state"));
    }
    for at in 0..saved.len() {
        let mut flipped = saved.clone();
        flipped[at] ^= 0xff;
        let _ = KeyState::from_bytes(&policy, &flipped);
    }
    assert_eq!(KeyState::from_bytes(&policy, &saved).unwrap(), state);
}
