//! A logged request as the demo would have received it, and the logged
//! status as its route's answer.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::middleware::Next;
use axum::response::Response;
use http::StatusCode;
use http::header::{AUTHORIZATION, HeaderName, HeaderValue};
use http::{Method, Uri};
use tollgate_sim::access::AccessRecord;

/// The status the server logged for a request, carried by the request to
/// [`answer_as_logged`].
#[derive(Debug, Clone, Copy)]
struct LoggedStatus(StatusCode);

/// Marks a response its route's handler made (through
/// [`answer_as_logged`]): whatever its status, the request was admitted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RouteAnswered;

/// The request of `record`, or `None` when its method, target, a header
/// or its logged status cannot be sent.
pub(crate) fn build(record: &AccessRecord) -> Option<Request<Body>> {
    let method = Method::from_bytes(record.method().as_bytes()).ok()?;
    let uri: Uri = record.target().parse().ok()?;
    let mut request = Request::new(Body::empty());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    let headers = request.headers_mut();
    for (name, value) in record.headers() {
        let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
        let value = HeaderValue::from_str(value).ok()?;
        headers.append(name, value);
    }
    if let Some(user) = record.user()
        && !headers.contains_key(AUTHORIZATION)
    {
        let value = HeaderValue::from_str(&format!("Bearer demo-{user}")).ok()?;
        headers.insert(AUTHORIZATION, value);
    }
    if let Some(status) = record.status() {
        let status = StatusCode::from_u16(status).ok()?;
        request.extensions_mut().insert(LoggedStatus(status));
    }
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::new(record.ip(), 0)));
    Some(request)
}

/// Around each route's handler: the handler runs (what it reports to the
/// layers, such as the tokens of an `ActualCost`, stands), and its
/// response takes the logged status, if the line had one. A log holds no
/// bodies, so the handler cannot tell a right password from a wrong one:
/// the server's logged answer can. The response is marked
/// [`RouteAnswered`]: a logged `429` (the server's own limit refused it)
/// that the replayed limits admit is the route's answer, not a refusal.
pub(crate) async fn answer_as_logged(request: Request, next: Next) -> Response {
    let logged = request.extensions().get::<LoggedStatus>().copied();
    let mut response = next.run(request).await;
    if let Some(LoggedStatus(status)) = logged {
        *response.status_mut() = status;
    }
    response.extensions_mut().insert(RouteAnswered);
    response
}
