//! The response future of the rate-limit service.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tollgate_core::{Decision, StoreError};
use tower_service::Service;

use crate::body::{BodyKind, WrapBody};
use crate::fallback::FailureMode;
use crate::headers::Decoration;
use crate::report::Verdict;
use crate::response::Responder;

pub(crate) type Check = Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + Send>>;

/// How a layer in waiting mode asks the store again.
pub(crate) struct Waiter {
    pub(crate) recheck: Box<dyn Fn() -> Check + Send + Sync>,
    pub(crate) deadline: tokio::time::Instant,
}

/// The inner service as a decision finds it: owned by the response future
/// after an asynchronous check, or still in the service when the store
/// answered at once. In the second case an admitted request calls the
/// service that `poll_ready` drove to readiness, in place, and nothing is
/// cloned; only a request held for later takes it, leaving a clone behind.
pub(crate) enum Inner<'a, S> {
    Owned(S),
    Ready(&'a mut S),
}

impl<S: Clone> Inner<'_, S> {
    fn call<B>(self, request: Request<B>) -> S::Future
    where
        S: Service<Request<B>>,
    {
        match self {
            Inner::Owned(mut inner) => inner.call(request),
            Inner::Ready(inner) => inner.call(request),
        }
    }

    pub(crate) fn into_owned(self) -> S {
        match self {
            Inner::Owned(inner) => inner,
            Inner::Ready(inner) => {
                let clone = inner.clone();
                std::mem::replace(inner, clone)
            }
        }
    }
}

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit).
    ///
    /// It asks the store (only when the store cannot answer at once), holds
    /// a shaped request for its delay (or, in waiting mode, a denied one
    /// until it is admitted), then runs the inner service's future and adds
    /// the rate-limit headers to its response. `M` types the response body
    /// (see [`BodyKind`]).
    pub struct ResponseFuture<F, S, B, M = WrapBody> {
        #[pin]
        state: State<F, S, B>,
        responder: Arc<Responder>,
        body: PhantomData<fn() -> M>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, S, B> {
        Checking {
            check: Check,
            inner: Option<S>,
            request: Option<Request<B>>,
            waiter: Option<Waiter>,
            enforce: bool,
        },
        Waiting {
            sleep: Pin<Box<tokio::time::Sleep>>,
            inner: Option<S>,
            request: Option<Request<B>>,
            waiter: Option<Waiter>,
            enforce: bool,
        },
        Delaying {
            sleep: Pin<Box<tokio::time::Sleep>>,
            inner: Option<S>,
            request: Option<Request<B>>,
            decoration: Option<Decoration>,
        },
        // The state of nearly every request: kept small (the decision's
        // headers, not the decision), since the future is moved whole.
        Calling {
            #[pin]
            future: F,
            decoration: Option<Decoration>,
        },
        Responding {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<F, S, B, M> ResponseFuture<F, S, B, M>
where
    S: Service<Request<B>, Future = F> + Clone,
{
    pub(crate) fn call(
        inner: Inner<'_, S>,
        request: Request<B>,
        responder: Arc<Responder>,
    ) -> Self {
        Self {
            state: State::Calling {
                future: inner.call(request),
                decoration: None,
            },
            responder,
            body: PhantomData,
        }
    }

    pub(crate) fn respond(response: Response<Bytes>, responder: Arc<Responder>) -> Self {
        Self {
            state: State::Responding {
                response: Some(response),
            },
            responder,
            body: PhantomData,
        }
    }

    pub(crate) fn check(
        check: Check,
        inner: S,
        request: Request<B>,
        responder: Arc<Responder>,
        waiter: Option<Waiter>,
        enforce: bool,
    ) -> Self {
        Self {
            state: State::Checking {
                check,
                inner: Some(inner),
                request: Some(request),
                waiter,
                enforce,
            },
            responder,
            body: PhantomData,
        }
    }

    pub(crate) fn decided(
        result: Result<Decision, StoreError>,
        inner: Inner<'_, S>,
        request: Request<B>,
        responder: Arc<Responder>,
        waiter: Option<Waiter>,
        enforce: bool,
    ) -> Self {
        let state = next_state(result, inner, request, &responder, waiter, enforce);
        Self {
            state,
            responder,
            body: PhantomData,
        }
    }
}

/// What follows a store's answer. A denial of a key that is not
/// `enforce`d (shadow mode) lets the request through with its headers.
fn next_state<F, S, B>(
    result: Result<Decision, StoreError>,
    inner: Inner<'_, S>,
    request: Request<B>,
    responder: &Responder,
    waiter: Option<Waiter>,
    enforce: bool,
) -> State<F, S, B>
where
    S: Service<Request<B>, Future = F> + Clone,
{
    let telemetry = &responder.telemetry;
    match result {
        Ok(decision) if decision.is_allowed() => {
            telemetry.decided(&decision, Verdict::Allowed);
            if decision.delay() > Duration::ZERO {
                State::Delaying {
                    sleep: Box::pin(tokio::time::sleep(decision.delay())),
                    inner: Some(inner.into_owned()),
                    request: Some(request),
                    decoration: responder.decoration(&decision),
                }
            } else {
                State::Calling {
                    future: inner.call(request),
                    decoration: responder.decoration(&decision),
                }
            }
        }
        Ok(decision) if !enforce => {
            telemetry.decided(&decision, Verdict::ShadowLimited);
            State::Calling {
                future: inner.call(request),
                decoration: responder.decoration(&decision),
            }
        }
        Ok(decision) => {
            if let (Some(waiter), Some(retry)) = (waiter, decision.retry_after()) {
                let wake = tokio::time::Instant::now() + retry;
                if wake <= waiter.deadline {
                    return State::Waiting {
                        sleep: Box::pin(tokio::time::sleep_until(wake)),
                        inner: Some(inner.into_owned()),
                        request: Some(request),
                        waiter: Some(waiter),
                        enforce,
                    };
                }
            }
            telemetry.decided(&decision, Verdict::Limited);
            State::Responding {
                response: Some(responder.reject(&decision)),
            }
        }
        Err(error) => {
            telemetry.store_failed(Some(responder.failure), &error);
            match responder.failure {
                FailureMode::Open => {
                    telemetry.failed_over(FailureMode::Open);
                    State::Calling {
                        future: inner.call(request),
                        decoration: None,
                    }
                }
                // `Local` was handled where the store was asked; what is left
                // is a failure of the fallback itself.
                _ => {
                    telemetry.failed_over(FailureMode::Closed);
                    State::Responding {
                        response: Some(responder.unavailable()),
                    }
                }
            }
        }
    }
}

impl<F, S, B, M, ResBody, E> Future for ResponseFuture<F, S, B, M>
where
    S: Service<Request<B>, Response = Response<ResBody>, Error = E, Future = F> + Clone,
    F: Future<Output = Result<Response<ResBody>, E>>,
    M: BodyKind<ResBody>,
{
    type Output = Result<Response<M::Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking {
                    check,
                    inner,
                    request,
                    waiter,
                    enforce,
                } => {
                    let result = ready!(check.as_mut().poll(cx));
                    let next = match (inner.take(), request.take()) {
                        (Some(inner), Some(request)) => next_state(
                            result,
                            Inner::Owned(inner),
                            request,
                            this.responder,
                            waiter.take(),
                            *enforce,
                        ),
                        _ => State::Responding { response: None },
                    };
                    this.state.set(next);
                }
                StateProj::Waiting {
                    sleep,
                    inner,
                    request,
                    waiter,
                    enforce,
                } => {
                    ready!(sleep.as_mut().poll(cx));
                    let next = match (waiter.take(), inner.take(), request.take()) {
                        (Some(waiter), Some(inner), Some(request)) => State::Checking {
                            check: (waiter.recheck)(),
                            inner: Some(inner),
                            request: Some(request),
                            waiter: Some(waiter),
                            enforce: *enforce,
                        },
                        _ => State::Responding { response: None },
                    };
                    this.state.set(next);
                }
                StateProj::Delaying {
                    sleep,
                    inner,
                    request,
                    decoration,
                } => {
                    ready!(sleep.as_mut().poll(cx));
                    let next = match (inner.take(), request.take()) {
                        (Some(mut inner), Some(request)) => State::Calling {
                            future: inner.call(request),
                            decoration: decoration.take(),
                        },
                        _ => State::Responding { response: None },
                    };
                    this.state.set(next);
                }
                StateProj::Calling { future, decoration } => {
                    let response = ready!(future.poll(cx))?;
                    let mut response = response.map(M::inner);
                    if let Some(decoration) = decoration.take() {
                        this.responder.decorate(decoration, &mut response);
                    }
                    return Poll::Ready(Ok(response));
                }
                StateProj::Responding { response } => {
                    // `None` only if polled again after completion.
                    let response = response.take().unwrap_or_else(|| {
                        let mut r = Response::new(Bytes::new());
                        *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                        r
                    });
                    return Poll::Ready(Ok(response.map(M::own)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for a large inner future (axum's is 320 bytes).
    #[expect(dead_code, reason = "only its size is used")]
    struct Large([u8; 320]);

    #[test]
    fn the_future_adds_little_to_the_inner_one() {
        // The inner future, the decision's headers (40 bytes, with a tag)
        // and the responder: what an admitted request's future holds while
        // the inner service works. It is moved whole a few times before it
        // is polled (into axum's boxed future, say), so every byte is copied
        // more than once; holding the whole decision (120 bytes) and the
        // waiting mode's fields here made it 112 bytes larger.
        let outer = std::mem::size_of::<ResponseFuture<Large, (), (), WrapBody>>();
        let inner = std::mem::size_of::<Large>();
        assert!(outer - inner <= 56, "{outer} - {inner}");
    }
}
