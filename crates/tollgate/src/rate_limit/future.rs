//! The response future of the rate-limit service.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tollgate_core::Decision;
use tower_service::Service;

use crate::answer::{self, Protocol};
use crate::fallback::Answer;
use crate::response::Responder;

use super::body::{BodyKind, WrapBody};
use super::call::{Check, Deferred, Inner, Waiter};
use super::settle::SettleCall;
use super::state::{Finish, Settle, State, StateProj, next_state};

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit).
    ///
    /// It asks the store (only when the store cannot answer at once), holds
    /// a shaped request for its delay (or, in waiting mode, a denied one
    /// until it is admitted), then runs the inner service's future and adds
    /// the rate-limit headers to its response. `M` types the response body
    /// (see [`BodyKind`]).
    pub struct ResponseFuture<F, M = WrapBody>
    where
        F: Future,
    {
        #[pin]
        state: State<F, F::Output>,
        body: PhantomData<fn() -> M>,
    }
}

impl<F: Future, M> ResponseFuture<F, M> {
    pub(crate) fn call<S, B>(inner: Inner<'_, S>, request: Request<B>) -> Self
    where
        S: Service<Request<B>, Future = F> + Clone,
    {
        Self {
            state: State::Calling {
                future: inner.call(request),
                finish: Finish::Headers(None),
            },
            body: PhantomData,
        }
    }

    pub(super) fn new(state: State<F, F::Output>) -> Self {
        Self {
            state,
            body: PhantomData,
        }
    }

    pub(crate) fn respond(response: Response<Bytes>) -> Self {
        Self {
            state: State::Responding {
                response: Some(response),
            },
            body: PhantomData,
        }
    }

    pub(crate) fn check(
        check: Check,
        call: Deferred<F>,
        responder: Arc<Responder>,
        waiter: Option<Waiter>,
        enforce: bool,
        settle: Option<SettleCall>,
    ) -> Self {
        Self {
            state: State::Checking {
                check,
                call: Some(call),
                waiter,
                enforce,
                settle,
                responder,
            },
            body: PhantomData,
        }
    }

    pub(crate) fn decided<S, B>(
        result: Answer<Decision>,
        inner: Inner<'_, S>,
        request: Request<B>,
        responder: &Arc<Responder>,
        waiter: Option<Waiter>,
        enforce: bool,
        settle: Option<SettleCall>,
    ) -> Self
    where
        S: Service<Request<B>, Future = F> + Clone + Send + 'static,
        B: Send + 'static,
    {
        let next = (inner, request);
        let state = next_state(result, next, responder, waiter, enforce, settle);
        Self {
            state,
            body: PhantomData,
        }
    }
}

impl<F, M, ResBody, E> Future for ResponseFuture<F, M>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
    M: BodyKind<ResBody>,
{
    type Output = Result<Response<M::Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        // Nearly every request: the inner service's call, whose response
        // gets its headers. Every other state is polled by a function of
        // its own, so that the code most requests run stays small.
        if let StateProj::Calling { future, finish } = this.state.as_mut().project()
            && let Finish::Headers(_) = finish
        {
            let result = ready!(future.poll(cx));
            let mut response = result?.map(M::inner);
            if let Finish::Headers(Some(decoration)) = finish.take() {
                decoration.raise_wait(&mut response);
                decoration.write(response.headers_mut());
            }
            return Poll::Ready(Ok(response));
        }
        poll_states::<F, M, ResBody, E>(this.state, cx)
    }
}

