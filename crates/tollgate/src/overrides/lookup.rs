//! [`CachedLookup`]: overrides from any async lookup (a database), cached.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tollgate_core::{
    Applied, Clock, ConfigError, FirstAnswer, Key, Override, OverrideSource, OverrideTable, Policy,
    SystemClock, Timestamp,
};

use crate::report::LogThrottle;

use asks::{Asked, Asks, First, Pending};

/// One key's override under one policy, from wherever you keep them: a
/// database, a configuration service. [`CachedLookup`] asks it in the
/// background and caches the answer, so that only a key's first requests
/// on an instance wait for it.
///
/// ```
/// use std::collections::HashMap;
/// use tollgate::{Key, Override, OverrideLookup, Timestamp};
///
/// /// Overrides in a table of tenants (a map stands in for the database).
/// struct Tenants(HashMap<String, Override>);
///
/// impl OverrideLookup for Tenants {
///     type Error = std::convert::Infallible;
///
///     async fn lookup(
///         &self,
///         key: &Key,
///         policy: &str,
///     ) -> Result<Option<(Override, Option<Timestamp>)>, Self::Error> {
///         let tenant = String::from_utf8_lossy(key.as_bytes());
///         let _ = policy; // one override per tenant, on every policy
///         Ok(self.0.get(&*tenant).map(|rule| (rule.clone(), None)))
///     }
/// }
/// # let _ = Tenants(HashMap::new());
/// ```
pub trait OverrideLookup: Send + Sync + 'static {
    /// Why a lookup failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// `key`'s override under the policy named `policy` and its expiry,
    /// if it has one.
    ///
    /// # Errors
    ///
    /// When the lookup fails: the cache keeps what it knew, and asks
    /// again after its cache time.
    fn lookup(
        &self,
        key: &Key,
        policy: &str,
    ) -> impl Future<Output = Result<Option<(Override, Option<Timestamp>)>, Self::Error>> + Send;
}

/// An [`OverrideSource`] over any [`OverrideLookup`], cached per key and
/// policy for a stated cache time (default 10 s). A key seen for the first
/// time, or whose answer is older than the cache time, is looked up in the
/// background (once at a time). A key with an answer is decided by it
/// meanwhile, without waiting: so an override set in your database applies
/// within the cache time plus one lookup. Expiries apply at once, by the
/// clock.
///
/// A key without an answer yet (the first requests of a key on an
/// instance, or of one the cache forgot) waits for its first lookup, up to
/// the [first wait](CachedLookupBuilder::first_wait) (default 100 ms)
/// counted from when the lookup began: the source answers
/// [`Applied::Pending`], and the layer and the limiter wait. That is what
/// keeps a restart from giving a key with limits of its own a fresh quota:
/// a request decided under the plan carries the key's state over to the
/// plan's limits, and an override's limit whose period the plan lacks
/// starts afresh after it (see the failure-modes guide, "When a policy
/// changes"). Past the first wait (a slow or failing lookup), or with a
/// first wait of zero, requests are decided under the policy as it is:
/// keep an override's periods among its plan's where that matters.
///
/// A lookup that fails or panics leaves the key what it had, and the key
/// is looked up again after the cache time. One still under way a cache
/// time after it began is given up on (aborted) by the next request that
/// finds it so, which asks again. Failures are logged at most once a
/// second.
///
/// The cache holds at most `max_keys` keys and policies (default 100,000);
/// past it, the oldest key without an override in force is forgotten for
/// each new one, so hostile keys cannot grow it, and a flood of them does
/// not lift a deny (while no more than 1,024 keys with overrides come in
/// a row in the order keys were first met).
/// Needs a Tokio runtime for the background lookups, with its timer for
/// the first wait (as `#[tokio::main]` builds it).
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Algorithm, Applied, CachedLookup, FakeClock, Key, Override, OverrideLookup,
///     OverrideSource, Policy, Timestamp};
///
/// struct Db;
/// impl OverrideLookup for Db {
///     type Error = std::convert::Infallible;
///     async fn lookup(&self, key: &Key, _: &str)
///         -> Result<Option<(Override, Option<Timestamp>)>, Self::Error> {
///         Ok((key.as_bytes() == b"acme").then(|| (Override::Exempt, None)))
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = FakeClock::default();
/// let cached = CachedLookup::builder(Db).cache_time(Duration::from_secs(30)).clock(clock).build()?;
/// assert_eq!(cached.time(), Duration::from_secs(30));
/// let api = Policy::new("api", Algorithm::Gcra, "10/s")?;
/// let acme = Key::user("acme");
/// cached.load(&acme, &api).await?; // what the first request starts in the background
/// assert!(matches!(cached.applied(&acme, &api), Some(Applied::Exempt)));
/// # Ok(())
/// # }
/// ```
pub struct CachedLookup<L> {
    inner: Arc<Inner<L>>,
}

