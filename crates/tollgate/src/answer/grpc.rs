//! The layer's own gRPC answers: trailers-only responses with a status,
//! and for a rejection the wait, in the forms clients read it: gRFC A6's
//! `grpc-retry-pushback-ms`, and a `google.rpc.RetryInfo` in
//! `grpc-status-details-bin` for clients that read rich error details.

use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};

use super::numbers::number;
use super::retry_text;
use super::wait::{retry_after, retry_after_secs};
use http::{Response, StatusCode};

/// The gRPC status codes the layer answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Code {
    /// A missing key the client must send (HTTP 400, and the other 4xx
    /// statuses without a code of their own).
    InvalidArgument = 3,
    /// A missing key answered as not found (HTTP 404).
    NotFound = 5,
    /// A missing key refused as forbidden (HTTP 403).
    PermissionDenied = 7,
    /// A rate-limit or in-flight refusal (and HTTP 429).
    ResourceExhausted = 8,
    /// A missing key that is the server's doing (HTTP 500).
    Internal = 13,
    /// A store failure under a closed failure mode.
    Unavailable = 14,
    /// A missing key of an unauthenticated request (HTTP 401).
    Unauthenticated = 16,
}

impl Code {
    /// The code nearest an HTTP `status`: 401 is `UNAUTHENTICATED`, 403
    /// `PERMISSION_DENIED`, 404 `NOT_FOUND`, 429 `RESOURCE_EXHAUSTED`,
    /// any other client error (400 among them) `INVALID_ARGUMENT`, 503
    /// `UNAVAILABLE`, and the rest `INTERNAL`: a client's mistake is
    /// never told as the server's.
    pub(super) fn of_status(status: StatusCode) -> Self {
        match status {
            StatusCode::UNAUTHORIZED => Code::Unauthenticated,
            StatusCode::FORBIDDEN => Code::PermissionDenied,
            StatusCode::NOT_FOUND => Code::NotFound,
            StatusCode::TOO_MANY_REQUESTS => Code::ResourceExhausted,
            StatusCode::SERVICE_UNAVAILABLE => Code::Unavailable,
            status if status.is_client_error() => Code::InvalidArgument,
            _ => Code::Internal,
        }
    }

    /// The code as `grpc-status` carries it.
    fn header(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Code::InvalidArgument => "3",
            Code::NotFound => "5",
            Code::PermissionDenied => "7",
            Code::ResourceExhausted => "8",
            Code::Internal => "13",
            Code::Unavailable => "14",
            Code::Unauthenticated => "16",
        })
    }
}

/// The status a gRPC call's answer stands for in HTTP's terms: the
/// `grpc-status` of a trailers-only answer (on a 200, as gRPC answers
/// every call; tonic answers every error so), mapped as grpc-gateway maps
/// it (`UNAUTHENTICATED` 401, `PERMISSION_DENIED` 403, `NOT_FOUND` 404,
/// `RESOURCE_EXHAUSTED` 429, `UNAVAILABLE` 503, ...); otherwise the
/// response's own status (a call whose status comes in trailers, after
/// the answer began, is a 200 here).
pub(crate) fn http_status<B>(response: &Response<B>) -> StatusCode {
    let status = response.status();
    if status != StatusCode::OK {
        return status;
    }
    let code = response
        .headers()
        .get("grpc-status")
        .map(HeaderValue::as_bytes);
    let Some(code) = code else {
        return status;
    };
    let mapped = match code {
        b"0" => 200,
        b"1" => 499,
        b"3" | b"9" | b"11" => 400,
        b"4" => 504,
        b"5" => 404,
        b"6" | b"10" => 409,
        b"7" => 403,
        b"8" => 429,
        b"12" => 501,
        b"14" => 503,
        b"16" => 401,
        // UNKNOWN, INTERNAL, DATA_LOSS, and a code gRPC does not define.
        _ => 500,
    };
    StatusCode::from_u16(mapped).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

const PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
const DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");
const MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// A trailers-only gRPC response with `code` and `message`.
pub(super) fn response(code: Code, message: &str) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", code.header());
    // Percent-encoded, as gRPC's protocol asks: a message may be an
    // application's own text (a missing key's cause), with any character.
    let encoded = percent_encoding::utf8_percent_encode(message, MESSAGE_ESCAPED).to_string();
    if let Ok(message) = HeaderValue::from_str(&encoded) {
        headers.insert(MESSAGE, message);
    }
    super::own::mark(&mut response);
    response
}

