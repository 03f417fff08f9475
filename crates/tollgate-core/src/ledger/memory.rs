//! [`MemoryLedger`]: usage kept in this process.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::StoreError;
use crate::key::Key;
use crate::time::Timestamp;

use super::calendar::{Granularity, LedgerSettings, Span, secs};
use super::usage::{Usage, UsageQuery};
use super::{Ledger, MAX_BUCKET_UNITS, MAX_RECORD_UNITS};

/// One key's buckets: by granularity and start (in seconds), the sum of
/// what was recorded (refunds negative), within ±[`MAX_BUCKET_UNITS`].
type Buckets = BTreeMap<(Granularity, u64), i64>;

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
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The buckets of the last instant recorded, and the span sharing them.
    span: Option<Span>,
    usage: HashMap<Box<str>, HashMap<Key, Buckets>>,
    keys: usize,
    records: u64,
    dropped: u64,
    /// The latest instant recorded, in seconds: the ledger's now.
    latest: u64,
}

/// What [`MemoryLedger::take_all`] takes: the units recorded in one
/// bucket of one key under one policy (negative for more refunded than
/// recorded since the last take).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    /// The policy's name.
    pub policy: Box<str>,
    /// The key.
    pub key: Key,
    /// The bucket's granularity.
    pub granularity: Granularity,
    /// The bucket's start.
    pub start: Timestamp,
    /// The units recorded, within ±2^62.
    pub units: i64,
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
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Its calendar and retention.
    pub fn settings(&self) -> &LedgerSettings {
        &self.shared.settings
    }

    /// How many records were not kept because the ledger was full.
    pub fn dropped(&self) -> u64 {
        self.shared.state.lock().dropped
    }

    /// How many pairs of policy and key it holds.
    pub fn len(&self) -> usize {
        self.shared.state.lock().keys
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes every bucket out, leaving the ledger empty: for a ledger that
    /// sums usage here and forwards it elsewhere (the Redis ledger).
    pub fn take_all(&self) -> Vec<LedgerEntry> {
        let usage = {
            let mut state = self.shared.state.lock();
            state.keys = 0;
            std::mem::take(&mut state.usage)
        };
        let mut entries = Vec::new();
        for (policy, keys) in usage {
            for (key, buckets) in keys {
                for ((granularity, start), units) in buckets {
                    entries.push(LedgerEntry {
                        policy: policy.clone(),
                        key: key.clone(),
                        granularity,
                        start: Timestamp::from_secs(start),
                        units,
                    });
                }
            }
        }
        entries
    }

    /// Adds `entries` back (those [`take_all`](Self::take_all) took that
    /// could not be forwarded), as far as there is room.
    pub fn put_back(&self, entries: Vec<LedgerEntry>) {
        let mut state = self.shared.state.lock();
        for e in entries {
            let start = e.start.as_micros() / 1_000_000;
            state.add(self.shared.max_keys, &e.policy, &e.key, |b| {
                add(b, (e.granularity, start), e.units);
            });
        }
    }

    fn add_units(&self, key: &Key, policy: &str, at: Timestamp, units: i64) {
        let at = secs(at);
        let settings = &self.shared.settings;
        let mut state = self.shared.state.lock();
        let span = match state.span {
            Some(span) if span.holds(at) => span,
            _ => {
                let span = settings.starts(at);
                state.span = Some(span);
                span
            }
        };
        state.latest = state.latest.max(at.max(0).unsigned_abs());
        state.add(self.shared.max_keys, policy, key, |buckets| {
            for g in Granularity::ALL {
                let start = span.starts[g.index()].max(0).unsigned_abs();
                add(buckets, (g, start), units);
            }
        });
        state.records += 1;
        if state.records % SWEEP_EVERY == 0 {
            state.sweep(settings);
        }
    }
}

/// Forgets buckets past their retention once every so many records.
const SWEEP_EVERY: u64 = 4_096;

fn add(buckets: &mut Buckets, bucket: (Granularity, u64), units: i64) {
    let sum = buckets.entry(bucket).or_insert(0);
    *sum = sum
        .saturating_add(units)
        .clamp(-MAX_BUCKET_UNITS, MAX_BUCKET_UNITS);
}

impl State {
    fn add(&mut self, max_keys: usize, policy: &str, key: &Key, f: impl FnOnce(&mut Buckets)) {
        if let Some(buckets) = self
            .usage
            .get_mut(policy)
            .and_then(|keys| keys.get_mut(key))
        {
            f(buckets);
            return;
        }
        if self.keys >= max_keys {
            self.dropped += 1;
            return;
        }
        self.keys += 1;
        let keys = self.usage.entry(policy.into()).or_default();
        f(keys.entry(key.clone()).or_default());
    }

    fn sweep(&mut self, settings: &LedgerSettings) {
        let now = self.latest;
        let mut removed = 0;
        self.usage.retain(|_, keys| {
            keys.retain(|_, buckets| {
                buckets.retain(|&(g, start), _| settings.expires_at_secs(g, start) > now);
                removed += usize::from(buckets.is_empty());
                !buckets.is_empty()
            });
            !keys.is_empty()
        });
        self.keys -= removed;
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
        let state = self.shared.state.lock();
        let buckets = state.usage.get(policy).and_then(|keys| keys.get(key));
        let units = starts.into_iter().map(|start| {
            let secs = start.as_micros() / 1_000_000;
            let sum = buckets
                .and_then(|b| b.get(&(g, secs)))
                .copied()
                .unwrap_or(0);
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
