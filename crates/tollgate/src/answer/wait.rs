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

/// A wait in 32 bits: whole milliseconds, rounded up, below 2^31 ms
/// (about 24 days); whole seconds, rounded up, beyond (to 68 years, where
/// it saturates). 0 is no wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Wait(u32);

impl Wait {
    pub(super) const NONE: Wait = Wait(0);
    const IN_SECONDS: u32 = 1 << 31;

    pub(super) fn of(wait: Duration) -> Self {
        let ms = wait.as_micros().div_ceil(1_000).max(1);
        match u32::try_from(ms) {
            Ok(ms) if ms < Self::IN_SECONDS => Wait(ms),
            Ok(_) | Err(_) => {
                let secs = u32::try_from(retry_after_secs(wait)).unwrap_or(u32::MAX);
                Wait(Self::IN_SECONDS | secs.min(Self::IN_SECONDS - 1))
            }
        }
    }

    pub(super) fn get(self) -> Duration {
        match self.0 & Self::IN_SECONDS {
            0 => Duration::from_millis(u64::from(self.0)),
            _ => Duration::from_secs(u64::from(self.0 & !Self::IN_SECONDS)),
        }
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

    /// Milliseconds, rounded up, to about 24 days; whole seconds beyond,
    /// rounded up, saturating at 68 years; never no wait.
    #[test]
    fn a_wait_keeps_milliseconds_then_seconds_and_never_shortens() {
        let ms = Duration::from_millis;
        assert_eq!(Wait::of(Duration::from_nanos(1)).get(), ms(1));
        assert_eq!(Wait::of(Duration::ZERO).get(), ms(1));
        assert_eq!(Wait::of(Duration::from_micros(500_001)).get(), ms(501));
        let last_ms = ms((1 << 31) - 1);
        assert_eq!(Wait::of(last_ms).get(), last_ms);
        let past = ms(1 << 31);
        assert_eq!(Wait::of(past).get(), Duration::from_secs(2_147_484));
        let most = Duration::from_secs((1 << 31) - 1);
        assert_eq!(Wait::of(Duration::MAX).get(), most);
        assert_eq!(Wait::of(most).get(), most);
    }
}