/// What `grpc-message` escapes: every byte outside printable ASCII, and
/// '%' itself (utf8_percent_encode escapes all non-ASCII bytes too).
const MESSAGE_ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');

/// The limit a refusal ran into, as a `google.rpc.QuotaFailure` names it.
pub(super) struct Violation<'a> {
    /// The policy's (or limit's) name.
    pub(super) subject: &'a str,
    /// Which of its limits fired, in words.
    pub(super) description: &'a str,
}

/// `RESOURCE_EXHAUSTED`, to be retried after `wait`: in
/// `grpc-retry-pushback-ms`, whole milliseconds rounded up, and as a
/// `RetryInfo` of the exact wait; and a `QuotaFailure` naming `violation`.
/// `None` is a request that can never be admitted: a pushback of -1, which
/// tells a gRFC A6 client not to retry, and no `RetryInfo`.
pub(super) fn exhausted(
    message: &str,
    wait: Option<Duration>,
    violation: &Violation<'_>,
) -> Response<Bytes> {
    let mut response = response(Code::ResourceExhausted, message);
    let headers = response.headers_mut();
    headers.insert(PUSHBACK, pushback(wait));
    let details = status_details(Code::ResourceExhausted, message, wait, violation);
    let encoded = base64::engine::general_purpose::STANDARD_NO_PAD.encode(details);
    if let Ok(value) = HeaderValue::from_str(&encoded) {
        headers.insert(DETAILS, value);
    }
    response
}

/// `UNAVAILABLE`, to be retried after `wait`: as `retry-after` (whole
/// seconds) and as a pushback, without `RetryInfo`.
pub(super) fn unavailable(message: &str, wait: Duration) -> Response<Bytes> {
    let mut response = response(Code::Unavailable, message);
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, retry_after(wait));
    headers.insert(PUSHBACK, pushback(Some(wait)));
    response
}

/// `grpc-retry-pushback-ms` for `wait`: whole milliseconds, rounded up; -1
/// (do not retry) for a request that no wait admits.
fn pushback(wait: Option<Duration>) -> HeaderValue {
    match wait {
        Some(wait) => number(pushback_ms(wait)),
        None => HeaderValue::from_static("-1"),
    }
}

/// `wait` in whole milliseconds, rounded up, at most [`MAX_PUSHBACK_MS`].
fn pushback_ms(wait: Duration) -> u64 {
    let ms = u64::try_from(wait.as_micros().div_ceil(1_000)).unwrap_or(u64::MAX);
    ms.min(MAX_PUSHBACK_MS)
}

/// The longest pushback told: 2^31 - 1 ms (24.8 days), the most a client
/// that reads it as a 32-bit integer (grpc-java) can take. Past it, such a
/// client reads a negative or unparseable number, which gRFC A6 takes as
/// "never retry": a 30-day block would be told never to come back. A
/// client pushed back that long and refused again is told the rest.
const MAX_PUSHBACK_MS: u64 = (1 << 31) - 1;

/// A `google.rpc.Status` of `code` and `message` whose details are a
/// `google.rpc.RetryInfo` of `wait`, if any, and a `google.rpc.QuotaFailure`
/// of `violation`, in protobuf's wire format.
fn status_details(
    code: Code,
    message: &str,
    wait: Option<Duration>,
    violation: &Violation<'_>,
) -> Vec<u8> {
    let mut status = match wait {
        Some(wait) => status_with_retry_info(code, message, wait),
        None => status_of(code, message),
    };
    // google.rpc.QuotaFailure { repeated Violation violations = 1; }
    // Violation { string subject = 1; string description = 2; }
    let mut one = Vec::new();
    bytes_field(&mut one, 1, violation.subject.as_bytes());
    bytes_field(&mut one, 2, violation.description.as_bytes());
    let mut failure = Vec::new();
    bytes_field(&mut failure, 1, &one);
    let mut any = Vec::new();
    bytes_field(&mut any, 1, b"type.googleapis.com/google.rpc.QuotaFailure");
    bytes_field(&mut any, 2, &failure);
    bytes_field(&mut status, 3, &any);
    status
}

/// A `google.rpc.Status` of `code` and `message`, without details.
fn status_of(code: Code, message: &str) -> Vec<u8> {
    // google.rpc.Status { int32 code = 1; string message = 2; repeated Any details = 3; }
    let mut status = Vec::new();
    varint_field(&mut status, 1, code as u64);
    bytes_field(&mut status, 2, message.as_bytes());
    status
}

