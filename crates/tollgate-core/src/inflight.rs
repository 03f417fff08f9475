//! A limit on requests in flight per key: [`InFlightLimit`], and the
//! [`SlotStore`] operations that hold its slots.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::builder::validate_name;
use crate::error::{ConfigError, StoreError};
use crate::key::Key;

/// At most `max` requests of one key in progress at once: a concurrency
/// limit per key, across every app server that shares the store.
///
/// A request takes a slot before it runs and gives it back when it is done
/// (for an HTTP layer, when its response body is finished or dropped). On a
/// shared store a slot is a lease of `lease`, which the holder renews while
/// the request runs: the slot of an app server that died frees itself when
/// its lease runs out. The name is the identity of the slots, as a policy's
/// name is of its state.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::InFlightLimit;
///
/// let exports = InFlightLimit::new("exports", 2)?.lease(Duration::from_secs(10))?;
/// assert_eq!((exports.name(), exports.max()), ("exports", 2));
/// assert!(InFlightLimit::new("exports", 0).is_err());
/// # Ok::<(), tollgate_core::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlightLimit {
    name: Arc<str>,
    max: u64,
    lease: Duration,
}

impl InFlightLimit {
    /// The default lease of a slot in a shared store.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

    /// At most `max` requests of one key in flight, under `name`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidName`] for a name a policy could not have, and
    /// [`ConfigError::InvalidSetting`] for a `max` of 0.
    pub fn new(name: impl Into<String>, max: u64) -> Result<Self, ConfigError> {
        let name = name.into();
        validate_name(&name)?;
        if max == 0 {
            return Err(ConfigError::InvalidSetting {
                setting: "max in flight",
                reason: "must be at least 1",
            });
        }
        Ok(Self {
            name: name.into(),
            max,
            lease: Self::DEFAULT_LEASE,
        })
    }

    /// How long a slot in a shared store lasts without a renewal (default
    /// 30 s; renewed every third of it while the request runs): how long
    /// the slot of an app server that died stays taken.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] for a lease under 10 ms or over a
    /// day.
    pub fn lease(mut self, lease: Duration) -> Result<Self, ConfigError> {
        if lease < Duration::from_millis(10) || lease > Duration::from_secs(86_400) {
            return Err(ConfigError::InvalidSetting {
                setting: "lease",
                reason: "must be from 10 ms to a day",
            });
        }
        self.lease = lease;
        Ok(self)
    }

    /// The name, the identity of the slots.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The most requests of one key in flight.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The lease of a slot in a shared store.
    pub fn lease_duration(&self) -> Duration {
        self.lease
    }

    /// This limit's share on one of `instances` app servers that each
    /// enforce it alone (a local fallback while the shared store fails):
    /// the same name and lease, and `max` divided by `instances`, rounded
    /// down but at least 1, so that a key is never refused everywhere.
    ///
    /// ```
    /// use std::num::NonZeroU64;
    /// use tollgate_core::InFlightLimit;
    ///
    /// let exports = InFlightLimit::new("exports", 5)?;
    /// assert_eq!(exports.divided(NonZeroU64::new(2).unwrap()).max(), 2);
    /// assert_eq!(exports.divided(NonZeroU64::new(9).unwrap()).max(), 1);
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    pub fn divided(&self, instances: std::num::NonZeroU64) -> InFlightLimit {
        Self {
            name: self.name.clone(),
            max: (self.max / instances.get()).max(1),
            lease: self.lease,
        }
    }
}

/// What [`SlotStore::acquire`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slots {
    /// Whether the request took a slot.
    pub acquired: bool,
    /// The slots of the key held now, the request's included if it took one.
    pub held: u64,
}

