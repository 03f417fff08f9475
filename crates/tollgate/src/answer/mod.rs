//! What a client is told, in one home: the rate-limit headers of every
//! answer (`headers.rs`, public as `tollgate::headers`, with the numbers of
//! `numbers.rs`, the values made once for good of `prebuilt.rs` and the
//! IETF values and next units of `ietf.rs`), and every answer the layer
//! makes by itself when it refuses a request, in the protocol the layer
//! speaks.
//!
//! | Refusal | HTTP | gRPC |
//! |---|---|---|
//! | rate limit | 429 (or the layer's status), `problem+json` quota-exceeded naming the policy and the limit that fired, `Retry-After`, `tollgate-exceeded` | `RESOURCE_EXHAUSTED`, pushback and `RetryInfo` of the wait, a `QuotaFailure` naming the limit, `retry-after`, `tollgate-exceeded` |
//! | cost exceeds capacity | the same, without `Retry-After` | `RESOURCE_EXHAUSTED`, pushback -1, the `QuotaFailure` |
//! | key blocked by an operator (`Store::block`) | as a rate limit, for the rest of the block; the body, the header (`<policy>; blocked`) and the `QuotaFailure` say it is a block instead of naming a limit | as a rate limit, likewise |
//! | store unavailable | 503, `Retry-After: 1` | `UNAVAILABLE`, `retry-after: 1`, pushback 1000 |
//! | in-flight limit full | 429, `Retry-After: 1`, `x-concurrency-limit` | `RESOURCE_EXHAUSTED`, pushback 1000, `RetryInfo` of 1 s, a `QuotaFailure` naming the limit, `retry-after: 1`, `x-concurrency-limit` |
//! | no key | 400, 401, 500 or the layer's status | the code nearest the status: `INVALID_ARGUMENT` (any client error without a code of its own), `UNAUTHENTICATED`, `PERMISSION_DENIED`, `NOT_FOUND`, `RESOURCE_EXHAUSTED`, `UNAVAILABLE` for a 503, or `INTERNAL` for the server's doing |
//! | over capacity (adaptive limit) | 503, `Retry-After: 1`, problem+json naming the limit and the request's class | `UNAVAILABLE`, `retry-after: 1`, pushback 1000 |
//!
//! This file decides what each refusal says and picks the protocol;
//! `http.rs` writes `application/problem+json` bodies and `grpc.rs`
//! trailers-only statuses with their pushback and `RetryInfo`; `wait.rs`
//! turns a wait into `Retry-After`, and `retry_text.rs` raises the wait a
//! refusal's text tells. None of them imports this file. The
//! rate-limit headers of a denial are added by the layer's `Responder`,
//! which also swaps in a custom rejection; the public [`rejection`] adds
//! them here, for code that decides outside the layer.

mod grpc;
pub mod headers;
mod http;
mod ietf;
mod missing;
mod numbers;
mod own;
mod prebuilt;
mod retry_text;
mod status;
mod usage;
mod wait;

pub(crate) use grpc::http_status as grpc_http_status;
pub use missing::MissingKey;
pub(crate) use own::{OwnAnswer, mark as mark_own, reads_as_limited, reads_as_overload};
pub use status::RateLimitReport;
pub use usage::UsageReport;
#[cfg(feature = "axum")]
pub(crate) use usage::bad_usage_query;
pub(crate) use wait::write_retry_after;

use std::fmt::Write as _;
use std::time::Duration;

use ::http::header::{HeaderValue, RETRY_AFTER};
use ::http::{Response, StatusCode};
use bytes::Bytes;
use tollgate_core::{Decision, InFlightLimit, Outcome, Priority, StoreError};

use crate::extract::MissingCause;
use headers::HeaderStyle;
use wait::{RETRY_SOON, retry_after, retry_after_secs};

/// The header that tells a client the in-flight limit it ran into.
pub const CONCURRENCY_LIMIT: &str = "x-concurrency-limit";

/// The protocol a layer answers in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// HTTP statuses with `application/problem+json` bodies (the default).
    #[default]
    Http,
    /// gRPC: trailers-only responses with a `grpc-status`.
    Grpc,
}

/// The words of a store failure under a closed failure mode.
const UNAVAILABLE: &str = "the rate limiter is unavailable";

