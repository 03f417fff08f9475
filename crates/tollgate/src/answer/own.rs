//! The mark on the answers a layer makes by itself that read as an
//! overloaded service (503 and 504; gRPC `UNAVAILABLE`): an adaptive
//! layer around it takes them for what they are, a limiter's refusal, not
//! the service's overload.

use http::Response;

/// In a response's extensions: a Tollgate layer made this answer itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OwnAnswer;

/// Marks `response` as a layer's own answer.
pub(super) fn mark<B>(response: &mut Response<B>) {
    response.extensions_mut().insert(OwnAnswer);
}
