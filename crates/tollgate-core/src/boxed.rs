//! [`BoxStore`]: any store behind one type, chosen at run time.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::decision::Decision;
use crate::error::StoreError;
use crate::inflight::{InFlightLimit, Renewal, SlotStore, Slots};
use crate::key::Key;
use crate::policy::Policy;
use crate::settle::Settlement;
use crate::store::Store;

/// Any [`Store`] behind one type: for a service that picks its store at
/// startup (in memory on a laptop, Redis in production) without an enum
/// of its own. Cloning is cheap; clones share the store.
///
/// A store that answers at once ([`Store::try_check_now`], the memory
/// store) still does, without a boxed future; a store that waits (Redis)
/// boxes the future of each decision. [`Store::last_known`] is passed
/// through, so a local fallback still takes over a key's use. Made with
/// [`BoxStore::with_slots`], it also holds the slots of in-flight limits
/// ([`SlotStore`]).
///
/// ```
/// use tollgate_core::{Algorithm, BoxStore, Key, MemoryStore, Policy, Store};
///
/// let store = BoxStore::new(MemoryStore::new());
/// let policy = Policy::new("api", Algorithm::Gcra, "10/s")?;
/// let decision = store.try_check_now(&Key::user("ada"), &policy, 1).unwrap()?;
/// assert_eq!(decision.remaining(), 9);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct BoxStore {
    store: Arc<dyn DynStore>,
    slots: Option<Arc<dyn DynSlots>>,
}

type Boxed<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

trait DynSlots: Send + Sync + 'static {
    fn acquire<'a>(
        &'a self,
        key: &'a Key,
        limit: &'a InFlightLimit,
        holder: u64,
    ) -> Boxed<'a, Slots>;
    fn renew<'a>(
        &'a self,
        key: &'a Key,
        limit: &'a InFlightLimit,
        holder: u64,
    ) -> Boxed<'a, Renewal>;
    fn release<'a>(&'a self, key: &'a Key, limit: &'a InFlightLimit, holder: u64) -> Boxed<'a, ()>;
    fn release_now(&self, key: &Key, limit: &InFlightLimit, holder: u64) -> bool;
    fn leases(&self) -> bool;
}

impl<S: SlotStore> DynSlots for S {
    fn acquire<'a>(
        &'a self,
        key: &'a Key,
        limit: &'a InFlightLimit,
        holder: u64,
    ) -> Boxed<'a, Slots> {
        Box::pin(SlotStore::acquire(self, key, limit, holder))
    }

    fn renew<'a>(
        &'a self,
        key: &'a Key,
        limit: &'a InFlightLimit,
        holder: u64,
    ) -> Boxed<'a, Renewal> {
        Box::pin(SlotStore::renew(self, key, limit, holder))
    }

    fn release<'a>(&'a self, key: &'a Key, limit: &'a InFlightLimit, holder: u64) -> Boxed<'a, ()> {
        Box::pin(SlotStore::release(self, key, limit, holder))
    }

    fn release_now(&self, key: &Key, limit: &InFlightLimit, holder: u64) -> bool {
        SlotStore::release_now(self, key, limit, holder)
    }

    fn leases(&self) -> bool {
        SlotStore::leases(self)
    }
}

/// A [`BoxStore`] made with [`BoxStore::new`] holds no slots.
#[derive(Debug, thiserror::Error)]
#[error("this BoxStore holds no in-flight slots: make it with BoxStore::with_slots")]
struct NoSlots;

impl BoxStore {
    /// `store` behind one type, holding the slots of in-flight limits too.
    ///
    /// ```
    /// use tollgate_core::{BoxStore, InFlightLimit, Key, MemoryStore, SlotStore};
    ///
    /// # futures_block_on(async {
    /// let store = BoxStore::with_slots(MemoryStore::new());
    /// let exports = InFlightLimit::new("exports", 1)?;
    /// let key = Key::user("ada");
    /// assert!(store.acquire(&key, &exports, 1).await?.acquired);
    /// assert!(!store.acquire(&key, &exports, 2).await?.acquired);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// # fn futures_block_on<F: Future>(f: F) -> F::Output {
    /// #     let mut f = std::pin::pin!(f);
    /// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    /// #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
    /// # }
    /// ```
    pub fn with_slots<S: Store + SlotStore>(store: S) -> Self {
        let store = Arc::new(store);
        Self {
            store: store.clone(),
            slots: Some(store),
        }
    }

    fn slots(&self) -> Result<&dyn DynSlots, StoreError> {
        self.slots
            .as_deref()
            // No call is made: nothing may have been taken.
            .ok_or_else(|| StoreError::unavailable(NoSlots))
    }
}

