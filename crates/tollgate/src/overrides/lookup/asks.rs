//! The cache's bookkeeping: when each key and policy was last asked, the
//! lookup under way, and which key to forget for a new one.

use std::collections::{HashMap, VecDeque};

use tokio::sync::watch;
use tokio::task::AbortHandle;
use tollgate_core::{Key, OverrideTable, Timestamp};

pub(super) struct Asked {
    /// When the last lookup ended.
    pub(super) at: Option<Timestamp>,
    /// The lookup under way, if any.
    pub(super) pending: Option<Pending>,
}

/// A lookup under way: when it began, which lookup it is, and its task
/// once spawned.
pub(super) struct Pending {
    pub(super) since: Timestamp,
    /// Tells this lookup from any other of the same key and policy, also
    /// one begun at the same time (a key forgotten and met again).
    pub(super) id: u64,
    pub(super) task: Option<AbortHandle>,
    /// What requests wait on, if this is the key's first lookup (and the
    /// first wait is not zero).
    pub(super) first: Option<First>,
}

/// A key's first lookup, which its requests wait for.
pub(super) struct First {
    /// Closed when the lookup ends, however it ends.
    pub(super) ended: watch::Receiver<()>,
    /// Until when requests wait for it: the first wait after it began.
    pub(super) until: tokio::time::Instant,
}

impl Asked {
    /// The key's first lookup, if it is under way and requests still wait
    /// for it.
    pub(super) fn first_pending(&self) -> Option<&First> {
        let first = self.pending.as_ref()?.first.as_ref()?;
        (first.until > tokio::time::Instant::now()).then_some(first)
    }

    /// Asked at `at`, with no lookup under way.
    pub(super) fn ended(at: Timestamp) -> Self {
        Self {
            at: Some(at),
            pending: None,
        }
    }
}

/// When each key and policy was last asked: by key, then by policy name,
/// so that a request's question borrows its key and allocates nothing.
#[derive(Default)]
pub(super) struct Asks {
    pub(super) by_key: HashMap<Key, Vec<(Box<str>, Asked)>>,
    /// Every key of `by_key` once, oldest first (see
    /// [`forget_one`](Self::forget_one)).
    pub(super) order: VecDeque<Key>,
    pub(super) len: usize,
    /// The id of the next lookup.
    pub(super) next_id: u64,
}

/// How many keys with an override [`Asks::forget_one`] passes over, at
/// most, before it forgets the next key, override or not: a cache whose
/// oldest keys include more than this many in a row with overrides may
/// forget one for a new key.
const PASS_OVER: usize = 1_024;

impl Asks {
    pub(super) fn get_mut(&mut self, key: &Key, policy: &str) -> Option<&mut Asked> {
        let asked = self.by_key.get_mut(key)?.iter_mut();
        asked
            .filter(|(name, _)| **name == *policy)
            .map(|(_, a)| a)
            .next()
    }

    /// Records `asked` of `key` under `policy`; a new one past `max`
    /// first forgets another (see [`forget_one`](Self::forget_one)), in
    /// `table` too.
    pub(super) fn put(
        &mut self,
        key: &Key,
        policy: &str,
        asked: Asked,
        max: usize,
        table: &OverrideTable,
        now: Timestamp,
    ) {
        if let Some(known) = self.get_mut(key, policy) {
            *known = asked;
            return;
        }
        if self.len >= max {
            self.forget_one(table, now);
        }
        let entry = (Box::from(policy), asked);
        match self.by_key.get_mut(key) {
            Some(entries) => entries.push(entry),
            None => {
                self.by_key.insert(key.clone(), vec![entry]);
                self.order.push_back(key.clone());
            }
        }
        self.len += 1;
    }

    /// Forgets the oldest key (the first met) that has no override in
    /// force in `table` at `now`. A key with one goes to the back of the
    /// order instead, at most [`PASS_OVER`] of them a time, after which the
    /// next key in the order is forgotten, override or not. So a flood of
    /// keys without an override (hostile keys, met while the cache is
    /// full) churns among themselves, and a deny or an exemption is not
    /// dropped from the table for one, to be applied again only once its
    /// lookup returns (meanwhile the denied key was admitted). With `k`
    /// keys with overrides in a cache of `max`, a forget passes over about
    /// `k / (max - k)` of them on average.
    pub(super) fn forget_one(&mut self, table: &OverrideTable, now: Timestamp) {
        let overridden = |key: &Key, asked: &[(Box<str>, Asked)]| {
            asked
                .iter()
                .any(|(policy, _)| table.holds(key, policy, now))
        };
        for _ in 0..PASS_OVER.min(self.order.len()) {
            let Some(key) = self.order.pop_front() else {
                return;
            };
            match self.by_key.get(&key) {
                Some(asked) if overridden(&key, asked) => self.order.push_back(key),
                Some(_) => return self.forget(&key, table),
                None => {}
            }
        }
        if let Some(key) = self.order.pop_front() {
            self.forget(&key, table);
        }
    }

    /// Forgets `key`, in `table` too.
    pub(super) fn forget(&mut self, key: &Key, table: &OverrideTable) {
        if let Some(forgotten) = self.by_key.remove(key) {
            self.len -= forgotten.len();
            for (policy, asked) in forgotten {
                table.remove(key, &policy);
                // Its lookup is not waited for any more: so that hostile
                // keys met while the source hangs cannot pile up lookups
                // beyond `max`, it ends with the entry.
                if let Some(task) = asked.pending.and_then(|pending| pending.task) {
                    task.abort();
                }
            }
        }
    }
}