/// A `google.rpc.Status` of `code` and `message` whose one detail is a
/// `google.rpc.RetryInfo` of `wait`, in protobuf's wire format.
fn status_with_retry_info(code: Code, message: &str, wait: Duration) -> Vec<u8> {
    let mut status = status_of(code, message);
    bytes_field(&mut status, 3, &retry_info(wait));
    status
}

const RETRY_INFO: &[u8] = b"type.googleapis.com/google.rpc.RetryInfo";

/// A `google.protobuf.Any` of a `google.rpc.RetryInfo` of `wait`.
fn retry_info(wait: Duration) -> Vec<u8> {
    // google.protobuf.Duration { int64 seconds = 1; int32 nanos = 2; }
    let mut duration = Vec::new();
    if wait.as_secs() > 0 {
        varint_field(&mut duration, 1, wait.as_secs());
    }
    if wait.subsec_nanos() > 0 {
        varint_field(&mut duration, 2, u64::from(wait.subsec_nanos()));
    }
    // google.rpc.RetryInfo { google.protobuf.Duration retry_delay = 1; }
    let mut retry_info = Vec::new();
    bytes_field(&mut retry_info, 1, &duration);
    // google.protobuf.Any { string type_url = 1; bytes value = 2; }
    let mut any = Vec::new();
    bytes_field(&mut any, 1, RETRY_INFO);
    bytes_field(&mut any, 2, &retry_info);
    any
}

/// Whether the gRPC refusal in `headers` pushes its client back for less
/// than `wait` (to the millisecond; a pushback of -1, never to retry, is
/// not less).
fn pushes_back_less(headers: &http::HeaderMap, wait: Duration) -> bool {
    let told = headers
        .get(PUSHBACK)
        .and_then(|t| t.to_str().ok()?.parse::<u64>().ok());
    told.is_some_and(|told| told < pushback_ms(wait))
}

/// Tells the gRPC refusal in `headers` to wait at least `wait`: each of
/// its pushback (unless it says never to retry), its `RetryInfo` delays
/// and the whole seconds its message closes with ("retry in 10 s", in
/// `grpc-message` and in the status) that tells a shorter wait is raised
/// to it; a longer one, which the app may have set, stays. For a nearer
/// layer's refusal of a request an outer layer admitted and left empty
/// (see `Decoration::raise_wait`).
pub(super) fn wait_longer(headers: &mut http::HeaderMap, wait: Duration) {
    if pushes_back_less(headers, wait) {
        headers.insert(PUSHBACK, pushback(Some(wait)));
    }
    let secs = retry_after_secs(wait);
    let message = headers.get(MESSAGE);
    let message = message.and_then(|message| retry_text::raised(message.as_bytes(), secs));
    if let Some(Ok(message)) = message.as_deref().map(HeaderValue::from_bytes) {
        headers.insert(MESSAGE, message);
    }
    let engine = base64::engine::general_purpose::STANDARD_NO_PAD;
    let details = headers.get(DETAILS).map(|value| {
        // Written unpadded; read either way.
        let value = value.as_bytes();
        engine.decode(
            value
                .strip_suffix(b"==")
                .or(value.strip_suffix(b"="))
                .unwrap_or(value),
        )
    });
    let Some(Ok(details)) = details else {
        return;
    };
    let Some(raised) = with_retry_info(&details, wait) else {
        return;
    };
    if let Ok(value) = HeaderValue::from_str(&engine.encode(raised)) {
        headers.insert(DETAILS, value);
    }
}

/// The `google.rpc.Status` `status` with each `RetryInfo` detail's delay
/// raised to `wait` where it is shorter (or cannot be read), and the
/// whole seconds its message closes with likewise, every other field as
/// it was; `None` if `status` is not protobuf's wire format.
fn with_retry_info(status: &[u8], wait: Duration) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(status.len() + 8);
    let mut rest = status;
    while !rest.is_empty() {
        let (field, value, after) = next_field(rest)?;
        let raised = match value {
            Some(any) if field == 3 => {
                let (url_field, url, _) = next_field(any)?;
                let shorter = url_field == 1
                    && url == Some(RETRY_INFO)
                    && retry_delay(any).is_none_or(|delay| delay < wait);
                shorter.then(|| (3, retry_info(wait)))
            }
            Some(message) if field == 2 => {
                retry_text::raised(message, retry_after_secs(wait)).map(|raised| (2, raised))
            }
            Some(_) | None => None,
        };
        match raised {
            Some((field, raised)) => bytes_field(&mut out, field, &raised),
            None => out.extend_from_slice(&rest[..rest.len() - after.len()]),
        }
        rest = after;
    }
    Some(out)
}

