//! The store abstraction.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::Policy;
use crate::settle::Settlement;
#[cfg(doc)]
use crate::state::KeyState;

/// Where rate-limit state lives: decides one request atomically.
///
/// A store owns its clock. `check` must decide and consume atomically per
/// key: two concurrent checks of one key never both see the same remaining
/// allowance. A cost of 0 is a peek that consumes nothing and creates no
/// state. A store error is never a decision: the caller applies its failure
/// policy.
///
/// Stores that can decide without I/O also implement
/// [`try_check_now`](Store::try_check_now), which lets callers skip the
/// future (and its allocation) entirely.
///
/// A store must give exactly the decisions of the [reference
/// algorithms](crate::state). The `testing` feature's conformance suite,
/// `tollgate_core::testing::check_store`, checks that on any store built on
/// a `FakeClock`; the memory store and the Redis store run it in their
/// tests, and a store of your own should too.
///
/// # A store of your own
///
/// A new backend needs no code of its own for the algorithms, and no
/// change to this crate. It keeps each key's [`KeyState`] in its saved
/// form, bytes, under the policy's name and the key, and for each
/// operation loads them, lets the state decide, and keeps the new bytes,
/// atomically (in a transaction, under a lock, or with a
/// compare-and-swap). Atomic includes a key's first request: two
/// instances that both find no state must not both write a fresh one (a
/// row lock on a row that does not exist yet locks nothing; insert the
/// first state only if none is there, and decide again if one is). A
/// state whose [`expires_at`](KeyState::expires_at) has passed decides as
/// a fresh one and may be deleted. Carry-over to a new configuration,
/// settling, blocks and their end all come with the state. A complete (if unbounded) store
/// over a map of bytes, which passes the conformance suite (`tests/contract.rs`
/// runs it):
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::Mutex;
/// use std::time::Duration;
/// use tollgate_core::state::KeyState;
/// use tollgate_core::{
///     Algorithm, Clock, Decision, FakeClock, Key, Policy, Settlement, Store, StoreError, Timestamp,
/// };
///
/// #[derive(Default)]
/// struct BytesStore {
///     clock: FakeClock,
///     map: Mutex<HashMap<(String, Key), Vec<u8>>>,
/// }
///
/// impl BytesStore {
///     fn with_state(
///         &self,
///         key: &Key,
///         policy: &Policy,
///         f: impl FnOnce(&mut KeyState, Timestamp) -> Decision,
///     ) -> Result<Decision, StoreError> {
///         let now = self.clock.now();
///         let mut map = self.map.lock().unwrap();
///         let slot = (policy.name().to_owned(), key.clone());
///         let mut state = match map.get(&slot) {
///             Some(bytes) => KeyState::from_bytes(policy, bytes).map_err(StoreError::backend)?,
///             None => KeyState::new(policy, now),
///         };
///         let decision = f(&mut state, now);
///         // A state that has expired is forgotten: a peek creates nothing.
///         if state.expires_at(policy) > now {
///             map.insert(slot, state.to_bytes());
///         } else {
///             map.remove(&slot);
///         }
///         Ok(decision)
///     }
/// }
///
/// impl Store for BytesStore {
///     async fn check(&self, key: &Key, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
///         self.with_state(key, policy, |state, now| state.decide(policy, now, cost))
///     }
///
///     async fn settle(&self, key: &Key, policy: &Policy, settlement: Settlement) -> Result<Decision, StoreError> {
///         self.with_state(key, policy, |state, now| state.settle(policy, now, &settlement))
///     }
///
///     async fn reset(&self, key: &Key, policy: &Policy) -> Result<(), StoreError> {
///         self.map.lock().unwrap().remove(&(policy.name().to_owned(), key.clone()));
///         Ok(())
///     }
///
///     async fn block(&self, key: &Key, policy: &Policy, duration: Duration) -> Result<(), StoreError> {
///         let state = KeyState::blocked_for(self.clock.now(), duration);
///         self.map.lock().unwrap().insert((policy.name().to_owned(), key.clone()), state.to_bytes());
///         Ok(())
///     }
/// }
///
/// # futures_lite_block_on(async {
/// let store = BytesStore::default();
/// let policy = Policy::new("demo", Algorithm::Gcra, "1/s")?;
/// let key = Key::user("ada");
/// let reserved = store.check(&key, &policy, 1).await?;
/// assert!(reserved.is_allowed());
/// assert!(!store.check(&key, &policy, 1).await?.is_allowed());
/// store.settle(&key, &policy, Settlement::of(&reserved, 1, 0)).await?;
/// assert!(store.check(&key, &policy, 1).await?.is_allowed());
/// store.block(&key, &policy, Duration::from_secs(60)).await?;
/// let denied = store.check(&key, &policy, 1).await?;
/// assert_eq!(denied.retry_after(), Some(Duration::from_secs(60)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// # fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     let mut f = std::pin::pin!(f);
/// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
/// #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
/// # }
/// ```
pub trait Store: Send + Sync + 'static {
    /// Decides a request of `cost` by `key` under `policy`, and consumes it
    /// if admitted.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot decide (full, unreachable,
    /// too slow).
    fn check(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Decides without waiting, for stores that need no I/O. Returns `None`
    /// when the store must be asked through [`check`](Store::check); the
    /// default does.
    fn try_check_now(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        let _ = (key, policy, cost);
        None
    }

    /// The state of `key` under `policy`, consuming nothing: a peek, the
    /// decision of a request of cost 0, which is never denied (but for a
    /// key an operator blocked: denied for the rest of the block). The default
    /// asks [`check`](Store::check) with cost 0.
    ///
    /// # Errors
    ///
    /// As [`check`](Store::check).
    fn status(
        &self,
        key: &Key,
        policy: &Policy,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.check(key, policy, 0)
    }

    /// Forgets what `key` has used under `policy`'s name, whatever
    /// configuration it was kept under: the key starts afresh. In
    /// tollgate's stores, a refund of a request reserved at or before the
    /// reset then changes nothing for a while (see [`Settlement`]'s
    /// fence).
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot reach its state.
    fn reset(
        &self,
        key: &Key,
        policy: &Policy,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Settles the actual cost of a request admitted earlier against the
    /// cost it reserved (see [`Settlement`] for what a charge beyond the
    /// allowance does under each algorithm), atomically, and reports the
    /// key's state after it: an allowed decision whose remaining and reset
    /// are what the response's headers show. A key blocked meanwhile
    /// stays blocked: the decision is the block's denial, and nothing
    /// changes. In tollgate's stores, a refund or a charge of a key kept
    /// under another configuration of the policy (the request was
    /// reserved under a plan, an override or a deploy that the key has
    /// moved on from) changes nothing either, unless the key's state
    /// carries over to `policy` whole (the same algorithm, and a limit of
    /// each of its periods) or holds nothing any more (every limit whole
    /// again; under a calendar, every limit empty), and reports the key's
    /// state as `policy` reads it (the memory store knows the last eight
    /// configurations of a name: of a key kept under an older one, a
    /// fresh state): carrying the key over would drop a limit of its own,
    /// and what that limit holds. Such a charge goes uncounted: one
    /// request's excess missed, rather than a fresh limit handed to the
    /// key.
    ///
    /// # Errors
    ///
    /// As [`check`](Store::check).
    fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: Settlement,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Blocks `key` under `policy`'s name for `duration` (at most 2^50
    /// µs), whatever configuration of the policy decides it: its state is
    /// forgotten, every request is denied with a `Retry-After` of exactly
    /// the rest of the block (see [`blocked`](crate::state::blocked)), a
    /// settlement changes nothing, and when the block ends the key starts
    /// afresh. [`reset`](Store::reset) lifts a block; a new block replaces
    /// the old one. In tollgate's stores, a refund of a request reserved
    /// at or before the block changes nothing for a while after it either
    /// (see [`Settlement`]'s fence).
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot reach its state.
    fn block(
        &self,
        key: &Key,
        policy: &Policy,
        duration: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The last decision the store made for `key` under `policy`, if it
    /// still remembers it: for a local fallback that takes over while the
    /// store fails, so that the key's use carries over (see
    /// [`PolicyState::seeded`](crate::state::PolicyState::seeded) and
    /// [`MemoryStore::seed`](crate::MemoryStore::seed)). A store that
    /// remembers a decision made under another configuration of the
    /// policy's name answers it carried over to `policy`
    /// ([`PolicyState::carry_to`](crate::state::PolicyState::carry_to)), as
    /// its own state would be. The default remembers nothing.
    fn last_known(&self, key: &Key, policy: &Policy) -> Option<Decision> {
        let _ = (key, policy);
        None
    }

    /// What the store is, in a word: `memory`, `redis`, ... Traces name
    /// the store that decided a request by it (the span field
    /// `tollgate.store`), so it is made once, not per request. A store
    /// that wraps another (a ledger's, a boxed one) answers the wrapped
    /// store's name. The default is the type's name, as
    /// [`std::any::type_name`] gives it: a store of your own should answer
    /// a short name of its backend (`postgres`, say).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate_core::{BoxStore, MemoryStore, Store};
    ///
    /// assert_eq!(MemoryStore::new().name(), "memory");
    /// assert_eq!(Arc::new(MemoryStore::new()).name(), "memory");
    /// assert_eq!(BoxStore::new(MemoryStore::new()).name(), "memory");
    /// ```
    fn name(&self) -> &'static str {
        std::any::type_name::<Self>()
    }
}

impl<S: Store> Store for Arc<S> {
    fn reset(
        &self,
        key: &Key,
        policy: &Policy,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).reset(key, policy)
    }

    fn check(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).check(key, policy, cost)
    }

    fn status(
        &self,
        key: &Key,
        policy: &Policy,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).status(key, policy)
    }

    fn try_check_now(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        (**self).try_check_now(key, policy, cost)
    }

    fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: Settlement,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).settle(key, policy, settlement)
    }

    fn block(
        &self,
        key: &Key,
        policy: &Policy,
        duration: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).block(key, policy, duration)
    }

    fn last_known(&self, key: &Key, policy: &Policy) -> Option<Decision> {
        (**self).last_known(key, policy)
    }

    fn name(&self) -> &'static str {
        (**self).name()
    }
}
