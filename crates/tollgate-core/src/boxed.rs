//! [`BoxStore`]: any store behind one type, chosen at run time.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::decision::Decision;
use crate::error::StoreError;
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
/// through, so a local fallback still takes over a key's use.
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
}

impl BoxStore {
    /// Boxes `store`.
    pub fn new<S: Store>(store: S) -> Self {
        Self {
            store: Arc::new(store),
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
}

impl fmt::Debug for BoxStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BoxStore")
            .field(&self.store.type_name())
            .finish()
    }
}
