//! [`OverrideTable`]: the overrides one instance knows, looked up locally.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{Mutex, RwLock};
use smallvec::SmallVec;

use crate::key::Key;
use crate::policy::Policy;
use crate::time::Timestamp;

use super::rule::{Applied, Override, limited};

/// The overrides an instance knows, by key and policy name, with their
/// expiries: what [`MemoryOverrides`](crate::MemoryOverrides) keeps, what
/// the Redis source keeps a copy of, and what a source of your own can
/// keep. A lookup takes a read lock and one hash of the key; a table with
/// no override answers from one atomic load, so a layer with a source
/// whose table is empty pays next to nothing.
///
/// An entry applies until its expiry (`now < expires_at`); after it,
/// lookups ignore it and [`sweep`](Self::sweep) drops it. Entries are
/// written by operators, never by clients, so the table holds as many as
/// operators set.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{Algorithm, Applied, Key, Override, OverrideTable, Policy, Timestamp};
///
/// let table = OverrideTable::new();
/// let api = Policy::new("api", Algorithm::Gcra, "100/min")?;
/// let ada = Key::user("ada");
/// let now = Timestamp::from_secs(1_000);
/// table.set(ada.clone(), "api", Override::limit("1000/min")?, Some(now + Duration::from_secs(60)));
///
/// let Some(Applied::Limits(raised)) = table.applied(&ada, &api, now) else { panic!() };
/// assert_eq!((raised.name(), raised.limits()[0].count()), ("api", 1000));
/// // Other keys, and the key after the expiry: the plan.
/// assert!(table.applied(&Key::user("bob"), &api, now).is_none());
/// assert!(table.applied(&ada, &api, now + Duration::from_secs(60)).is_none());
/// assert_eq!(table.sweep(now + Duration::from_secs(60)), 1);
/// assert!(table.is_empty());
/// # Ok::<(), tollgate_core::ConfigError>(())
/// ```
pub struct OverrideTable {
    count: AtomicUsize,
    map: RwLock<Map>,
}

type Map = HashMap<Key, SmallVec<[(Box<str>, Arc<Entry>); 1]>, foldhash::fast::RandomState>;

/// One override: the rule, its expiry, and the policy it made last.
struct Entry {
    rule: Override,
    expires_at: Option<Timestamp>,
    /// The policy of the rule's limits, made on first use, under the
    /// algorithm of the policy it was made from.
    made: Mutex<Option<Policy>>,
}

impl Entry {
    fn new(rule: Override, expires_at: Option<Timestamp>) -> Arc<Self> {
        Arc::new(Self {
            rule,
            expires_at,
            made: Mutex::new(None),
        })
    }

    fn in_force(&self, now: Timestamp) -> bool {
        self.expires_at.is_none_or(|end| now < end)
    }

    /// What the entry makes of a request under `base`. Limits that cannot
    /// apply to `base` (its algorithm changed to one without a burst since
    /// the override was checked) are ignored: the plan applies.
    fn applied(&self, base: &Policy, now: Timestamp) -> Option<Applied> {
        match &self.rule {
            Override::Exempt => Some(Applied::Exempt),
            // Told as a block's rest is: at most the longest span a policy
            // holds (a deny set for u64::MAX seconds told its clients to
            // come back in half a million years).
            Override::Deny => Some(Applied::Deny {
                ends_in: self.expires_at.map(|end| {
                    let rest = end.saturating_duration_since(now);
                    rest.min(std::time::Duration::from_micros(crate::policy::MAX_SPAN_US))
                }),
            }),
            Override::Limits { limits, burst } => {
                let mut made = self.made.lock();
                // Made for a base of the same name, algorithm and
                // calendar: the override's limits count in the base's
                // periods, which a reloaded configuration may move.
                if let Some(policy) = &*made
                    && policy.algorithm() == base.algorithm()
                    && policy.name() == base.name()
                    && policy.calendar() == base.calendar()
                {
                    return Some(Applied::Limits(policy.clone()));
                }
                let policy = limited(base, limits, *burst).ok()?;
                *made = Some(policy.clone());
                Some(Applied::Limits(policy))
            }
        }
    }
}

impl OverrideTable {
    /// An empty table.
    pub fn new() -> Self {
        Self {
            count: AtomicUsize::new(0),
            map: RwLock::new(Map::default()),
        }
    }

