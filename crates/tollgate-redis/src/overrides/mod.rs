//! [`RedisOverrides`]: per-key overrides kept in Redis, honoured by every
//! instance within a poll interval.
//!
//! Redis holds one hash of overrides and a version beside it (both under
//! the store's prefix, in one hash tag): every change raises the version.
//! Each instance polls the version (one script call, which returns the
//! overrides only when the version moved) every poll interval, and keeps
//! them in an [`OverrideTable`]: a request asks the table, never Redis.
//! `form.rs` holds how an override is written in the hash, the scripts are
//! `lua/overrides/`.

mod form;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tollgate_core::{
    Applied, Clock, ConfigError, FirstAnswer, Key, Override, OverrideError, OverrideSource,
    OverrideStore, OverrideTable, Policy, StoreError, SystemClock, Timestamp,
};

use crate::connect::{ManagedConnection, RedisConnection};
use crate::error::RedisStoreError;
use crate::script::DecisionScript;
use crate::store::RedisStore;

/// How often an instance drops the overrides expired in Redis and renews
/// the two keys' TTL, besides reading the version at every poll.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The longest first wait: requests are held for it.
const MAX_FIRST_WAIT: Duration = Duration::from_secs(5);

/// The longest the overrides' keys are kept (a hundred years): an
/// override's expiry may be as far as a caller asks, but Redis refuses a
/// TTL past its clock's range, and the script would fail after writing.
const MAX_KEEP: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Per-key overrides kept in Redis, on a [`RedisStore`]'s connection and
/// prefix: set on one instance, honoured by every instance within its
/// poll interval (default 250 ms, so within 250 ms plus a round trip),
/// with no restart; kept across restarts of the instances (a new instance
/// loads them before [`start`](RedisOverridesBuilder::start) returns).
/// A request's lookup is local: a key without an override costs a table
/// lookup (an atomic load while there is no override at all), never a
/// round trip.
///
/// An override with an expiry stops applying at its expiry by this
/// source's clock (the system clock, or [`RedisOverridesBuilder::clock`]),
/// on every instance, whether or not it has polled since; the instances
/// drop expired overrides from Redis every minute. The hash and its
/// version have a TTL: past the longest expiry set, at least the
/// retention (default 30 days), which every running instance renews
/// every minute; an override without an expiry thus outlives a restart of
/// the whole fleet by the retention.
///
/// Unlike the store's state keys, which are digests, the hash keeps the
/// keys an operator named (a user id, an API key): every instance rebuilds
/// its table from them.
///
/// ```no_run
/// use std::time::Duration;
/// use tollgate::{Algorithm, Key, MemoryStore, Override, OverrideStore, Policy, RateLimitLayer};
/// use tollgate_redis::{RedisOverrides, RedisStore};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// let overrides = RedisOverrides::builder().start(&store).await?;
/// let api = Policy::new("api", Algorithm::Gcra, "100/min")?;
/// let layer = RateLimitLayer::new(api.clone(), tollgate::GlobalKey)
///     .store(store.clone())
///     .overrides(overrides.clone());
/// // An enterprise tenant gets 10x for a week, on every instance.
/// let tenant = Key::user("acme");
/// let week = Duration::from_secs(7 * 86_400);
/// overrides.set(&tenant, &api, Override::limit("1000/min")?, Some(week)).await?;
/// # let _ = layer;
/// # Ok(())
/// # }
/// ```
pub struct RedisOverrides<C = ManagedConnection> {
    shared: Arc<Shared<C>>,
}

struct Shared<C> {
    store: RedisStore<C>,
    table: OverrideTable,
    clock: Arc<dyn Clock>,
    hash: String,
    version: String,
    retention: Duration,
    interval: Duration,
    poll: DecisionScript,
    write: DecisionScript,
    /// The version last loaded; held through a poll, so that polls do not
    /// interleave and an older reply never replaces a newer one.
    seen: tokio::sync::Mutex<String>,
    /// Whether the overrides were ever loaded. Until they are, no key's
    /// override is known.
    loaded: AtomicBool,
    /// The poll requests asked for while nothing was loaded, if one is
    /// under way: closed when it ends, loaded or failed.
    asked: parking_lot::Mutex<Option<watch::Receiver<()>>>,
    /// How long requests wait for it.
    first_wait: Duration,
}

