//! The circuit breaker of the Redis store's calls, and its gauge.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tollgate_core::ConfigError;

/// The state of the Redis store's circuit breaker (see
/// [`RedisStore::breaker_state`](crate::RedisStore::breaker_state)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// Calls are refused at once, without touching the backend.
    Open,
    /// One probe call is allowed through to see whether the backend is back.
    HalfOpen,
}

/// Stops calling a failing backend, then probes it until it recovers.
///
/// After `threshold` consecutive failures (errors or missed deadlines) the
/// breaker opens: [`try_acquire`](CircuitBreaker::try_acquire) refuses at
/// once for `cooldown`, so a dead backend adds no latency. Then one caller
/// at a time probes it (half-open); a success closes the breaker, a failure
/// opens it for another `cooldown`. Time is the monotonic system clock: a
/// breaker's timing is local to the process, not limiter time.
///
/// Redis is judged by the store's deadline alone. A caller that gives up
/// sooner (its client went away, or a shorter timeout above the store)
/// leaves no judgment either way, so a timeout above the store should be
/// longer than the store's deadline.
pub(crate) struct CircuitBreaker {
    threshold: u32,
    cooldown: Duration,
    state: Mutex<Inner>,
    /// Probes let through so far: each half-open state knows its own.
    probes: AtomicU64,
    /// When the breaker was made: the origin of [`Self::answered`].
    born: Instant,
    /// When a call last succeeded, Redis's last sign of life: nanoseconds
    /// since `born`, plus one (none yet: zero).
    answered: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
enum Inner {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    /// One probe is out: the `probe`th since the breaker was made.
    HalfOpen {
        probe: u64,
    },
}

impl Inner {
    fn is_closed(&self) -> bool {
        match self {
            Self::Closed { .. } => true,
            Self::Open { .. } | Self::HalfOpen { .. } => false,
        }
    }
}

impl CircuitBreaker {
    /// A breaker that opens after `threshold` consecutive failures and
    /// stays open for `cooldown` before probing.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] when `threshold` or `cooldown` is zero.
    pub(crate) fn new(threshold: u32, cooldown: Duration) -> Result<Self, ConfigError> {
        if threshold == 0 {
            return Err(ConfigError::InvalidSetting {
                setting: "breaker_threshold",
                reason: "must be at least 1",
            });
        }
        if cooldown.is_zero() {
            return Err(ConfigError::InvalidSetting {
                setting: "breaker_cooldown",
                reason: "must be greater than zero",
            });
        }
        // Added to clock readings when the breaker opens.
        if cooldown > crate::patience::MAX_WAIT {
            return Err(ConfigError::InvalidSetting {
                setting: "breaker_cooldown",
                reason: "must be at most a day",
            });
        }
        Ok(Self {
            threshold,
            cooldown,
            state: Mutex::new(Inner::Closed { failures: 0 }),
            probes: AtomicU64::new(0),
            born: Instant::now(),
            answered: AtomicU64::new(0),
        })
    }

    /// Whether a call succeeded within `window` of now: Redis answered
    /// lately.
    pub(crate) fn answered_within(&self, window: Duration) -> bool {
        self.answered_within_at(window, Instant::now())
    }

    fn answered_within_at(&self, window: Duration, now: Instant) -> bool {
        let last = self.answered.load(std::sync::atomic::Ordering::Relaxed);
        let window = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        last != 0 && self.since_born(now).saturating_sub(last - 1) <= window
    }

    /// Nanoseconds from `born` to `now`, saturating some 584 years on one
    /// short of `u64::MAX`, so that one more (the stored form) fits.
    fn since_born(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.born).as_nanos();
        u64::try_from(since).unwrap_or(u64::MAX).min(u64::MAX - 1)
    }

    /// The current state.
    pub(crate) fn state(&self) -> BreakerState {
        self.state_at(Instant::now())
    }

