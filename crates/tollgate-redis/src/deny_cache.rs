//! A bounded local cache of denials.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tollgate_core::{Decision, LimitStatus, Outcome, Policy, Timestamp};

/// Remembers, per key, that Redis denied a cost-1 request to a single-limit
/// policy until a time, and denies such requests locally until then.
///
/// Exact: a denial only gets later when others consume, never earlier, and
/// the expiry counts from when the denied call was *sent* (before Redis
/// decided), so the cache never denies a request Redis would admit. The
/// rest of the decision is exact too: while a cost-1 request is denied,
/// `remaining` stays 0 and the reset time stays put under every algorithm.
/// That does not hold for other costs (a bucket refills towards them) or
/// for a policy's other limits, so those always go to Redis.
pub(crate) struct DenyCache {
    max_entries: usize,
    entries: Mutex<HashMap<String, Entry>>,
}

struct Entry {
    fingerprint: u64,
    sent_at: u64,
    until: u64,
    decision: Decision,
}

impl DenyCache {
    pub(crate) fn new(max_entries: usize) -> Self {
        Self {
            max_entries,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// A local denial of `cost` for `state_key` at local time `now` (µs).
    pub(crate) fn lookup(
        &self,
        state_key: &str,
        policy: &Policy,
        cost: u64,
        now: u64,
    ) -> Option<Decision> {
        if self.max_entries == 0 {
            return None;
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if !cacheable(policy, cost) {
            return None;
        }
        let entry = entries.get(state_key)?;
        if now >= entry.until || entry.fingerprint != policy.fingerprint() {
            entries.remove(state_key);
            return None;
        }
        Some(shift(
            policy,
            &entry.decision,
            now.saturating_sub(entry.sent_at),
            entry.until - now,
        ))
    }

    /// Remembers `decision`, a denial of `cost` for a call sent at local
    /// time `sent_at` (µs).
    pub(crate) fn insert(
        &self,
        state_key: &str,
        policy: &Policy,
        cost: u64,
        sent_at: u64,
        decision: &Decision,
    ) {
        let Some(retry) = decision.retry_after() else {
            return;
        };
        if self.max_entries == 0 || !cacheable(policy, cost) {
            return;
        }
        let until = sent_at + u64::try_from(retry.as_micros()).unwrap_or(u64::MAX / 2);
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= self.max_entries && !entries.contains_key(state_key) {
            entries.retain(|_, e| e.until > sent_at);
            if entries.len() >= self.max_entries {
                return;
            }
        }
        entries.insert(
            state_key.to_owned(),
            Entry {
                fingerprint: policy.fingerprint(),
                sent_at,
                until,
                decision: decision.clone(),
            },
        );
    }

    /// Forgets every denial.
    pub(crate) fn clear(&self) {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    pub(crate) fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

fn cacheable(policy: &Policy, cost: u64) -> bool {
    cost == 1 && policy.limits().len() == 1
}

/// `decision` as it stands `elapsed` µs later, with `retry` µs to go.
fn shift(policy: &Policy, decision: &Decision, elapsed: u64, retry: u64) -> Decision {
    let elapsed_d = Duration::from_micros(elapsed);
    let statuses = decision.limits().iter().map(|s| {
        LimitStatus::new(
            s.index(),
            s.limit(),
            s.capacity(),
            s.remaining(),
            s.reset().saturating_sub(elapsed_d),
            s.retry_after().map(|r| r.saturating_sub(elapsed_d)),
        )
    });
    Decision::new(
        policy,
        Outcome::Limited {
            retry_after: Duration::from_micros(retry),
        },
        Timestamp::from_micros(decision.now().as_micros() + elapsed),
        Duration::ZERO,
        statuses,
    )
}