/// The settings of a [`RedisOverrides`]; [`start`](Self::start) makes it.
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisOverridesBuilder {
    interval: Duration,
    retention: Duration,
    first_wait: Duration,
    clock: Option<Arc<dyn Clock>>,
}

impl RedisOverrides {
    /// The settings: a poll every 250 ms, a retention of 30 days, the
    /// system clock.
    pub fn builder() -> RedisOverridesBuilder {
        RedisOverridesBuilder {
            interval: Duration::from_millis(250),
            retention: Duration::from_secs(30 * 86_400),
            first_wait: Duration::from_millis(100),
            clock: None,
        }
    }
}

impl RedisOverridesBuilder {
    /// How often each instance reads the version (default 250 ms): an
    /// override applies everywhere within this, plus a round trip. From
    /// 10 ms to 1 s.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// How long the overrides stay in Redis after the last instance stops
    /// renewing them, and at least after the last change (default 30 days,
    /// at least a minute, at most a hundred years: Redis refuses a TTL
    /// past its clock's range).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// How long a request waits for the poll it asks for while the
    /// overrides were never loaded (default 100 ms, at most 5 s; see
    /// [`start`](Self::start)).
    pub fn first_wait(mut self, wait: Duration) -> Self {
        self.first_wait = wait;
        self
    }

    /// The clock expiries are set and read by (default: the system clock).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Loads the overrides from `store`'s Redis, under its prefix, and
    /// starts the task that polls them; it stops when the last clone of
    /// the source is dropped. A Redis that cannot be reached yet is not an
    /// error: the source logs the failure, and polls on. Until it has
    /// loaded the overrides, it knows no key's: it answers
    /// [`Applied::Pending`], and a request that can wait asks for a poll
    /// (one at a time) and waits for it, up to the
    /// [first wait](Self::first_wait) (100 ms by default), then goes by
    /// its plan. So the requests decided in Redis once it answers again do
    /// not carry keys with limits of their own over to their plans'
    /// limits, which would start those limits afresh. While the store's
    /// circuit breaker is open, the poll fails at once and requests go to
    /// the failure policy; a request whose poll failed just before the
    /// breaker let a request through may still be decided in Redis under
    /// its plan. Needs a Tokio runtime.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] for a poll interval outside 10 ms
    /// to 1 s, a retention under a minute or over a hundred years, or a
    /// first wait over 5 s.
    pub async fn start<C: RedisConnection>(
        self,
        store: &RedisStore<C>,
    ) -> Result<RedisOverrides<C>, ConfigError> {
        if !(Duration::from_millis(10)..=Duration::from_secs(1)).contains(&self.interval) {
            return Err(ConfigError::InvalidSetting {
                setting: "poll_interval",
                reason: "must be from 10 ms to 1 s",
            });
        }
        if self.retention < SWEEP_EVERY {
            return Err(ConfigError::InvalidSetting {
                setting: "retention",
                reason: "must be at least a minute",
            });
        }
        if self.retention > MAX_KEEP {
            return Err(ConfigError::InvalidSetting {
                setting: "retention",
                reason: "must not exceed a hundred years (Redis refuses the TTL)",
            });
        }
        if self.first_wait > MAX_FIRST_WAIT {
            return Err(ConfigError::InvalidSetting {
                setting: "first_wait",
                reason: "must not exceed 5 s: requests are held for it",
            });
        }
        // `<prefix>:{<prefix>:overrides}` and its version: under the
        // prefix, in one hash slot.
        let prefix = store.prefix();
        let tag = format!("{prefix}:{{{prefix}:overrides}}");
        let shared = Arc::new(Shared {
            store: store.clone(),
            table: OverrideTable::new(),
            clock: self.clock.unwrap_or_else(|| Arc::new(SystemClock)),
            version: format!("{tag}:version"),
            hash: tag,
            retention: self.retention,
            interval: self.interval,
            poll: DecisionScript::new(include_str!("../lua/overrides/poll.lua")),
            write: DecisionScript::new(include_str!("../lua/overrides/write.lua")),
            seen: tokio::sync::Mutex::new(String::new()),
            loaded: AtomicBool::new(false),
            asked: parking_lot::Mutex::new(None),
            first_wait: self.first_wait,
        });
        if let Err(error) = shared.poll(true).await {
            tracing::warn!(%error, "overrides not loaded from Redis yet; polling on");
        }
        tokio::spawn(poll_until_dropped(Arc::downgrade(&shared)));
        Ok(RedisOverrides { shared })
    }
}

