//! Tollgate's outbound demo: workers in several processes call one
//! partner API whose limits are a peak (10 calls per second) and a daily
//! quota (500 per day). The workers share the partner's limits, at the
//! partner's own figures, through Redis, and the partner never answers
//! 429.
//!
//! - `partner.rs`: the stand-in partner, with its own exact counters.
//! - `pacing.rs`: the partner's limits as Tollgate limiters, and how a
//!   worker is let through.
//! - `worker.rs`: workers calling the partner, and an instance of them.
//!
//! Run with: `cargo run -p outbound -- [--seconds 60] [--processes 2] [--workers 4] [--redis-url URL]`

mod pacing;
mod partner;
mod worker;

pub use pacing::{DEFAULT_HEADROOM, Pacing, PartnerLimits, Stop};
pub use partner::{LIMIT_HEADER, Partner, PartnerLog, PartnerQuota};
pub use worker::{Answer, CallPartner, Calls, PartnerClient, instance, work};

/// What a run measured: the partner's log against its allowance.
#[derive(Debug, Clone)]
pub struct Report {
    /// The partner's limits.
    pub quota: PartnerQuota,
    /// How long the workers ran.
    pub run: std::time::Duration,
    /// What the partner saw.
    pub log: PartnerLog,
    /// What the workers counted.
    pub calls: Calls,
}

impl Report {
    /// The calls the partner accepted, per thousand of its allowance for
    /// the run ([`PartnerQuota::allowance`]).
    pub fn used_permille(&self) -> u64 {
        let allowance = self.quota.allowance(self.run).max(1);
        self.log.accepted.len() as u64 * 1_000 / allowance
    }

    /// The time from the first accepted call to the last, by the
    /// partner's clock.
    pub fn span(&self) -> std::time::Duration {
        let first = self.log.accepted.iter().min();
        let last = self.log.accepted.iter().max();
        match (first, last) {
            (Some(first), Some(last)) => std::time::Duration::from_micros(last - first),
            _ => std::time::Duration::ZERO,
        }
    }

    /// The acceptance: no 429, and at least 95 % of the allowance used.
    pub fn passed(&self) -> bool {
        self.log.rejected() == 0 && self.used_permille() >= 950
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let allowance = self.quota.allowance(self.run);
        let used = self.used_permille();
        writeln!(
            f,
            "{:.1} s: the partner accepted {} calls of its allowance of {allowance} ({}.{} %), answered {} with 429 ({} over the peak, {} over the day)",
            self.run.as_secs_f64(),
            self.log.accepted.len(),
            used / 10,
            used % 10,
            self.log.rejected(),
            self.log.over_peak,
            self.log.over_daily,
        )?;
        writeln!(
            f,
            "busiest {:?} window: {} calls (peak {}); the accepted calls spanned {:.1} s",
            self.quota.period,
            self.log.busiest(self.quota.period),
            self.quota.peak,
            self.span().as_secs_f64(),
        )?;
        write!(
            f,
            "workers: {} ok, {} answered 429, {} failed, {} stopped for the day",
            self.calls.ok, self.calls.rejected, self.calls.failed, self.calls.day_over
        )
    }
}
