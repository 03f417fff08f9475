//! How long a refused client is told to wait, from a `Duration` to
//! `Retry-After`.

use std::time::Duration;

use http::header::{HeaderMap, HeaderValue, RETRY_AFTER};
use tollgate_core::Decision;

use super::numbers::number;

/// "Retry in a second": the wait of a refusal that has none of its own, a
/// store failure under a closed failure mode or a full in-flight limit.
pub(super) const RETRY_SOON: Duration = Duration::from_secs(1);

/// `wait` in the whole seconds `Retry-After` carries: rounded up, at least
/// 1 (a client told 0 would retry at once).
pub(super) fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait
        .as_secs()
        .saturating_add(u64::from(wait.subsec_nanos() > 0));
    secs.max(1)
}

/// `Retry-After` for `wait`, as [`retry_after_secs`] counts it.
pub(super) fn retry_after(wait: Duration) -> HeaderValue {
    number(retry_after_secs(wait))
}

/// Writes `Retry-After` for `decision`, if it names a wait (a request that
/// can never be admitted gets none).
pub(crate) fn write_retry_after(decision: &Decision, headers: &mut HeaderMap) {
    if let Some(wait) = decision.retry_after() {
        headers.insert(RETRY_AFTER, retry_after(wait));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_at_least_one() {
        assert_eq!(retry_after(Duration::ZERO), "1");
        assert_eq!(retry_after(Duration::from_micros(1)), "1");
        assert_eq!(retry_after(RETRY_SOON), "1");
        assert_eq!(retry_after(Duration::from_millis(1_001)), "2");
        assert_eq!(retry_after(Duration::from_secs(3_600)), "3600");
    }
}
