//! [`CachedLookup`]: overrides from any async lookup (a database), cached.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::AbortHandle;
use tollgate_core::{
    Applied, Clock, ConfigError, Key, Override, OverrideSource, OverrideTable, Policy, SystemClock,
    Timestamp,
};

use crate::report::Throttle;

/// One key's override under one policy, from wherever you keep them: a
/// database, a configuration service. [`CachedLookup`] asks it in the
/// background and caches the answer, so a request never waits for it.
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
/// policy for a stated cache time (default 10 s): a request never waits
/// for the lookup. A key seen for the first time, or whose answer is older
/// than the cache time, is looked up in the background (once at a time),
/// and the request is decided by what is known meanwhile: the policy as it
/// is for a key not seen before, the last answer for the others. So an
/// override set in your database applies within the cache time plus one
/// lookup, and the first request of a key on an instance is decided
/// before its lookup returns. That request carries the key's state over
/// to the plan's limits: an override's limit whose period the plan lacks
/// starts afresh after it (see the failure-modes guide, "When a policy
/// changes"), so keep an override's periods among its plan's. Expiries
/// apply at once, by the clock.
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
/// Needs a Tokio runtime for the background lookups.
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

struct Inner<L> {
    lookup: L,
    time: Duration,
    max_keys: usize,
    clock: Arc<dyn Clock>,
    /// The overrides found, in force until their expiry.
    table: OverrideTable,
    /// When each key and policy was last asked, and whether a lookup is
    /// under way.
    asked: Mutex<Asks>,
    /// Failed lookups' warnings: a failing source logs once a second, not
    /// once per key.
    failures: Throttle,
}

struct Asked {
    /// When the last lookup ended.
    at: Option<Timestamp>,
    /// The lookup under way, if any.
    pending: Option<Pending>,
}

/// A lookup under way: when it began, which lookup it is, and its task
/// once spawned.
struct Pending {
    since: Timestamp,
    /// Tells this lookup from any other of the same key and policy, also
    /// one begun at the same time (a key forgotten and met again).
    id: u64,
    task: Option<AbortHandle>,
}

impl Asked {
    /// Asked at `at`, with no lookup under way.
    fn ended(at: Timestamp) -> Self {
        Self {
            at: Some(at),
            pending: None,
        }
    }
}

/// When each key and policy was last asked: by key, then by policy name,
/// so that a request's question borrows its key and allocates nothing.
#[derive(Default)]
struct Asks {
    by_key: HashMap<Key, Vec<(Box<str>, Asked)>>,
    /// Every key of `by_key` once, oldest first (see
    /// [`forget_one`](Self::forget_one)).
    order: VecDeque<Key>,
    len: usize,
    /// The id of the next lookup.
    next_id: u64,
}

/// How many keys with an override [`Asks::forget_one`] passes over, at
/// most, before it forgets the next key, override or not: a cache whose
/// oldest keys include more than this many in a row with overrides may
/// forget one for a new key.
const PASS_OVER: usize = 1_024;

impl Asks {
    fn get_mut(&mut self, key: &Key, policy: &str) -> Option<&mut Asked> {
        let asked = self.by_key.get_mut(key)?.iter_mut();
        asked
            .filter(|(name, _)| **name == *policy)
            .map(|(_, a)| a)
            .next()
    }

    /// Records `asked` of `key` under `policy`; a new one past `max`
    /// first forgets another (see [`forget_one`](Self::forget_one)), in
    /// `table` too.
    fn put(
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
    fn forget_one(&mut self, table: &OverrideTable, now: Timestamp) {
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
    fn forget(&mut self, key: &Key, table: &OverrideTable) {
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

impl<L: OverrideLookup> CachedLookup<L> {
    /// The settings of overrides looked up by `lookup`: cached 10 s, at
    /// most 100,000 keys and policies, on the system clock.
    pub fn builder(lookup: L) -> CachedLookupBuilder<L> {
        CachedLookupBuilder {
            lookup,
            time: Duration::from_secs(10),
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
    /// look up every request) or a zero `max_keys`.
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
        Ok(CachedLookup {
            inner: Arc::new(Inner {
                lookup: self.lookup,
                time: self.time,
                max_keys: self.max_keys,
                clock: self.clock,
                table: OverrideTable::new(),
                asked: Mutex::new(Asks::default()),
                failures: Throttle::new(Duration::from_secs(1)),
            }),
        })
    }
}

impl<L> fmt::Debug for CachedLookupBuilder<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedLookupBuilder")
            .field("time", &self.time)
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
    /// marks one under way since `now`, and hands back its id and the task
    /// of the one it gives up on, to abort.
    fn due(&self, key: &Key, policy: &str, now: Timestamp) -> Due {
        let stale = |at: Timestamp| now.saturating_duration_since(at) >= self.time;
        let mut asked = self.asked.lock();
        let id = asked.next_id;
        let began = Pending {
            since: now,
            id,
            task: None,
        };
        let Some(entry) = asked.get_mut(key, policy) else {
            let first = Asked {
                at: None,
                pending: Some(began),
            };
            asked.put(key, policy, first, self.max_keys, &self.table, now);
            asked.next_id += 1;
            return Due::Yes { id, given_up: None };
        };
        let due = match &entry.pending {
            Some(pending) => stale(pending.since),
            None => entry.at.is_none_or(stale),
        };
        if !due {
            return Due::No;
        }
        let given_up = entry.pending.replace(began).and_then(|old| old.task);
        asked.next_id += 1;
        Due::Yes { id, given_up }
    }

    /// Records the task of lookup `id`; aborts it if it already ended, or
    /// was given up on or forgotten meanwhile. (An abort only schedules
    /// the task's drop, which takes this lock later.)
    fn began(&self, key: &Key, policy: &str, id: u64, task: AbortHandle) {
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
    /// Yes, as lookup `id`, giving up on the lookup of this task if there
    /// is one.
    Yes {
        id: u64,
        given_up: Option<AbortHandle>,
    },
}

impl<L: OverrideLookup> OverrideSource for CachedLookup<L> {
    fn applied(&self, key: &Key, policy: &Policy) -> Option<Applied> {
        let inner = &self.inner;
        let now = inner.clock.now();
        match inner.due(key, policy.name(), now) {
            Due::No => {}
            Due::Yes { id, given_up } => inner.ask(key, policy.name(), now, id, given_up),
        }
        inner.table.applied(key, policy, now)
    }
}

impl<L: OverrideLookup> Inner<L> {
    /// Looks `key` up under `policy` in the background as lookup `id`,
    /// marked as under way since `now`, first aborting the lookup
    /// `given_up`, if any.
    fn ask(
        self: &Arc<Self>,
        key: &Key,
        policy: &str,
        now: Timestamp,
        id: u64,
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
                };
                let task = runtime.spawn(asking.run());
                self.began(key, policy, id, task.abort_handle());
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
            .field("max_keys", &self.inner.max_keys)
            .field("overrides", &self.inner.table.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
