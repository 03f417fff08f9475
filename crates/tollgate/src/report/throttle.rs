//! A throttle of log lines: at most one per interval, counting the rest.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

// tokio's clock: the same as std's, but for tests that pause it, so that
// what a throttle lets through does not depend on how busy the machine is.
use tokio::time::Instant;

/// Lets a log line through at most once per interval, counting the ones it
/// holds back, so that an outage, or a client, cannot flood the logs: what
/// the layers log their warnings through, for an app's own lines too (the
/// demo logs its failed responses through one).
///
/// ```
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use tollgate::LogThrottle;
///
/// let throttle = LogThrottle::new(Duration::from_secs(1));
/// let start = Instant::now();
/// assert_eq!(throttle.may_log(start), Some(0));
/// assert_eq!(throttle.may_log(start), None);
/// assert_eq!(throttle.may_log(start + Duration::from_millis(999)), None);
/// // The next line, with the two held back since.
/// assert_eq!(throttle.may_log(start + Duration::from_secs(1)), Some(2));
/// ```
#[derive(Debug)]
pub struct LogThrottle {
    origin: Instant,
    interval: Duration,
    /// When the last line was logged, in ms since `origin`, plus one (0: never).
    last: AtomicU64,
    suppressed: AtomicU64,
}

impl LogThrottle {
    /// A throttle of one line per `interval`, from now.
    pub fn new(interval: Duration) -> Self {
        Self {
            origin: Instant::now(),
            interval,
            last: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(lines held back since the last one)` if a line may be logged
    /// at `now`; `None` (and the line counted as held back) if not.
    pub fn may_log(&self, now: Instant) -> Option<u64> {
        let now_ms = u64::try_from(now.saturating_duration_since(self.origin).as_millis())
            .unwrap_or(u64::MAX - 1)
            + 1;
        let last = self.last.load(Ordering::Acquire);
        let interval = u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX);
        if last != 0 && now_ms.saturating_sub(last) < interval {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if self
            .last
            .compare_exchange(last, now_ms, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_once_per_second_with_the_count_of_the_rest() {
        let throttle = LogThrottle::new(Duration::from_secs(1));
        let t0 = throttle.origin;
        assert_eq!(throttle.may_log(t0), Some(0));
        for _ in 0..99 {
            assert_eq!(throttle.may_log(t0 + Duration::from_millis(500)), None);
        }
        assert_eq!(throttle.may_log(t0 + Duration::from_millis(999)), None);
        assert_eq!(
            throttle.may_log(t0 + Duration::from_millis(1_000)),
            Some(100)
        );
        assert_eq!(throttle.may_log(t0 + Duration::from_millis(1_001)), None);
    }
}
