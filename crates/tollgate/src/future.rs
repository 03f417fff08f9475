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
use tollgate_core::Decision;
use tower_service::Service;

use crate::body::{BodyKind, WrapBody};
use crate::fallback::Answer;
use crate::headers::Decoration;
use crate::report::Verdict;
use crate::response::Responder;
use crate::settle::{SettleCall, Settled, Settling};

pub(crate) type Check = Pin<Box<dyn Future<Output = Answer<Decision>> + Send>>;

/// The call of the inner service for a request held for later (while the
/// store decides, a shaped request's delay passes, or a denied one waits):
/// the service and the request, boxed, so that the future's type names
/// neither.
type Deferred<F> = Box<dyn FnOnce() -> F + Send>;

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
    fn call<B>(self, request: Request<B>) -> S::Future
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
        let clone = self.0.clone();
        let mut ready = std::mem::replace(self.0, clone);
        Box::new(move || ready.call(request))
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
    pub struct ResponseFuture<F, M = WrapBody>
    where
        F: Future,
    {
        #[pin]
        state: State<F, F::Output>,
        responder: Arc<Responder>,
        body: PhantomData<fn() -> M>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, R> {
        Checking {
            check: Check,
            call: Option<Deferred<F>>,
            waiter: Option<Waiter>,
            enforce: bool,
            settle: Option<SettleCall>,
        },
        Waiting {
            sleep: Pin<Box<tokio::time::Sleep>>,
            call: Option<Deferred<F>>,
            waiter: Option<Waiter>,
            enforce: bool,
            settle: Option<SettleCall>,
        },
        Delaying {
            sleep: Pin<Box<tokio::time::Sleep>>,
            call: Option<Deferred<F>>,
            finish: Finish,
        },
        // The state of nearly every request: kept small (the decision's
        // headers, not the decision), since the future is moved whole.
        Calling {
            #[pin]
            future: F,
            finish: Finish,
        },
        // The response is in; its cost is being settled, after which its
        // headers show the state.
        Settling {
            settled: Settled,
            response: Option<R>,
            decoration: Option<Decoration>,
        },
        Responding {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<F: Future, M> ResponseFuture<F, M> {
    pub(crate) fn call<S, B>(
        inner: Inner<'_, S>,
        request: Request<B>,
        responder: Arc<Responder>,
    ) -> Self
    where
        S: Service<Request<B>, Future = F> + Clone,
    {
        Self {
            state: State::Calling {
                future: inner.call(request),
                finish: Finish::Headers(None),
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
            },
            responder,
            body: PhantomData,
        }
    }

    pub(crate) fn decided<S, B>(
        result: Answer<Decision>,
        inner: Inner<'_, S>,
        request: Request<B>,
        responder: Arc<Responder>,
        waiter: Option<Waiter>,
        enforce: bool,
        settle: Option<SettleCall>,
    ) -> Self
    where
        S: Service<Request<B>, Future = F> + Clone + Send + 'static,
        B: Send + 'static,
    {
        let next = (inner, request);
        let state = next_state(result, next, &responder, waiter, enforce, settle);
        Self {
            state,
            responder,
            body: PhantomData,
        }
    }
}

/// The call a decision leads to: of the service `poll_ready` made ready,
/// or one deferred while the store decided.
trait Call<F> {
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

/// What an admitted request does once its inner response is in: add the
/// headers of its decision, or first settle its cost (for a layer that
/// settles), then add the headers of the state after. Boxed when settling,
/// so that every other request's future stays as small as it was.
enum Finish {
    Headers(Option<Decoration>),
    Settle(Box<(Option<Decoration>, Settling)>),
}

impl Finish {
    fn take(&mut self) -> Self {
        std::mem::replace(self, Finish::Headers(None))
    }
}

/// What follows a store's answer. A denial of a key that is not
/// `enforce`d (shadow mode) lets the request through with its headers.
/// An admitted request of a settling layer settles its cost once its
/// response is in; nothing else does.
fn next_state<F, R>(
    result: Answer<Decision>,
    next: impl Call<F>,
    responder: &Responder,
    waiter: Option<Waiter>,
    enforce: bool,
    settle: Option<SettleCall>,
) -> State<F, R> {
    let telemetry = &responder.telemetry;
    match result {
        Answer::Decided(decision) if decision.is_allowed() => {
            telemetry.decided(&decision, Verdict::Allowed);
            let decoration = responder.decoration(&decision);
            let finish = match settle {
                None => Finish::Headers(decoration),
                Some(call) => {
                    Finish::Settle(Box::new((decoration, Settling::new(&decision, call))))
                }
            };
            if decision.delay() > Duration::ZERO {
                State::Delaying {
                    sleep: Box::pin(tokio::time::sleep(decision.delay())),
                    call: Some(next.defer()),
                    finish,
                }
            } else {
                State::Calling {
                    future: next.call(),
                    finish,
                }
            }
        }
        Answer::Decided(decision) if !enforce => {
            telemetry.decided(&decision, Verdict::ShadowLimited);
            State::Calling {
                future: next.call(),
                finish: Finish::Headers(responder.decoration(&decision)),
            }
        }
        Answer::Decided(decision) => {
            if let (Some(waiter), Some(retry)) = (waiter, decision.retry_after()) {
                let wake = tokio::time::Instant::now() + retry;
                if wake <= waiter.deadline {
                    return State::Waiting {
                        sleep: Box::pin(tokio::time::sleep_until(wake)),
                        call: Some(next.defer()),
                        waiter: Some(waiter),
                        enforce,
                        settle,
                    };
                }
            }
            telemetry.decided(&decision, Verdict::Limited);
            State::Responding {
                response: Some(responder.reject(&decision)),
            }
        }
        // The failure policy was applied, and reported, where the store
        // was asked.
        Answer::LetThrough(_) => State::Calling {
            future: next.call(),
            finish: Finish::Headers(None),
        },
        Answer::Refused(_) => State::Responding {
            response: Some(responder.unavailable()),
        },
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
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking {
                    check,
                    call,
                    waiter,
                    enforce,
                    settle,
                } => {
                    let result = ready!(check.as_mut().poll(cx));
                    let next = match call.take() {
                        Some(call) => next_state(
                            result,
                            call,
                            this.responder,
                            waiter.take(),
                            *enforce,
                            settle.take(),
                        ),
                        None => State::Responding { response: None },
                    };
                    this.state.set(next);
                }
                StateProj::Waiting {
                    sleep,
                    call,
                    waiter,
                    enforce,
                    settle,
                } => {
                    ready!(sleep.as_mut().poll(cx));
                    let next = match (waiter.take(), call.take()) {
                        (Some(waiter), Some(call)) => State::Checking {
                            check: (waiter.recheck)(),
                            call: Some(call),
                            waiter: Some(waiter),
                            enforce: *enforce,
                            settle: settle.take(),
                        },
                        _ => State::Responding { response: None },
                    };
                    this.state.set(next);
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
                    this.state.set(next);
                }
                StateProj::Calling { future, finish } => {
                    let result = ready!(future.poll(cx));
                    let decoration = match (finish.take(), &result) {
                        (Finish::Headers(decoration), _) => decoration,
                        (Finish::Settle(settle), Ok(response)) => {
                            let (decoration, settling) = *settle;
                            match settling.start(response.status(), response.extensions()) {
                                None => decoration,
                                Some(settled) => {
                                    this.state.set(State::Settling {
                                        settled,
                                        response: Some(result),
                                        decoration,
                                    });
                                    continue;
                                }
                            }
                        }
                        (Finish::Settle(settle), Err(_)) => settle.0,
                    };
                    let mut response = result?.map(M::inner);
                    if let Some(decoration) = decoration {
                        this.responder.decorate(decoration, &mut response);
                    }
                    return Poll::Ready(Ok(response));
                }
                StateProj::Settling {
                    settled,
                    response,
                    decoration,
                } => {
                    let settled = ready!(settled.as_mut().poll(cx));
                    // After a failed settlement the headers show the
                    // reservation's state.
                    let decoration = match settled {
                        Ok(decision) => this.responder.decoration(&decision),
                        Err(error) => {
                            this.responder.telemetry.store_failed(None, &error);
                            decoration.take()
                        }
                    };
                    let Some(result) = response.take() else {
                        this.state.set(State::Responding { response: None });
                        continue;
                    };
                    let mut response = result?.map(M::inner);
                    if let Some(decoration) = decoration {
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

    impl Future for Large {
        type Output = Result<Response<Bytes>, std::convert::Infallible>;

        fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
            Poll::Pending
        }
    }

    #[test]
    fn the_future_adds_little_to_the_inner_one() {
        // The inner future, the decision's headers (40 bytes, with a tag)
        // and the responder: what an admitted request's future holds while
        // the inner service works. It is moved whole a few times before it
        // is polled (into axum's boxed future, say), so every byte is copied
        // more than once; holding the whole decision (120 bytes) and the
        // waiting mode's fields here made it 112 bytes larger.
        let outer = std::mem::size_of::<ResponseFuture<Large, WrapBody>>();
        let inner = std::mem::size_of::<Large>();
        assert!(outer - inner <= 56, "{outer} - {inner}");
    }
}
