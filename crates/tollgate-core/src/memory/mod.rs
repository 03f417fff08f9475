//! The embedded in-memory store.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::decision::Decision;
use crate::error::{ConfigError, StoreError};
use crate::inflight::{InFlightLimit, MemorySlots, Renewal, SlotStore, Slots};
use crate::key::Key;
use crate::memory::shard::{KeysGauge, Padded, Shard, Shared, lock};
use crate::policy::Policy;
use crate::settle::Settlement;
use crate::state::PolicyState;
use crate::store::Store;
use crate::time::{Clock, SystemClock, Timestamp};

mod form;
mod shard;

/// The in-memory store: exact, sharded and bounded.
///
/// - **Exact.** Each key's state is decided under its shard's lock, so
///   concurrent checks of one key never over-admit.
/// - **Sharded.** Keys spread over many independently locked shards.
/// - **Bounded.** At most [`max_keys`](MemoryStoreBuilder::max_keys) keys
///   are held (the budget is split evenly over the shards). A shard forgets
///   its expired keys in one pass when it has doubled in size since its
///   last pass, or when it is full and something has expired, once a
///   sixteenth of its keys has expired as a count of their expiries tells
///   (which counts each key expired at most a quarter of its lifetime
///   late) or it has refused as many new keys since its last pass (any
///   one key, in a shard of fewer than 1,024); so sweeping costs a bounded
///   amount per new key, and a shard full of live keys is never scanned.
///   Until then, a full shard refuses a new key as if its keys were all
///   live. A key whose
///   state still matters is never evicted to make room: when a shard is
///   full of live keys, a new key gets [`StoreError::Full`] and the
///   caller's failure policy decides.
///   Blocks, and the fences of resets and blocks (see
///   [`Settlement::fence`](crate::Settlement::fence)), are held beside the
///   keys and not counted against `max_keys`; they count towards a shard's
///   doubling, so the same sweeps forget them once they end, however few
///   keys the shard holds.
/// - **Compact.** Keys are kept as a 64-bit keyed hash (random per store)
///   of the policy and the key, so no client-supplied bytes are retained.
///   A single-limit GCRA, token-bucket or leaky-bucket key costs 16 bytes
///   plus the hash table's slack, a single fixed-window key (below half
///   a million a second) 24; other policies keep their full state per key.
///   Two
///   distinct keys share state only if their hashes collide, which for a
///   million live keys happens with a probability of about 3 in 100 million,
///   and cannot be aimed at without the store's random seed.
///
/// State is per policy *name* and key: two policies with the same name
/// share state, and when a policy's limits change, what each key has used
/// carries over to the new limits (see
/// [`PolicyState::carry_to`](crate::state::PolicyState::carry_to)), also when the
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
    /// The slots of in-flight limits, apart from the decisions' state.
    slots: Arc<MemorySlots>,
}

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
            slots: Arc::default(),
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
        let decision = self.shared.check(key, policy, cost)?;
        Ok(decision.with_cost(cost))
    }

    /// Takes an in-flight slot synchronously; what
    /// [`SlotStore::acquire`] does.
    ///
    /// ```
    /// use tollgate_core::{InFlightLimit, Key, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let exports = InFlightLimit::new("exports", 1)?;
    /// let key = Key::user("ada");
    /// assert!(store.acquire_slot_sync(&key, &exports, 1).acquired);
    /// assert!(!store.acquire_slot_sync(&key, &exports, 2).acquired);
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    pub fn acquire_slot_sync(&self, key: &Key, limit: &InFlightLimit, holder: u64) -> Slots {
        self.slots.acquire(key, limit, holder)
    }

    /// Renews `holder`'s slot synchronously; what [`SlotStore::renew`]
    /// does: a slot it does not hold is taken, past the limit if every
    /// slot is held (a request that runs counts, whatever the limit).
    ///
    /// ```
    /// use tollgate_core::{InFlightLimit, Key, MemoryStore, Renewal};
    ///
    /// let store = MemoryStore::new();
    /// let exports = InFlightLimit::new("exports", 1)?;
    /// let key = Key::user("ada");
    /// assert!(store.acquire_slot_sync(&key, &exports, 1).acquired);
    /// assert_eq!(store.renew_slot_sync(&key, &exports, 1), Renewal::Renewed);
    /// assert_eq!(store.renew_slot_sync(&key, &exports, 2), Renewal::RetakenPastLimit);
    /// assert!(!store.acquire_slot_sync(&key, &exports, 3).acquired);
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    pub fn renew_slot_sync(&self, key: &Key, limit: &InFlightLimit, holder: u64) -> Renewal {
        self.slots.renew(key, limit, holder)
    }

    /// Settles synchronously; what [`Store::settle`] does.
    ///
    /// ```
    /// use tollgate_core::{Algorithm, Key, MemoryStore, Policy, Settlement};
    ///
    /// let store = MemoryStore::new();
    /// let policy = Policy::new("tokens", Algorithm::TokenBucket, "100/min")?;
    /// let key = Key::user("ada");
    /// let reserved = store.check_sync(&key, &policy, 10)?;
    /// let settled = store.settle_sync(&key, &policy, &Settlement::of(&reserved, 10, 4))?;
    /// assert_eq!(settled.remaining(), 96);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::Full`] when the key is new and its shard is full of
    /// keys that are still inside their windows.
    pub fn settle_sync(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: &Settlement,
    ) -> Result<Decision, StoreError> {
        self.shared.settle(key, policy, settlement)
    }

    /// Takes `state` as the state of `key` under `policy`: for a local
    /// fallback that takes over from a failed shared store what it last
    /// knew of the key (see [`Store::last_known`] and
    /// [`PolicyState::seeded`]). Where the store holds some already (it
    /// decided the key in this failure, or in an earlier one), each limit
    /// keeps the more used of the two: what the shared store counted since
    /// an earlier failure is not lost, nor what was admitted here. State
    /// held under another configuration of the name (a share of the limit
    /// before the count of instances changed, say) is carried over first,
    /// as a check carries it.
    ///
    /// ```
    /// use tollgate_core::state::PolicyState;
    /// use tollgate_core::{Algorithm, FakeClock, Key, MemoryStore, Policy, Timestamp};
    ///
    /// let now = Timestamp::from_secs(1_700_000_000);
    /// let local = MemoryStore::builder().clock(FakeClock::new(now)).build()?;
    /// let policy = Policy::new("api", Algorithm::FixedWindow, "100/h")?;
    /// let key = Key::user("ada");
    /// // An earlier failure: 1 admitted here.
    /// local.check_sync(&key, &policy, 1)?;
    /// // Since, the shared store counted 90.
    /// let mut shared = PolicyState::new(&policy, now);
    /// let last = shared.decide(&policy, now, 90);
    /// local.seed(&key, &policy, PolicyState::seeded(&policy, &last))?;
    /// assert_eq!(local.check_sync(&key, &policy, 0)?.remaining(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::Full`] when the key is new and its shard is full.
    pub fn seed(&self, key: &Key, policy: &Policy, state: PolicyState) -> Result<(), StoreError> {
        self.shared.seed(key, policy, state)
    }

    /// Lifts a block of `key` under `policy`'s name made before `at`, and
    /// says whether there was one; a block made at or after `at` stands.
    /// For a local fallback that holds a block made through it, once the
    /// shared store answered the key unblocked after that (an operator
    /// reset it through another instance, say): the block would otherwise
    /// refuse the key here, in a failure, until its end.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::{Algorithm, Clock, FakeClock, Key, MemoryStore, Policy, Store, Timestamp};
    ///
    /// # block_on(async {
    /// let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
    /// let local = MemoryStore::builder().clock(clock.clone()).build()?;
    /// let policy = Policy::new("api", Algorithm::Gcra, "100/h")?;
    /// let key = Key::user("ada");
    /// local.block(&key, &policy, Duration::from_secs(3_600)).await?;
    /// // Not a block made at that instant.
    /// assert!(!local.lift_block_before(&key, &policy, clock.now()));
    /// clock.advance(Duration::from_secs(1));
    /// assert!(local.lift_block_before(&key, &policy, clock.now()));
    /// assert!(local.check_sync(&key, &policy, 1)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     let mut f = std::pin::pin!(f);
    /// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    /// #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
    /// # }
    /// ```
    pub fn lift_block_before(&self, key: &Key, policy: &Policy, at: Timestamp) -> bool {
        self.shared.lift_block_before(key, policy, at)
    }
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

    // Inlined, so that a caller that knows the store sees that it always
    // answers at once.
    #[inline]
    fn try_check_now(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        Some(self.check_sync(key, policy, cost))
    }

    fn reset(
        &self,
        key: &Key,
        policy: &Policy,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.shared.reset(key, policy);
        std::future::ready(Ok(()))
    }

    fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: Settlement,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        std::future::ready(self.settle_sync(key, policy, &settlement))
    }

    fn block(
        &self,
        key: &Key,
        policy: &Policy,
        duration: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.shared.block(key, policy, duration);
        std::future::ready(Ok(()))
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}

