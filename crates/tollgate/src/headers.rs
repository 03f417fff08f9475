//! Rate-limit response headers.

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use tollgate_core::Decision;

/// `x-ratelimit-limit`: capacity of the binding limit.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `x-ratelimit-remaining`: requests the binding limit still admits now.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `x-ratelimit-used`: `limit - remaining`.
pub const X_RATELIMIT_USED: HeaderName = HeaderName::from_static("x-ratelimit-used");
/// `x-ratelimit-reset`: when the binding limit is fully back, in UTC epoch
/// seconds, rounded up.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `x-ratelimit-resource`: the policy's name.
pub const X_RATELIMIT_RESOURCE: HeaderName = HeaderName::from_static("x-ratelimit-resource");

/// Which rate-limit headers responses carry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// GitHub's `x-ratelimit-*` headers (the default).
    #[default]
    GitHub,
    /// No rate-limit headers. Rejections still carry `Retry-After`.
    None,
}

/// Writes the headers of `style` for `decision` into `headers`.
pub(crate) fn write(style: HeaderStyle, decision: &Decision, headers: &mut HeaderMap) {
    match style {
        HeaderStyle::GitHub => {
            headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(decision.limit()));
            headers.insert(
                X_RATELIMIT_REMAINING,
                HeaderValue::from(decision.remaining()),
            );
            headers.insert(X_RATELIMIT_USED, HeaderValue::from(decision.used()));
            headers.insert(
                X_RATELIMIT_RESET,
                HeaderValue::from(decision.reset_at().as_secs_ceil()),
            );
            if let Ok(name) = HeaderValue::from_str(decision.policy().name()) {
                headers.insert(X_RATELIMIT_RESOURCE, name);
            }
        }
        HeaderStyle::None => {}
    }
}

/// `Retry-After` in whole seconds, rounded up, at least 1.
pub(crate) fn retry_after_secs(decision: &Decision) -> Option<u64> {
    let retry = decision.retry_after()?;
    let secs = retry.as_secs() + u64::from(retry.subsec_nanos() > 0);
    Some(secs.max(1))
}

pub(crate) fn write_retry_after(decision: &Decision, headers: &mut HeaderMap) {
    if let Some(secs) = retry_after_secs(decision) {
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    }
}
