//! The last decision Redis made for each recent key, for a local fallback
//! to take over from while Redis fails (`Store::last_known`).

use std::collections::HashMap;
use std::hash::BuildHasher;

use parking_lot::Mutex;
use tollgate_core::state::{self, PolicyState};
use tollgate_core::{Decision, Policy};

/// Shards of the map: every decision is recorded, from every worker
/// thread, so one lock for all of them would be contended.
const SHARDS: usize = 16;

/// A bounded map from state key to the last decision Redis made for it.
/// When a shard is full, decisions whose every limit has reset since are
/// forgotten to make room; a key that finds no room is not remembered (its
/// fallback starts afresh, within the local share of the limit).
pub(crate) struct LastKnown {
    /// Entries per shard.
    per_shard: usize,
    hasher: foldhash::quality::RandomState,
    shards: Box<[Mutex<Shard>]>,
}

/// A decision whose every limit is back within this (µs) carries nothing
/// worth seeding a fallback with: it is not added to the map (an entry
/// already there is still updated).
const WORTH_KEEPING_US: u64 = 1_000;

#[derive(Default)]
struct Shard {
    /// Keyed by the state key's 64-bit hash (seeded per process, so a
    /// client cannot aim collisions), as the lease table is.
    entries: HashMap<u64, Known, foldhash::fast::FixedState>,
    /// While full: the local time (µs) before which no entry goes stale,
    /// so that a full shard of fresh entries is not scanned again for
    /// every key that finds no room.
    full_until: u64,
}

struct Known {
    /// The configuration of the policy the decision was made under.
    policy: Policy,
    decision: Decision,
    /// Local time (µs) after which every limit of the decision has reset.
    stale_at: u64,
}

/// Which record of a key a decision may replace: a check's, any; a
/// refund's, only one of its configuration; a charge's, none of another.
#[derive(Clone, Copy)]
enum Replaces {
    Any,
    Own,
    NoOther,
}