/// Polls every interval while a handle of the source is left; sweeps
/// every [`SWEEP_EVERY`].
async fn poll_until_dropped<C: RedisConnection>(shared: Weak<Shared<C>>) {
    let Some(interval) = shared.upgrade().map(|s| s.interval) else {
        return;
    };
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_sweep = tokio::time::Instant::now();
    let mut failing = false;
    loop {
        ticks.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let sweep = last_sweep.elapsed() >= SWEEP_EVERY;
        match shared.poll(sweep).await {
            Ok(()) => {
                if sweep {
                    last_sweep = tokio::time::Instant::now();
                }
                failing = false;
            }
            // Said once per outage, not every interval.
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(%error, "overrides not read from Redis; keeping the last known");
            }
            Err(_) => {}
        }
    }
}

impl<C: RedisConnection> Shared<C> {
    /// Reads the overrides if their version moved; with `sweep`, first
    /// drops those expired by now and renews the keys' TTL. Marks them
    /// loaded if they were read.
    async fn poll(&self, sweep: bool) -> Result<(), RedisStoreError> {
        let polled = self.poll_once(sweep).await;
        if polled.is_ok() {
            self.loaded.store(true, Ordering::Release);
        }
        polled
    }

    async fn poll_once(&self, sweep: bool) -> Result<(), RedisStoreError> {
        let mut seen = self.seen.lock().await;
        let now = if sweep {
            self.clock.now().as_micros()
        } else {
            0
        };
        let keep = if sweep { millis(self.retention) } else { 0 };
        let inner = &*self.store.inner;
        let reply = inner
            .guarded(&self.hash, async {
                let args = |cmd: &mut redis::Cmd| {
                    cmd.arg(2).arg(&self.hash).arg(&self.version);
                    cmd.arg(seen.as_str()).arg(now).arg(keep);
                };
                inner
                    .wire
                    .eval(&self.hash, &self.poll, (6, 128), args)
                    .await
            })
            .await?;
        let (version, all) = form::poll_reply(reply)
            .ok_or_else(|| RedisStoreError::Protocol("overrides poll".to_owned()))?;
        if let Some(all) = all {
            self.table.replace(all);
        }
        *seen = version;
        Ok(())
    }

