//! [`WatchedStore`]: a store whose decisions are counted in [`TopKeys`].

use crate::decision::Decision;
use crate::error::StoreError;
use crate::inflight::SlotStore;
use crate::key::Key;
use crate::policy::Policy;
use crate::settle::Settlement;
use crate::store::Store;

use super::TopKeys;

/// A store that counts each decision of a request in [`TopKeys`]: every
/// check of a cost above 0 in [`Active`](super::Ranking::Active), and
/// each one denied in [`Limited`](super::Ranking::Limited) as well. A
/// decision counts once, whatever its cost. Peeks and statuses (cost 0),
/// settlements, resets, blocks and in-flight slots are not counted, nor
/// a check the store failed to decide: under a layer's failure policy,
/// the decisions of the local fallback are not seen, as for
/// [`MeteredStore`](crate::ledger::MeteredStore).
///
/// ```
/// use tollgate_core::topkeys::{Ranking, TopKeys, WatchedStore};
/// use tollgate_core::{Algorithm, Key, MemoryStore, Policy, Store};
///
/// # futures_lite_block_on(async {
/// let top = TopKeys::new();
/// let store = WatchedStore::new(MemoryStore::new(), top.clone());
/// let policy = Policy::new("api", Algorithm::Gcra, "1/min")?;
/// store.check(&Key::user("ada"), &policy, 1).await?;
/// store.check(&Key::user("ada"), &policy, 1).await?; // denied
/// store.status(&Key::user("ada"), &policy).await?; // not counted
/// assert_eq!(top.summary("api", Ranking::Active).total(), 2);
/// assert_eq!(top.summary("api", Ranking::Limited).keys()[0].count(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// # fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     let mut f = std::pin::pin!(f);
/// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
/// #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct WatchedStore<S> {
    store: S,
    top: TopKeys,
}

impl<S> WatchedStore<S> {
    /// `store`, counting in `top`.
    pub fn new(store: S, top: TopKeys) -> Self {
        Self { store, top }
    }

    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.store
    }

    /// The top keys it counts in.
    pub fn top_keys(&self) -> &TopKeys {
        &self.top
    }

    /// The wrapped store, unwrapped.
    pub fn into_inner(self) -> S {
        self.store
    }

    fn decided(&self, key: &Key, policy: &Policy, cost: u64, decision: &Decision) {
        if cost > 0 {
            self.top.record(key, policy.name(), !decision.is_allowed());
        }
    }
}

impl<S: Store> Store for WatchedStore<S> {
    store_pass_through!(seen: decided);

    async fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: Settlement,
    ) -> Result<Decision, StoreError> {
        self.store.settle(key, policy, settlement).await
    }
}

// In-flight slots are not decisions of a rate: they pass to the wrapped
// store.
slots_pass_through!(impl<S: SlotStore> for WatchedStore<S>);
