//! Responses the layer produces itself: rejections and failures.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use tollgate_core::{Decision, Key, Outcome, Policy};

use crate::extract::MissingCause;
use crate::grpc::{self, Code};
use crate::headers::{self, Decoration, HeaderStyle};
use crate::report::Telemetry;

/// What the layer does with a request from which no key can be extracted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answer by whose mistake it is, as the key extractor tells
    /// ([`KeyExtractor::missing`](crate::KeyExtractor::missing)); the
    /// default. A client that left out what it must send gets 400 with an
    /// `application/problem+json` body saying what, an unauthenticated
    /// request 401, and a server wired without what the key needs 500.
    /// Each is logged (client mistakes at debug level, server ones at
    /// error level) at most once a second, with the count held back.
    #[default]
    ByCause,
    /// Answer 500 whatever the cause, logged at error level at most once a
    /// second.
    Error,
    /// Answer with this status (for example 401 on routes keyed by user).
    Reject(StatusCode),
    /// Let the request through unlimited, without rate-limit headers.
    Allow,
}

pub(crate) type CustomRejection = Arc<dyn Fn(&Decision) -> Response<Bytes> + Send + Sync>;

/// Builds the responses the layer answers by itself.
#[derive(Clone)]
pub(crate) struct Responder {
    pub(crate) headers: HeaderStyle,
    pub(crate) status: StatusCode,
    pub(crate) custom: Option<CustomRejection>,
    pub(crate) missing: MissingKey,
    pub(crate) grpc: bool,
    /// The percentage of keys whose denials are enforced; the others run
    /// in shadow mode.
    pub(crate) enforce_percent: u8,
    /// Shared by every service of one layer, so throttling holds across them.
    pub(crate) telemetry: Arc<Telemetry>,
    /// The policy name as a header value, made once.
    pub(crate) name: Option<HeaderValue>,
    pub(crate) policy: Arc<str>,
}

impl Responder {
    pub(crate) fn new(policy: &str) -> Self {
        Self {
            headers: HeaderStyle::default(),
            status: StatusCode::TOO_MANY_REQUESTS,
            custom: None,
            missing: MissingKey::default(),
            grpc: false,
            enforce_percent: 100,
            telemetry: Arc::new(Telemetry::new(policy)),
            name: shared_header_value(policy),
            policy: Arc::from(policy),
        }
    }

    /// This responder for requests a chooser put under the policy named
    /// `policy`: headers and problem bodies name it, and it counts in its
    /// own metrics.
    fn for_policy(&self, policy: &str) -> Self {
        Self {
            telemetry: Arc::new(Telemetry::new(policy)),
            name: shared_header_value(policy),
            policy: Arc::from(policy),
            ..self.clone()
        }
    }

    /// Whether denials of `key` are enforced rather than shadowed.
    pub(crate) fn enforces(&self, key: &Key) -> bool {
        match self.enforce_percent {
            100.. => true,
            0 => false,
            percent => ramp_bucket(key) < u64::from(percent),
        }
    }
}

/// The responders of the policies a chooser picks, made on first use and
/// kept by policy name: a fixed set of plans costs no allocation per
/// request.
pub(crate) struct Responders {
    own: Arc<Responder>,
    chosen: RwLock<Vec<Arc<Responder>>>,
}

/// The most chosen policies whose responders are kept; beyond them (a
/// chooser that makes a policy per tenant, say), one is made per request.
const MAX_CHOSEN: usize = 256;

impl Responders {
    pub(crate) fn new(own: Arc<Responder>) -> Self {
        Self {
            own,
            chosen: RwLock::default(),
        }
    }

    /// The responder of requests under `policy`.
    pub(crate) fn of(&self, policy: &Policy) -> Arc<Responder> {
        let name = policy.name();
        if *self.own.policy == *name {
            return self.own.clone();
        }
        let chosen = self.chosen.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(known) = chosen.iter().find(|r| *r.policy == *name) {
            return known.clone();
        }
        drop(chosen);
        let made = Arc::new(self.own.for_policy(name));
        let mut chosen = self.chosen.write().unwrap_or_else(PoisonError::into_inner);
        if chosen.len() < MAX_CHOSEN {
            chosen.push(made.clone());
        }
        made
    }
}

/// A key's place on the enforcement ramp, 0 to 99: the same on every
/// machine and in every version, so a key enforced at 10% stays enforced
/// at 20%.
fn ramp_bucket(key: &Key) -> u64 {
    // FNV-1a over the kind and the bytes, then a SplitMix64 finaliser to
    // spread FNV's weak low bits.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let kind = key.kind().as_str().as_bytes();
    for &byte in kind.iter().chain([0xff].iter()).chain(key.as_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^= hash >> 31;
    hash % 100
}

impl fmt::Debug for Responder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Responder")
            .field("headers", &self.headers)
            .field("status", &self.status)
            .field("custom", &self.custom.as_ref().map(|_| ".."))
            .field("missing", &self.missing)
            .field("grpc", &self.grpc)
            .field("enforce_percent", &self.enforce_percent)
            .finish()
    }
}

/// `text` as a header value whose clones share one buffer.
fn shared_header_value(text: &str) -> Option<HeaderValue> {
    let bytes = Bytes::copy_from_slice(text.as_bytes());
    // The first clone of a `Bytes` made from a vector moves it into a
    // shared, reference-counted buffer; do it now rather than per response.
    drop(bytes.clone());
    HeaderValue::from_maybe_shared(bytes).ok()
}

const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

