//! [`RedisLedger`]: the usage ledger on Redis, shared by every instance
//! and kept across restarts.

mod builder;
mod flush;

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::ledger::{Ledger, LedgerSettings, MemoryLedger, Usage, UsageQuery};
use tollgate_core::{Clock, Key, StoreError, Timestamp};

use crate::connect::{ManagedConnection, RedisConnection};
use crate::keys::KeyNamer;
use crate::script::DecisionScript;
use crate::store::Inner;

pub use builder::RedisLedgerBuilder;
pub(crate) use builder::instance_name;

/// A usage ledger on Redis (see [`tollgate_core::ledger`]): each key's
/// settled usage per policy in hour, day and month buckets, shared by every
/// instance on the store's prefix, and kept across restarts.
///
/// A record is a local map update, not a round trip: the ledger sums its
/// records in memory and flushes them every
/// [`flush_interval`](RedisLedgerBuilder::flush_interval) (1 s by default),
/// and on [`flush`](Ledger::flush), with one script call per key, all
/// sent at once on the store's connection; a
/// [`usage`](Ledger::usage) read writes its own key's records first. Each bucket is a Redis key of
/// its own (`<prefix>:usage/<policy>:{<hash>}:<h|d|m><start>`, the key's
/// buckets sharing a cluster slot) that expires after the retention. A
/// bucket's value can be below 0 for a while (a refund that another
/// instance flushed before the record it settles): a read counts it as 0,
/// as [`MemoryLedger`] does.
///
/// **What a crash can lose**: the records since the last flush, at most
/// one flush interval of them (more while Redis is unreachable: a failed
/// flush keeps its batches for the next). Memory stays bounded through an
/// outage: at most
/// [`max_pending_keys`](RedisLedgerBuilder::max_pending_keys) pairs of
/// policy and key wait in the batches of failed flushes, and as many
/// recorded since; a flush takes no more recorded pairs than the batches
/// to send again leave room for, and records of a new pair beyond the
/// bound are counted by [`dropped`](RedisLedger::dropped). Call
/// [`flush`](Ledger::flush) at shutdown: once it returns `Ok`, every
/// record made before it is written.
///
/// **Each record counts once.** A flush sends one batch per key, numbered;
/// the script applies a batch only if the key's marker for this ledger
/// (one small key per key and instance, kept a day) holds an older number,
/// and a batch whose call failed is sent again as it was, number included.
/// So a batch Redis applied whose reply was lost (a deadline, a dropped
/// connection) is not counted twice when it is sent again, provided that
/// is within a day. Until the failed batches are through, new records wait
/// in memory.
///
/// ```
/// use tollgate_core::ledger::{Granularity, Ledger, MeteredStore, UsageQuery};
/// use tollgate_core::{Algorithm, Key, Policy, Settlement, Store};
/// use tollgate_redis::{RedisLedger, RedisStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
/// let store = RedisStore::connect(&url).await?;
/// let ledger = RedisLedger::builder(&store).build()?;
/// let store = MeteredStore::new(store, ledger.clone());
/// let policy = Policy::new("doc-ledger", Algorithm::Gcra, "100/min")?;
/// # let unique = tollgate_core::Clock::now(&tollgate_core::SystemClock).as_micros();
/// let ada = Key::user(format!("doc-{unique}"));
/// let reserved = store.check(&ada, &policy, 10).await?;
/// store.settle(&ada, &policy, Settlement::of(&reserved, 10, 4)).await?;
/// // This month's days, up to now.
/// let month = UsageQuery::from_params(ledger.settings(), reserved.now(), None, None, None)?;
/// assert_eq!(month.granularity(), Granularity::Day);
/// assert_eq!(ledger.usage(&ada, "doc-ledger", month).await?.total(), 4);
/// ledger.flush().await?; // at shutdown
/// # Ok(())
/// # }
/// ```
pub struct RedisLedger<C = ManagedConnection> {
    shared: Arc<Shared<C>>,
}