    fn state_at(&self, now: Instant) -> BreakerState {
        match *self.lock() {
            Inner::Closed { .. } => BreakerState::Closed,
            Inner::Open { until } if now >= until => BreakerState::HalfOpen,
            Inner::Open { .. } => BreakerState::Open,
            Inner::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Asks to call the backend: a [`Permit`] to report the outcome on, or
    /// `None` when the breaker is open (or another caller is probing).
    /// A permit dropped without a report (its caller gave up: a client
    /// that went away, a timeout above the store) counts for nothing: the
    /// backend did not fail. A dropped probe lets the next caller probe.
    pub(crate) fn try_acquire(&self) -> Option<Permit<'_>> {
        self.try_acquire_at(Instant::now())
    }

    fn try_acquire_at(&self, now: Instant) -> Option<Permit<'_>> {
        let mut state = self.lock();
        let probe = match *state {
            Inner::Closed { .. } => None,
            Inner::Open { until } if now >= until => {
                let probe = self.probes.fetch_add(1, Ordering::Relaxed);
                *state = Inner::HalfOpen { probe };
                Some(probe)
            }
            Inner::Open { .. } | Inner::HalfOpen { .. } => return None,
        };
        Some(Permit {
            breaker: self,
            reported: false,
            probe,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn report(&self, ok: bool) {
        self.report_at(ok, Instant::now());
    }

    fn report_at(&self, ok: bool, now: Instant) {
        if ok {
            let answered = self.since_born(now) + 1;
            self.answered
                .store(answered, std::sync::atomic::Ordering::Relaxed);
        }
        let mut state = self.lock();
        let was_closed = state.is_closed();
        *state = match (*state, ok) {
            (Inner::Closed { .. } | Inner::Open { .. } | Inner::HalfOpen { .. }, true) => {
                Inner::Closed { failures: 0 }
            }
            (Inner::Closed { failures }, false) if failures + 1 < self.threshold => Inner::Closed {
                failures: failures + 1,
            },
            (Inner::Closed { .. } | Inner::Open { .. } | Inner::HalfOpen { .. }, false) => {
                Inner::Open {
                    until: now + self.cooldown,
                }
            }
        };
        let is_closed = state.is_closed();
        drop(state);
        match (was_closed, is_closed) {
            (true, false) => open_gauge(1.0),
            (false, true) => open_gauge(-1.0),
            _ => {}
        }
    }
}

/// Moves the [`CIRCUITS_OPEN`](tollgate_core::telemetry::CIRCUITS_OPEN)
/// gauge by `delta`, with the `metrics` feature.
fn open_gauge(_delta: f64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(tollgate_core::telemetry::CIRCUITS_OPEN).increment(_delta);
}

impl Drop for CircuitBreaker {
    fn drop(&mut self) {
        if !self.lock().is_closed() {
            open_gauge(-1.0);
        }
    }
}

impl fmt::Debug for CircuitBreaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("threshold", &self.threshold)
            .field("cooldown", &self.cooldown)
            .field("state", &self.state())
            .finish()
    }
}

/// Leave to call the backend once; report how it went.
#[derive(Debug)]
#[must_use = "report the outcome with success() or failure()"]
pub(crate) struct Permit<'a> {
    breaker: &'a CircuitBreaker,
    reported: bool,
    /// Which probe of the half-open breaker this is, if it is one.
    probe: Option<u64>,
}

