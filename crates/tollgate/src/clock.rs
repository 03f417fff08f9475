//! A clock driven by Tokio's timer.

use tollgate_core::{Clock, SystemClock, Timestamp};

/// Wall-clock time that advances with Tokio's clock: the system time when
/// it was made, plus the time elapsed on [`tokio::time::Instant`].
///
/// Under `#[tokio::test(start_paused = true)]` it moves only as paused time
/// auto-advances, so limiter time and timers agree and tests never sleep
/// for real. In production prefer [`SystemClock`](tollgate_core::SystemClock).
///
/// ```
/// use std::time::Duration;
/// use tollgate::TokioClock;
/// use tollgate_core::{Clock, Timestamp};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let clock = TokioClock::starting_at(Timestamp::from_secs(1_000));
/// tokio::time::sleep(Duration::from_millis(1_500)).await;
/// assert_eq!(clock.now(), Timestamp::from_millis(1_001_500));
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    base: Timestamp,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// Starts at the current system time.
    pub fn new() -> Self {
        Self::starting_at(SystemClock.now())
    }

    /// Starts at `base`.
    pub fn starting_at(base: Timestamp) -> Self {
        Self {
            base,
            start: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        self.base + self.start.elapsed()
    }
}

/// The instant `wait` from now on Tokio's clock, or about thirty years
/// from now when `wait` goes past what an instant can hold (a
/// configured wait of [`Duration::MAX`](std::time::Duration::MAX), a
/// retry time of centuries): adding it would panic.
pub(crate) fn instant_after(wait: std::time::Duration) -> tokio::time::Instant {
    const FAR: std::time::Duration = std::time::Duration::from_secs(86_400 * 365 * 30);
    let now = tokio::time::Instant::now();
    now.checked_add(wait.min(FAR)).unwrap_or(now)
}