struct Shared<C> {
    store: Arc<Inner<C>>,
    names: KeyNamer,
    settings: LedgerSettings,
    /// What was recorded since the last flush.
    pending: MemoryLedger,
    /// `max_pending_keys`: the most pairs of policy and key recorded and
    /// not yet sent, and the most in the batches of failed flushes.
    max_pending: usize,
    /// Half of `max_pending_keys`: from there, the background flush is
    /// woken early.
    early: usize,
    script: DecisionScript,
    /// Held by a flush, and by a read that flushes first: a read never
    /// sees a flush half done.
    flushing: tokio::sync::Mutex<()>,
    wake: Arc<tokio::sync::Notify>,
    /// Stops the background flush when the last clone is dropped.
    task: Option<tokio::task::AbortHandle>,
    flush_timeout: Duration,
    /// This ledger's own name in the markers of the batches it applied.
    instance: u64,
    /// The next batch's sequence number.
    seq: std::sync::atomic::AtomicU64,
    /// The batches of a failed flush, sent again as they are.
    retry: parking_lot::Mutex<Vec<flush::Batch>>,
}

impl<C> Drop for Shared<C> {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl<C> Clone for RedisLedger<C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<C> std::fmt::Debug for RedisLedger<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLedger")
            .field("prefix", &self.shared.names.prefix())
            .field("settings", &self.shared.settings)
            .finish_non_exhaustive()
    }
}

impl<C> RedisLedger<C> {
    /// Starts configuring a ledger on `store`'s connection, prefix and
    /// clock.
    pub fn builder(store: &crate::RedisStore<C>) -> RedisLedgerBuilder<C> {
        RedisLedgerBuilder::new(store.inner.clone())
    }

    /// Its calendar and retention.
    pub fn settings(&self) -> &LedgerSettings {
        &self.shared.settings
    }

    /// How many records were not kept because the pending records were
    /// full (Redis unreachable for long).
    pub fn dropped(&self) -> u64 {
        self.shared.pending.dropped()
    }

    /// How many pairs of policy and key wait for the next flush: those
    /// recorded since the last one, and the batches of a failed flush.
    pub fn pending(&self) -> usize {
        self.shared.pending.len() + self.shared.retry.lock().len()
    }

    /// The Redis key of the bucket of `granularity` starting at `start` of
    /// `key` under the policy named `policy`.
    pub fn bucket_key(
        &self,
        key: &Key,
        policy: &str,
        granularity: tollgate_core::ledger::Granularity,
        start: Timestamp,
    ) -> String {
        flush::bucket_key(
            &self.shared.names.usage_stem(policy, key),
            granularity,
            start.as_micros() / 1_000_000,
        )
    }
}

impl<C: RedisConnection> Shared<C> {
    fn now(&self) -> Timestamp {
        match &self.store.wire.clock {
            Some(clock) => clock.now(),
            None => tollgate_core::SystemClock.now(),
        }
    }

    /// Whether the ledger's clock is a test clock: keys then live at least
    /// ten minutes of real time, as the store's.
    fn test_clock(&self) -> bool {
        self.store.wire.clock.is_some()
    }
}

impl<C: RedisConnection> Ledger for RedisLedger<C> {
    fn settings(&self) -> &LedgerSettings {
        &self.shared.settings
    }

    fn record(&self, key: &Key, policy: &str, at: Timestamp, units: u64) {
        self.shared.pending.record(key, policy, at, units);
        self.wake_if_full();
    }

    fn refund(&self, key: &Key, policy: &str, at: Timestamp, units: u64) {
        self.shared.pending.refund(key, policy, at, units);
        self.wake_if_full();
    }

    /// Flushes this instance's records of the key under the policy first,
    /// so that the answer includes them (and no other key's: they wait for
    /// the next flush); other instances' records are included once they
    /// flushed. It fails while records of this key could not be written,
    /// not for another key's.
    async fn usage(&self, key: &Key, policy: &str, query: UsageQuery) -> Result<Usage, StoreError> {
        let _flushing = self.shared.flushing.lock().await;
        // Its own records unwritten, the read would leave them out.
        flush::flush_one(&self.shared, policy, key).await?;
        Ok(flush::read(&self.shared, key, policy, &query).await?)
    }

    async fn flush(&self) -> Result<(), StoreError> {
        let _flushing = self.shared.flushing.lock().await;
        Ok(flush::flush(&self.shared).await?)
    }
}

impl<C> RedisLedger<C> {
    fn wake_if_full(&self) {
        if self.shared.pending.len() >= self.shared.early {
            self.shared.wake.notify_one();
        }
    }
}