/// The longest first wait: requests are held for it.
const MAX_FIRST_WAIT: Duration = Duration::from_secs(5);

struct Inner<L> {
    lookup: L,
    time: Duration,
    first_wait: Duration,
    max_keys: usize,
    clock: Arc<dyn Clock>,
    /// The overrides found, in force until their expiry.
    table: OverrideTable,
    /// When each key and policy was last asked, and whether a lookup is
    /// under way.
    asked: Mutex<Asks>,
    /// Failed lookups' warnings: a failing source logs once a second, not
    /// once per key.
    failures: LogThrottle,
}

impl<L: OverrideLookup> CachedLookup<L> {
    /// The settings of overrides looked up by `lookup`: cached 10 s, at
    /// most 100,000 keys and policies, on the system clock.
    pub fn builder(lookup: L) -> CachedLookupBuilder<L> {
        CachedLookupBuilder {
            lookup,
            time: Duration::from_secs(10),
            first_wait: Duration::from_millis(100),
            max_keys: 100_000,
            clock: Arc::new(SystemClock),
        }
    }

    /// The cache time.
    pub fn time(&self) -> Duration {
        self.inner.time
    }

    /// Looks `key` up under `policy` now and caches the answer: what a
    /// request that finds no fresh answer starts in the background.
    ///
    /// # Errors
    ///
    /// The lookup's error; what was cached stays.
    pub async fn load(&self, key: &Key, policy: &Policy) -> Result<(), L::Error> {
        self.inner.load(key, policy.name()).await
    }
}

/// The settings of a [`CachedLookup`]; [`build`](Self::build) checks them.
#[must_use]
pub struct CachedLookupBuilder<L> {
    lookup: L,
    time: Duration,
    first_wait: Duration,
    max_keys: usize,
    clock: Arc<dyn Clock>,
}

impl<L: OverrideLookup> CachedLookupBuilder<L> {
    /// How long an answer is used before it is asked again (default
    /// 10 s): the longest an override set in the lookup's source takes to
    /// apply, plus one lookup.
    pub fn cache_time(mut self, time: Duration) -> Self {
        self.time = time;
        self
    }

    /// How long the requests of a key wait for its first answer, counted
    /// from when its lookup began, on Tokio's clock (default 100 ms; at
    /// most the cache time, and 5 s). Past it, or with zero, they are decided under
    /// the policy as it is until the answer is in; see [`CachedLookup`] for
    /// what that does to a key with limits of its own.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Algorithm, Applied, CachedLookup, Key, Override, OverrideLookup,
    ///     OverrideSource, Policy, Timestamp};
    ///
    /// struct Db;
    /// impl OverrideLookup for Db {
    ///     type Error = std::convert::Infallible;
    ///     async fn lookup(&self, _: &Key, _: &str)
    ///         -> Result<Option<(Override, Option<Timestamp>)>, Self::Error> {
    ///         tokio::time::sleep(Duration::from_millis(20)).await; // the round trip
    ///         Ok(Some((Override::Exempt, None)))
    ///     }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cached = CachedLookup::builder(Db).first_wait(Duration::from_millis(50)).build()?;
    /// let (api, acme) = (Policy::new("api", Algorithm::Gcra, "10/s")?, Key::user("acme"));
    /// // Not known yet: its first lookup has begun. A layer waits for it.
    /// assert!(matches!(cached.applied(&acme, &api), Some(Applied::Pending)));
    /// let start = tokio::time::Instant::now();
    /// cached.first_answer(&acme, &api).expect("a lookup under way").await;
    /// assert_eq!(start.elapsed(), Duration::from_millis(20));
    /// assert!(matches!(cached.applied(&acme, &api), Some(Applied::Exempt)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn first_wait(mut self, wait: Duration) -> Self {
        self.first_wait = wait;
        self
    }

    /// The most keys and policies cached (default 100,000).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The clock of cache times and expiries (default: the system clock).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The source.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] for a zero cache time (which would
    /// look up every request), a zero `max_keys`, or a first wait longer
    /// than the cache time or 5 s.
    pub fn build(self) -> Result<CachedLookup<L>, ConfigError> {
        if self.time.is_zero() {
            return Err(ConfigError::InvalidSetting {
                setting: "cache_time",
                reason: "must be above zero",
            });
        }
        if self.max_keys == 0 {
            return Err(ConfigError::InvalidSetting {
                setting: "max_keys",
                reason: "must be at least 1",
            });
        }
        if self.first_wait > self.time {
            return Err(ConfigError::InvalidSetting {
                setting: "first_wait",
                reason: "must not exceed the cache time, after which a lookup is given up on",
            });
        }
        if self.first_wait > MAX_FIRST_WAIT {
            return Err(ConfigError::InvalidSetting {
                setting: "first_wait",
                reason: "must not exceed 5 s: requests are held for it",
            });
        }
        Ok(CachedLookup {
            inner: Arc::new(Inner {
                lookup: self.lookup,
                time: self.time,
                first_wait: self.first_wait,
                max_keys: self.max_keys,
                clock: self.clock,
                table: OverrideTable::new(),
                asked: Mutex::new(Asks::default()),
                failures: LogThrottle::new(Duration::from_secs(1)),
            }),
        })
    }
}

