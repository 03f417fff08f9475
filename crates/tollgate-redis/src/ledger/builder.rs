//! [`RedisLedgerBuilder`]: a Redis ledger's settings, and its background
//! flush.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tollgate_core::ConfigError;
use tollgate_core::ledger::{LedgerSettings, MemoryLedger};

use crate::connect::RedisConnection;
use crate::script::DecisionScript;
use crate::store::Inner;

use super::{RedisLedger, Shared, flush};

/// Configures a [`RedisLedger`]; made by [`RedisLedger::builder`].
pub struct RedisLedgerBuilder<C> {
    store: Arc<Inner<C>>,
    settings: LedgerSettings,
    interval: Duration,
    max_pending_keys: usize,
    flush_timeout: Duration,
}

impl<C> std::fmt::Debug for RedisLedgerBuilder<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLedgerBuilder")
            .field("settings", &self.settings)
            .field("interval", &self.interval)
            .field("max_pending_keys", &self.max_pending_keys)
            .finish_non_exhaustive()
    }
}

impl<C> RedisLedgerBuilder<C> {
    pub(crate) fn new(store: Arc<Inner<C>>) -> Self {
        Self {
            store,
            settings: LedgerSettings::new(),
            interval: Duration::from_secs(1),
            max_pending_keys: MemoryLedger::DEFAULT_MAX_KEYS,
            flush_timeout: Duration::from_secs(5),
        }
    }

    /// The calendar (time zone) and retention of the buckets (UTC, and
    /// [`LedgerSettings::new`]'s retention, by default). Every instance on
    /// one prefix must use the same.
    #[must_use]
    pub fn settings(mut self, settings: LedgerSettings) -> Self {
        self.settings = settings;
        self
    }

    /// How often the records are flushed to Redis (1 s by default): at
    /// most this much is lost in a crash.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] for an interval under 10 ms or over
    /// an hour.
    pub fn flush_interval(mut self, interval: Duration) -> Result<Self, ConfigError> {
        if interval < Duration::from_millis(10) || interval > Duration::from_secs(3_600) {
            return Err(ConfigError::InvalidSetting {
                setting: "flush_interval",
                reason: "flush from every 10 ms to every hour",
            });
        }
        self.interval = interval;
        Ok(self)
    }

    /// The most pairs of policy and key recorded that wait for a flush
    /// (100,000 by default), and the most in the batches of failed flushes
    /// that wait to be sent again: while Redis fails, at most twice this
    /// many pairs are held, and records of new pairs beyond are
    /// [`dropped`](crate::RedisLedger::dropped). From half of it a flush
    /// starts early.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] for 0.
    pub fn max_pending_keys(mut self, max: usize) -> Result<Self, ConfigError> {
        if max == 0 {
            return Err(ConfigError::InvalidSetting {
                setting: "max_pending_keys",
                reason: "hold at least 1 key",
            });
        }
        self.max_pending_keys = max;
        Ok(self)
    }

    /// How long a flush waits for each of its calls (5 s by default, from
    /// 1 ms to 1 min). A call that takes longer fails the flush, and its
    /// batch is sent again by the next one, counted once all the same.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] outside that range.
    pub fn flush_timeout(mut self, timeout: Duration) -> Result<Self, ConfigError> {
        if timeout < Duration::from_millis(1) || timeout > Duration::from_secs(60) {
            return Err(ConfigError::InvalidSetting {
                setting: "flush_timeout",
                reason: "wait from 1 ms to 1 min for a flush's call",
            });
        }
        self.flush_timeout = timeout;
        Ok(self)
    }
}

impl<C: RedisConnection> RedisLedgerBuilder<C> {
    /// The ledger, with its background flush spawned on the current Tokio
    /// runtime; the flush stops when the last clone of the ledger is
    /// dropped (flush first: see [`RedisLedger`]).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] (setting `runtime`) outside a Tokio
    /// runtime.
    pub fn build(self) -> Result<RedisLedger<C>, ConfigError> {
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| ConfigError::InvalidSetting {
                setting: "runtime",
                reason: "build the ledger inside a Tokio runtime: it flushes in a task",
            })?;
        let interval = self.interval;
        let wake = Arc::new(tokio::sync::Notify::new());
        let shared = Arc::new_cyclic(|weak: &Weak<Shared<C>>| {
            let task = runtime.spawn(flush_every(weak.clone(), wake.clone(), interval));
            Shared {
                names: self.store.names.clone(),
                store: self.store,
                pending: MemoryLedger::with_settings(self.settings.clone(), self.max_pending_keys),
                max_pending: self.max_pending_keys,
                early: self.max_pending_keys.div_ceil(2),
                settings: self.settings,
                script: DecisionScript::new(include_str!("../lua/ledger_flush.lua")),
                flushing: tokio::sync::Mutex::new(()),
                wake,
                task: Some(task.abort_handle()),
                flush_timeout: self.flush_timeout,
                instance: instance_name(),
                seq: std::sync::atomic::AtomicU64::new(1),
                retry: parking_lot::Mutex::new(Vec::new()),
            }
        });
        Ok(RedisLedger { shared })
    }
}

/// A name for this ledger, random enough that two instances never share
/// one: std's per-process random hash keys, the process id and the time.
pub(crate) fn instance_name() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u64(tollgate_core::Clock::now(&tollgate_core::SystemClock).as_micros());
    hasher.finish()
}

/// Flushes every `interval`, or sooner when woken, while the ledger lives.
async fn flush_every<C: RedisConnection>(
    ledger: Weak<Shared<C>>,
    wake: Arc<tokio::sync::Notify>,
    interval: Duration,
) {
    let mut failing = false;
    loop {
        // After a failed flush, a quarter of an interval before records
        // piling up may wake it early: a batch that fails at once (Redis
        // refusing connections) would otherwise be sent again and again.
        let mut wait = interval;
        if failing {
            tokio::time::sleep(interval / 4).await;
            wait -= interval / 4;
        }
        let _ = tokio::time::timeout(wait, wake.notified()).await;
        let Some(shared) = ledger.upgrade() else {
            return;
        };
        let _flushing = shared.flushing.lock().await;
        match flush::flush(&shared).await {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("the usage ledger flushes again");
            }
            Ok(()) => {}
            // Said once per outage, not every interval.
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(%error, "the usage ledger could not flush; its records wait for the next flush");
            }
            Err(_) => {}
        }
    }
}