/// What [`SlotStore::renew`] found.
///
/// A running request cannot be un-run: when its slot is gone, the renewal
/// takes it back, past the limit if new requests took every slot
/// meanwhile. Renewing every holder so is what makes the limit hold again
/// for new requests within one renewal period after the store lost its
/// slots, when the renewals reach it (`InFlightLayer` tries one that was
/// not applied, and did not meet the process's own load, again after a
/// quarter of the period): from then on
/// every running request is counted, and no new one takes a slot until
/// fewer than the limit run. (Taken back only when a slot was free, a lost
/// holder stayed uncounted while new requests took each slot that freed
/// between its renewals.)
///
/// ```
/// use tollgate_core::{InFlightLimit, Key, MemoryStore, Renewal, SlotStore};
///
/// # block_on(async {
/// let store = MemoryStore::new();
/// let limit = InFlightLimit::new("exports", 1)?;
/// let key = Key::user("ada");
/// assert!(store.acquire(&key, &limit, 1).await?.acquired);
/// assert_eq!(store.renew(&key, &limit, 1).await?, Renewal::Renewed);
/// // Holder 2's slot is gone (never taken here), and the one slot is held:
/// // holder 2 runs, so it counts, past the limit.
/// let retaken = store.renew(&key, &limit, 2).await?;
/// assert_eq!(retaken, Renewal::RetakenPastLimit);
/// assert!(retaken.found_gone() && retaken.past_limit());
/// store.release(&key, &limit, 1).await?;
/// // Holder 2 still holds the one slot: a new request waits for it.
/// assert_eq!(store.renew(&key, &limit, 2).await?, Renewal::Renewed);
/// assert!(!store.acquire(&key, &limit, 3).await?.acquired);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     let mut f = std::pin::pin!(f);
/// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
/// #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Renewal {
    /// The holder held its slot: its lease is extended.
    Renewed,
    /// The holder's slot was gone (its lease had ended, or the store lost
    /// it: a restart without persistence, `FLUSHALL`, a failover to a
    /// replica that missed writes) and a slot was free: the holder took it
    /// back, and new requests count it again.
    Retaken,
    /// The holder's slot was gone and every slot was held by others (new
    /// requests took them meanwhile): the holder took it back all the
    /// same, past the limit. Its request runs, and counts, so no new
    /// request takes a slot until fewer than the limit are held.
    RetakenPastLimit,
}

impl Renewal {
    /// Whether the renewal found the holder's slot gone (and took it
    /// back).
    pub fn found_gone(self) -> bool {
        match self {
            Renewal::Renewed => false,
            Renewal::Retaken | Renewal::RetakenPastLimit => true,
        }
    }

    /// Whether the renewal took the holder's slot back past the limit:
    /// more than the limit are held now.
    pub fn past_limit(self) -> bool {
        match self {
            Renewal::Renewed | Renewal::Retaken => false,
            Renewal::RetakenPastLimit => true,
        }
    }
}

