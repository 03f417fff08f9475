//! [`MeteredStore`]: a store whose admissions and settlements are
//! recorded in a usage ledger.

use crate::decision::{DecidedBy, Decision};
use crate::error::StoreError;
use crate::inflight::SlotStore;
use crate::key::Key;
use crate::policy::Policy;
use crate::settle::Settlement;
use crate::store::Store;

use super::Ledger;

/// A store that records in `ledger` the cost of each request it admits,
/// and each settlement it takes, so that the ledger holds each key's
/// settled usage per policy.
///
/// - An admitted check of cost `n` records `n` at the time the store
///   counted it ([`Decision::reserved_at`]: the decision's time, or a
///   lease's grant for a request spent from one); a denied one, and a
///   cost of 0 (a peek, a status), record nothing.
/// - A settlement the store took records its difference (the charge, or
///   minus the refund) in the buckets of the reservation's time
///   ([`Settlement::reserved_at`]), so that each bucket holds the actual
///   cost of the requests admitted in it, whenever they settled. A
///   settlement of a key blocked meanwhile is recorded too: the request
///   ran. A settlement that failed is not: the store did not take it
///   (the reservation stands), or its reply was lost or late after it
///   did (a remote store's timeout), and then the ledger keeps the
///   reserved cost while the limit counted the settled one.
/// - A reset or a block changes the limiter's state, never the ledger:
///   billing history is not erased.
/// - Wrapped around a leased store, the units spent from a lease are
///   recorded as they are spent, each at the lease's grant (its
///   [`Decision::reserved_at`]); a lease's grant and the units given back
///   are not usage.
/// - Under a layer's failure policy, a request that the local fallback
///   admits (or that `Open` lets through) while the store fails is not
///   recorded: the ledger holds what the shared limit counted.
///
/// ```
/// use tollgate_core::ledger::{Granularity, Ledger, MemoryLedger, MeteredStore, UsageQuery};
/// use tollgate_core::{Algorithm, FakeClock, Key, MemoryStore, Policy, Settlement, Store, Timestamp};
///
/// # futures_lite_block_on(async {
/// let clock = FakeClock::new(Timestamp::from_secs(1_767_225_600));
/// let ledger = MemoryLedger::new();
/// let store = MeteredStore::new(MemoryStore::builder().clock(clock).build()?, ledger.clone());
/// let policy = Policy::new("tokens", Algorithm::TokenBucket, "1000/h")?;
/// let ada = Key::user("ada");
/// let reserved = store.check(&ada, &policy, 100).await?;
/// store.settle(&ada, &policy, Settlement::of(&reserved, 100, 42)).await?;
/// store.reset(&ada, &policy).await?; // the limit starts afresh; the bill stays
/// let day = UsageQuery::new(Granularity::Day, reserved.now(), Timestamp::from_secs(1_767_312_000))?;
/// assert_eq!(ledger.usage(&ada, "tokens", day).await?.total(), 42);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// # fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     let mut f = std::pin::pin!(f);
/// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
/// #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct MeteredStore<S, L> {
    store: S,
    ledger: L,
}

impl<S, L> MeteredStore<S, L> {
    /// `store`, recording in `ledger`.
    pub fn new(store: S, ledger: L) -> Self {
        Self { store, ledger }
    }

    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.store
    }

    /// The ledger.
    pub fn ledger(&self) -> &L {
        &self.ledger
    }
}

impl<S: Store, L: Ledger> MeteredStore<S, L> {
    /// Records an admitted request's cost, if the store behind counted it:
    /// not what a local fallback admitted in its place (wrapped around a
    /// `FallbackStore`, or spent from a lease a fallback granted), nor
    /// what no one counted.
    fn admitted(&self, key: &Key, policy: &Policy, cost: u64, decision: &Decision) {
        if cost > 0 && decision.is_allowed() && decision.decided_by() == DecidedBy::Store {
            // When the store counted it, as its settlement is (see
            // `Decision::reserved_at`): a charge and its refund land in
            // one bucket.
            self.ledger
                .record(key, policy.name(), decision.reserved_at(), cost);
        }
    }
}

impl<S: Store, L: Ledger> Store for MeteredStore<S, L> {
    store_pass_through!(seen: admitted);

    async fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: Settlement,
    ) -> Result<Decision, StoreError> {
        let decision = self.store.settle(key, policy, settlement).await?;
        // A reservation the store did not count was not recorded.
        if settlement.decided_by() != DecidedBy::Store {
            return Ok(decision);
        }
        let at = settlement.reserved_at();
        self.ledger
            .record(key, policy.name(), at, settlement.charge());
        self.ledger
            .refund(key, policy.name(), at, settlement.refund());
        Ok(decision)
    }
}

// In-flight slots are not usage: they pass to the wrapped store.
slots_pass_through!(impl<S: SlotStore, L: Ledger> for MeteredStore<S, L>);
