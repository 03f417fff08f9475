//! The stand-in partner: an HTTP API that answers 429 beyond its own
//! limits, counted exactly by its own clock when each call arrives.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use tollgate::Clock;

/// The header a partner's 429 names the limit it ran into with.
pub const LIMIT_HEADER: &str = "x-partner-limit";

/// A partner's limits: a peak over a short period, and a quota over a
/// calendar day (UTC, as the partner's clock counts it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartnerQuota {
    /// Calls allowed in any window of `period`.
    pub peak: u64,
    /// The peak's period: no window this long holds more than `peak`.
    pub period: Duration,
    /// Calls allowed per UTC day.
    pub daily: u64,
}

impl PartnerQuota {
    /// The partner of the outbound demo: 10 calls per second, 500 per day.
    pub const DEMO: Self = Self {
        peak: 10,
        period: Duration::from_secs(1),
        daily: 500,
    };

    /// The most calls the partner accepts in a run of `run`, from a fresh
    /// day: every full or begun period's peak, up to the daily quota.
    pub fn allowance(&self, run: Duration) -> u64 {
        let period = self.period.as_micros().max(1);
        let periods = run.as_micros().div_ceil(period);
        let peak = u64::try_from(periods).unwrap_or(u64::MAX);
        peak.saturating_mul(self.peak).min(self.daily)
    }
}

/// What the partner saw.
#[derive(Debug, Default, Clone)]
pub struct PartnerLog {
    /// When each accepted call arrived, in µs of the partner's clock.
    pub accepted: Vec<u64>,
    /// Calls refused for the peak.
    pub over_peak: u64,
    /// Calls refused for the daily quota.
    pub over_daily: u64,
}

impl PartnerLog {
    /// Every 429 the partner answered.
    pub fn rejected(&self) -> u64 {
        self.over_peak + self.over_daily
    }

    /// The most accepted calls in any window of `period`.
    pub fn busiest(&self, period: Duration) -> usize {
        let span = u64::try_from(period.as_micros()).unwrap_or(u64::MAX);
        let mut times = self.accepted.clone();
        times.sort_unstable();
        let (mut start, mut most) = (0, 0);
        for end in 0..times.len() {
            while times[end] - times[start] >= span {
                start += 1;
            }
            most = most.max(end - start + 1);
        }
        most
    }
}

/// The partner's own counters.
#[derive(Debug)]
struct Counters {
    quota: PartnerQuota,
    /// Accepted arrivals within the last period, oldest first.
    recent: VecDeque<u64>,
    /// The UTC day counted, and its accepted calls.
    day: u64,
    today: u64,
    log: PartnerLog,
}

const DAY_US: u64 = 86_400_000_000;

impl Counters {
    /// Counts a call arriving at `now` (µs): `None` if accepted, else the
    /// limit it ran into.
    fn arrive(&mut self, now: u64) -> Option<&'static str> {
        let period = u64::try_from(self.quota.period.as_micros()).unwrap_or(u64::MAX);
        while self
            .recent
            .front()
            .is_some_and(|&t| now.saturating_sub(t) >= period)
        {
            self.recent.pop_front();
        }
        if now / DAY_US != self.day {
            self.day = now / DAY_US;
            self.today = 0;
        }
        if self.today >= self.quota.daily {
            self.log.over_daily += 1;
            return Some("daily");
        }
        if self.recent.len() as u64 >= self.quota.peak {
            self.log.over_peak += 1;
            return Some("peak");
        }
        self.recent.push_back(now);
        self.today += 1;
        self.log.accepted.push(now);
        None
    }
}

/// The partner's state, shared by its handlers and whoever reads its log.
#[derive(Clone)]
pub struct Partner {
    counters: Arc<Mutex<Counters>>,
    clock: Arc<dyn Clock>,
}

impl Partner {
    /// A partner with `quota`, counting by `clock`.
    pub fn new(quota: PartnerQuota, clock: impl Clock) -> Self {
        let counters = Counters {
            quota,
            recent: VecDeque::new(),
            day: 0,
            today: 0,
            log: PartnerLog::default(),
        };
        Self {
            counters: Arc::new(Mutex::new(counters)),
            clock: Arc::new(clock),
        }
    }

    /// `POST /call`: 200 within the limits, else 429 naming the limit.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/call", post(call))
            .with_state(self.clone())
    }

    /// What the partner saw so far.
    pub fn log(&self) -> PartnerLog {
        self.lock().log.clone()
    }

    /// Counts a call arriving now: `None` if accepted, else the limit it
    /// ran into.
    pub fn arrive(&self) -> Option<&'static str> {
        let mut counters = self.lock();
        // Read under the lock: arrivals are counted in the order of their
        // times.
        let now = self.clock.now().as_micros();
        counters.arrive(now)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counters> {
        self.counters.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

async fn call(State(partner): State<Partner>) -> (StatusCode, [(&'static str, &'static str); 1]) {
    match partner.arrive() {
        None => (StatusCode::OK, [(LIMIT_HEADER, "none")]),
        Some(limit) => (StatusCode::TOO_MANY_REQUESTS, [(LIMIT_HEADER, limit)]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(quota: PartnerQuota) -> Counters {
        Counters {
            quota,
            recent: VecDeque::new(),
            day: 0,
            today: 0,
            log: PartnerLog::default(),
        }
    }

    #[test]
    fn the_partner_counts_its_peak_in_any_window_and_its_day_by_the_calendar() {
        let quota = PartnerQuota {
            peak: 2,
            period: Duration::from_secs(1),
            daily: 3,
        };
        let mut c = counters(quota);
        let day = 19_000 * DAY_US;
        assert_eq!(c.arrive(day), None);
        assert_eq!(c.arrive(day + 500_000), None);
        // A third within a second of the first.
        assert_eq!(c.arrive(day + 999_999), Some("peak"));
        assert_eq!(c.arrive(day + 1_000_000), None);
        // The day's three are spent.
        assert_eq!(c.arrive(day + 60_000_000), Some("daily"));
        // The next UTC day starts afresh.
        assert_eq!(c.arrive(day + DAY_US), None);
        assert_eq!((c.log.over_peak, c.log.over_daily), (1, 1));
        assert_eq!(c.log.accepted.len(), 4);
        assert_eq!(c.log.busiest(Duration::from_secs(1)), 2);
    }

    #[test]
    fn the_allowance_of_a_run_is_its_periods_peaks_up_to_the_day() {
        let demo = PartnerQuota::DEMO;
        assert_eq!(demo.allowance(Duration::from_secs(10)), 100);
        assert_eq!(demo.allowance(Duration::from_millis(10_500)), 110);
        assert_eq!(demo.allowance(Duration::from_secs(60)), 500);
    }
}
