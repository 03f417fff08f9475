//! The states of the rate-limit response future, and the state that
//! follows a store's answer.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use pin_project_lite::pin_project;
use tollgate_core::{Decision, FirstAnswer};

use crate::answer::headers::Decoration;
use crate::fallback::{Answer, Reserved};
use crate::report::Verdict;
use crate::response::Responder;

use super::call::{Call, Check, Deferred, Waiter};
use super::settle::{SettleCall, Settled, Settling};

pin_project! {
    #[project = StateProj]
    pub(super) enum State<F, R> {
        // The key's override is not known yet: the source's first answer is
        // awaited, then the request is decided as it would have been.
        Looking {
            first: FirstAnswer,
            call: Option<Deferred<F>>,
            then: Option<Box<dyn FnOnce(Deferred<F>) -> State<F, R> + Send>>,
        },
        Checking {
            check: Check,
            call: Option<Deferred<F>>,
            waiter: Option<Waiter>,
            enforce: bool,
            settle: Option<SettleCall>,
            responder: Arc<Responder>,
        },
        Waiting {
            sleep: Pin<Box<tokio::time::Sleep>>,
            call: Option<Deferred<F>>,
            waiter: Option<Waiter>,
            enforce: bool,
            settle: Option<SettleCall>,
            responder: Arc<Responder>,
        },
        Delaying {
            sleep: Pin<Box<tokio::time::Sleep>>,
            call: Option<Deferred<F>>,
            finish: Finish,
        },
        // The state of nearly every request: kept small (the decision's
        // headers, not the decision), since the future is moved whole, and
        // without the layer's settings (their reference count would be
        // touched twice per request).
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
            responder: Arc<Responder>,
        },
        Responding {
            response: Option<Response<Bytes>>,
        },
    }
}

/// What an admitted request does once its inner response is in: add the
/// headers of its decision, or first settle its cost (for a layer that
/// settles), then add the headers of the state after. Boxed when settling,
/// so that every other request's future stays as small as it was.
pub(super) enum Finish {
    Headers(Option<Decoration>),
    Settle(Box<Settle>),
}

/// What a request of a settling layer keeps until its response is in: the
/// headers of its reservation, its settlement, and the settings to answer
/// with once settled.
pub(super) struct Settle {
    pub(super) decoration: Option<Decoration>,
    pub(super) settling: Settling,
    pub(super) responder: Arc<Responder>,
}

impl Finish {
    pub(super) fn take(&mut self) -> Self {
        std::mem::replace(self, Finish::Headers(None))
    }
}

/// What follows a store's answer. A denial of a key that is not
/// `enforce`d (shadow mode) lets the request through with its headers,
/// unless an operator blocked the key.
/// An admitted request of a settling layer settles its cost once its
/// response is in; nothing else does.
pub(super) fn next_state<F, R>(
    result: Answer<Decision>,
    next: impl Call<F>,
    responder: &Arc<Responder>,
    waiter: Option<Waiter>,
    enforce: bool,
    settle: Option<SettleCall>,
) -> State<F, R> {
    match result {
        // Nearly every request: admitted at once, with its headers to add.
        // The other answers are in a function of their own, so that the
        // code every request runs is small.
        Answer::Decided(decision)
            if decision.is_allowed() && settle.is_none() && decision.delay() == Duration::ZERO =>
        {
            responder.decided(&decision, Verdict::Allowed);
            State::Calling {
                future: next.call(),
                finish: Finish::Headers(responder.admitted_decoration(&decision, enforce)),
            }
        }
        result => any_state(result, next, responder, waiter, enforce, settle),
    }
}

/// [`next_state`] for every answer.
#[cold]
#[inline(never)]
fn any_state<F, R>(
    result: Answer<Decision>,
    next: impl Call<F>,
    responder: &Arc<Responder>,
    waiter: Option<Waiter>,
    enforce: bool,
    settle: Option<SettleCall>,
) -> State<F, R> {
    // Where a reservation was made is where its settlement goes. A failure
    // the policy handled is `Err`: `None` let through, or the refusal.
    let (result, reserved) = match result {
        Answer::Decided(decision) => (Ok(decision), Reserved::InStore),
        Answer::Local(decision) => (Ok(decision), Reserved::Locally),
        Answer::LetThrough(_) => (Err(None), Reserved::InStore),
        Answer::Refused(refusal) => (Err(Some(refusal)), Reserved::InStore),
    };
    match result {
        Ok(decision) if decision.is_allowed() => {
            responder.decided(&decision, Verdict::Allowed);
            let decoration = responder.admitted_decoration(&decision, enforce);
            let finish = match settle {
                None => Finish::Headers(decoration),
                Some(call) => Finish::Settle(Box::new(Settle {
                    decoration,
                    settling: Settling::new(&decision, reserved, call),
                    responder: responder.clone(),
                })),
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
        // A dry run waives the limit's denials, not an operator's block.
        Ok(decision) if !enforce && !decision.is_blocked() => {
            responder.decided(&decision, Verdict::ShadowLimited);
            State::Calling {
                future: next.call(),
                finish: Finish::Headers(responder.decoration(&decision)),
            }
        }
        Ok(decision) => {
            if let (Some(waiter), Some(retry)) = (waiter, decision.retry_after()) {
                let now = tokio::time::Instant::now();
                if retry <= waiter.deadline.saturating_duration_since(now) {
                    return State::Waiting {
                        sleep: Box::pin(tokio::time::sleep_until(now + retry)),
                        call: Some(next.defer()),
                        waiter: Some(waiter),
                        enforce,
                        settle,
                        responder: responder.clone(),
                    };
                }
            }
            responder.decided(&decision, Verdict::Limited);
            State::Responding {
                response: Some(responder.reject(&decision)),
            }
        }
        // The failure policy was applied, and reported, where the store
        // was asked.
        Err(None) => State::Calling {
            future: next.call(),
            finish: Finish::Headers(None),
        },
        Err(Some(refusal)) => State::Responding {
            response: Some(responder.refused(&refusal)),
        },
    }
}
