//! The last decision Redis made for each recent key, for a local fallback
//! to take over from while Redis fails (`Store::last_known`).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tollgate_core::{Decision, Policy};

/// A bounded map from state key to the last decision Redis made for it.
/// When full, decisions whose every limit has reset since are forgotten to
/// make room; a key that finds no room is not remembered (its fallback
/// starts afresh, within the local share of the limit).
pub(crate) struct LastKnown {
    max_entries: usize,
    entries: Mutex<HashMap<String, Known>>,
}

struct Known {
    fingerprint: u64,
    decision: Decision,
    /// Local time (µs) after which every limit of the decision has reset.
    stale_at: u64,
}

impl LastKnown {
    pub(crate) fn new(max_entries: usize) -> Self {
        Self {
            max_entries,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Known>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Remembers `decision`, made for `state_key` under `policy` at local
    /// time `now` (µs).
    pub(crate) fn record(&self, state_key: String, policy: &Policy, decision: &Decision, now: u64) {
        if self.max_entries == 0 {
            return;
        }
        let reset = decision
            .limits()
            .iter()
            .map(|s| u64::try_from(s.reset().as_micros()).unwrap_or(u64::MAX / 4))
            .max()
            .unwrap_or(0);
        let known = Known {
            fingerprint: policy.fingerprint(),
            decision: decision.clone(),
            stale_at: now.saturating_add(reset),
        };
        let mut entries = self.entries();
        if entries.len() >= self.max_entries && !entries.contains_key(&state_key) {
            entries.retain(|_, k| k.stale_at > now);
            if entries.len() >= self.max_entries {
                return;
            }
        }
        entries.insert(state_key, known);
    }

    /// The last decision for `state_key` under `policy`, unless every limit
    /// has reset since local time `now` (µs).
    pub(crate) fn get(&self, state_key: &str, policy: &Policy, now: u64) -> Option<Decision> {
        let entries = self.entries();
        let known = entries.get(state_key)?;
        (known.fingerprint == policy.fingerprint() && known.stale_at > now)
            .then(|| known.decision.clone())
    }

    /// Forgets the decision of `state_key`, whose state was reset.
    pub(crate) fn remove(&self, state_key: &str) {
        self.entries().remove(state_key);
    }
}