/// The answer to a request `decision` denies under the policy named
/// `policy`; `status` is the HTTP status of a denial (429 unless the layer
/// was told otherwise). Without `Retry-After` and rate-limit headers: the
/// caller adds them, to this answer or to a custom one.
pub(crate) fn denied(
    decision: &Decision,
    policy: &str,
    status: StatusCode,
    protocol: Protocol,
) -> Response<Bytes> {
    let refusal = Refusal::of(decision);
    let detail = refusal.detail(policy);
    // The limit that fired, as it is written in a policy (`10/s`): for an
    // operator's block, which no limit made, `blocked` instead.
    let limit = decision.binding().limit().to_string();
    let (named, exceeded) = match refusal {
        Refusal::Blocked { .. } => ("blocked", format!("{policy}; blocked")),
        Refusal::Limited { .. } | Refusal::Never { .. } => {
            (limit.as_str(), format!("{policy}; limit={limit}"))
        }
    };
    let mut response = match protocol {
        Protocol::Http => http::quota_exceeded(&detail, policy, named, status),
        Protocol::Grpc => {
            let description = match refusal {
                Refusal::Blocked { .. } => String::from("key blocked by an operator"),
                Refusal::Limited { .. } | Refusal::Never { .. } => {
                    format!("limit {limit} exceeded")
                }
            };
            let violation = grpc::Violation {
                subject: policy,
                description: &description,
            };
            grpc::exhausted(&detail, refusal.pushback_wait(), &violation)
        }
    };
    // A policy's name is a header value already (`x-ratelimit-resource`).
    if let Ok(value) = HeaderValue::from_str(&exceeded) {
        response
            .headers_mut()
            .insert(headers::TOLLGATE_EXCEEDED, value);
    }
    response
}

/// The answer to a request of a key that an operator's override denies
/// under the policy named `policy`: 403 Forbidden with a problem body (gRPC
/// `PERMISSION_DENIED`), not 429, since no waiting lifts it but the
/// operator; for a deny that expires, `Retry-After` is the rest of it and
/// the body says so. Consumes nothing.
pub(crate) fn denied_by_operator(
    policy: &str,
    ends_in: Option<Duration>,
    protocol: Protocol,
) -> Response<Bytes> {
    let detail = match ends_in {
        Some(wait) => format!(
            "access under '{policy}' is denied to this key by an operator, for {} s more",
            retry_after_secs(wait)
        ),
        None => {
            format!("access under '{policy}' is denied to this key by an operator, until lifted")
        }
    };
    let mut response = match protocol {
        Protocol::Http => http::problem(StatusCode::FORBIDDEN, &detail),
        Protocol::Grpc => grpc::response(grpc::Code::PermissionDenied, &detail),
    };
    if let Some(wait) = ends_in {
        let headers = response.headers_mut();
        headers.insert(RETRY_AFTER, retry_after(wait));
    }
    response
}

/// A request refused without a decision because the store failed. How
/// its client is told is [`refused`]'s; what a caller that needs a
/// result gets is [`StoreRefusal::into_result`]'s.
#[derive(Debug)]
pub(crate) struct StoreRefusal {
    pub(crate) error: StoreError,
}

impl StoreRefusal {
    /// What a caller that returns a result (not a response) gets: the
    /// store's error.
    pub(crate) fn into_result<T>(self) -> Result<T, StoreError> {
        Err(self.error)
    }
}

/// The answer to a request refused because the store failed (see
/// [`FailureMode`](crate::FailureMode)).
pub(crate) fn refused(refusal: &StoreRefusal, protocol: Protocol) -> Response<Bytes> {
    // Named field by field: a refusal that learns something new (how its
    // client should be told) is a compile error here until it is told so.
    let StoreRefusal { error: _ } = refusal;
    unavailable(protocol)
}

/// The answer when the store failed and the failure mode is closed: 503,
/// or gRPC's `UNAVAILABLE`, to be retried in a second.
fn unavailable(protocol: Protocol) -> Response<Bytes> {
    match protocol {
        Protocol::Http => http::unavailable(UNAVAILABLE, RETRY_SOON),
        Protocol::Grpc => grpc::unavailable(UNAVAILABLE, RETRY_SOON),
    }
}

/// The answer of a status endpoint whose store failed: 503, to be
/// retried in a second, as a request refused under a closed failure mode.
#[cfg(feature = "axum")]
pub(crate) fn status_unavailable() -> Response<Bytes> {
    unavailable(Protocol::Http)
}

/// The answer to a request whose key holds every slot of `limit`: 429 with
/// problem+json, or gRPC's `RESOURCE_EXHAUSTED`; either way to be retried
/// in a second, and naming the limit.
pub(crate) fn in_flight_full(limit: &InFlightLimit, protocol: Protocol) -> Response<Bytes> {
    let detail = format!(
        "at most {} requests of this client may be in progress at once; retry when one is done",
        limit.max()
    );
    let mut response = match protocol {
        Protocol::Http => http::in_flight_full(&detail, limit),
        Protocol::Grpc => grpc::exhausted(
            &detail,
            Some(RETRY_SOON),
            &grpc::Violation {
                subject: limit.name(),
                description: &format!("at most {} in flight", limit.max()),
            },
        ),
    };
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, retry_after(RETRY_SOON));
    headers.insert(CONCURRENCY_LIMIT, HeaderValue::from(limit.max()));
    response
}