/// The delay of the `google.rpc.RetryInfo` in the `google.protobuf.Any`
/// `any`, if it can be read.
fn retry_delay(any: &[u8]) -> Option<Duration> {
    let info = field_bytes(any, 2)?;
    let duration = field_bytes(info, 1).unwrap_or_default();
    let (mut secs, mut nanos) = (0, 0);
    let mut rest = duration;
    while !rest.is_empty() {
        let (field, value, after) = next_field(rest)?;
        if value.is_none() {
            // The varint just read, again: `next_field` keeps only the
            // bytes of a length-delimited field.
            let (number, _) = read_varint(read_varint(rest)?.1)?;
            match field {
                1 => secs = number,
                2 => nanos = u32::try_from(number).ok()?,
                _ => {}
            }
        }
        rest = after;
    }
    Some(Duration::new(secs, 0).saturating_add(Duration::from_nanos(u64::from(nanos))))
}

/// The bytes of the last length-delimited field numbered `number` in
/// `message`, if there is one and the message can be read.
fn field_bytes(message: &[u8], number: u64) -> Option<&[u8]> {
    let mut found = None;
    let mut rest = message;
    while !rest.is_empty() {
        let (field, value, after) = next_field(rest)?;
        if field == number {
            found = value.or(found);
        }
        rest = after;
    }
    found
}

/// A field in protobuf's wire format: its number, its bytes if
/// length-delimited (`None` for a varint), and what follows it.
type Field<'a> = (u64, Option<&'a [u8]>, &'a [u8]);

/// The first field of `bytes`. `None` for a wire type other than a varint
/// or bytes, or bytes cut short.
fn next_field(bytes: &[u8]) -> Option<Field<'_>> {
    let (tag, rest) = read_varint(bytes)?;
    let (number, value) = read_varint(rest)?;
    match tag & 7 {
        0 => Some((tag >> 3, None, value)),
        2 => {
            let len = usize::try_from(number).ok()?;
            let body = value.get(..len)?;
            Some((tag >> 3, Some(body), &value[len..]))
        }
        _ => None,
    }
}

/// A varint at the start of `bytes`, and what follows it.
fn read_varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, &bytes[i + 1..]));
        }
    }
    None
}

fn varint_field(out: &mut Vec<u8>, field: u8, value: u64) {
    out.push(field << 3);
    varint(out, value);
}

