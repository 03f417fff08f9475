//! The embedded in-memory store.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard, RwLock};

use crate::algorithm::PolicyState;
use crate::decision::Decision;
use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use crate::policy::{Layout, Policy};
use crate::store::Store;
use crate::time::{Clock, SystemClock, Timestamp};

/// The in-memory store: exact, sharded and bounded.
///
/// - **Exact.** Each key's state is decided under its shard's lock, so
///   concurrent checks of one key never over-admit.
/// - **Sharded.** Keys spread over many independently locked shards.
/// - **Bounded.** At most [`max_keys`](MemoryStoreBuilder::max_keys) keys
///   are held (the budget is split evenly over the shards). A shard forgets
///   its expired keys in one pass when it has doubled in size since its
///   last pass, or when it is full and some key has expired since; so
///   sweeping costs a bounded amount per new key, and a shard full of live
///   keys is never scanned. A key whose state still matters is never
///   evicted to make room: when a shard is full of live keys, a new key
///   gets [`StoreError::Full`] and the caller's failure policy decides.
/// - **Compact.** Keys are kept as a 64-bit keyed hash (random per store)
///   of the policy and the key, so no client-supplied bytes are retained.
///   A single-limit GCRA, token-bucket or leaky-bucket key costs 16 bytes
///   plus the hash table's slack, a single fixed-window key (below a
///   million a second) 24; other policies keep their full state per key.
///   Two
///   distinct keys share state only if their hashes collide, which for a
///   million live keys happens with a probability of about 3 in 100 million,
///   and cannot be aimed at without the store's random seed.
///
/// State is per policy *name* and key: two policies with the same name
/// share state, and when a policy's limits change, what each key has used
/// carries over to the new limits (see
/// [`PolicyState::carry_to`](crate::PolicyState::carry_to)), also when the
/// change moves the policy between the compact layouts below and the full
/// state (adding a second limit to a single one, say). The store keeps a
/// key under the configuration it was last decided with, and looks for it
/// under the others of its name (up to eight per name, the latest) only
/// when that one holds nothing.
///
/// ```
/// use tollgate_core::{Algorithm, FakeClock, Key, MemoryStore, Policy, Store};
///
/// # tokio_test(async {
/// let store = MemoryStore::builder()
///     .max_keys(10_000)
///     .clock(FakeClock::default())
///     .build()?;
/// let policy = Policy::new("login", Algorithm::FixedWindow, "3/min")?;
/// for _ in 0..3 {
///     assert!(store.check(&Key::user("ada"), &policy, 1).await?.is_allowed());
/// }
/// assert!(!store.check(&Key::user("ada"), &policy, 1).await?.is_allowed());
/// assert_eq!(store.len(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// # fn tokio_test<F: std::future::Future>(f: F) -> F::Output {
/// #     let mut f = std::pin::pin!(f);
/// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
/// #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

struct Shared {
    shards: Box<[Padded]>,
    shard_capacity: usize,
    max_keys: usize,
    /// `None` for the [`SystemClock`], read without a virtual call.
    clock: Option<Arc<dyn Clock>>,
    seed: foldhash::quality::RandomState,
    keys_gauge: KeysGauge,
    /// The configurations each policy name was decided under, so that a
    /// key whose state was kept under one is found, and carried over, from
    /// another. Written only when a new configuration keeps its first key.
    configs: RwLock<HashMap<u64, Vec<Policy>>>,
}

/// The most configurations of one policy name the store carries keys
/// between: beyond it, the oldest is forgotten, and its keys' state is
/// kept but no longer carried over to the others.
const MAX_CONFIGS: usize = 8;

/// The [`MEMORY_STORE_KEYS`](crate::telemetry::MEMORY_STORE_KEYS) gauge,
/// with the `metrics` feature; nothing without it.
struct KeysGauge {
    #[cfg(feature = "metrics")]
    gauge: metrics::Gauge,
}

