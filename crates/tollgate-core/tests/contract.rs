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
    assert_eq!(report.cases, 41);
    assert_eq!(report.decisions, 41 * 240);
    assert_eq!(report.statuses, 41 * 6);
    assert_eq!(report.resets, 41);
    assert_eq!(report.blocks, 41);
    assert_eq!(report.boundaries, 9);
    assert_eq!(report.settlements, 827);
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

fn words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn the_saved_form_is_stable() {
    // Bytes kept by one version are read by the next: the layout and the
    // algorithms' codes never change. Little-endian words: a version tag,
    // the algorithm's code, its burst plus 1 (0: none), the number of
    // limits, each limit's count and period in µs, then each limit's state.
    const LIMITS_V1: u64 = 0x7467_0000_0000_0001;
    let now = Timestamp::from_secs(1_700_000_000);
    let t = now.as_micros();

    let gcra = Policy::new("api", tollgate_core::Algorithm::Gcra, "2/s").unwrap();
    let mut state = KeyState::new(&gcra, now);
    state.decide(&gcra, now, 1);
    assert_eq!(
        words(&state.to_bytes()),
        [LIMITS_V1, 5, 0, 1, 2, 1_000_000, t + 500_000]
    );

    let window = Policy::builder("api")
        .algorithm(tollgate_core::Algorithm::FixedWindow)
        .limit("10/min")
        .build()
        .unwrap();
    let mut state = KeyState::new(&window, now);
    state.decide(&window, now, 3);
    let start = t - t % 60_000_000;
    assert_eq!(
        words(&state.to_bytes()),
        [LIMITS_V1, 0, 0, 1, 10, 60_000_000, start, 3]
    );

    let log = Policy::builder("api")
        .algorithm(tollgate_core::Algorithm::TokenBucket)
        .limit("4/s")
        .burst(8)
        .build()
        .unwrap();
    let state = KeyState::new(&log, now);
    assert_eq!(
        &words(&state.to_bytes())[..6],
        [LIMITS_V1, 3, 9, 1, 4, 1_000_000]
    );

    let blocked = KeyState::BlockedUntil(Timestamp::from_micros(t + 60_000_000));
    assert_eq!(
        words(&blocked.to_bytes()),
        [0x7467_0000_0000_0002, t + 60_000_000]
    );
}

mod hostile {
    use super::*;
    use proptest::prelude::*;
    use tollgate_core::Algorithm;

    /// State words a broken or hostile backend might hand back: the
    /// extremes, the bounds and anything at all.
    fn word() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            Just(u64::MAX),
            Just(1 << 62),
            Just((1 << 62) + 1),
            Just(1 << 52),
            Just((1 << 52) + 1),
            1_600_000_000_000_000u64..1_800_000_000_000_000,
            0u64..1_000,
            any::<u64>(),
        ]
    }

    /// A settlement whose reservation names the end of time, under every
    /// algorithm, one limit and two: an overflow panicked.
    #[test]
    fn a_reservation_at_the_end_of_time_settles_without_panicking() {
        let now = Timestamp::from_secs(1_700_000_000);
        for algorithm in Algorithm::ALL {
            for limits in [&["5/s"][..], &["5/s", "100/h"]] {
                let policy = limits
                    .iter()
                    .fold(Policy::builder("api").algorithm(algorithm), |b, l| {
                        b.limit(*l)
                    })
                    .build()
                    .unwrap();
                let mut state = KeyState::new(&policy, now);
                assert!(state.decide(&policy, now, 5).is_allowed());
                let end = Timestamp::from_micros(u64::MAX);
                let settled = state.settle(&policy, now, &Settlement::new(5, 0, end));
                assert!(settled.remaining() <= 5, "{algorithm}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]
        #[test]
        fn whatever_loads_decides_settles_and_saves_without_panicking(
            algorithm in prop::sample::select(Algorithm::ALL.to_vec()),
            state_words in prop::collection::vec(word(), 0..12),
            gap in 0u64..200_000_000,
            cost in prop_oneof![Just(0u64), Just(1), Just(7), Just(u64::MAX)],
            reserved_at in word(),
        ) {
            let policy = Policy::builder("api")
                .algorithm(algorithm)
                .limit("5/s")
                .limit("100/h")
                .build()
                .unwrap();
            let now = Timestamp::from_secs(1_700_000_000);
            // A real header, then state words from anywhere.
            let header: Vec<u64> = words(&KeyState::new(&policy, now).to_bytes())[..8].to_vec();
            let bytes: Vec<u8> = header
                .iter()
                .chain(&state_words)
                .flat_map(|w| w.to_le_bytes())
                .collect();
            let other = Policy::new("api", algorithm, "7/s").unwrap();
            let at = Timestamp::from_micros(now.as_micros() + gap);
            for policy in [&policy, &other] {
                let Ok(mut state) = KeyState::from_bytes(policy, &bytes) else {
                    continue;
                };
                let decision = state.decide(policy, at, cost);
                state.expires_at(policy);
                state.settle(policy, at, &Settlement::of(&decision, 1, u64::MAX));
                state.settle(policy, at, &Settlement::of(&decision, 5, 0));
                // A settlement that names any time at all as its reservation's.
                let since = Timestamp::from_micros(reserved_at);
                state.settle(policy, at, &Settlement::new(5, 0, since));
                state.settle(policy, at, &Settlement::new(5, 9, since));
                state.decide(policy, at, 1);
                let again = KeyState::from_bytes(policy, &state.to_bytes());
                prop_assert!(again.is_ok(), "{:?}", again);
            }
        }
    }
}
