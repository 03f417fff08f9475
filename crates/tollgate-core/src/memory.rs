//! The embedded in-memory store.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::algorithm::PolicyState;
use crate::decision::Decision;
use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use crate::policy::Policy;
use crate::store::Store;
use crate::time::{Clock, SystemClock, Timestamp};

/// The in-memory store: exact, sharded and bounded.
///
/// - **Exact.** Each key's state is decided under its shard's lock, so
///   concurrent checks of one key never over-admit.
/// - **Sharded.** Keys spread over many independently locked shards.
/// - **Bounded.** At most [`max_keys`](MemoryStoreBuilder::max_keys) keys
///   are held (the budget is split evenly over the shards). Expired state is
///   swept a little at a time as new keys arrive, from a per-shard expiry
///   queue, never by scanning. A key whose state still matters is never
///   evicted to make room: when a shard is full of live keys, a new key gets
///   [`StoreError::Full`] and the caller's failure policy decides.
/// - **No raw keys.** Keys are kept as a 128-bit keyed hash (random per
///   store) of the policy name and the key, so memory per key is fixed and
///   no client-supplied bytes are retained.
///
/// State is per policy *name* and key: two policies with the same name share
/// state, and a policy whose limits change starts its keys afresh.
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
    shards: Box<[Mutex<Shard>]>,
    shard_capacity: usize,
    max_keys: usize,
    clock: Arc<dyn Clock>,
    hash_keys: (RandomState, RandomState),
    keys_gauge: KeysGauge,
}

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
        let held = self.shards.iter().map(|s| lock(s).map.len()).sum();
        self.keys_gauge.sub(held);
    }
}

type KeyHash = u128;

#[derive(Default)]
struct Shard {
    map: HashMap<KeyHash, Entry, BuildHasherDefault<PassThrough>>,
    /// One record per key, at or before the key's expiry.
    expiry: BinaryHeap<Reverse<(u64, KeyHash)>>,
}

struct Entry {
    state: PolicyState,
    expires_at: u64,
}

/// How many expired keys an insert sweeps on its way, at most.
const SWEEP_PER_INSERT: usize = 8;

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
                shards: (0..shards).map(|_| Mutex::default()).collect(),
                shard_capacity,
                max_keys: b.max_keys,
                clock: b.clock,
                hash_keys: (RandomState::new(), RandomState::new()),
                keys_gauge: KeysGauge::new(),
            }),
        }
    }

    /// How many keys are held now, expired ones not yet swept included.
    pub fn len(&self) -> usize {
        self.shared.shards.iter().map(|s| lock(s).map.len()).sum()
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
        let hash = shared.hash(key, policy);
        let shard_index = ((hash >> 64) as usize) % shared.shards.len();
        let mut shard = lock(&shared.shards[shard_index]);
        let now = shared.clock.now();

        if let Some(entry) = shard.map.get_mut(&hash) {
            let decision = entry.state.decide(policy, now, cost);
            entry.expires_at = entry
                .expires_at
                .max(entry.state.expires_at(policy).as_micros());
            return Ok(decision);
        }

        let mut state = PolicyState::new(policy, now);
        let decision = state.decide(policy, now, cost);
        let expires_at = state.expires_at(policy).as_micros();
        if expires_at <= now.as_micros() {
            // A peek, or a request that can never be admitted: nothing to keep.
            return Ok(decision);
        }
        let mut swept = shard.sweep(now, SWEEP_PER_INSERT);
        if shard.map.len() >= shared.shard_capacity {
            swept += shard.sweep(now, usize::MAX);
            if shard.map.len() >= shared.shard_capacity {
                drop(shard);
                shared.keys_gauge.sub(swept);
                return Err(StoreError::Full {
                    max_keys: shared.max_keys,
                });
            }
        }
        shard.map.insert(hash, Entry { state, expires_at });
        shard.expiry.push(Reverse((expires_at, hash)));
        drop(shard);
        shared.keys_gauge.sub(swept);
        shared.keys_gauge.add(1);
        Ok(decision)
    }
}

impl Shared {
    fn hash(&self, key: &Key, policy: &Policy) -> KeyHash {
        let feed = |state: &RandomState| {
            let mut h = state.build_hasher();
            // Length-prefixed parts: no two different inputs feed the same bytes.
            h.write_usize(policy.name().len());
            h.write(policy.name().as_bytes());
            h.write(key.kind().as_str().as_bytes());
            h.write_usize(key.as_bytes().len());
            h.write(key.as_bytes());
            h.finish()
        };
        (u128::from(feed(&self.hash_keys.0)) << 64) | u128::from(feed(&self.hash_keys.1))
    }
}

impl Shard {
    /// Forgets up to `budget` keys whose state has expired by `now`;
    /// returns how many it forgot.
    fn sweep(&mut self, now: Timestamp, budget: usize) -> usize {
        let now = now.as_micros();
        let mut swept = 0;
        while swept < budget {
            match self.expiry.peek() {
                Some(Reverse((at, _))) if *at <= now => {}
                _ => break,
            }
            let Some(Reverse((_, hash))) = self.expiry.pop() else {
                break;
            };
            if let Some(entry) = self.map.get(&hash) {
                if entry.expires_at <= now {
                    self.map.remove(&hash);
                    swept += 1;
                } else {
                    self.expiry.push(Reverse((entry.expires_at, hash)));
                }
            }
        }
        swept
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // No code panics while holding a shard lock; if one ever did, the state
    // is still consistent enough to keep limiting.
    shard.lock().unwrap_or_else(PoisonError::into_inner)
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
            .field("clock", &self.shared.clock)
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
    clock: Arc<dyn Clock>,
}

impl Default for MemoryStoreBuilder {
    fn default() -> Self {
        Self {
            max_keys: MemoryStore::DEFAULT_MAX_KEYS,
            shards: None,
            clock: Arc::new(SystemClock),
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
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
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

    fn write_u128(&mut self, n: u128) {
        self.0 = n as u64;
    }
}
