//! The layer's HTTP answers: a status with an `application/problem+json`
//! body (RFC 9457) that says why.

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use tollgate_core::{InFlightLimit, Priority};

use super::wait::retry_after;

/// The problem type of a denial (IANA's registry of HTTP problem types).
const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// A denial under the policy named `policy`, with `status`, saying `detail`
/// and naming the policy as the violated one, and `limit`, the limit of it
/// that fired (`10/s`).
pub(super) fn quota_exceeded(
    detail: &str,
    policy: &str,
    limit: &str,
    status: StatusCode,
) -> Response<Bytes> {
    let name = json_escaped(policy);
    // A limit's text form holds only digits, letters and '/'.
    let body = format!(
        r#"{{"type":"{QUOTA_EXCEEDED}","title":"{}","status":{},"detail":"{}","violated-policies":["{name}"],"limit":"{limit}"}}"#,
        status.canonical_reason().unwrap_or("Too Many Requests"),
        status.as_u16(),
        json_escaped(detail),
    );
    problem_response(status, body)
}

/// A problem of no particular type: `status`, its reason as the title, and
/// `detail`.
pub(super) fn problem(status: StatusCode, detail: &str) -> Response<Bytes> {
    let body = format!(
        r#"{{"type":"about:blank","title":"{}","status":{},"detail":"{}"}}"#,
        status.canonical_reason().unwrap_or("Error"),
        status.as_u16(),
        json_escaped(detail),
    );
    problem_response(status, body)
}

/// 503, saying `detail`, to be retried after `wait`.
pub(super) fn unavailable(detail: &str, wait: Duration) -> Response<Bytes> {
    let mut response = problem(StatusCode::SERVICE_UNAVAILABLE, detail);
    response
        .headers_mut()
        .insert(RETRY_AFTER, retry_after(wait));
    response
}

/// 429 for a request refused by the in-flight `limit`, saying `detail`.
pub(super) fn in_flight_full(detail: &str, limit: &InFlightLimit) -> Response<Bytes> {
    // The name holds only characters JSON leaves as they are.
    let body = format!(
        r#"{{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"{detail}","in-flight-limit":{max},"policy":"{name}"}}"#,
        max = limit.max(),
        name = limit.name(),
    );
    problem_response(StatusCode::TOO_MANY_REQUESTS, body)
}

/// 503 for a request of `class` shed at the adaptive limit named `limit`,
/// saying `detail`, to be retried after `wait`.
pub(super) fn over_capacity(
    detail: &str,
    limit: &str,
    class: Priority,
    wait: Duration,
) -> Response<Bytes> {
    // The name holds only characters JSON leaves as they are.
    let body = format!(
        r#"{{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"{detail}","policy":"{limit}","priority":"{class}"}}"#,
    );
    let mut response = problem_response(StatusCode::SERVICE_UNAVAILABLE, body);
    response
        .headers_mut()
        .insert(RETRY_AFTER, retry_after(wait));
    response
}

/// `text` with what JSON strings cannot hold as it is escaped.
pub(super) fn json_escaped(text: &str) -> Cow<'_, str> {
    if !text.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `200 OK` with `body` as `application/json`: a report of the caller's
/// limits or usage.
pub(super) fn json_ok(body: String) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(body));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// `status` with `body` as `application/problem+json`.
fn problem_response(status: StatusCode, body: String) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    super::own::mark(&mut response);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_escaping_keeps_bodies_valid() {
        assert_eq!(
            json_escaped("send the x-api-key header"),
            "send the x-api-key header"
        );
        assert_eq!(json_escaped("a\"b\\c\nd"), "a\\\"b\\\\c\\u000ad");
    }

    #[test]
    fn unavailable_is_the_bytes_it_always_was() {
        let response = unavailable("the rate limiter is unavailable", Duration::from_secs(1));
        let body = r#"{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"the rate limiter is unavailable"}"#;
        assert_eq!(response.body(), body);
        assert_eq!(response.headers()[RETRY_AFTER], "1");
    }
}
