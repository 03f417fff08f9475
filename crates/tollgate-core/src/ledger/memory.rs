//! [`MemoryLedger`]: usage kept in this process.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::error::StoreError;
use crate::key::Key;
use crate::time::Timestamp;

use super::calendar::{Granularity, LedgerSettings, Span, secs};
use super::usage::{Usage, UsageQuery};
use super::{Ledger, MAX_BUCKET_UNITS, MAX_RECORD_UNITS};

/// One key's buckets: granularity, start (in seconds) and the sum of what
/// was recorded (refunds negative), within ±[`MAX_BUCKET_UNITS`]; the
/// newest last, so that a record finds its buckets at the end.
type Buckets = smallvec::SmallVec<[(Granularity, u64, i64); 4]>;

/// The keys of one policy, by a fast hash (the memory store's).
type Keys = HashMap<Key, Buckets, foldhash::quality::RandomState>;

/// Shards of the ledger, each behind its own lock, so that concurrent
/// records of different keys seldom wait for each other.
const SHARDS: usize = 16;

/// A usage ledger in this process's memory, for the memory store (and the
/// local sum that the Redis ledger flushes).
///
/// It is exact: a query answers at once what was recorded. It holds at most
/// `max_keys` pairs of policy and key (100,000 by default); a record for a
/// pair beyond them is not kept, and counted by
/// [`dropped`](MemoryLedger::dropped). Buckets past their retention are
/// forgotten, measured on the time of the records.
///
/// ```
/// use tollgate_core::ledger::{Granularity, Ledger, MemoryLedger, UsageQuery};
/// use tollgate_core::{Key, Timestamp};
///
/// # futures_lite_block_on(async {
/// let ledger = MemoryLedger::new();
/// let ada = Key::user("ada");
/// let t = Timestamp::from_secs(1_767_225_600); // 2026-01-01 00:00 UTC
/// ledger.record(&ada, "api", t, 10);
/// ledger.refund(&ada, "api", t, 3);
/// let query = UsageQuery::new(Granularity::Month, t, Timestamp::from_secs(1_769_904_000))?;
/// assert_eq!(ledger.usage(&ada, "api", query).await?.total(), 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// # fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     let mut f = std::pin::pin!(f);
/// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
/// #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryLedger {
    shared: Arc<Shared>,
}

struct Shared {
    settings: LedgerSettings,
    max_keys: usize,
    seed: foldhash::quality::RandomState,
    shards: [Mutex<State>; SHARDS],
    keys: AtomicUsize,
    dropped: AtomicU64,
    records: AtomicU64,
    /// The earliest instant recorded since the last sweep, in seconds:
    /// the ledger's now at the next sweep (`u64::MAX` before any record).
    /// The earliest, not the latest: one record dated far ahead (a store
    /// clock that stepped, a reservation's time in the wrong unit) made
    /// every bucket look past its retention, and a sweep forgot them all.
    earliest: AtomicU64,
}

#[derive(Default)]
struct State {
    /// The buckets of the last instant recorded, and the span sharing them.
    span: Option<Span>,
    usage: HashMap<Box<str>, Keys, foldhash::quality::RandomState>,
}

/// What [`MemoryLedger::take_all`] takes: the units recorded in one
/// bucket of one key under one policy (negative for more refunded than
/// recorded since the last take).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    policy: Box<str>,
    key: Key,
    granularity: Granularity,
    start: Timestamp,
    units: i64,
}

impl LedgerEntry {
    /// The entries of `key`'s `buckets` under `policy`.
    fn of<'a>(
        policy: &'a str,
        key: &'a Key,
        buckets: impl IntoIterator<Item = (Granularity, u64, i64)> + 'a,
    ) -> impl Iterator<Item = LedgerEntry> + 'a {
        buckets
            .into_iter()
            .map(|(granularity, start, units)| LedgerEntry {
                policy: policy.into(),
                key: key.clone(),
                granularity,
                start: Timestamp::from_secs(start),
                units,
            })
    }

    /// The policy's name.
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// The key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The bucket's granularity.
    pub fn granularity(&self) -> Granularity {
        self.granularity
    }

    /// The bucket's start.
    pub fn start(&self) -> Timestamp {
        self.start
    }

    /// The units recorded, within ±2^62.
    pub fn units(&self) -> i64 {
        self.units
    }
}

impl Default for MemoryLedger {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLedger")
            .field("settings", &self.shared.settings)
            .field("max_keys", &self.shared.max_keys)
            .finish_non_exhaustive()
    }
}

impl MemoryLedger {
    /// The default most pairs of policy and key held.
    pub const DEFAULT_MAX_KEYS: usize = 100_000;

    /// A ledger in UTC, with the default retention and size.
    pub fn new() -> Self {
        Self::with_settings(LedgerSettings::new(), Self::DEFAULT_MAX_KEYS)
    }

