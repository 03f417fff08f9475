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

/// `RateLimit-Policy` (IETF draft): every limit of the policy.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (IETF draft): every limit's remaining quota.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Which rate-limit headers responses carry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// GitHub's `x-ratelimit-*` headers (the default), for the binding limit.
    /// When several layers limit one route (per IP, then per user), the
    /// headers describe the one with the fewest requests remaining.
    #[default]
    GitHub,
    /// The IETF draft's (draft-ietf-httpapi-ratelimit-headers-10)
    /// `RateLimit-Policy` and `RateLimit` structured fields, with one item
    /// per limit of the policy:
    ///
    /// ```text
    /// RateLimit-Policy: "search-0";q=25;w=5, "search-1";q=300;w=60
    /// RateLimit: "search-0";r=0;t=3, "search-1";r=290;t=0
    /// ```
    ///
    /// Items are named after the policy, with `-<index>` when it has several
    /// limits. `q` is the capacity, `w` the period in seconds (rounded up),
    /// `r` the remaining quota and `t` the seconds until more quota is
    /// available (0 while some remains; rounded up).
    Ietf,
    /// Both of the above.
    Both,
    /// No rate-limit headers. Rejections still carry `Retry-After`.
    None,
}

/// Writes the headers of `style` for `decision` into `headers`. When a
/// nearer layer already wrote GitHub headers, they are replaced only if this
/// decision leaves fewer requests.
pub(crate) fn write(style: HeaderStyle, decision: &Decision, headers: &mut HeaderMap) {
    if matches!(style, HeaderStyle::Ietf | HeaderStyle::Both) {
        write_ietf(decision, headers);
    }
    // Stacked layers (per IP, then per user) all decorate one response:
    // the GitHub headers describe the tightest of them.
    let tighter = || match headers.get(X_RATELIMIT_REMAINING) {
        Some(existing) => existing
            .to_str()
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .is_none_or(|existing| decision.remaining() < existing),
        None => true,
    };
    match style {
        HeaderStyle::GitHub | HeaderStyle::Both if tighter() => {
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
        _ => {}
    }
}

fn ceil_secs(d: std::time::Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn write_ietf(decision: &Decision, headers: &mut HeaderMap) {
    use std::fmt::Write;
    let name = decision.policy().name();
    let several = decision.limits().len() > 1;
    let (mut policy, mut state) = (String::new(), String::new());
    for status in decision.limits() {
        let sep = if status.index() == 0 { "" } else { ", " };
        let item = if several {
            format!("\"{name}-{}\"", status.index())
        } else {
            format!("\"{name}\"")
        };
        let window = ceil_secs(status.limit().period());
        let _ = write!(policy, "{sep}{item};q={};w={window}", status.capacity());
        let more_in = if status.remaining() > 0 {
            0
        } else {
            ceil_secs(status.retry_after().unwrap_or(status.reset()))
        };
        let _ = write!(state, "{sep}{item};r={};t={more_in}", status.remaining());
    }
    // Policy names are validated tokens, so both values are valid header values.
    // Appended: stacked layers each add their items, and field lines of a
    // structured list combine into one list.
    if let (Ok(policy), Ok(state)) = (HeaderValue::try_from(policy), HeaderValue::try_from(state)) {
        headers.append(RATELIMIT_POLICY, policy);
        headers.append(RATELIMIT, state);
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