    /// Writes `value` (empty: clears) to `key`'s field under `policy`,
    /// keeping the keys at least `keep`, then reads the overrides back.
    async fn write(
        &self,
        key: &Key,
        policy: &str,
        value: &str,
        keep: Duration,
    ) -> Result<(), RedisStoreError> {
        let field = form::field(policy, key);
        let keep = millis(keep.max(self.retention).min(MAX_KEEP));
        let inner = &*self.store.inner;
        inner
            .guarded(&self.hash, async {
                let args = |cmd: &mut redis::Cmd| {
                    cmd.arg(2).arg(&self.hash).arg(&self.version);
                    cmd.arg(&field).arg(value).arg(keep);
                };
                inner
                    .wire
                    .eval(&self.hash, &self.write, (6, 128), args)
                    .await
            })
            .await?;
        self.poll(false).await
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl<C: RedisConnection> RedisOverrides<C> {
    /// Reads the overrides from Redis now, if they changed, rather than
    /// at the next poll.
    ///
    /// # Errors
    ///
    /// A [`RedisStoreError`] when Redis fails; the overrides known stay.
    pub async fn refresh(&self) -> Result<(), RedisStoreError> {
        self.shared.poll(false).await
    }
}

impl<C> RedisOverrides<C> {
    /// Whether the overrides were loaded from Redis at least once: until
    /// then, every key's are not known yet.
    pub fn is_loaded(&self) -> bool {
        self.shared.loaded.load(Ordering::Acquire)
    }

    /// The overrides this instance knows.
    pub fn table(&self) -> &OverrideTable {
        &self.shared.table
    }

    /// How often the version is read.
    pub fn poll_interval(&self) -> Duration {
        self.shared.interval
    }

    /// The hash of overrides in Redis (its version is this name and
    /// `:version`).
    pub fn hash_key(&self) -> &str {
        &self.shared.hash
    }
}

impl<C: RedisConnection> OverrideSource for RedisOverrides<C> {
    #[inline]
    fn applied(&self, key: &Key, policy: &Policy) -> Option<Applied> {
        let shared = &*self.shared;
        if shared.table.is_empty() {
            // Whether loaded first, then the table again: a first load
            // landing between the two reads is seen whole.
            if !shared.loaded.load(Ordering::Acquire) {
                return Some(Applied::Pending);
            }
            if shared.table.is_empty() {
                return None;
            }
        }
        shared.table.applied(key, policy, shared.clock.now())
    }

    /// Until the overrides are loaded, asks for a poll now (one at a
    /// time: a request that finds one under way waits for it), and waits
    /// for it to end, up to the first wait. While Redis fails (its
    /// circuit breaker open), it fails at once.
    fn first_answer(&self, _: &Key, _: &Policy) -> Option<FirstAnswer> {
        let shared = &self.shared;
        if shared.loaded.load(Ordering::Acquire) {
            return None;
        }
        let mut ended = {
            let mut asked = shared.asked.lock();
            // `Err`: its sender is gone, the poll ended.
            match asked
                .as_ref()
                .filter(|under_way| under_way.has_changed().is_ok())
            {
                Some(under_way) => under_way.clone(),
                None => {
                    let (end, ended) = watch::channel(());
                    *asked = Some(ended.clone());
                    let polling = Arc::clone(shared);
                    // `end` is dropped once the poll has ended (or with
                    // the task, if a runtime shutting down never runs it):
                    // that wakes the requests waiting.
                    tokio::spawn(async move {
                        let _end = end;
                        // A failure is logged by the polling task.
                        let _ = polling.poll(false).await;
                    });
                    ended
                }
            }
        };
        let wait = shared.first_wait;
        Some(Box::pin(async move {
            let _ = tokio::time::timeout(wait, ended.changed()).await;
        }))
    }

    #[inline]
    fn is_empty(&self) -> bool {
        // Loaded first: see `applied`.
        self.shared.loaded.load(Ordering::Acquire) && self.shared.table.is_empty()
    }
}

impl<C: RedisConnection> OverrideStore for RedisOverrides<C> {
    async fn set(
        &self,
        key: &Key,
        policy: &Policy,
        rule: Override,
        expires_in: Option<Duration>,
    ) -> Result<(), OverrideError> {
        rule.check(policy).map_err(OverrideError::Config)?;
        let expires_at = expires_in.map(|d| self.shared.clock.now() + d);
        let value = form::value(&rule, expires_at);
        let keep = expires_in.unwrap_or_default().saturating_add(SWEEP_EVERY);
        let written = self.shared.write(key, policy.name(), &value, keep).await;
        written.map_err(|e| OverrideError::Store(StoreError::from(e)))
    }

    async fn clear(&self, key: &Key, policy: &Policy) -> Result<(), StoreError> {
        let written = self.shared.write(key, policy.name(), "", Duration::ZERO);
        Ok(written.await?)
    }

    fn get(&self, key: &Key, policy: &Policy) -> Option<(Override, Option<Timestamp>)> {
        let shared = &*self.shared;
        shared.table.get(key, policy.name(), shared.clock.now())
    }
}

impl<C> Clone for RedisOverrides<C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<C> fmt::Debug for RedisOverrides<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisOverrides")
            .field("hash", &self.shared.hash)
            .field("interval", &self.shared.interval)
            .field("overrides", &self.shared.table.len())
            .finish_non_exhaustive()
    }
}