impl<L> fmt::Debug for CachedLookupBuilder<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedLookupBuilder")
            .field("time", &self.time)
            .field("first_wait", &self.first_wait)
            .field("max_keys", &self.max_keys)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl<L: OverrideLookup> Inner<L> {
    async fn load(&self, key: &Key, policy: &str) -> Result<(), L::Error> {
        let found = self.lookup.lookup(key, policy).await;
        let now = self.clock.now();
        if let Ok(found) = &found {
            match found {
                Some((rule, ends)) => self.table.set(key.clone(), policy, rule.clone(), *ends),
                None => {
                    self.table.remove(key, policy);
                }
            }
        }
        self.asked_at(key, policy, now);
        found.map(drop)
    }

    /// Whether `key` under `policy` needs a lookup now: its last answer is
    /// older than the cache time, and no lookup began within it. If so,
    /// marks one under way since `now`, and hands back its id, what to
    /// close when it ends, and the task of the one it gives up on, to
    /// abort. With it, whether the key waits for its first answer: it has
    /// none, and its lookup began less than the first wait ago.
    fn due(&self, key: &Key, policy: &str, now: Timestamp) -> (Due, bool) {
        let stale = |at: Timestamp| now.saturating_duration_since(at) >= self.time;
        let mut asked = self.asked.lock();
        let id = asked.next_id;
        let Some(entry) = asked.get_mut(key, policy) else {
            let (began, ended) = self.began(now, id, !self.first_wait.is_zero());
            let first = Asked {
                at: None,
                pending: Some(began),
            };
            asked.put(key, policy, first, self.max_keys, &self.table, now);
            asked.next_id += 1;
            let first = ended.is_some();
            let due = Due::Yes {
                id,
                ended,
                given_up: None,
            };
            return (due, first);
        };
        let due = match &entry.pending {
            Some(pending) => stale(pending.since),
            None => entry.at.is_none_or(stale),
        };
        if !due {
            let first = entry.first_pending().is_some();
            return (Due::No, first);
        }
        // Only a key's first lookup is waited for: not a refresh, nor the
        // lookup that replaces a first one given up on (requests waited
        // for that one already).
        let (began, ended) = self.began(now, id, false);
        let given_up = entry.pending.replace(began).and_then(|old| old.task);
        asked.next_id += 1;
        let due = Due::Yes {
            id,
            ended,
            given_up,
        };
        (due, false)
    }

    /// A lookup under way since `now`, as lookup `id`; if requests are to
    /// wait for it (`first`), with what to close when it ends.
    fn began(&self, now: Timestamp, id: u64, first: bool) -> (Pending, Option<watch::Sender<()>>) {
        let (first, ended) = if first {
            let (ended, waiting) = watch::channel(());
            let until = crate::clock::instant_after(self.first_wait);
            (
                Some(First {
                    ended: waiting,
                    until,
                }),
                Some(ended),
            )
        } else {
            (None, None)
        };
        let pending = Pending {
            since: now,
            id,
            task: None,
            first,
        };
        (pending, ended)
    }

    /// Records the task of lookup `id`; aborts it if it already ended, or
    /// was given up on or forgotten meanwhile. (An abort only schedules
    /// the task's drop, which takes this lock later.)
    fn spawned(&self, key: &Key, policy: &str, id: u64, task: AbortHandle) {
        let mut asked = self.asked.lock();
        match asked
            .get_mut(key, policy)
            .and_then(|entry| entry.pending.as_mut())
            .filter(|pending| pending.id == id)
        {
            Some(pending) => pending.task = Some(task),
            None => task.abort(),
        }
    }
}