impl KeysGauge {
    fn new() -> Self {
        Self {
            #[cfg(feature = "metrics")]
            gauge: metrics::gauge!(crate::telemetry::MEMORY_STORE_KEYS),
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    fn add(&self, _keys: usize) {
        #[cfg(feature = "metrics")]
        self.gauge.increment(_keys as f64);
    }

    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    fn sub(&self, _keys: usize) {
        #[cfg(feature = "metrics")]
        self.gauge.decrement(_keys as f64);
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let held = self.shards.iter().map(|s| lock(&s.0).len()).sum();
        self.keys_gauge.sub(held);
    }
}

/// A shard's lock on a cache line pair of its own, so that threads working
/// on neighbouring shards do not slow each other down.
#[repr(align(128))]
struct Padded(Mutex<Shard>);

type KeyHash = u64;
type HashedMap<V> = HashMap<KeyHash, V, BuildHasherDefault<PassThrough>>;

struct Shard {
    /// Single-limit GCRA, token-bucket and leaky-bucket keys: the one time
    /// that is their whole state (the theoretical arrival time, when the
    /// bucket is full again, or when the queue is next free), which is also
    /// when the state expires.
    words: HashedMap<u64>,
    /// Single fixed-window keys (below a million a second): the window
    /// word (see [`PolicyState::is_window_word`]) and when it expires.
    windows: HashedMap<Window>,
    /// Every other key.
    full: HashedMap<Entry>,
    /// Sweep when the shard holds this many keys.
    sweep_at: usize,
    /// No key held expires before this (µs): a sweep earlier frees nothing.
    next_expiry: u64,
}

struct Entry {
    state: PolicyState,
    expires_at: u64,
}

struct Window {
    word: u64,
    expires_at: u64,
}

/// When the window of `word` ends, or 0 if it counts nothing (it may be
/// forgotten at once).
fn window_end(word: u64, period: u64) -> u64 {
    let count = word % period;
    if count == 0 { 0 } else { word - count + period }
}

/// The smallest shard size worth a sweep.
const MIN_SWEEP: usize = 1_024;

impl MemoryStore {
    /// The default maximum number of keys.
    pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

    /// A store with the system clock and the default settings.
    pub fn new() -> Self {
        Self::build_unchecked(MemoryStoreBuilder::default())
    }

    /// Starts configuring a store.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder::default()
    }

    fn build_unchecked(b: MemoryStoreBuilder) -> Self {
        let shards = b
            .shards
            .unwrap_or_else(default_shards)
            .clamp(1, b.max_keys.max(1));
        let shard_capacity = (b.max_keys / shards).max(1);
        Self {
            shared: Arc::new(Shared {
                shards: (0..shards)
                    .map(|_| Padded(Mutex::new(Shard::new(shard_capacity))))
                    .collect(),
                shard_capacity,
                max_keys: b.max_keys,
                clock: b.clock,
                seed: foldhash::quality::RandomState::default(),
                keys_gauge: KeysGauge::new(),
                configs: RwLock::default(),
            }),
        }
    }

    /// How many keys are held now, expired ones not yet swept included.
    pub fn len(&self) -> usize {
        self.shared.shards.iter().map(|s| lock(&s.0).len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The configured maximum number of keys.
    pub fn max_keys(&self) -> usize {
        self.shared.max_keys
    }

    /// Decides synchronously; what [`Store::check`] does.
    ///
    /// # Errors
    ///
    /// [`StoreError::Full`] when the key is new and its shard is full of
    /// keys that are still inside their windows.
    pub fn check_sync(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let shared = &*self.shared;
        let base = shared.hash(key, policy);
        // The map uses the hash's low bits for buckets and its top 7 for
        // tags; pick the shard from the middle 32 bits, scaled to the shard
        // count by a multiplication rather than a (slow) division. Every
        // configuration of a policy finds a key in the same shard, under
        // its own name in the maps.
        let shard_index =
            ((((base >> 25) & 0xffff_ffff) * shared.shards.len() as u64) >> 32) as usize;
        let hash = base ^ policy.config_mix();
        let mut guard = lock(&shared.shards[shard_index].0);
        let shard = &mut *guard;
        let now = match &shared.clock {
            None => SystemClock.now(),
            Some(clock) => clock.now(),
        };
        match policy.layout() {
            Layout::Word => match shard.words.get_mut(&hash) {
                Some(word) => Ok(PolicyState::decide_word(policy, word, now, cost)),
                None => shard.new_word(shared, base, policy, now, cost),
            },
            Layout::WindowWord => {
                let period = policy.params().first().map_or(1, |p| p.period_us.max(1));
                let Some(window) = shard.windows.get_mut(&hash) else {
                    return shard.new_window(shared, base, policy, now, cost);
                };
                let decision = PolicyState::decide_window_word(policy, &mut window.word, now, cost);
                window.expires_at = window.expires_at.max(window_end(window.word, period));
                Ok(decision)
            }
            Layout::Full => {
                let Some(entry) = shard.full.get_mut(&hash) else {
                    return shard.new_full(shared, base, policy, now, cost);
                };
                let decision = entry.state.decide(policy, now, cost);
                entry.expires_at = entry
                    .expires_at
                    .max(entry.state.expires_at(policy).as_micros());
                Ok(decision)
            }
        }
    }
}

/// `state` carried over to `policy` at `now`.
fn carried(mut state: PolicyState, policy: &Policy, now: Timestamp) -> PolicyState {
    state.carry_to(policy, now);
    state
}

impl MemoryStore {
    /// Takes `state` as the state of `key` under `policy`, unless the store
    /// holds some already: for a local fallback that takes over from a
    /// failed shared store what it last knew of the key (see
    /// [`Store::last_known`] and [`PolicyState::seeded`]).
    ///
    /// # Errors
    ///
    /// [`StoreError::Full`] when the key is new and its shard is full.
    pub fn seed(&self, key: &Key, policy: &Policy, state: PolicyState) -> Result<(), StoreError> {
        let shared = &*self.shared;
        let base = shared.hash(key, policy);
        let shard_index =
            ((((base >> 25) & 0xffff_ffff) * shared.shards.len() as u64) >> 32) as usize;
        let hash = base ^ policy.config_mix();
        let mut guard = lock(&shared.shards[shard_index].0);
        let shard = &mut *guard;
        let now = match &shared.clock {
            None => SystemClock.now(),
            Some(clock) => clock.now(),
        };
        let mut state = state;
        state.carry_to(policy, now);
        let expires_at = state.expires_at(policy).as_micros();
        let held = match policy.layout() {
            Layout::Word => shard.words.contains_key(&hash),
            Layout::WindowWord => shard.windows.contains_key(&hash),
            Layout::Full => shard.full.contains_key(&hash),
        };
        if held || expires_at <= now.as_micros() {
            return Ok(());
        }
        shared.other_configs(policy);
        match (policy.layout(), state.word()) {
            (Layout::Word, Some(word)) => {
                shard.admit(shared, now, word, |s| s.words.insert(hash, word))
            }
            (Layout::WindowWord, Some(word)) => shard.admit(shared, now, expires_at, |s| {
                s.windows.insert(hash, Window { word, expires_at })
            }),
            _ => shard.admit(shared, now, expires_at, |s| {
                s.full.insert(hash, Entry { state, expires_at })
            }),
        }
    }
}

impl Shared {
    /// The other configurations of `policy`'s name the store has kept keys
    /// under; registers `policy` among them.
    fn other_configs(&self, policy: &Policy) -> Vec<Policy> {
        let name = policy.identity();
        let same = |p: &Policy| p.fingerprint() == policy.fingerprint();
        let known = self.configs.read();
        let others: Vec<Policy> = known
            .get(&name)
            .map(|configs| configs.iter().filter(|p| !same(p)).cloned().collect())
            .unwrap_or_default();
        let registered = known
            .get(&name)
            .is_some_and(|configs| configs.iter().any(same));
        drop(known);
        if !registered {
            let mut known = self.configs.write();
            let configs = known.entry(name).or_default();
            if !configs.iter().any(same) {
                if configs.len() >= MAX_CONFIGS {
                    configs.remove(0);
                }
                configs.push(policy.clone());
            }
        }
        others
    }

    fn hash(&self, key: &Key, policy: &Policy) -> KeyHash {
        let mut h = self.seed.build_hasher();
        // Fixed-width parts, then the key's bytes, whose length is among
        // them: no two different inputs feed the same bytes. The policy
        // enters as one number (its name and layout, hashed when it was
        // built), so a check costs three mixing steps, not six. Its limits
        // are not part of it: a changed configuration finds the state
        // built under the old one and carries it over.
        h.write_u64(policy.identity());
        h.write_u64(((key.as_bytes().len() as u64) << 8) | key.kind() as u64);
        h.write(key.as_bytes());
        h.finish()
    }
}

impl Shard {
    fn new(capacity: usize) -> Self {
        Self {
            words: HashedMap::default(),
            windows: HashedMap::default(),
            full: HashedMap::default(),
            sweep_at: MIN_SWEEP.min(capacity),
            next_expiry: u64::MAX,
        }
    }

    fn len(&self) -> usize {
        self.words.len() + self.windows.len() + self.full.len()
    }

    /// Decides for a key the shard holds no word of under `policy`:
    /// carried over from another configuration, or new. Out of line, to
    /// keep the check of a held key short.
    #[inline(never)]
    fn new_word(
        &mut self,
        shared: &Shared,
        base: KeyHash,
        policy: &Policy,
        now: Timestamp,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let mut word = self
            .take_other(shared, base, policy, now)
            .and_then(|state| state.word())
            .unwrap_or(0);
        let decision = PolicyState::decide_word(policy, &mut word, now, cost);
        if word > now.as_micros() {
            let hash = base ^ policy.config_mix();
            self.admit(shared, now, word, |s| s.words.insert(hash, word))?;
        }
        Ok(decision)
    }

    /// [`Shard::new_word`] for a window word.
    #[inline(never)]
    fn new_window(
        &mut self,
        shared: &Shared,
        base: KeyHash,
        policy: &Policy,
        now: Timestamp,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let mut word = self
            .take_other(shared, base, policy, now)
            .and_then(|state| state.word())
            .unwrap_or(0);
        let decision = PolicyState::decide_window_word(policy, &mut word, now, cost);
        let period = policy.params().first().map_or(1, |p| p.period_us.max(1));
        let expires_at = window_end(word, period);
        // A peek, or a request that can never be admitted, leaves nothing to keep.
        if expires_at > now.as_micros() {
            let hash = base ^ policy.config_mix();
            self.admit(shared, now, expires_at, |s| {
                s.windows.insert(hash, Window { word, expires_at })
            })?;
        }
        Ok(decision)
    }

    /// [`Shard::new_word`] for a full state.
    #[inline(never)]
    fn new_full(
        &mut self,
        shared: &Shared,
        base: KeyHash,
        policy: &Policy,
        now: Timestamp,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let mut state = self
            .take_other(shared, base, policy, now)
            .unwrap_or_else(|| PolicyState::new(policy, now));
        let decision = state.decide(policy, now, cost);
        let expires_at = state.expires_at(policy).as_micros();
        // A peek, or a request that can never be admitted, leaves nothing to keep.
        if expires_at > now.as_micros() {
            let hash = base ^ policy.config_mix();
            self.admit(shared, now, expires_at, |s| {
                s.full.insert(hash, Entry { state, expires_at })
            })?;
        }
        Ok(decision)
    }

    /// Takes the state the key of `base` holds under another configuration
    /// of `policy`'s name, carried over to `policy`.
    fn take_other(
        &mut self,
        shared: &Shared,
        base: KeyHash,
        policy: &Policy,
        now: Timestamp,
    ) -> Option<PolicyState> {
        for other in shared.other_configs(policy) {
            let hash = base ^ other.config_mix();
            let state = match other.layout() {
                Layout::Word => self
                    .words
                    .remove(&hash)
                    .and_then(|word| PolicyState::from_word(&other, word, now)),
                Layout::WindowWord => self
                    .windows
                    .remove(&hash)
                    .and_then(|window| PolicyState::from_word(&other, window.word, now)),
                Layout::Full => self.full.remove(&hash).map(|entry| entry.state),
            };
            if let Some(state) = state {
                shared.keys_gauge.sub(1);
                return Some(carried(state, policy, now));
            }
        }
        None
    }

    /// Makes room for a new key expiring at `expires_at` and inserts it with
    /// `insert`, or reports the shard full.
    fn admit<T>(
        &mut self,
        shared: &Shared,
        now: Timestamp,
        expires_at: u64,
        insert: impl FnOnce(&mut Self) -> T,
    ) -> Result<(), StoreError> {
        let now = now.as_micros();
        if self.len() >= self.sweep_at && now >= self.next_expiry {
            let swept = self.sweep(now);
            shared.keys_gauge.sub(swept);
            self.sweep_at = (self.len() * 2).max(MIN_SWEEP).min(shared.shard_capacity);
        }
        if self.len() >= shared.shard_capacity {
            return Err(StoreError::Full {
                max_keys: shared.max_keys,
            });
        }
        insert(self);
        self.next_expiry = self.next_expiry.min(expires_at);
        shared.keys_gauge.add(1);
        Ok(())
    }

    /// Forgets every key whose state has expired by `now` (µs); returns how
    /// many it forgot.
    fn sweep(&mut self, now: u64) -> usize {
        let before = self.len();
        let mut next = u64::MAX;
        self.words.retain(|_, &mut at| {
            let keep = at > now;
            if keep {
                next = next.min(at);
            }
            keep
        });
        self.windows.retain(|_, window| {
            let keep = window.expires_at > now;
            if keep {
                next = next.min(window.expires_at);
            }
            keep
        });
        self.full.retain(|_, entry| {
            let keep = entry.expires_at > now;
            if keep {
                next = next.min(entry.expires_at);
            }
            keep
        });
        self.next_expiry = next;
        before - self.len()
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A short spin, then parking: critical sections here are a few dozen
    // nanoseconds, far shorter than a trip through the kernel.
    shard.lock()
}

fn default_shards() -> usize {
    let cpus = std::thread::available_parallelism().map_or(4, usize::from);
    (cpus * 16).next_power_of_two().clamp(16, 256)
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shared.shards.len())
            .field("max_keys", &self.shared.max_keys)
            .field(
                "clock",
                &self.shared.clock.as_deref().unwrap_or(&SystemClock),
            )
            .finish_non_exhaustive()
    }
}

impl Store for MemoryStore {
    fn check(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        std::future::ready(self.check_sync(key, policy, cost))
    }

    fn try_check_now(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        Some(self.check_sync(key, policy, cost))
    }
}

/// Configures a [`MemoryStore`].
#[derive(Debug)]
#[must_use = "call .build() to get the store"]
pub struct MemoryStoreBuilder {
    max_keys: usize,
    shards: Option<usize>,
    clock: Option<Arc<dyn Clock>>,
}

impl Default for MemoryStoreBuilder {
    fn default() -> Self {
        Self {
            max_keys: MemoryStore::DEFAULT_MAX_KEYS,
            shards: None,
            clock: None,
        }
    }
}

impl MemoryStoreBuilder {
    /// The most keys held at once (default [`MemoryStore::DEFAULT_MAX_KEYS`]).
    /// Each shard holds `max_keys / shards` of them.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The number of shards (default: 16 per CPU, 16 to 256).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// The clock (default [`SystemClock`]).
    pub fn clock<C: Clock>(mut self, clock: C) -> Self {
        let system = std::any::TypeId::of::<C>() == std::any::TypeId::of::<SystemClock>();
        self.clock = (!system).then(|| Arc::new(clock) as Arc<dyn Clock>);
        self
    }

    /// Builds the store.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] when `max_keys` or `shards` is zero,
    /// or there are more shards than keys.
    pub fn build(self) -> Result<MemoryStore, ConfigError> {
        if self.max_keys == 0 {
            return Err(ConfigError::InvalidSetting {
                setting: "max_keys",
                reason: "must be at least 1",
            });
        }
        match self.shards {
            Some(0) => Err(ConfigError::InvalidSetting {
                setting: "shards",
                reason: "must be at least 1",
            }),
            Some(n) if n > self.max_keys => Err(ConfigError::InvalidSetting {
                setting: "shards",
                reason: "must not exceed max_keys",
            }),
            _ => Ok(MemoryStore::build_unchecked(self)),
        }
    }
}

/// The map's keys are already uniformly random hashes.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}
