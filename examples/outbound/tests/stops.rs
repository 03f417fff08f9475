//! What a worker is told when no call may go: the day over, or not in
//! time. On tokio's paused clock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use outbound::{DEFAULT_HEADROOM, Pacing, PartnerLimits, PartnerQuota, Stop};
use tollgate::{Jitter, Key, MemoryStore, Timestamp, TokioClock};

/// Sliding-log pacing with the default headroom spreads the peak of 10 a
/// second over 1.1 s. Ten calls spend it at once; a worker that can wait
/// 1.05 s is not let through in time, though the day (500) is far from
/// spent: `NotInTime`, not `DayIsOver` (the wait was compared with the
/// partner's 1 s, not the 1.1 s it is paced over).
#[tokio::test(start_paused = true)]
async fn a_peak_wait_past_the_partners_period_is_not_the_day_over() {
    let clock = TokioClock::starting_at(Timestamp::from_secs(1_700_000_000));
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    for pacing in [Pacing::SlidingLog, Pacing::Gcra] {
        let limits = PartnerLimits::new(
            PartnerQuota::DEMO,
            pacing,
            Jitter::NONE,
            DEFAULT_HEADROOM,
            store.clone(),
        )
        .unwrap();
        let account = Key::custom(format!("account-{pacing:?}"));
        for _ in 0..10 {
            limits
                .admit(&account, Duration::from_secs(5))
                .await
                .unwrap();
        }
        let stop = limits.admit(&account, Duration::from_millis(50)).await;
        assert_eq!(stop, Err(Stop::NotInTime), "{pacing:?}");
    }
}