/// Whether a request should start a lookup.
enum Due {
    No,
    /// Yes, as lookup `id`, closing `ended` (if requests wait for it) when
    /// it ends, and giving up on the lookup of this task if there is one.
    Yes {
        id: u64,
        ended: Option<watch::Sender<()>>,
        given_up: Option<AbortHandle>,
    },
}

impl<L: OverrideLookup> OverrideSource for CachedLookup<L> {
    fn applied(&self, key: &Key, policy: &Policy) -> Option<Applied> {
        let inner = &self.inner;
        let now = inner.clock.now();
        let (due, first) = inner.due(key, policy.name(), now);
        match due {
            Due::No => {}
            Due::Yes {
                id,
                ended,
                given_up,
            } => inner.ask(key, policy.name(), now, (id, ended), given_up),
        }
        let applied = inner.table.applied(key, policy, now);
        applied.or(first.then_some(Applied::Pending))
    }

    fn first_answer(&self, key: &Key, policy: &Policy) -> Option<FirstAnswer> {
        let mut asked = self.inner.asked.lock();
        let first = asked.get_mut(key, policy.name())?.first_pending()?;
        let (mut ended, until) = (first.ended.clone(), first.until);
        drop(asked);
        Some(Box::pin(async move {
            // Closed when the lookup ends: `Err` then, as nothing is sent.
            let _ = tokio::time::timeout_at(until, ended.changed()).await;
        }))
    }
}

impl<L: OverrideLookup> Inner<L> {
    /// Looks `key` up under `policy` in the background as lookup `id`,
    /// marked as under way since `now`, closing `ended` when it ends,
    /// first aborting the lookup `given_up`, if any.
    fn ask(
        self: &Arc<Self>,
        key: &Key,
        policy: &str,
        now: Timestamp,
        (id, ended): (u64, Option<watch::Sender<()>>),
        given_up: Option<AbortHandle>,
    ) {
        if let Some(task) = given_up {
            task.abort();
            self.failed(&"no answer within the cache time", policy);
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let asking = Asking {
                    inner: Arc::clone(self),
                    key: key.clone(),
                    policy: policy.into(),
                    id,
                    _ended: ended,
                };
                let task = runtime.spawn(asking.run());
                self.spawned(key, policy, id, task.abort_handle());
            }
            // No runtime to look up in: asked again after the cache time.
            Err(_) => {
                self.asked_at(key, policy, now);
            }
        }
    }
}

impl<L> Inner<L> {
    /// Records that `key` under `policy` was last asked at `now`, with no
    /// lookup under way.
    fn asked_at(&self, key: &Key, policy: &str, now: Timestamp) {
        let mut asked = self.asked.lock();
        let max = self.max_keys;
        asked.put(key, policy, Asked::ended(now), max, &self.table, now);
    }

    /// Logs a failed lookup, at most once a second.
    fn failed(&self, error: &dyn fmt::Display, policy: &str) {
        if let Some(suppressed) = self.failures.may_log(tokio::time::Instant::now()) {
            tracing::warn!(
                %error,
                policy,
                suppressed,
                "override lookup failed; the key keeps what it had until asked again"
            );
        }
    }
}

/// The lookup `id` of one key under one policy in the background. Dropped
/// however it ends (answered, failed, panicked,
/// aborted, or never run by a runtime shutting down), it ends its mark as
/// under way if the answer did not, so that the key is looked up again
/// after the cache time rather than never.
struct Asking<L: OverrideLookup> {
    inner: Arc<Inner<L>>,
    key: Key,
    policy: Box<str>,
    id: u64,
    /// Dropped after the mark (fields drop after `drop`), which wakes the
    /// requests waiting for the key's first answer, if any.
    _ended: Option<watch::Sender<()>>,
}

impl<L: OverrideLookup> Asking<L> {
    async fn run(self) {
        if let Err(error) = self.inner.load(&self.key, &self.policy).await {
            self.inner.failed(&error, &self.policy);
        }
    }
}

impl<L: OverrideLookup> Drop for Asking<L> {
    fn drop(&mut self) {
        let now = self.inner.clock.now();
        let mut asked = self.inner.asked.lock();
        if let Some(entry) = asked.get_mut(&self.key, &self.policy)
            && entry
                .pending
                .as_ref()
                .is_some_and(|pending| pending.id == self.id)
        {
            *entry = Asked::ended(now);
        }
    }
}

impl<L> Clone for CachedLookup<L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<L> fmt::Debug for CachedLookup<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedLookup")
            .field("time", &self.inner.time)
            .field("first_wait", &self.inner.first_wait)
            .field("max_keys", &self.inner.max_keys)
            .field("overrides", &self.inner.table.len())
            .finish_non_exhaustive()
    }
}

mod asks;
#[cfg(test)]
mod tests;