impl LastKnown {
    pub(crate) fn new(max_entries: usize) -> Self {
        Self {
            per_shard: max_entries.div_ceil(SHARDS),
            hasher: foldhash::quality::RandomState::default(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    /// The shard of `state_key`, and the key's hash within it.
    fn shard(&self, state_key: &str) -> (parking_lot::MutexGuard<'_, Shard>, u64) {
        let hash = self.hasher.hash_one(state_key);
        // The top bits choose the shard; the map uses the low ones.
        let at = (hash >> 60) as usize % SHARDS;
        (self.shards[at].lock(), hash)
    }

    /// Remembers `decision`, made for `state_key` under `policy` at local
    /// time `now` (µs).
    pub(crate) fn record(&self, state_key: &str, policy: &Policy, decision: &Decision, now: u64) {
        self.put(state_key, policy, decision, now, Replaces::Any);
    }

    /// Records `decision`, a refund's, as [`record`](Self::record) does,
    /// only over a record of `policy`'s configuration: a refund of a key
    /// kept under another configuration may have changed nothing (see
    /// `lib/carry.lua`), and the record of the one the key is kept under
    /// stays. Without a record, it makes none: the last check's, which a
    /// refund would have lowered, can only count more used.
    pub(crate) fn refresh(&self, state_key: &str, policy: &Policy, decision: &Decision, now: u64) {
        self.put(state_key, policy, decision, now, Replaces::Own);
    }

    /// Records `decision`, a charge's, as [`record`](Self::record) does,
    /// but never over a record of another configuration: a charge of a
    /// key kept under another configuration may have changed nothing (see
    /// `lib/carry.lua`), and its decision reads the key as the charge's
    /// configuration would, often as a new key. Without a record, it makes
    /// one: a charge counts more used than the last check did.
    pub(crate) fn charged(&self, state_key: &str, policy: &Policy, decision: &Decision, now: u64) {
        self.put(state_key, policy, decision, now, Replaces::NoOther);
    }

    /// [`record`](Self::record), [`refresh`](Self::refresh) or
    /// [`charged`](Self::charged), as `replaces` says.
    fn put(
        &self,
        state_key: &str,
        policy: &Policy,
        decision: &Decision,
        now: u64,
        replaces: Replaces,
    ) {
        if self.per_shard == 0 {
            return;
        }
        let reset = decision
            .limits()
            .iter()
            .map(|s| u64::try_from(s.reset().as_micros()).unwrap_or(u64::MAX / 4))
            .max()
            .unwrap_or(0);
        let stale_at = now.saturating_add(reset);
        let (mut shard, hash) = self.shard(state_key);
        let held = shard.entries.get_mut(&hash);
        let same = |k: &Known| k.policy.fingerprint() == policy.fingerprint();
        let skip = match replaces {
            Replaces::Any => false,
            Replaces::Own => held.as_deref().is_none_or(|k| !same(k)),
            Replaces::NoOther => held.as_deref().is_some_and(|k| !same(k)),
        };
        if skip {
            return;
        }
        if let Some(known) = held {
            // The common case: a key seen before, updated in place.
            if !same(known) {
                known.policy = policy.clone();
            }
            known.decision.clone_from(decision);
            known.stale_at = stale_at;
            // No record held may go stale before the time a full shard
            // waits for: this one may now go stale sooner.
            shard.full_until = shard.full_until.min(stale_at);
            return;
        }
        if reset < WORTH_KEEPING_US {
            return;
        }
        if shard.entries.len() >= self.per_shard {
            if now < shard.full_until {
                return;
            }
            shard.entries.retain(|_, k| k.stale_at > now);
            if shard.entries.len() >= self.per_shard {
                let next = shard.entries.values().map(|k| k.stale_at).min();
                shard.full_until = next.unwrap_or(now);
                return;
            }
        }
        let known = Known {
            policy: policy.clone(),
            decision: decision.clone(),
            stale_at,
        };
        shard.full_until = shard.full_until.min(stale_at);
        shard.entries.insert(hash, known);
    }

    /// The last decision for `state_key` under `policy`, unless every limit
    /// has reset since local time `now` (µs). A decision made under another
    /// configuration of the policy (an override set or lifted, a deploy)
    /// is carried over to `policy`, as Redis carries the key's state: a
    /// key whose limits changed while Redis fails keeps its use. Carried,
    /// it answers whatever its age, as long as it is kept: a limit lowered
    /// holds the use longer than the old limit's resets said, and a use
    /// that has drained since seeds nothing (it is seeded as of its own
    /// time). A full shard still makes room by forgetting the records
    /// whose limits, as they were made under, have all reset.
    pub(crate) fn get(&self, state_key: &str, policy: &Policy, now: u64) -> Option<Decision> {
        let (shard, hash) = self.shard(state_key);
        let known = shard.entries.get(&hash)?;
        if known.policy.fingerprint() == policy.fingerprint() {
            return (known.stale_at > now).then(|| known.decision.clone());
        }
        Some(carried(&known.policy, &known.decision, policy))
    }

    /// Forgets the decision of `state_key`, whose state was reset.
    pub(crate) fn remove(&self, state_key: &str) {
        let (mut shard, hash) = self.shard(state_key);
        shard.entries.remove(&hash);
    }
}

/// `decision`, made under `from`, as Redis would answer a request of no
/// cost under `to`, another configuration of the policy, at the decision's
/// time: a key blocked stays blocked until the block's end; the use of
/// any other carries over ([`PolicyState::carry_to`]).
fn carried(from: &Policy, decision: &Decision, to: &Policy) -> Decision {
    let now = decision.now();
    if decision.is_blocked() {
        return state::blocked(to, now, decision.reset_at());
    }
    let mut state = PolicyState::seeded(from, decision);
    state.carry_to(to, now);
    state.decide(to, now, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::{Algorithm, Key, MemoryStore, Store};

    /// A decision of `policy` whose limits are all back `reset_us` after
    /// it (a fresh GCRA key after one request: one emission interval).
    fn decision(policy: &Policy) -> Decision {
        MemoryStore::new()
            .try_check_now(&Key::user("k"), policy, 1)
            .and_then(Result::ok)
            .unwrap_or_else(|| unreachable!("the memory store decides at once"))
    }

    fn held(known: &LastKnown) -> usize {
        known.shards.iter().map(|s| s.lock().entries.len()).sum()
    }

    #[test]
    fn the_map_holds_at_most_its_bound_and_makes_room_once_entries_go_stale() {
        // 1 per second: a decision's limit is back a second after it.
        let policy = Policy::new("p", Algorithm::Gcra, "1/s").unwrap_or_else(|_| unreachable!());
        let decided = decision(&policy);
        let known = LastKnown::new(160);
        for i in 0..5_000 {
            known.record(&format!("key-{i}"), &policy, &decided, 0);
        }
        // 10 per shard, each shard filled by far more keys than it holds.
        assert_eq!(held(&known), 160);
        // Every entry is still in force: what filled a shard stays.
        let kept = (0..5_000)
            .filter(|i| known.get(&format!("key-{i}"), &policy, 1).is_some())
            .count();
        assert_eq!(kept, 160);
        // Two seconds on, every entry is stale: new keys find room.
        for i in 5_000..10_000 {
            known.record(&format!("key-{i}"), &policy, &decided, 2_000_000);
        }
        assert_eq!(held(&known), 160);
        let older = (0..5_000)
            .filter(|i| known.get(&format!("key-{i}"), &policy, 2_000_000).is_some())
            .count();
        assert_eq!(older, 0);
        let newer = (5_000..10_000)
            .filter(|i| known.get(&format!("key-{i}"), &policy, 2_000_000).is_some())
            .count();
        assert_eq!(newer, 160);
    }

    #[test]
    fn a_decision_back_within_a_millisecond_is_not_added_but_updates_its_entry() {
        let slow = Policy::new("p", Algorithm::Gcra, "1/s").unwrap_or_else(|_| unreachable!());
        // A million a second: one request is back within a microsecond.
        let fast =
            Policy::new("p", Algorithm::Gcra, "1000000/s").unwrap_or_else(|_| unreachable!());
        let known = LastKnown::new(160);
        known.record("k", &fast, &decision(&fast), 0);
        assert_eq!(held(&known), 0);
        known.record("k", &slow, &decision(&slow), 0);
        assert!(known.get("k", &slow, 1).is_some());
        // The entry follows the key's latest decision, whatever it is: the
        // fast one's, stale a microsecond later, and carried to the slow
        // configuration.
        known.record("k", &fast, &decision(&fast), 2);
        assert!(known.get("k", &fast, 2).is_some());
        assert!(known.get("k", &fast, 3).is_none());
        let carried = known.get("k", &slow, 3).map(|d| d.limit());
        assert_eq!(carried, Some(1));
        assert_eq!(held(&known), 1);
    }

    /// A plan of 1/s and the key's own 2/s, and a decision of the plan
    /// with nothing used.
    fn plan_and_own() -> (Policy, Policy, Decision) {
        let plan = Policy::new("p", Algorithm::Gcra, "1/s").unwrap_or_else(|_| unreachable!());
        let own = Policy::new("p", Algorithm::Gcra, "2/s").unwrap_or_else(|_| unreachable!());
        let nothing_used = MemoryStore::new()
            .try_check_now(&Key::user("k"), &plan, 0)
            .and_then(Result::ok)
            .unwrap_or_else(|| unreachable!("the memory store decides at once"));
        (plan, own, nothing_used)
    }

    /// A refund's decision under the plan leaves the record of the key's
    /// own limits as it was (1 of 2 used): carried from the refund's, it
    /// would read 0 used.
    #[test]
    fn a_refund_refreshes_only_a_record_of_its_own_configuration() {
        let (plan, own, nothing_used) = plan_and_own();
        let known = LastKnown::new(160);
        known.refresh("k", &plan, &decision(&plan), 0);
        assert_eq!(held(&known), 0);
        known.record("k", &own, &decision(&own), 0);
        known.refresh("k", &plan, &nothing_used, 1);
        let kept = known.get("k", &own, 2).map(|d| d.remaining());
        assert_eq!(kept, Some(1));
        known.record("k", &plan, &decision(&plan), 3);
        known.refresh("k", &plan, &decision(&plan), 4);
        assert!(known.get("k", &plan, 5).is_some());
    }

    /// A charge's decision under the plan leaves a record of the key's own
    /// limits as it was (1 of 2 used): the charge may have changed
    /// nothing, and its decision read the key as a new one. Without a
    /// record, it records.
    #[test]
    fn a_charge_replaces_no_record_of_another_configuration() {
        let (plan, own, nothing_used) = plan_and_own();
        let known = LastKnown::new(160);
        known.record("k", &own, &decision(&own), 0);
        known.charged("k", &plan, &nothing_used, 1);
        let kept = known.get("k", &own, 2).map(|d| d.remaining());
        assert_eq!(kept, Some(1));
        let fresh = LastKnown::new(160);
        fresh.charged("k", &plan, &decision(&plan), 0);
        assert_eq!(held(&fresh), 1);
        let charged = fresh.get("k", &plan, 1).map(|d| d.remaining());
        assert_eq!(charged, Some(0));
    }

    /// A record made under another configuration of the policy answers
    /// carried over to the one asked for, as Redis carries the key: 8 of
    /// 10 a minute used is a debt under 5 a minute, and leaves 12 of 20;
    /// a blocked key stays blocked until the block's end.
    #[test]
    fn a_record_of_another_configuration_is_carried_over() {
        let of = |limit: &str| {
            Policy::new("p", Algorithm::FixedWindow, limit).unwrap_or_else(|_| unreachable!())
        };
        let (old, lowered, raised) = (of("10/min"), of("5/min"), of("20/min"));
        let store = MemoryStore::new();
        let key = Key::user("k");
        let mut last = None;
        for _ in 0..8 {
            last = store.try_check_now(&key, &old, 1).and_then(Result::ok);
        }
        let last = last.unwrap_or_else(|| unreachable!("the memory store decides at once"));
        let known = LastKnown::new(160);
        known.record("k", &old, &last, 0);
        let carried = |to: &Policy| known.get("k", to, 1).map(|d| (d.limit(), d.remaining()));
        assert_eq!(carried(&lowered), Some((5, 0)));
        assert_eq!(carried(&raised), Some((20, 12)));
        // Past the old window's end, carried still: seeded as of its time.
        let later = known.get("k", &lowered, 3_600_000_000);
        assert_eq!(later.map(|d| d.now()), Some(last.now()));
        let until = last.now() + std::time::Duration::from_secs(30);
        known.record("k", &old, &state::blocked(&old, last.now(), until), 0);
        let blocked = known.get("k", &raised, 1);
        let blocked = blocked.map(|d| (d.is_blocked(), d.reset_at(), d.limit()));
        assert_eq!(blocked, Some((true, until, 20)));
    }

    /// A full shard waits, without a scan, until its first entry goes
    /// stale; an entry updated in place to go stale sooner brings that
    /// time forward, so its room is taken once it is stale.
    #[test]
    fn a_full_shard_takes_a_key_once_an_entry_updated_in_place_is_stale() {
        let policy = Policy::new("p", Algorithm::Gcra, "1/s").unwrap_or_else(|_| unreachable!());
        let decided = decision(&policy);
        // One per shard, every shard full, each entry stale at 1.001 s.
        let known = LastKnown::new(SHARDS);
        for i in 0..5_000 {
            known.record(&format!("old-{i}"), &policy, &decided, 1_000);
        }
        assert_eq!(held(&known), SHARDS);
        // One of them recorded again as of 0 µs: stale at 1 s.
        let sooner = (0..5_000)
            .map(|i| format!("old-{i}"))
            .find(|key| known.get(key, &policy, 1_000).is_some())
            .unwrap_or_else(|| unreachable!("every shard holds one"));
        known.record(&sooner, &policy, &decided, 0);
        // At 1.0005 s only its shard has room: one new key is taken.
        let now = 1_000_500;
        for i in 0..5_000 {
            known.record(&format!("new-{i}"), &policy, &decided, now);
        }
        let taken = (0..5_000)
            .filter(|i| known.get(&format!("new-{i}"), &policy, now).is_some())
            .count();
        assert_eq!(taken, 1);
        assert_eq!(held(&known), SHARDS);
    }

    #[test]
    fn no_entries_are_kept_when_the_bound_is_zero() {
        let policy = Policy::new("p", Algorithm::Gcra, "1/s").unwrap_or_else(|_| unreachable!());
        let known = LastKnown::new(0);
        known.record("k", &policy, &decision(&policy), 0);
        assert_eq!(held(&known), 0);
        assert!(known.get("k", &policy, 0).is_none());
    }
}