impl Permit<'_> {
    /// The call succeeded.
    pub(crate) fn success(mut self) {
        self.reported = true;
        self.breaker.report(true);
    }

    /// The call failed or missed its deadline.
    pub(crate) fn failure(mut self) {
        self.reported = true;
        self.breaker.report(false);
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        // A caller that gave up (a cancelled future) learned nothing of
        // the backend: a client going away is not a store failure. A
        // probe given up on must not leave the breaker waiting for it
        // forever: the next caller probes.
        if let (false, Some(probe)) = (self.reported, self.probe) {
            let mut state = self.breaker.lock();
            match *state {
                Inner::HalfOpen { probe: out } if out == probe => {
                    *state = Inner::Open {
                        until: Instant::now(),
                    };
                }
                Inner::HalfOpen { .. } | Inner::Closed { .. } | Inner::Open { .. } => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_success_is_a_sign_of_life_for_a_window() {
        let b = CircuitBreaker::new(3, Duration::from_millis(20)).unwrap();
        let t0 = Instant::now();
        let second = Duration::from_secs(1);
        assert!(!b.answered_within_at(second, t0), "none yet");
        let mut permit = b.try_acquire_at(t0).unwrap();
        permit.reported = true;
        b.report_at(false, t0);
        assert!(!b.answered_within_at(second, t0), "a failure is none");
        let mut permit = b.try_acquire_at(t0).unwrap();
        permit.reported = true;
        b.report_at(true, t0 + second);
        assert!(b.answered_within_at(second, t0 + second));
        assert!(b.answered_within_at(second, t0 + second * 2));
        let just_past = t0 + second * 2 + Duration::from_nanos(1);
        assert!(!b.answered_within_at(second, just_past));
        assert!(b.answered_within_at(Duration::MAX, just_past));
    }

    #[test]
    fn opens_after_consecutive_failures_and_probes_after_cooldown() {
        let b = CircuitBreaker::new(3, Duration::from_millis(20)).unwrap();
        let t0 = Instant::now();
        let fail = |at| {
            let mut permit = b.try_acquire_at(at).unwrap();
            permit.reported = true;
            b.report_at(false, at);
        };
        fail(t0);
        fail(t0);
        b.try_acquire_at(t0).unwrap().success();
        fail(t0);
        fail(t0);
        assert_eq!(
            b.state_at(t0),
            BreakerState::Closed,
            "a success resets the count"
        );
        fail(t0);
        assert_eq!(b.state_at(t0), BreakerState::Open);
        assert!(b.try_acquire_at(t0 + Duration::from_millis(19)).is_none());
        let later = t0 + Duration::from_millis(20);
        assert_eq!(b.state_at(later), BreakerState::HalfOpen);
        let mut probe = b.try_acquire_at(later).expect("half-open probe");
        assert!(b.try_acquire_at(later).is_none(), "one probe at a time");
        probe.reported = true;
        b.report_at(false, later);
        assert_eq!(b.state_at(later), BreakerState::Open);
        let again = later + Duration::from_millis(20);
        b.try_acquire_at(again).unwrap().success();
        assert_eq!(b.state_at(again), BreakerState::Closed);
    }

    /// The example the breaker's documentation gave while it was public.
    #[test]
    fn two_failures_open_a_breaker_of_threshold_two() {
        let breaker = CircuitBreaker::new(2, Duration::from_secs(1)).unwrap();
        for _ in 0..2 {
            let permit = breaker.try_acquire().expect("closed");
            permit.failure();
        }
        assert_eq!(breaker.state(), BreakerState::Open);
        assert!(breaker.try_acquire().is_none());
    }

    #[test]
    fn permits_given_up_on_count_for_nothing() {
        let b = CircuitBreaker::new(3, Duration::from_secs(1)).unwrap();
        for _ in 0..10 {
            drop(b.try_acquire().expect("closed"));
        }
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "callers gave up; Redis did not fail"
        );
        b.try_acquire().unwrap().failure();
        b.try_acquire().unwrap().failure();
        drop(b.try_acquire().expect("closed"));
        assert_eq!(b.state(), BreakerState::Closed, "two failures of three");
        b.try_acquire().unwrap().failure();
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn a_probe_given_up_on_lets_the_next_caller_probe() {
        let b = CircuitBreaker::new(1, Duration::from_millis(20)).unwrap();
        let t0 = Instant::now();
        let stale = b.try_acquire_at(t0).expect("closed");
        let mut failing = b.try_acquire_at(t0).unwrap();
        failing.reported = true;
        b.report_at(false, t0);
        let later = t0 + Duration::from_millis(20);
        let probe = b.try_acquire_at(later).expect("half-open probe");
        drop(stale);
        assert!(
            b.try_acquire_at(later).is_none(),
            "still one probe at a time"
        );
        drop(probe);
        // Reopened as of the drop, on the real clock.
        let after = Instant::now().max(later);
        assert_eq!(b.state_at(after), BreakerState::HalfOpen);
        b.try_acquire_at(after)
            .expect("the next caller probes")
            .success();
        assert_eq!(b.state_at(after), BreakerState::Closed);
    }

    #[test]
    fn an_old_probe_given_up_on_leaves_the_current_probe_alone() {
        let b = CircuitBreaker::new(1, Duration::from_millis(20)).unwrap();
        let t0 = Instant::now();
        let fail = |at| {
            let mut permit = b.try_acquire_at(at).unwrap();
            permit.reported = true;
            b.report_at(false, at);
        };
        let stale = b.try_acquire_at(t0).expect("closed");
        fail(t0);
        let first = b
            .try_acquire_at(t0 + Duration::from_millis(20))
            .expect("probe");
        // A call from before the breaker opened succeeds: closed again;
        // then it fails and reopens, and a second probe goes out.
        stale.success();
        let t1 = t0 + Duration::from_millis(30);
        fail(t1);
        let second = b
            .try_acquire_at(t1 + Duration::from_millis(20))
            .expect("probe");
        drop(first);
        assert!(
            b.try_acquire_at(t1 + Duration::from_millis(20)).is_none(),
            "the second probe is still the only one"
        );
        drop(second);
    }

    #[test]
    fn bad_settings_are_typed_errors() {
        assert!(CircuitBreaker::new(0, Duration::from_secs(1)).is_err());
        assert!(CircuitBreaker::new(1, Duration::ZERO).is_err());
    }
}
