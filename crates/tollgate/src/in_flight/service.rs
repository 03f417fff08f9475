//! [`InFlight`], the service: takes a slot, or answers the request itself.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tollgate_core::{InFlightLimit, MemoryStore, SlotStore, Slots};
use tower_service::Service;

use crate::answer::{self};
use crate::extract::KeyExtractor;
use crate::fallback::{Answer, FailureMode};
use crate::response::Responder;

use super::body::InFlightBody;
use super::slot::{Holds, Slot};
use super::telemetry::Telemetry;

/// What an in-flight layer's services and their clones share.
pub(super) struct Shared<K, St> {
    pub(super) limit: InFlightLimit,
    pub(super) extractor: Arc<K>,
    pub(super) store: St,
    pub(super) failure: FailureMode,
    /// The local fallback's slots, and this instance's share of the limit.
    pub(super) local: MemoryStore,
    pub(super) local_limit: InFlightLimit,
    pub(super) responder: Responder,
    pub(super) telemetry: Telemetry,
}

/// The service of an [`InFlightLayer`](super::InFlightLayer).
pub struct InFlight<S, K, St> {
    pub(super) inner: S,
    pub(super) shared: Arc<Shared<K, St>>,
}

impl<S: Clone, K, St> Clone for InFlight<S, K, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, K, St> fmt::Debug for InFlight<S, K, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight")
            .field("inner", &self.inner)
            .field("limit", &self.shared.limit)
            .finish_non_exhaustive()
    }
}

type BoxedResponse<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<InFlightBody<B>>, E>> + Send>>;

impl<S, K, St, ReqBody, ResBody> Service<Request<ReqBody>> for InFlight<S, K, St>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    K: KeyExtractor<ReqBody>,
    St: SlotStore + Clone,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<InFlightBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxedResponse<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service `poll_ready` made ready goes with the request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        let Some(key) = shared.extractor.extract(&request) else {
            let cause = shared.extractor.missing(&request);
            let response = shared.responder.missing_key(&cause);
            return Box::pin(async move { Ok(response.map(InFlightBody::own)) });
        };
        Box::pin(async move {
            let holder = shared.store.new_holder();
            let acquired = shared.store.acquire(&key, &shared.limit, holder).await;
            let taken = acquired.map(|slots| (slots, Holds::Store));
            let local = || {
                let slots = shared
                    .local
                    .acquire_slot_sync(&key, &shared.local_limit, holder);
                Ok((slots, Holds::Local))
            };
            let slot: Option<Box<dyn Any + Send + Sync>> =
                match shared.failure.apply(taken, local, &shared.telemetry) {
                    Answer::Decided((Slots { acquired: true, .. }, Holds::Store)) => {
                        let store = shared.store.clone();
                        Some(Slot::boxed(
                            store,
                            key,
                            &shared.limit,
                            holder,
                            &shared.telemetry,
                        ))
                    }
                    Answer::Decided((Slots { acquired: true, .. }, Holds::Local)) => {
                        let store = shared.local.clone();
                        let limit = &shared.local_limit;
                        Some(Slot::boxed(store, key, limit, holder, &shared.telemetry))
                    }
                    Answer::Decided((
                        Slots {
                            acquired: false, ..
                        },
                        Holds::Store | Holds::Local,
                    )) => {
                        shared.telemetry.rejected();
                        let protocol = shared.responder.protocol;
                        let response = answer::in_flight_full(&shared.limit, protocol);
                        return Ok(response.map(InFlightBody::own));
                    }
                    Answer::LetThrough(_) => None,
                    Answer::Refused(refusal) => {
                        let response = shared.responder.refused(&refusal);
                        return Ok(response.map(InFlightBody::own));
                    }
                };
            // Held across the call: dropped (and given back) if the call
            // fails, panics or is dropped, else handed to the body.
            let response = inner.call(request).await?;
            Ok(response.map(|body| InFlightBody::inner(body, slot)))
        })
    }
}
