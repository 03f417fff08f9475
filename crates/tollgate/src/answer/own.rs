//! What reads as an overloaded service in a response, or as a limit's
//! refusal, and the mark on the answers a layer makes by itself that do
//! not read as a refusal: an adaptive layer around it takes none of them
//! for the service at work.

use http::{HeaderName, HeaderValue, Response, StatusCode};

/// In a response's extensions: a Tollgate layer made this answer itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OwnAnswer;

/// Whether `response` says the service ran out of capacity or time: 503
/// or 504, or gRPC's `UNAVAILABLE` (14) or `DEADLINE_EXCEEDED` (4) in a
/// trailers-only response's headers, read only on a 200 (gRPC answers
/// every call so). (A status in trailers comes later.)
pub(crate) fn reads_as_overload<B>(response: &Response<B>) -> bool {
    match response.status() {
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT => true,
        // gRPC answers every call with 200; its status is in a header.
        StatusCode::OK => {
            let grpc = response.headers().get(GRPC_STATUS);
            matches!(grpc.map(HeaderValue::as_bytes), Some(b"14" | b"4"))
        }
        _ => false,
    }
}

/// Whether `response` is a limit's refusal: 429, or gRPC's
/// `RESOURCE_EXHAUSTED` (8) in a trailers-only response's headers, read
/// only on a 200. A Tollgate layer's own refusals answer so, unmarked
/// (marking each would cost an allocation on every refusal); so do a
/// service's that passes on a limit of its own, or an upstream's. Either
/// way its latency is a limit's, not the service's at work.
pub(crate) fn reads_as_limited<B>(response: &Response<B>) -> bool {
    match response.status() {
        StatusCode::TOO_MANY_REQUESTS => true,
        StatusCode::OK => {
            let grpc = response.headers().get(GRPC_STATUS);
            grpc.map(HeaderValue::as_bytes) == Some(b"8")
        }
        _ => false,
    }
}

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// Marks `response`, a layer's own answer, unless it reads as a limit's
/// refusal, which a layer around tells by its status alone (the mark
/// costs an allocation): a 503 of a store failing closed, a rejection
/// status or an answer of the app's own (a 403, say), an operator's deny,
/// a missing key's 400 or 500. Unmarked, a layer around took those for
/// the service's answers: an overload, or a fast request served.
pub(crate) fn mark<B>(response: &mut Response<B>) {
    if !reads_as_limited(response) {
        response.extensions_mut().insert(OwnAnswer);
    }
}
