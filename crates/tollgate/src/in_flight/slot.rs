//! A slot held by a request, renewed while it runs and given back when dropped.

use std::any::Any;

use tollgate_core::{InFlightLimit, Key, SlotStore};

use super::telemetry::Telemetry;
/// Where a request's slot was taken: in the layer's store, or, while it
/// fails, in the local fallback.
#[derive(Debug, Clone, Copy)]
pub(super) enum Holds {
    Store,
    Local,
}

/// A slot held: given back when dropped, and its lease renewed meanwhile
/// in a store of leases.
pub(super) struct Slot<St: SlotStore + Clone> {
    store: St,
    key: Key,
    limit: InFlightLimit,
    holder: u64,
    renewal: Option<tokio::task::AbortHandle>,
    telemetry: Telemetry,
}

impl<St: SlotStore + Clone> Slot<St> {
    /// A slot taken in `store`, as the response body holds it.
    pub(super) fn boxed(
        store: St,
        key: Key,
        limit: &InFlightLimit,
        holder: u64,
        telemetry: &Telemetry,
    ) -> Box<dyn Any + Send + Sync> {
        Box::new(Self::take(store, key, limit.clone(), holder, telemetry))
    }

    fn take(store: St, key: Key, limit: InFlightLimit, holder: u64, telemetry: &Telemetry) -> Self {
        telemetry.held(1.0);
        // Outside a runtime nothing renews: the slot is held until its
        // lease ends, or it is given back.
        let runtime = store
            .leases()
            .then(tokio::runtime::Handle::try_current)
            .and_then(Result::ok);
        let renewal = runtime.map(|runtime| {
            let (store, key, limit) = (store.clone(), key.clone(), limit.clone());
            let telemetry = telemetry.clone();
            let every = limit.lease_duration() / 3;
            runtime
                .spawn(async move {
                    let mut tick = tokio::time::interval(every);
                    tick.tick().await;
                    // Renews until the slot is given back. A slot found gone
                    // is taken back, past the limit if new requests hold every
                    // slot (the request cannot be un-run), so that new
                    // requests count this one again within a renewal period of
                    // the store losing its slots.
                    loop {
                        tick.tick().await;
                        if let Ok(renewal) = store.renew(&key, &limit, holder).await
                            && renewal.found_gone()
                        {
                            telemetry.slot_gone(renewal);
                        }
                    }
                })
                .abort_handle()
        });
        Self {
            store,
            key,
            limit,
            holder,
            renewal,
            telemetry: telemetry.clone(),
        }
    }
}

impl<St: SlotStore + Clone> Drop for Slot<St> {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        self.telemetry.held(-1.0);
        give_back(&self.store, &self.key, &self.limit, self.holder);
    }
}

/// Gives `holder`'s slot back: at once if the store needs no I/O, else in
/// the background. Outside a runtime the lease frees the slot. Giving back
/// a slot the store never took changes nothing: slots are held by holder.
pub(super) fn give_back<St: SlotStore + Clone>(
    store: &St,
    key: &Key,
    limit: &InFlightLimit,
    holder: u64,
) {
    if store.release_now(key, limit, holder) {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let (store, key, limit) = (store.clone(), key.clone(), limit.clone());
        runtime.spawn(async move {
            let _ = store.release(&key, &limit, holder).await;
        });
    }
}