/// Polls the response future in any state: asking the store, waiting,
/// calling the inner service, settling, answering.
#[inline(never)]
fn poll_states<F, M, ResBody, E>(
    mut state: Pin<&mut State<F, F::Output>>,
    cx: &mut Context<'_>,
) -> Poll<Result<Response<M::Body>, E>>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
    M: BodyKind<ResBody>,
{
    loop {
        match state.as_mut().project() {
            StateProj::Checking {
                check,
                call,
                waiter,
                enforce,
                settle,
                responder,
            } => {
                let result = ready!(check.as_mut().poll(cx));
                let next = match call.take() {
                    Some(call) => next_state(
                        result,
                        call,
                        responder,
                        waiter.take(),
                        *enforce,
                        settle.take(),
                    ),
                    None => State::Responding { response: None },
                };
                state.set(next);
            }
            StateProj::Looking { first, call, then } => {
                ready!(first.as_mut().poll(cx));
                let next = match (then.take(), call.take()) {
                    (Some(then), Some(call)) => then(call),
                    _ => State::Responding { response: None },
                };
                state.set(next);
            }
            StateProj::Waiting {
                sleep,
                call,
                waiter,
                enforce,
                settle,
                responder,
            } => {
                ready!(sleep.as_mut().poll(cx));
                let next = match (waiter.take(), call.take()) {
                    (Some(waiter), Some(call)) => State::Checking {
                        check: (waiter.recheck)(),
                        call: Some(call),
                        waiter: Some(waiter),
                        enforce: *enforce,
                        settle: settle.take(),
                        responder: responder.clone(),
                    },
                    _ => State::Responding { response: None },
                };
                state.set(next);
            }
            StateProj::Delaying {
                sleep,
                call,
                finish,
            } => {
                ready!(sleep.as_mut().poll(cx));
                let next = match call.take() {
                    Some(call) => State::Calling {
                        future: call(),
                        finish: finish.take(),
                    },
                    None => State::Responding { response: None },
                };
                state.set(next);
            }
            StateProj::Calling { future, finish } => {
                let result = ready!(future.poll(cx));
                let decoration = match (finish.take(), &result) {
                    (Finish::Headers(decoration), _) => decoration,
                    (Finish::Settle(settle), Ok(response)) => {
                        let Settle {
                            decoration,
                            settling,
                            responder,
                        } = *settle;
                        // A gRPC call's status is its code's.
                        let status = match responder.protocol {
                            Protocol::Http => response.status(),
                            Protocol::Grpc => answer::grpc_http_status(response),
                        };
                        match settling.start(status, response.extensions()) {
                            None => decoration,
                            Some(settled) => {
                                state.set(State::Settling {
                                    settled,
                                    response: Some(result),
                                    decoration,
                                    responder,
                                });
                                continue;
                            }
                        }
                    }
                    (Finish::Settle(settle), Err(_)) => settle.decoration,
                };
                let mut response = result?.map(M::inner);
                if let Some(decoration) = decoration {
                    decoration.raise_wait(&mut response);
                    decoration.write(response.headers_mut());
                }
                return Poll::Ready(Ok(response));
            }
            StateProj::Settling {
                settled,
                response,
                decoration,
                responder,
            } => {
                let settled = ready!(settled.as_mut().poll(cx));
                // After a failed settlement the headers show the
                // reservation's state.
                let decoration = match settled {
                    Ok(decision) => {
                        // Enforced as the reservation's was (a style that
                        // sends none has none, and makes none).
                        let enforce = decoration.as_ref().is_none_or(|d| d.enforce);
                        responder.admitted_decoration(&decision, enforce)
                    }
                    Err(error) => {
                        responder.telemetry.store_failed(None, &error);
                        decoration.take()
                    }
                };
                let Some(result) = response.take() else {
                    state.set(State::Responding { response: None });
                    continue;
                };
                let mut response = result?.map(M::inner);
                if let Some(decoration) = decoration {
                    decoration.raise_wait(&mut response);
                    decoration.write(response.headers_mut());
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for a large inner future (axum's is 320 bytes).
    #[expect(dead_code, reason = "only its size is used")]
    struct Large([u8; 320]);

    impl Future for Large {
        type Output = Result<Response<Bytes>, std::convert::Infallible>;

        fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
            Poll::Pending
        }
    }

    #[test]
    fn the_future_adds_little_to_the_inner_one() {
        // The inner future and the decision's headers (56 bytes: its
        // figures, and the style and the values to write them with): what
        // an admitted request's future holds while the inner service works.
        // It is moved whole a few times before it is polled (into axum's
        // boxed future, say), so every byte is copied more than once;
        // holding the whole decision (120 bytes) and the waiting mode's
        // fields here made it 112 bytes larger.
        let outer = std::mem::size_of::<ResponseFuture<Large, WrapBody>>();
        let inner = std::mem::size_of::<Large>();
        assert!(outer - inner <= 56, "{outer} - {inner}");
    }
}