/// The answer to a request of `class` shed because the service is at the
/// adaptive limit named `limit`: 503 with problem+json, or gRPC's
/// `UNAVAILABLE`; either way to be retried in a second.
pub(crate) fn over_capacity(limit: &str, class: Priority, protocol: Protocol) -> Response<Bytes> {
    let detail =
        format!("the service is over its capacity and sheds {class} requests first; retry in 1 s");
    match protocol {
        Protocol::Http => http::over_capacity(&detail, limit, class, RETRY_SOON),
        Protocol::Grpc => grpc::unavailable(&detail, RETRY_SOON),
    }
}

/// The answer to a request whose key is missing for `cause`, as `missing`
/// says: a problem+json body, or the gRPC status nearest its HTTP status.
pub(crate) fn missing_key(
    missing: MissingKey,
    cause: &MissingCause,
    protocol: Protocol,
) -> Response<Bytes> {
    let (status, detail) = missing.answer(cause);
    match protocol {
        Protocol::Http => http::problem(status, detail),
        Protocol::Grpc => grpc::response(grpc::Code::of_status(status), detail),
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
    let status = StatusCode::TOO_MANY_REQUESTS;
    let mut response = denied(decision, policy, status, Protocol::Http);
    headers::write(style, decision, policy, response.headers_mut());
    response
}

/// Why a decision refuses a request, as its answer tells it.
enum Refusal {
    /// Waiting cures it: the same request is admitted after the wait, if
    /// the decision says how long.
    Limited {
        /// The decision's wait.
        wait: Option<Duration>,
        /// For a request of more than one unit that the limit refused,
        /// what it needed and what was left: `(cost, remaining)`.
        short: Option<(u64, u64)>,
    },
    /// An operator blocked the key: it is admitted once the block ends.
    Blocked {
        /// The rest of the block.
        wait: Duration,
    },
    /// The request costs more than a limit's capacity: no wait cures it.
    Never {
        /// The request's cost.
        cost: u64,
        /// The capacity it exceeds.
        capacity: u64,
    },
}

impl Refusal {
    /// The refusal `decision` makes: a cost beyond capacity can never be
    /// admitted; any other refusal is a wait, as long as the decision's
    /// own (an admitting decision refused by a custom rule has none).
    fn of(decision: &Decision) -> Self {
        if decision.is_blocked() {
            return Self::Blocked {
                wait: decision.retry_after().unwrap_or(Duration::ZERO),
            };
        }
        match decision.outcome() {
            Outcome::CostExceedsCapacity { cost, capacity } => Self::Never { cost, capacity },
            Outcome::Limited { retry_after } => Self::Limited {
                wait: Some(retry_after),
                short: (decision.cost() > 1).then(|| (decision.cost(), decision.remaining())),
            },
            Outcome::Allowed => Self::Limited {
                wait: None,
                short: None,
            },
        }
    }

    /// The refusal in words, naming the policy `policy`.
    fn detail(&self, policy: &str) -> String {
        match *self {
            Self::Never { cost, capacity } => format!(
                "request cost {cost} exceeds the capacity {capacity} of limit '{policy}'; it can never be admitted"
            ),
            Self::Blocked { wait } => format!(
                "this key is blocked under '{policy}' by an operator, retry in {} s",
                retry_after_secs(wait)
            ),
            Self::Limited { wait, short } => {
                let mut detail = format!("limit '{policy}' exceeded");
                if let Some((cost, remaining)) = short {
                    let _ = write!(detail, ": the request needs {cost}, {remaining} remain");
                }
                match (wait, short) {
                    (Some(wait), None) => {
                        let _ = write!(detail, ", retry in {} s", retry_after_secs(wait));
                    }
                    (Some(wait), Some(_)) => {
                        let _ = write!(detail, "; retry in {} s", retry_after_secs(wait));
                    }
                    (None, _) => {}
                }
                detail
            }
        }
    }

    /// The wait a gRPC client is pushed back by: none for a request that
    /// can never be admitted, else the decision's (zero if it names none).
    fn pushback_wait(&self) -> Option<Duration> {
        match *self {
            Self::Never { .. } => None,
            Self::Blocked { wait } => Some(wait),
            Self::Limited { wait, .. } => Some(wait.unwrap_or(Duration::ZERO)),
        }
    }
}
