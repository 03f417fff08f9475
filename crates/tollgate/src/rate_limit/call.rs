//! The inner service's call, now or held for later, and how a waiting
//! request asks the store again.

use std::future::Future;
use std::pin::Pin;

use http::Request;
use tollgate_core::Decision;
use tower_service::Service;

use crate::fallback::Answer;

pub(crate) type Check = Pin<Box<dyn Future<Output = Answer<Decision>> + Send>>;

/// The call of the inner service for a request held for later (while the
/// store decides, a shaped request's delay passes, or a denied one waits):
/// the service and the request, boxed, so that the future's type names
/// neither.
pub(super) type Deferred<F> = Box<dyn FnOnce() -> F + Send>;

/// How a layer in waiting mode asks the store again.
pub(crate) struct Waiter {
    pub(crate) recheck: Box<dyn Fn() -> Check + Send + Sync>,
    pub(crate) deadline: tokio::time::Instant,
}

/// The inner service that `poll_ready` drove to readiness, still in the
/// service. A request the store answered at once calls it in place, and
/// nothing is cloned; only a request held for later takes it along,
/// leaving a clone behind.
pub(crate) struct Inner<'a, S>(pub(crate) &'a mut S);

impl<S: Clone> Inner<'_, S> {
    pub(super) fn call<B>(self, request: Request<B>) -> S::Future
    where
        S: Service<Request<B>>,
    {
        self.0.call(request)
    }

    /// The call of `request`, for later.
    pub(crate) fn defer<B>(self, request: Request<B>) -> Deferred<S::Future>
    where
        S: Service<Request<B>> + Send + 'static,
        B: Send + 'static,
    {
        let mut ready = crate::ready::take_ready(self.0);
        Box::new(move || ready.call(request))
    }
}

/// The call a decision leads to: of the service `poll_ready` made ready,
/// or one deferred while the store decided.
pub(super) trait Call<F> {
    /// Calls now.
    fn call(self) -> F;
    /// Keeps the call for later.
    fn defer(self) -> Deferred<F>;
}

impl<S, B> Call<S::Future> for (Inner<'_, S>, Request<B>)
where
    S: Service<Request<B>> + Clone + Send + 'static,
    B: Send + 'static,
{
    fn call(self) -> S::Future {
        self.0.call(self.1)
    }

    fn defer(self) -> Deferred<S::Future> {
        self.0.defer(self.1)
    }
}

impl<F> Call<F> for Deferred<F> {
    fn call(self) -> F {
        self()
    }

    fn defer(self) -> Deferred<F> {
        self
    }
}
