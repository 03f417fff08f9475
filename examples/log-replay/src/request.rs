//! A logged request as the demo would have received it.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::header::{AUTHORIZATION, HeaderName, HeaderValue};
use http::{Method, Request, Uri};
use tollgate_sim::access::AccessRecord;

/// The request of `record`, or `None` when its method, target or a
/// header cannot be sent.
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
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::new(record.ip(), 0)));
    Some(request)
}
