//! [`AdaptiveConcurrency`], the service: admits, queues or sheds.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::body::ResponseBody;
use crate::ready::take_ready;
use crate::response::Responder;

use super::classify::Classify;
use super::future::{Held, respond, shed};
use super::gate::{Entry, Gate};

/// The service of an [`AdaptiveConcurrencyLayer`](super::AdaptiveConcurrencyLayer).
pub struct AdaptiveConcurrency<S, C> {
    pub(super) inner: S,
    pub(super) classify: Arc<C>,
    pub(super) gate: Arc<Gate>,
    pub(super) responder: Arc<Responder>,
}

impl<S: Clone, C> Clone for AdaptiveConcurrency<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            classify: self.classify.clone(),
            gate: self.gate.clone(),
            responder: self.responder.clone(),
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for AdaptiveConcurrency<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveConcurrency")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The response future of an [`AdaptiveConcurrency`] service.
type BoxedResponse<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, E>> + Send>>;

impl<S, C, ReqBody, ResBody> Service<Request<ReqBody>> for AdaptiveConcurrency<S, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    C: Classify<ReqBody>,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxedResponse<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let inner = take_ready(&mut self.inner);
        let class = self.classify.classify(&request);
        match self.gate.enter(class) {
            Entry::Admitted(permit) => {
                // Held from now: a future dropped before its first poll
                // still gives the slot back.
                let held = Held::new(self.gate.clone(), permit);
                Box::pin(respond(inner, held, request))
            }
            Entry::Wait(waiting) => {
                let gate = self.gate.clone();
                let responder = self.responder.clone();
                Box::pin(async move {
                    match waiting.slot().await {
                        Some(permit) => respond(inner, Held::new(gate, permit), request).await,
                        None => Ok(shed(&responder, class)),
                    }
                })
            }
            Entry::Shed => {
                let response = shed(&self.responder, class);
                Box::pin(async move { Ok(response) })
            }
        }
    }
}