/// Slots of in-flight limits, held as long as their requests: no leases.
impl SlotStore for MemoryStore {
    fn acquire(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> impl Future<Output = Result<Slots, StoreError>> + Send {
        std::future::ready(Ok(self.acquire_slot_sync(key, limit, holder)))
    }

    fn renew(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> impl Future<Output = Result<Renewal, StoreError>> + Send {
        std::future::ready(Ok(self.slots.renew(key, limit, holder)))
    }

    fn release(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.slots.release(key, limit, holder);
        std::future::ready(Ok(()))
    }

    fn release_now(&self, key: &Key, limit: &InFlightLimit, holder: u64) -> bool {
        self.slots.release(key, limit, holder);
        true
    }

    fn leases(&self) -> bool {
        false
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
    /// The most shards a store may have: each is a lock of its own, padded
    /// to a cache line, made when the store is built; past a few per CPU,
    /// more shards hold no lock less often.
    pub const MAX_SHARDS: usize = 4096;

    /// The most keys held at once (default [`MemoryStore::DEFAULT_MAX_KEYS`]).
    /// Each shard holds `max_keys / shards` of them.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The number of shards (default: 16 per CPU, 16 to 256; at most
    /// [`MAX_SHARDS`](Self::MAX_SHARDS)).
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
    /// there are more shards than keys, or more than
    /// [`MAX_SHARDS`](Self::MAX_SHARDS).
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
            Some(n) if n > Self::MAX_SHARDS => Err(ConfigError::InvalidSetting {
                setting: "shards",
                reason: "must not exceed 4096",
            }),
            _ => Ok(MemoryStore::build_unchecked(self)),
        }
    }
}
