//! The future of an [`InFlight`](super::InFlight) request with a key:
//! take a slot (or let the failure policy answer), call the inner service,
//! and hand the slot to the response's body; and what the layer's
//! services share to do it.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::{Request, Response};
use tollgate_core::{InFlightLimit, Key, MemoryStore, SlotStore, Slots, StoreError};
use tower_service::Service;

use crate::answer;
use crate::fallback::{Answer, FailureMode, FailureReport, Handled, InstanceCount};
use crate::home::Home;
use crate::response::Responder;

use super::body::InFlightBody;
use super::slot::{Holds, LocalHold, Slot, give_back};
use super::telemetry::Telemetry;

/// What an in-flight layer's services and their clones share.
pub(super) struct Shared<K, St> {
    pub(super) limit: InFlightLimit,
    pub(super) extractor: Arc<K>,
    pub(super) store: St,
    pub(super) failure: FailureMode,
    /// The local fallback's slots, and how many instances share the
    /// limit.
    pub(super) local: MemoryStore,
    pub(super) instances: InstanceCount,
    pub(super) responder: Responder,
    pub(super) telemetry: Telemetry,
    /// The runtime the layer made the service on, where slots are renewed
    /// and given back when the request's runtime would leave that unrun.
    pub(super) home: Home,
}

/// The response future of an [`InFlight`](super::InFlight) service.
pub(super) type BoxedResponse<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<InFlightBody<B>>, E>> + Send>>;

/// Takes a slot of `key` for `request` and calls `inner` while holding it.
pub(super) async fn respond<S, K, St, ReqBody, ResBody>(
    mut inner: S,
    shared: Arc<Shared<K, St>>,
    key: Key,
    request: Request<ReqBody>,
) -> Result<Response<InFlightBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    St: SlotStore + Clone,
{
    let holder = shared.store.new_holder();
    let taking = Taking {
        home: &shared.home,
        store: &shared.store,
        key: &key,
        limit: &shared.limit,
        holder,
    };
    let acquired = shared.store.acquire(&key, &shared.limit, holder).await;
    std::mem::forget(taking);
    // A failure that may have come after the store took the slot (a reply
    // past the deadline, or lost on its way back): the slot is given back,
    // unless the failure policy lets the request run (locally, or open),
    // whose registration holds it in the store while the request runs and
    // gives it back when it ends (given back now, it would be taken back by the
    // registration's renewal, and a give-back tried again after that
    // would take the running request out of the count). Any other answer
    // is the slot's whole story (an error before the call, such as an open
    // breaker, took nothing).
    let lost = acquired
        .as_ref()
        .err()
        .is_some_and(StoreError::may_have_acted);
    let unheld = || {
        if lost {
            give_back(&shared.store, &key, &shared.limit, holder, &shared.home);
        }
    };
    // A request that runs while the store fails, registered there.
    let registered = |key| {
        let store = shared.store.clone();
        let (telemetry, home) = (&shared.telemetry, &shared.home);
        Slot::registered(store, key, &shared.limit, holder, telemetry, home, lost)
    };
    let taken = acquired.map(|slots| (slots, Holds::Store));
    // This instance's share of the limit, under the count of now.
    let local_limit = || shared.limit.divided(shared.instances.get());
    let local = || {
        let slots = shared.local.acquire_slot_sync(&key, &local_limit(), holder);
        shared.telemetry.handled(match slots.acquired {
            true => Handled::LocalAllowed,
            false => Handled::LocalLimited,
        });
        Ok((slots, Holds::Local))
    };
    let slot: Option<Box<dyn Any + Send + Sync>> =
        match shared.failure.apply(taken, local, &shared.telemetry) {
            Answer::Decided((Slots { acquired: true, .. }, Holds::Store))
            | Answer::Local((Slots { acquired: true, .. }, Holds::Store)) => {
                let store = shared.store.clone();
                // Held in the local fallback too, where it can take over:
                // under `Local`, from a store that can fail (one of leases,
                // across the network); not from memory.
                let local =
                    (shared.failure == FailureMode::Local && shared.store.leases()).then(|| {
                        LocalHold::new(shared.local.clone(), key.clone(), local_limit(), holder)
                    });
                let (telemetry, home) = (&shared.telemetry, &shared.home);
                let slot = Slot::boxed(store, key, &shared.limit, holder, telemetry, home);
                Some(Box::new((slot, local)))
            }
            Answer::Decided((Slots { acquired: true, .. }, Holds::Local))
            | Answer::Local((Slots { acquired: true, .. }, Holds::Local)) => {
                Some(registered(key).with_local(shared.local.clone(), &local_limit()))
            }
            Answer::Decided((
                Slots {
                    acquired: false, ..
                },
                holds,
            ))
            | Answer::Local((
                Slots {
                    acquired: false, ..
                },
                holds,
            )) => {
                unheld();
                shared.telemetry.rejected();
                let protocol = shared.responder.protocol;
                // The limit that refused: the local fallback's is this
                // instance's share.
                let response = match holds {
                    Holds::Store => answer::in_flight_full(&shared.limit, protocol),
                    Holds::Local => answer::in_flight_full(&local_limit(), protocol),
                };
                return Ok(response.map(InFlightBody::own));
            }
            Answer::LetThrough(_) => Some(Box::new(registered(key))),
            Answer::Refused(refusal) => {
                unheld();
                let response = shared.responder.refused(&refusal);
                return Ok(response.map(InFlightBody::own));
            }
        };
    // Held across the call: dropped (and given back) if the call
    // fails, panics or is dropped, else handed to the body.
    let response = inner.call(request).await?;
    Ok(response.map(|body| InFlightBody::inner(body, slot)))
}

/// A slot being taken in the store: if the request is dropped before the
/// store's answer (its client went away), the store may hold the slot
/// already, and it is given back rather than held until its lease ends.
/// Forgotten once the store answers.
struct Taking<'a, St: SlotStore + Clone> {
    home: &'a Home,
    store: &'a St,
    key: &'a Key,
    limit: &'a InFlightLimit,
    holder: u64,
}

impl<St: SlotStore + Clone> Drop for Taking<'_, St> {
    fn drop(&mut self) {
        give_back(self.store, self.key, self.limit, self.holder, self.home);
    }
}