impl Responder {
    /// What the response to an admitted request will need from `decision`
    /// for its headers (`None` when the layer sends none).
    pub(crate) fn decoration(&self, decision: &Decision) -> Option<Decoration> {
        Decoration::new(self.headers, decision, &self.policy)
    }

    /// Adds the rate-limit headers of an admitted request.
    pub(crate) fn decorate<B>(&self, decoration: Decoration, response: &mut Response<B>) {
        decoration.write(
            self.headers,
            response.headers_mut(),
            &self.policy,
            self.name.as_ref(),
        );
    }

    /// The response to a denied request.
    pub(crate) fn reject(&self, decision: &Decision) -> Response<Bytes> {
        let mut response = match &self.custom {
            Some(custom) => custom(decision),
            None => self.problem(decision),
        };
        let headers = response.headers_mut();
        if !headers.contains_key(RETRY_AFTER) {
            headers::write_retry_after(decision, headers);
        }
        if let Some(decoration) = self.decoration(decision) {
            decoration.write(self.headers, headers, &self.policy, self.name.as_ref());
        }
        response
    }

    fn problem(&self, decision: &Decision) -> Response<Bytes> {
        let name = &*self.policy;
        if self.grpc {
            return grpc::rejection(decision, &detail(decision, name));
        }
        quota_exceeded(decision, name, self.status)
    }

    /// The response to a request without a key, unless it is let through:
    /// its status and the words the client reads follow `self.missing`
    /// and `cause`. Logged through the throttle.
    pub(crate) fn missing_key(&self, cause: &MissingCause) -> Response<Bytes> {
        self.telemetry.key_missing(cause);
        let (status, detail): (StatusCode, &str) = match (self.missing, cause) {
            (MissingKey::Reject(status), _) => (status, "no rate-limit key for this request"),
            (MissingKey::ByCause, MissingCause::Client(what)) => (StatusCode::BAD_REQUEST, what),
            (MissingKey::ByCause, MissingCause::Unauthenticated) => {
                (StatusCode::UNAUTHORIZED, "authentication required")
            }
            _ => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "no rate-limit key for this request",
            ),
        };
        if self.grpc {
            let code = match status {
                StatusCode::BAD_REQUEST => Code::InvalidArgument,
                StatusCode::UNAUTHORIZED => Code::Unauthenticated,
                StatusCode::FORBIDDEN => Code::PermissionDenied,
                _ => Code::Internal,
            };
            return grpc::response(code, detail);
        }
        let body = format!(
            r#"{{"type":"about:blank","title":"{}","status":{},"detail":"{}"}}"#,
            status.canonical_reason().unwrap_or("Error"),
            status.as_u16(),
            json_escaped(detail),
        );
        problem_response(status, body)
    }

    /// The response when the store failed and the failure mode is closed.
    pub(crate) fn unavailable(&self) -> Response<Bytes> {
        if self.grpc {
            return grpc::unavailable("the rate limiter is unavailable");
        }
        let body = r#"{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"the rate limiter is unavailable"}"#;
        let mut response = problem_response(StatusCode::SERVICE_UNAVAILABLE, body.to_owned());
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        response
    }
}

/// The layer's rejection of `decision`, made under the policy named
/// `policy`: 429 with an `application/problem+json` body that says why and
/// names the policy, `Retry-After`, and the rate-limit headers of `style`.
/// For code that decides outside the layer, such as a middleware over
/// [`RateLimiter`](crate::RateLimiter), to answer as the layer does.
///
/// ```
/// use http::StatusCode;
/// use tollgate::{Algorithm, HeaderStyle, Key, Policy, RateLimiter, rejection};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RateLimiter::new(Policy::new("export", Algorithm::FixedWindow, "1/h")?);
/// let key = Key::user("ada");
/// limiter.check(&key).await?;
/// let denied = limiter.check(&key).await?;
/// let response = rejection(&denied, "export", HeaderStyle::GitHub);
/// assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert!(response.headers().contains_key("retry-after"));
/// assert_eq!(response.headers()["x-ratelimit-remaining"], "0");
/// # Ok(())
/// # }
/// ```
pub fn rejection(decision: &Decision, policy: &str, style: HeaderStyle) -> Response<Bytes> {
    let mut response = quota_exceeded(decision, policy, StatusCode::TOO_MANY_REQUESTS);
    headers::write(style, decision, policy, response.headers_mut());
    response
}

/// The problem+json answer to a denial under `name`, with `status`.
fn quota_exceeded(decision: &Decision, name: &str, status: StatusCode) -> Response<Bytes> {
    let detail = detail(decision, name);
    let name = json_escaped(name);
    let body = format!(
        r#"{{"type":"{QUOTA_EXCEEDED}","title":"{}","status":{},"detail":"{}","violated-policies":["{name}"]}}"#,
        status.canonical_reason().unwrap_or("Too Many Requests"),
        status.as_u16(),
        json_escaped(&detail),
    );
    problem_response(status, body)
}

/// Why a request was denied, in words.
fn detail(decision: &Decision, name: &str) -> String {
    match decision.outcome() {
        Outcome::CostExceedsCapacity { cost, capacity } => format!(
            "request cost {cost} exceeds the capacity {capacity} of limit '{name}'; it can never be admitted"
        ),
        _ => match headers::retry_after_secs(decision) {
            Some(secs) => format!("limit '{name}' exceeded, retry in {secs} s"),
            None => format!("limit '{name}' exceeded"),
        },
    }
}

/// `text` with what JSON strings cannot hold as it is escaped.
fn json_escaped(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        return std::borrow::Cow::Borrowed(text);
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
    std::borrow::Cow::Owned(out)
}

pub(crate) fn problem_response(status: StatusCode, body: String) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
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
}