    /// A ledger of `settings` that holds at most `max_keys` pairs of policy
    /// and key (at least 1).
    pub fn with_settings(settings: LedgerSettings, max_keys: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                settings,
                max_keys: max_keys.max(1),
                seed: foldhash::quality::RandomState::default(),
                shards: std::array::from_fn(|_| Mutex::new(State::default())),
                keys: AtomicUsize::new(0),
                dropped: AtomicU64::new(0),
                records: AtomicU64::new(0),
                earliest: AtomicU64::new(u64::MAX),
            }),
        }
    }

    /// Its calendar and retention.
    pub fn settings(&self) -> &LedgerSettings {
        &self.shared.settings
    }

    /// How many records were not kept because the ledger was full.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// How many pairs of policy and key it holds.
    pub fn len(&self) -> usize {
        self.shared.keys.load(Ordering::Relaxed)
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes every bucket out, leaving the ledger empty: for a ledger that
    /// sums usage here and forwards it elsewhere (the Redis ledger).
    pub fn take_all(&self) -> Vec<LedgerEntry> {
        self.take_pairs(usize::MAX, |_, _| true)
    }

    /// Takes out the buckets of at most `max_pairs` pairs of policy and key
    /// that `pick` chooses, leaving every other bucket in place: for a
    /// ledger that forwards usage elsewhere as far as it has room (the
    /// Redis ledger while Redis fails). Pairs left in place keep their room:
    /// a record made meanwhile cannot take it (taking every bucket out and
    /// [putting back](Self::put_back) what did not go, a record of a new
    /// pair in between took the room of one put back, whose usage was
    /// dropped). `pick` runs under a shard's lock: it must not call the
    /// ledger.
    ///
    /// ```
    /// use tollgate_core::ledger::{Ledger, MemoryLedger};
    /// use tollgate_core::{Key, Timestamp};
    ///
    /// let ledger = MemoryLedger::new();
    /// let t = Timestamp::from_secs(1_767_225_600);
    /// for user in ["ada", "bob", "cy"] {
    ///     ledger.record(&Key::user(user), "api", t, 1);
    /// }
    /// let taken = ledger.take_pairs(1, |_, key| key != &Key::user("bob"));
    /// // One pair's hour, day and month buckets.
    /// assert_eq!(taken.len(), 3);
    /// assert_ne!(taken[0].key(), &Key::user("bob"));
    /// assert_eq!(ledger.len(), 2);
    /// ```
    pub fn take_pairs(
        &self,
        max_pairs: usize,
        mut pick: impl FnMut(&str, &Key) -> bool,
    ) -> Vec<LedgerEntry> {
        let mut entries = Vec::new();
        let mut taken = 0;
        for shard in &self.shared.shards {
            if taken >= max_pairs {
                break;
            }
            let mut state = shard.lock();
            let before = taken;
            for (policy, keys) in &mut state.usage {
                keys.retain(|key, buckets| {
                    if taken >= max_pairs || !pick(policy, key) {
                        return true;
                    }
                    taken += 1;
                    entries.extend(LedgerEntry::of(policy, key, buckets.drain(..)));
                    false
                });
            }
            state.usage.retain(|_, keys| !keys.is_empty());
            drop(state);
            self.shared
                .keys
                .fetch_sub(taken - before, Ordering::Relaxed);
        }
        entries
    }

    /// Takes out the buckets of `key` under `policy`, leaving every other
    /// pair in place: what [`take_pairs`](Self::take_pairs) does for one
    /// pair, looking in the key's shard only.
    ///
    /// ```
    /// use tollgate_core::ledger::{Ledger, MemoryLedger};
    /// use tollgate_core::{Key, Timestamp};
    ///
    /// let ledger = MemoryLedger::new();
    /// let t = Timestamp::from_secs(1_767_225_600);
    /// ledger.record(&Key::user("ada"), "api", t, 2);
    /// ledger.record(&Key::user("bob"), "api", t, 1);
    /// let taken = ledger.take_pair(&Key::user("ada"), "api");
    /// assert_eq!(taken.iter().map(|e| e.units()).collect::<Vec<_>>(), [2, 2, 2]);
    /// assert_eq!(ledger.len(), 1);
    /// ```
    pub fn take_pair(&self, key: &Key, policy: &str) -> Vec<LedgerEntry> {
        let mut state = self.shard(key).lock();
        let Some(keys) = state.usage.get_mut(policy) else {
            return Vec::new();
        };
        let Some(buckets) = keys.remove(key) else {
            return Vec::new();
        };
        if keys.is_empty() {
            state.usage.remove(policy);
        }
        drop(state);
        self.shared.keys.fetch_sub(1, Ordering::Relaxed);
        LedgerEntry::of(policy, key, buckets).collect()
    }

    /// Adds `entries` back (those [`take_all`](Self::take_all) took that
    /// could not be forwarded), as far as there is room.
    pub fn put_back(&self, entries: Vec<LedgerEntry>) {
        for e in entries {
            let start = e.start.as_micros() / 1_000_000;
            let mut state = self.shard(&e.key).lock();
            self.shared.add(&mut state, &e.policy, &e.key, |b| {
                add(b, e.granularity, start, e.units);
            });
        }
    }

    fn shard(&self, key: &Key) -> &Mutex<State> {
        let hash = self.shared.seed.hash_one(key.as_bytes());
        &self.shared.shards[(hash % SHARDS as u64) as usize]
    }

    fn add_units(&self, key: &Key, policy: &str, at: Timestamp, units: i64) {
        let at = secs(at);
        let settings = &self.shared.settings;
        let mut state = self.shard(key).lock();
        let span = match state.span {
            Some(span) if span.holds(at) => span,
            _ => {
                let span = settings.starts(at);
                state.span = Some(span);
                span
            }
        };
        self.shared.add(&mut state, policy, key, |buckets| {
            for g in Granularity::ALL {
                add(
                    buckets,
                    g,
                    span.starts[g.index()].max(0).unsigned_abs(),
                    units,
                );
            }
        });
        drop(state);
        let shared = &self.shared;
        shared
            .earliest
            .fetch_min(at.max(0).unsigned_abs(), Ordering::Relaxed);
        if shared.records.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            // `u64::MAX` when another sweep, late, took this one's records
            // (each bucket would look expired): nothing to sweep against.
            let now = shared.earliest.swap(u64::MAX, Ordering::Relaxed);
            if now == u64::MAX {
                return;
            }
            for shard in &shared.shards {
                let removed = shard.lock().sweep(settings, now);
                shared.keys.fetch_sub(removed, Ordering::Relaxed);
            }
        }
    }
}