fn bytes_field(out: &mut Vec<u8>, field: u8, bytes: &[u8]) {
    out.push((field << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gRPC answer's status in HTTP's terms: its code's on a 200, the
    /// response's own otherwise.
    #[test]
    fn grpc_codes_read_as_http_statuses() {
        let of = |status: u16, code: Option<&'static str>| {
            let mut response = Response::new(());
            *response.status_mut() = StatusCode::from_u16(status).unwrap();
            if let Some(code) = code {
                let value = HeaderValue::from_static(code);
                response.headers_mut().insert("grpc-status", value);
            }
            http_status(&response).as_u16()
        };
        let codes = [
            ("0", 200),
            ("1", 499),
            ("2", 500),
            ("3", 400),
            ("4", 504),
            ("5", 404),
            ("6", 409),
            ("7", 403),
            ("8", 429),
            ("9", 400),
            ("10", 409),
            ("11", 400),
            ("12", 501),
            ("13", 500),
            ("14", 503),
            ("15", 500),
            ("16", 401),
            ("17", 500),
            ("x", 500),
        ];
        for (code, status) in codes {
            assert_eq!(of(200, Some(code)), status, "{code}");
        }
        assert_eq!(of(200, None), 200);
        assert_eq!(of(404, Some("0")), 404);
    }

    /// A client's mistake is never told as the server's: every 4xx a
    /// layer may answer a missing key with has a client's code (404, 422
    /// and 429 were `INTERNAL`).
    #[test]
    fn client_errors_map_to_client_codes() {
        let of = |status: u16| Code::of_status(StatusCode::from_u16(status).unwrap());
        assert_eq!(of(400), Code::InvalidArgument);
        assert_eq!(of(401), Code::Unauthenticated);
        assert_eq!(of(403), Code::PermissionDenied);
        assert_eq!(of(404), Code::NotFound);
        assert_eq!(of(422), Code::InvalidArgument);
        assert_eq!(of(429), Code::ResourceExhausted);
        assert_eq!(of(500), Code::Internal);
        assert_eq!(of(503), Code::Unavailable);
        for status in 400..500 {
            assert_ne!(of(status), Code::Internal, "{status}");
        }
    }

    /// `grpc-message` is percent-encoded, as gRPC's protocol asks: an
    /// application's text with '%' or beyond ASCII was written raw, or
    /// dropped where it was no valid header value.
    #[test]
    fn the_message_is_percent_encoded() {
        let response = response(Code::InvalidArgument, "send the é header: 100% required");
        assert_eq!(
            response.headers()["grpc-message"],
            "send the %C3%A9 header: 100%25 required"
        );
        let plain = response_message("send the x-api-key header");
        assert_eq!(plain, "send the x-api-key header");
    }

    fn response_message(message: &str) -> String {
        let response = response(Code::InvalidArgument, message);
        response.headers()["grpc-message"]
            .to_str()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn pushback_rounds_up_to_whole_milliseconds() {
        assert_eq!(pushback_ms(Duration::from_micros(1)), 1);
        assert_eq!(pushback_ms(Duration::from_millis(500)), 500);
        assert_eq!(pushback_ms(Duration::from_micros(66_000_001)), 66_001);
        assert_eq!(pushback_ms(Duration::ZERO), 0);
        assert_eq!(pushback(Some(Duration::from_secs(1))), "1000");
        assert_eq!(pushback(Some(Duration::from_micros(66_000_001))), "66001");
        assert_eq!(pushback(None), "-1");
        // A 30-day block, and the longest wait there is: at most 2^31 - 1,
        // a 32-bit integer (it was 2592000000, and 18446744073709551615).
        assert_eq!(
            pushback(Some(Duration::from_secs(30 * 86_400))),
            "2147483647"
        );
        assert_eq!(pushback(Some(Duration::MAX)), "2147483647");
        assert_eq!(
            pushback_ms(Duration::from_millis((1 << 31) - 1)),
            (1 << 31) - 1
        );
    }

    /// A refusal's `RetryInfo` is replaced, its other details kept;
    /// details that do not parse are left alone, without a panic.
    #[test]
    fn a_retry_info_is_raised_in_place() {
        let violation = Violation {
            subject: "user-1",
            description: "limit 1/10s exceeded",
        };
        let wait = Some(Duration::from_secs(10));
        let details = status_details(Code::ResourceExhausted, "m", wait, &violation);
        let raised = with_retry_info(&details, Duration::from_secs(60)).unwrap();
        let expected = status_details(
            Code::ResourceExhausted,
            "m",
            Some(Duration::from_secs(60)),
            &violation,
        );
        assert_eq!(raised, expected);
        let never = status_details(Code::ResourceExhausted, "m", None, &violation);
        assert_eq!(
            with_retry_info(&never, Duration::from_secs(60)).unwrap(),
            never
        );
        for garbage in [&b"\xff"[..], &[0x1a, 9, 1], &[0x0b], &[0x08]] {
            assert_eq!(
                with_retry_info(garbage, Duration::from_secs(1)),
                None,
                "{garbage:?}"
            );
        }
    }

    #[test]
    fn retry_info_is_protobuf_wire_format() {
        let bytes = status_with_retry_info(Code::ResourceExhausted, "x", Duration::new(1, 5));
        let url = b"type.googleapis.com/google.rpc.RetryInfo";
        let mut expected = vec![0x08, 8, 0x12, 1, b'x', 0x1a, 2 + url.len() as u8 + 2 + 6];
        expected.extend_from_slice(&[0x0a, url.len() as u8]);
        expected.extend_from_slice(url);
        // RetryInfo { retry_delay: Duration { seconds: 1, nanos: 5 } }
        expected.extend_from_slice(&[0x12, 6, 0x0a, 4, 0x08, 1, 0x10, 5]);
        assert_eq!(bytes, expected);
        let mut long = Vec::new();
        varint(&mut long, 300);
        assert_eq!(long, [0xac, 0x02]);
    }
}