/// The slots of the store given to [`BoxStore::with_slots`]. A store made
/// with [`BoxStore::new`] fails every call as
/// [unavailable](StoreError::Unavailable), having taken nothing, and holds
/// no leases to renew.
///
/// ```
/// use tollgate_core::{BoxStore, InFlightLimit, Key, MemoryStore, SlotStore};
///
/// # futures_block_on(async {
/// let store = BoxStore::new(MemoryStore::new());
/// let exports = InFlightLimit::new("exports", 1)?;
/// let error = store.acquire(&Key::global(), &exports, 1).await.unwrap_err();
/// assert!(!error.may_have_acted());
/// assert!(!store.leases());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// # fn futures_block_on<F: Future>(f: F) -> F::Output {
/// #     let mut f = std::pin::pin!(f);
/// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
/// #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
/// # }
/// ```
impl SlotStore for BoxStore {
    async fn acquire(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> Result<Slots, StoreError> {
        self.slots()?.acquire(key, limit, holder).await
    }

    async fn renew(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> Result<Renewal, StoreError> {
        self.slots()?.renew(key, limit, holder).await
    }

    async fn release(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> Result<(), StoreError> {
        self.slots()?.release(key, limit, holder).await
    }

    fn release_now(&self, key: &Key, limit: &InFlightLimit, holder: u64) -> bool {
        self.slots
            .as_deref()
            .is_some_and(|s| s.release_now(key, limit, holder))
    }

    fn leases(&self) -> bool {
        // Without slots nothing is held, so nothing is renewed.
        self.slots.as_deref().is_some_and(DynSlots::leases)
    }
}

/// The decision future of a boxed store.
type BoxedCheck<'a> = Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + Send + 'a>>;

/// The reset future of a boxed store.
type BoxedReset<'a> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;

/// [`Store`] made object safe.
trait DynStore: Send + Sync + 'static {
    fn check<'a>(&'a self, key: &'a Key, policy: &'a Policy, cost: u64) -> BoxedCheck<'a>;
    fn try_check_now(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>>;
    fn status<'a>(&'a self, key: &'a Key, policy: &'a Policy) -> BoxedCheck<'a>;
    fn reset<'a>(&'a self, key: &'a Key, policy: &'a Policy) -> BoxedReset<'a>;
    fn settle<'a>(&'a self, key: &'a Key, policy: &'a Policy, s: Settlement) -> BoxedCheck<'a>;
    fn block<'a>(&'a self, key: &'a Key, policy: &'a Policy, d: Duration) -> BoxedReset<'a>;
    fn last_known(&self, key: &Key, policy: &Policy) -> Option<Decision>;
    fn type_name(&self) -> &'static str;
    fn name(&self) -> &'static str;
}

impl<S: Store> DynStore for S {
    fn check<'a>(&'a self, key: &'a Key, policy: &'a Policy, cost: u64) -> BoxedCheck<'a> {
        Box::pin(Store::check(self, key, policy, cost))
    }

    fn try_check_now(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        Store::try_check_now(self, key, policy, cost)
    }

    fn status<'a>(&'a self, key: &'a Key, policy: &'a Policy) -> BoxedCheck<'a> {
        Box::pin(Store::status(self, key, policy))
    }

    fn reset<'a>(&'a self, key: &'a Key, policy: &'a Policy) -> BoxedReset<'a> {
        Box::pin(Store::reset(self, key, policy))
    }

    fn settle<'a>(&'a self, key: &'a Key, policy: &'a Policy, s: Settlement) -> BoxedCheck<'a> {
        Box::pin(Store::settle(self, key, policy, s))
    }

    fn block<'a>(&'a self, key: &'a Key, policy: &'a Policy, d: Duration) -> BoxedReset<'a> {
        Box::pin(Store::block(self, key, policy, d))
    }

    fn last_known(&self, key: &Key, policy: &Policy) -> Option<Decision> {
        Store::last_known(self, key, policy)
    }

    fn type_name(&self) -> &'static str {
        std::any::type_name::<S>()
    }

    fn name(&self) -> &'static str {
        Store::name(self)
    }
}

impl BoxStore {
    /// Boxes `store`.
    pub fn new<S: Store>(store: S) -> Self {
        Self {
            store: Arc::new(store),
            slots: None,
        }
    }
}

impl Store for BoxStore {
    async fn check(&self, key: &Key, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        self.store.check(key, policy, cost).await
    }

    fn try_check_now(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        self.store.try_check_now(key, policy, cost)
    }

    async fn status(&self, key: &Key, policy: &Policy) -> Result<Decision, StoreError> {
        self.store.status(key, policy).await
    }

    async fn reset(&self, key: &Key, policy: &Policy) -> Result<(), StoreError> {
        self.store.reset(key, policy).await
    }

    async fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: Settlement,
    ) -> Result<Decision, StoreError> {
        self.store.settle(key, policy, settlement).await
    }

    async fn block(
        &self,
        key: &Key,
        policy: &Policy,
        duration: Duration,
    ) -> Result<(), StoreError> {
        self.store.block(key, policy, duration).await
    }

    fn last_known(&self, key: &Key, policy: &Policy) -> Option<Decision> {
        self.store.last_known(key, policy)
    }

    fn name(&self) -> &'static str {
        self.store.name()
    }
}

impl fmt::Debug for BoxStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BoxStore")
            .field(&self.store.type_name())
            .finish()
    }
}
