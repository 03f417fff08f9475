//! What an admitted request does (runs while holding its slot) and what a
//! shed one is told.

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate_core::{Completion, Permit, Priority};
use tower_service::Service;

use crate::answer;
use crate::body::ResponseBody;
use crate::response::Responder;

use super::gate::Gate;

/// A slot held by a request: handed back when the response is ready, or,
/// if the request is dropped first (even before its future was first
/// polled), as teaching nothing.
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
            self.gate.release(permit, Completion::Ignored);
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
        Ok(response) => completion_of(response.status()),
        Err(_) => Completion::Ignored,
    };
    held.done(completion);
    result.map(|response| response.map(ResponseBody::inner))
}

/// What a response of `status` teaches the limit: 503 and 504 say the
/// service behind ran out of capacity or time.
fn completion_of(status: StatusCode) -> Completion {
    if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::GATEWAY_TIMEOUT {
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