    /// Whether the table holds no override (expired ones not yet swept
    /// count).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.count.load(Ordering::Acquire) == 0
    }

    /// How many overrides the table holds (expired ones not yet swept
    /// count).
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Sets `key`'s override under the policy named `policy`, replacing
    /// any, until `expires_at` if given.
    pub fn set(&self, key: Key, policy: &str, rule: Override, expires_at: Option<Timestamp>) {
        let entry = Entry::new(rule, expires_at);
        let mut map = self.map.write();
        let entries = map.entry(key).or_default();
        match entries.iter_mut().find(|(name, _)| **name == *policy) {
            Some((_, old)) => *old = entry,
            None => {
                entries.push((policy.into(), entry));
                self.count.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// Clears `key`'s override under the policy named `policy`; whether
    /// there was one.
    pub fn remove(&self, key: &Key, policy: &str) -> bool {
        let mut map = self.map.write();
        let Some(entries) = map.get_mut(key) else {
            return false;
        };
        let before = entries.len();
        entries.retain(|(name, _)| **name != *policy);
        let removed = before != entries.len();
        if entries.is_empty() {
            map.remove(key);
        }
        if removed {
            self.count.fetch_sub(1, Ordering::AcqRel);
        }
        removed
    }

    /// Replaces every override with `entries` (key, policy name, rule,
    /// expiry): a source that reloads all it knows at once. An entry
    /// whose rule and expiry are unchanged keeps the policy it made.
    pub fn replace(
        &self,
        entries: impl IntoIterator<Item = (Key, String, Override, Option<Timestamp>)>,
    ) {
        let old = self.map.read();
        let mut map = Map::default();
        let mut count = 0;
        for (key, policy, rule, expires_at) in entries {
            let kept = old.get(&key).and_then(|e| {
                let (_, entry) = e.iter().find(|(name, _)| **name == *policy)?;
                (entry.rule == rule && entry.expires_at == expires_at).then(|| entry.clone())
            });
            let entry = kept.unwrap_or_else(|| Entry::new(rule, expires_at));
            let entries: &mut SmallVec<_> = map.entry(key).or_default();
            match entries.iter_mut().find(|(name, _)| **name == *policy) {
                Some((_, old)) => *old = entry,
                None => {
                    entries.push((policy.into_boxed_str(), entry));
                    count += 1;
                }
            }
        }
        drop(old);
        let mut current = self.map.write();
        *current = map;
        self.count.store(count, Ordering::Release);
    }

    /// `key`'s override under the policy named `policy` and its expiry, if
    /// one is in force at `now`.
    pub fn get(
        &self,
        key: &Key,
        policy: &str,
        now: Timestamp,
    ) -> Option<(Override, Option<Timestamp>)> {
        let entry = self.entry(key, policy, now)?;
        Some((entry.rule.clone(), entry.expires_at))
    }

    /// Whether an override of `key` under the policy named `policy` is in
    /// force at `now`.
    ///
    /// ```
    /// use tollgate_core::{Key, Override, OverrideTable, Timestamp};
    ///
    /// let table = OverrideTable::new();
    /// let (mallory, now) = (Key::user("mallory"), Timestamp::from_secs(1_700_000_000));
    /// let ends = Timestamp::from_secs(1_700_000_600);
    /// table.set(mallory.clone(), "api", Override::Deny, Some(ends));
    /// assert!(table.holds(&mallory, "api", now));
    /// assert!(!table.holds(&mallory, "search", now));
    /// assert!(!table.holds(&mallory, "api", ends));
    /// ```
    pub fn holds(&self, key: &Key, policy: &str, now: Timestamp) -> bool {
        self.entry(key, policy, now).is_some()
    }

    /// What `key`'s override under `policy`, if one is in force at `now`,
    /// makes of a request.
    #[inline]
    pub fn applied(&self, key: &Key, policy: &Policy, now: Timestamp) -> Option<Applied> {
        if self.is_empty() {
            return None;
        }
        self.entry(key, policy.name(), now)?.applied(policy, now)
    }

    /// Every override in force at `now`: key, policy name, rule, expiry.
    pub fn entries(&self, now: Timestamp) -> Vec<(Key, String, Override, Option<Timestamp>)> {
        let map = self.map.read();
        let mut all = Vec::with_capacity(self.len());
        for (key, entries) in map.iter() {
            for (policy, entry) in entries.iter().filter(|(_, e)| e.in_force(now)) {
                let rule = entry.rule.clone();
                all.push((key.clone(), policy.to_string(), rule, entry.expires_at));
            }
        }
        all
    }

    /// Drops the overrides expired at `now`; how many.
    pub fn sweep(&self, now: Timestamp) -> usize {
        let mut map = self.map.write();
        let mut dropped = 0;
        map.retain(|_, entries| {
            let before = entries.len();
            entries.retain(|(_, e)| e.in_force(now));
            dropped += before - entries.len();
            !entries.is_empty()
        });
        self.count.fetch_sub(dropped, Ordering::AcqRel);
        dropped
    }

    fn entry(&self, key: &Key, policy: &str, now: Timestamp) -> Option<Arc<Entry>> {
        let map = self.map.read();
        let (_, entry) = map.get(key)?.iter().find(|(name, _)| **name == *policy)?;
        entry.in_force(now).then(|| entry.clone())
    }
}

impl Default for OverrideTable {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for OverrideTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OverrideTable")
            .field("len", &self.len())
            .finish()
    }
}