/// A store that holds the slots of [`InFlightLimit`]s. Each request's slot
/// is named by a `holder` id, unique among the requests of every app
/// server (see [`SlotStore::new_holder`]).
pub trait SlotStore: Send + Sync + 'static {
    /// Takes a slot of `key` under `limit` for `holder`, if fewer than
    /// `limit.max()` are held. Atomic: concurrent requests never take more
    /// slots than the limit. A holder that holds a slot already keeps it
    /// (acquired, nothing more held).
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot decide.
    fn acquire(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> impl Future<Output = Result<Slots, StoreError>> + Send;

    /// Extends `holder`'s lease, called while its request runs. A holder
    /// whose slot is gone (its lease ended, or the store lost it) takes it
    /// back, atomically as [`acquire`](SlotStore::acquire) takes one:
    /// within the limit if fewer than `limit.max()` are held
    /// ([`Renewal::Retaken`]), and past it if not
    /// ([`Renewal::RetakenPastLimit`]). Its request runs either way, and
    /// counts, so no new request takes a slot until enough have ended.
    ///
    /// On a store of several connections, a renewal may reach the store
    /// after a release sent later, and take the slot back for a lease.
    /// So `tollgate`'s layer gives a slot back only once the renewal on its
    /// way has its reply; a renewal that timed out can still arrive after,
    /// and that slot frees itself when its lease ends.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot be reached.
    fn renew(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> impl Future<Output = Result<Renewal, StoreError>> + Send;

    /// Gives `holder`'s slot back. A holder is one request's: once given
    /// back, it is not acquired again.
    ///
    /// A store whose calls can reach it out of order (several
    /// connections) may see a release before the acquire sent ahead of it,
    /// when a request is dropped while its slot is being taken. Such a
    /// store remembers a holder given back while it held no slot, for a
    /// lease, and its acquire then takes nothing (the Redis store does);
    /// otherwise that slot would be held by no one until its lease ended.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot be reached: the slot then
    /// frees itself when its lease runs out.
    fn release(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Gives the slot back at once, for stores that need no I/O: `true` if
    /// done; the default does nothing and returns `false`, and the caller
    /// then calls [`release`](SlotStore::release).
    fn release_now(&self, key: &Key, limit: &InFlightLimit, holder: u64) -> bool {
        let _ = (key, limit, holder);
        false
    }

    /// Whether slots are leases that their holders must renew while their
    /// requests run (a store shared by app servers, which may die holding
    /// one). The default is `true`.
    fn leases(&self) -> bool {
        true
    }

    /// A holder id no other request of any app server uses: 64 random bits.
    fn new_holder(&self) -> u64 {
        new_holder()
    }
}

/// 64 bits that no other request of any process is likely to draw: a
/// per-process random seed hashed with a counter.
fn new_holder() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEED: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut h = SEED
        .get_or_init(std::collections::hash_map::RandomState::new)
        .build_hasher();
    h.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.finish()
}

/// The in-memory store's slots: per limit name and key, the holders. They
/// live as long as their requests (a process that dies takes them along),
/// so they are no leases. Sharded by key, each key's holders a set: a
/// request takes one shard's lock and looks its holder up at once, however
/// many requests the key runs (a limit of thousands in flight on one key,
/// as a route's global limit, scanned every holder on every acquire and
/// release, under one lock for the whole process's fallback).
pub(crate) struct MemorySlots {
    hasher: foldhash::fast::RandomState,
    shards: [Mutex<SlotMap>; SLOT_SHARDS],
}

/// Shards of [`MemorySlots`].
const SLOT_SHARDS: usize = 16;

/// The slots of one key under one limit's name.
type SlotsOf = (Arc<str>, Key);

/// The holders of one key's slots: random 64-bit numbers, hashed fast.
type Holders = std::collections::HashSet<u64, foldhash::fast::RandomState>;

/// One shard's keys and their holders.
type SlotMap = HashMap<SlotsOf, Holders, foldhash::fast::RandomState>;

impl Default for MemorySlots {
    fn default() -> Self {
        Self {
            hasher: foldhash::fast::RandomState::default(),
            shards: std::array::from_fn(|_| Mutex::default()),
        }
    }
}

impl MemorySlots {
    /// The shard of `key`'s slots under `limit`, locked.
    fn shard(&self, key: &Key, limit: &InFlightLimit) -> parking_lot::MutexGuard<'_, SlotMap> {
        use std::hash::BuildHasher;
        let hash = self.hasher.hash_one((&*limit.name, key));
        self.shards[(hash % SLOT_SHARDS as u64) as usize].lock()
    }

    pub(crate) fn acquire(&self, key: &Key, limit: &InFlightLimit, holder: u64) -> Slots {
        let mut held = self.shard(key, limit);
        let holders = held.entry((limit.name.clone(), key.clone())).or_default();
        if holders.contains(&holder) {
            return Slots {
                acquired: true,
                held: holders.len() as u64,
            };
        }
        let acquired = (holders.len() as u64) < limit.max;
        if acquired {
            holders.insert(holder);
        }
        Slots {
            acquired,
            held: holders.len() as u64,
        }
    }

    /// Renews `holder`'s slot: in memory a slot is gone only once given
    /// back, and is taken back as [`SlotStore::renew`] says, as on Redis.
    pub(crate) fn renew(&self, key: &Key, limit: &InFlightLimit, holder: u64) -> Renewal {
        let mut held = self.shard(key, limit);
        let holders = held.entry((limit.name.clone(), key.clone())).or_default();
        if holders.contains(&holder) {
            return Renewal::Renewed;
        }
        let within = (holders.len() as u64) < limit.max;
        holders.insert(holder);
        match within {
            true => Renewal::Retaken,
            false => Renewal::RetakenPastLimit,
        }
    }

    pub(crate) fn release(&self, key: &Key, limit: &InFlightLimit, holder: u64) {
        let mut held = self.shard(key, limit);
        let id = (limit.name.clone(), key.clone());
        if let Some(holders) = held.get_mut(&id) {
            holders.remove(&holder);
            if holders.is_empty() {
                held.remove(&id);
            }
        }
    }
}
