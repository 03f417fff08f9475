//! [`InFlight`], the service: takes a slot, or answers the request itself.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tollgate_core::SlotStore;
use tower_service::Service;

use crate::extract::KeyExtractor;
use crate::ready::take_ready;

use super::body::InFlightBody;
use super::future::{BoxedResponse, Shared, respond};

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
        let inner = take_ready(&mut self.inner);
        let shared = self.shared.clone();
        let Some(key) = shared.extractor.extract(&request) else {
            let cause = shared.extractor.missing(&request);
            let response = shared.responder.missing_key(&cause);
            return Box::pin(async move { Ok(response.map(InFlightBody::own)) });
        };
        Box::pin(respond(inner, shared, key, request))
    }
}
