//! The pieces of [`serve_layers`](crate::serve_layers): the request id a
//! client may send, the span of each request, and the matched route
//! recorded on it.

use axum::Router;
use axum::extract::{MatchedPath, Request};
use http::HeaderName;
use tower::util::MapRequestLayer;
use tower_http::request_id::RequestId;
use tower_http::trace::MakeSpan;
use tracing::Span;
use tracing::field::Empty;

/// `x-request-id`: the id of a request, the client's if it sent a valid
/// one ([`valid_request_id`]), else a new UUID; the response carries it.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest request id kept from a client, in bytes: a UUID is 36.
pub const MAX_REQUEST_ID_LEN: usize = 64;

/// Whether a client's request id is kept: 1 to [`MAX_REQUEST_ID_LEN`]
/// bytes of ASCII letters, digits and `-_.:+/=` (a UUID, a ULID, a
/// base64 id, a load balancer's `Root=1-...`), nothing that could break a
/// log line.
///
/// ```
/// use axum_app::serve::valid_request_id;
///
/// assert!(valid_request_id(b"67e55044-10b1-426f-9247-bb680e5fe0c8"));
/// assert!(!valid_request_id(b""));
/// assert!(!valid_request_id(b"id with spaces"));
/// assert!(!valid_request_id(&[b'a'; 65]));
/// ```
pub fn valid_request_id(id: &[u8]) -> bool {
    (1..=MAX_REQUEST_ID_LEN).contains(&id.len())
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:+/=".contains(b))
}

/// Removes the client's `x-request-id` unless it sent one, and a
/// [valid](valid_request_id) one: tower-http's `SetRequestId` keeps any
/// id it finds, and makes one only where there is none.
pub(crate) fn drop_invalid_request_id(mut request: Request) -> Request {
    let mut ids = request.headers().get_all(REQUEST_ID).iter();
    let keep = match (ids.next(), ids.next()) {
        (Some(id), None) => valid_request_id(id.as_bytes()),
        (None, _) => true,
        (Some(_), Some(_)) => false,
    };
    if !keep {
        request.headers_mut().remove(REQUEST_ID);
    }
    request
}

/// The layer of [`drop_invalid_request_id`].
pub(crate) fn request_id_check() -> MapRequestLayer<fn(Request) -> Request> {
    MapRequestLayer::new(drop_invalid_request_id)
}

/// The span of each request, made by tower-http's `TraceLayer`: `request`
/// at `INFO` level, with the fields of the crate docs' table.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestSpan;

impl<B> MakeSpan<B> for RequestSpan {
    fn make_span(&mut self, request: &http::Request<B>) -> Span {
        use tollgate::trace::{FALLBACK, LIMIT, OUTCOME, POLICY, STORE};
        let id = request
            .extensions()
            .get::<RequestId>()
            .and_then(|id| id.header_value().to_str().ok());
        let span = tracing::info_span!(
            "request",
            request_id = id,
            method = %request.method(),
            path = Empty,
            { POLICY } = Empty,
            { OUTCOME } = Empty,
            { LIMIT } = Empty,
            { STORE } = Empty,
            { FALLBACK } = Empty,
        );
        // Known here when the layers wrap the routes themselves; otherwise
        // the routes record it (`record_route`).
        if let Some(path) = request.extensions().get::<MatchedPath>() {
            span.record("path", path.as_str());
        }
        span
    }
}

/// Records the route that matched a request (`/api/items`, never the raw
/// path or its query) as `path` on the request's span: for a router
/// served behind another service (the demo's reloadable router), whose
/// routes the span's maker cannot see. Every router of the demo's routes
/// goes through it.
pub fn record_route(router: Router) -> Router {
    router.layer(MapRequestLayer::new(
        record_matched_path as fn(Request) -> Request,
    ))
}

fn record_matched_path(request: Request) -> Request {
    if let Some(path) = request.extensions().get::<MatchedPath>() {
        Span::current().record("path", path.as_str());
    }
    request
}

/// tower-http's log of a failed response (a 5xx), through a
/// [`LogThrottle`](tollgate::LogThrottle) of a second: a client can make
/// the server answer 503 to every request (the service shedding its load, a
/// store failing closed), and must not make it write a line for each. A
/// line says how many failures it stands for (`failures`: itself and those
/// held back since the last line).
#[derive(Debug, Clone)]
pub struct ThrottledFailureLog {
    throttle: std::sync::Arc<tollgate::LogThrottle>,
}

impl Default for ThrottledFailureLog {
    fn default() -> Self {
        let throttle = tollgate::LogThrottle::new(std::time::Duration::from_secs(1));
        Self {
            throttle: std::sync::Arc::new(throttle),
        }
    }
}

impl tower_http::trace::OnFailure<tower_http::classify::ServerErrorsFailureClass>
    for ThrottledFailureLog
{
    fn on_failure(
        &mut self,
        class: tower_http::classify::ServerErrorsFailureClass,
        latency: std::time::Duration,
        span: &Span,
    ) {
        let Some(held_back) = self.throttle.may_log(tokio::time::Instant::now()) else {
            return;
        };
        tracing::error!(
            parent: span,
            classification = %class,
            latency_ms = latency.as_millis(),
            failures = held_back + 1,
            "response failed"
        );
    }
}