/// Forgets buckets past their retention once every so many records, shard
/// by shard.
const SWEEP_EVERY: u64 = 4_096;

/// Adds `units` to the bucket of `granularity` starting at `start`,
/// looked for from the newest.
fn add(buckets: &mut Buckets, granularity: Granularity, start: u64, units: i64) {
    let found = buckets
        .iter_mut()
        .rev()
        .find(|(g, s, _)| *g == granularity && *s == start);
    let sum = match found {
        Some((_, _, sum)) => sum,
        None => {
            buckets.push((granularity, start, 0));
            let last = buckets.len() - 1;
            &mut buckets[last].2
        }
    };
    *sum = sum
        .saturating_add(units)
        .clamp(-MAX_BUCKET_UNITS, MAX_BUCKET_UNITS);
}

impl Shared {
    /// Applies `f` to the buckets of `key` under `policy` in `state`, made
    /// if there is room.
    fn add(&self, state: &mut State, policy: &str, key: &Key, f: impl FnOnce(&mut Buckets)) {
        if let Some(buckets) = state
            .usage
            .get_mut(policy)
            .and_then(|keys| keys.get_mut(key))
        {
            f(buckets);
            return;
        }
        let taken = self
            .keys
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_keys).then_some(n + 1)
            });
        if taken.is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let keys = state.usage.entry(policy.into()).or_default();
        f(keys.entry(key.clone()).or_default());
    }
}

impl State {
    /// Forgets the buckets past retention; returns how many keys went.
    fn sweep(&mut self, settings: &LedgerSettings, now: u64) -> usize {
        let mut removed = 0;
        self.usage.retain(|_, keys| {
            keys.retain(|_, buckets| {
                buckets.retain(|b| settings.expires_at_secs(b.0, b.1) > now);
                removed += usize::from(buckets.is_empty());
                !buckets.is_empty()
            });
            !keys.is_empty()
        });
        removed
    }
}

impl Ledger for MemoryLedger {
    fn settings(&self) -> &LedgerSettings {
        &self.shared.settings
    }

    fn record(&self, key: &Key, policy: &str, at: Timestamp, units: u64) {
        if units > 0 {
            self.add_units(key, policy, at, clamp_record(units));
        }
    }

    fn refund(&self, key: &Key, policy: &str, at: Timestamp, units: u64) {
        if units > 0 {
            self.add_units(key, policy, at, -clamp_record(units));
        }
    }

    async fn usage(&self, key: &Key, policy: &str, query: UsageQuery) -> Result<Usage, StoreError> {
        let settings = &self.shared.settings;
        let starts = query.bucket_starts(settings);
        let g = query.granularity();
        let state = self.shard(key).lock();
        let buckets = state.usage.get(policy).and_then(|keys| keys.get(key));
        let sum_of = |start: u64| {
            let bucket = buckets?.iter().find(|(bg, s, _)| *bg == g && *s == start)?;
            Some(bucket.2)
        };
        let units = starts.into_iter().map(|start| {
            let sum = sum_of(start.as_micros() / 1_000_000).unwrap_or(0);
            (start, bucket_units(sum))
        });
        Ok(Usage::from_buckets(settings, &query, units))
    }

    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// A record's units, at most [`MAX_RECORD_UNITS`].
pub(crate) fn clamp_record(units: u64) -> i64 {
    i64::try_from(units.min(MAX_RECORD_UNITS)).unwrap_or(i64::MAX)
}

/// What a bucket's sum shows: from 0 to [`MAX_BUCKET_UNITS`].
pub(crate) fn bucket_units(sum: i64) -> u64 {
    sum.clamp(0, MAX_BUCKET_UNITS).unsigned_abs()
}
