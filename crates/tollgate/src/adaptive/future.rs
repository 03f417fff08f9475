//! What an admitted request does (runs while holding its slot) and what a
//! shed one is told.

use std::sync::Arc;

use http::{Request, Response};
use http_body_util::Full;
use tollgate_core::{Completion, Permit, Priority};
use tower_service::Service;

use crate::answer::{self, OwnAnswer};
use crate::body::ResponseBody;
use crate::response::Responder;

use super::gate::Gate;

/// A slot held by a request: handed back when the response is ready, or,
/// if the request is dropped first (even before its future was first
/// polled), as abandoned (see [`Completion::Abandoned`]).
pub(super) struct Held {
    gate: Arc<Gate>,
    permit: Option<Permit>,
}

impl Held {
    /// Holds `permit` of `gate`, from the moment it was given.
    pub(super) fn new(gate: Arc<Gate>, permit: Permit) -> Self {
        Self {
            gate,
            permit: Some(permit),
        }
    }

    fn done(mut self, completion: Completion) {
        if let Some(permit) = self.permit.take() {
            self.gate.release(permit, completion);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.gate.release(permit, Completion::Abandoned);
        }
    }
}

/// Calls `inner` with `request` while holding its slot.
pub(super) async fn respond<S, ReqBody, ResBody>(
    mut inner: S,
    held: Held,
    request: Request<ReqBody>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    let result = inner.call(request).await;
    let completion = match &result {
        Ok(response) => completion_of(response),
        Err(_) => Completion::Abandoned,
    };
    held.done(completion);
    result.map(|response| response.map(ResponseBody::inner))
}

/// What `response` teaches the limit: an answer that reads as overload
/// (503, 504, or their gRPC codes) says the service behind ran out of
/// capacity or time, unless a Tollgate layer inside made it itself: a
/// limiter's refusal (a store failing closed, a rejection status of 503,
/// another adaptive layer) says nothing of this service's capacity, and
/// its latency is not the service's. Nor does a 429 (or gRPC's
/// `RESOURCE_EXHAUSTED`), a rate limit's answer in microseconds: taken for
/// service, a flood of refused requests would read as a fast service with
/// no queue, and raise the limit while it lasts.
fn completion_of<B>(response: &Response<B>) -> Completion {
    if response.extensions().get::<OwnAnswer>().is_some() || answer::reads_as_limited(response) {
        Completion::Ignored
    } else if answer::reads_as_overload(response) {
        Completion::Dropped
    } else {
        Completion::Served
    }
}

/// The answer to a request of `class` the layer shed.
pub(super) fn shed<B>(responder: &Responder, class: Priority) -> Response<ResponseBody<B>> {
    let response = answer::over_capacity(&responder.policy, class, responder.protocol);
    response.map(|body| ResponseBody::own(Full::new(body)))
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::*;

    fn response(status: u16, grpc: Option<&'static str>) -> Response<()> {
        let mut response = Response::new(());
        *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
        if let Some(code) = grpc {
            response
                .headers_mut()
                .insert("grpc-status", http::HeaderValue::from_static(code));
        }
        response
    }

    #[test]
    fn overload_answers_from_inside_shrink_the_limit() {
        assert_eq!(completion_of(&response(200, None)), Completion::Served);
        assert_eq!(completion_of(&response(500, None)), Completion::Served);
        assert_eq!(completion_of(&response(503, None)), Completion::Dropped);
        assert_eq!(completion_of(&response(504, None)), Completion::Dropped);
        assert_eq!(completion_of(&response(200, Some("0"))), Completion::Served);
        assert_eq!(
            completion_of(&response(200, Some("14"))),
            Completion::Dropped
        );
        assert_eq!(
            completion_of(&response(200, Some("4"))),
            Completion::Dropped
        );
        assert_eq!(
            completion_of(&response(200, Some("13"))),
            Completion::Served
        );
        // A limit's refusal teaches nothing: 429, or RESOURCE_EXHAUSTED.
        assert_eq!(completion_of(&response(429, None)), Completion::Ignored);
        assert_eq!(
            completion_of(&response(200, Some("8"))),
            Completion::Ignored
        );
        // A gRPC status is read on a 200 only, as gRPC answers.
        assert_eq!(
            completion_of(&response(503, Some("0"))),
            Completion::Dropped
        );
        assert_eq!(
            completion_of(&response(429, Some("14"))),
            Completion::Ignored
        );
        // A layer's own 503 (a custom one too) is no sign of overload.
        let mut own = response(503, None);
        crate::answer::mark_own(&mut own);
        assert_eq!(completion_of(&own), Completion::Ignored);
    }
}
