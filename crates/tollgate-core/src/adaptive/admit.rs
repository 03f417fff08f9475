//! [`Concurrency`]: one instance's requests in flight under an adaptive
//! limit, who may be admitted, and what each finished request teaches the
//! limit.

use std::time::Duration;

use super::config::{AdaptiveLimit, Priority};
use super::estimate::{Estimator, Sample};
use super::window::Windows;
use crate::time::Timestamp;

/// The right of one admitted request to run, to be handed back to
/// [`Concurrency::release`] when it is done.
#[derive(Debug)]
#[must_use = "a permit holds a slot until it is released"]
pub struct Permit {
    class: Priority,
    admitted: Timestamp,
    in_flight: u32,
    /// The window of samples it counts in, if any.
    window: Option<u64>,
    /// Its request waited in a queue before it was admitted.
    waited: bool,
}

impl Permit {
    /// Marks a permit given to a request that waited in a queue first. If
    /// its client gives up, that says nothing of the service: its budget
    /// was partly spent in the queue, which a low limit makes long. So it
    /// never counts towards a window's share of requests given up on
    /// (see [`Completion::Abandoned`]); the time it ran after admission
    /// is still a latency sample once long enough.
    pub fn after_waiting(mut self) -> Self {
        self.waited = true;
        self
    }

    /// The class the request was admitted as.
    pub fn class(&self) -> Priority {
        self.class
    }

    /// When it was admitted.
    pub fn admitted(&self) -> Timestamp {
        self.admitted
    }
}

/// How an admitted request ended, as the limit learns from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// It was served: its latency is a sample.
    Served,
    /// It failed for want of capacity (the service said it was
    /// overloaded, or it timed out): the limit shrinks.
    Dropped,
    /// It ended without the service's answer: its caller went away (a
    /// client that timed out, a cancelled task), or the service failed
    /// with an error. Its latency was at least the time it ran: once that
    /// is longer than the latency the limit's algorithm knows (Vegas's
    /// no-load latency, Gradient2's average, AIMD's latency ceiling), it
    /// is a latency sample of that time, as a served request that slow
    /// would be; sooner, it is none (it would read as a faster service
    /// than is known). And a window of samples a quarter or more of whose
    /// requests (two at least, none admitted
    /// [`after_waiting`](Permit::after_waiting)) were abandoned after half
    /// their typical latency (that one, or the last window's if lower; any
    /// time before any request came back) counts as
    /// [`Dropped`](Self::Dropped) if it ran at half the limit or more:
    /// clients giving up in numbers is overload, even where their deadline
    /// is shorter than the latency the algorithm aims for.
    Abandoned,
    /// It ended in a way that says nothing about capacity (it never ran,
    /// or the caller knows its end is unrelated to load): not a sample.
    Ignored,
}

/// What a [`Concurrency`] holds at a moment, for metrics and dashboards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConcurrencySnapshot {
    /// The limit in force.
    pub limit: u32,
    /// The requests in flight.
    pub in_flight: u32,
    /// The requests in flight per class, in [`Priority::ALL`]'s order.
    pub in_flight_by_class: [u32; 3],
    /// The requests refused since the start, per class, in
    /// [`Priority::ALL`]'s order.
    pub refused_by_class: [u64; 3],
    /// The requests admitted since the start.
    pub admitted: u64,
}

/// The requests one instance has in flight under an [`AdaptiveLimit`],
/// and the limit it has found so far.
///
/// Time is given by the caller on every call, so that the same state runs
/// on the wall clock and in a simulation. It is not shared: wrap it in a
/// mutex to use it from several threads.
#[derive(Debug, Clone)]
pub struct Concurrency {
    config: AdaptiveLimit,
    estimator: Estimator,
    windows: Windows,
    started: Timestamp,
    in_flight: [u32; 3],
    refused: [u64; 3],
    /// When each class was last refused.
    refused_at: [Option<Timestamp>; 3],
    /// The latest time the state was given.
    seen: Timestamp,
    admitted: u64,
}

impl Concurrency {
    /// The state of a new instance under `config`, started at `now` (its
    /// warm-up counts from `now`).
    pub fn new(config: &AdaptiveLimit, now: Timestamp) -> Self {
        Self {
            estimator: Estimator::new(config.algorithm, config.initial),
            windows: Windows::new(config.window),
            config: config.clone(),
            started: now,
            in_flight: [0; 3],
            refused: [0; 3],
            refused_at: [None; 3],
            seen: now,
            admitted: 0,
        }
    }

    /// The settings.
    pub fn config(&self) -> &AdaptiveLimit {
        &self.config
    }

    /// The ceiling of the limit at `now`: the maximum, or less while the
    /// instance warms up.
    fn ceiling(&self, now: Timestamp) -> u32 {
        let Some(warm_up) = self.config.warm_up else {
            return self.config.max;
        };
        let elapsed = now.saturating_duration_since(self.started);
        if elapsed >= warm_up.over {
            return self.config.max;
        }
        // In whole µs, so that `ceiling_rises_at` finds each rise exactly.
        let span = u128::from(self.config.max - warm_up.from);
        let ramp = span * elapsed.as_micros() / warm_up.over.as_micros().max(1);
        // Between `from` and the maximum, both u32 (elapsed < over).
        warm_up.from + u32::try_from(ramp).unwrap_or(0)
    }

    /// The limit in force at `now`.
    pub fn limit(&self, now: Timestamp) -> u32 {
        self.estimator.limit().min(self.ceiling(now))
    }

    /// The requests in flight.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.iter().sum()
    }

    /// How long a refusal closes the classes below the refused one.
    pub const CLOSED_FOR: Duration = Duration::from_micros(Self::CLOSED_FOR_US);
    const CLOSED_FOR_US: u64 = 100_000;

    /// How many requests of `class` may be in flight in all, at `now`:
    /// the limit less the share of it reserved for each class above, or
    /// none while a class above is being refused (one was refused less
    /// than 100 ms ago): a class below never takes the slots a class above
    /// is waiting for.
    pub fn ceiling_of(&self, class: Priority, now: Timestamp) -> u32 {
        if self.closed(class, now) {
            return 0;
        }
        let limit = self.limit(now);
        let kept: u32 = class
            .above()
            .iter()
            .map(|&above| reserved_slots(limit, self.config.reserved[above.index()]))
            .sum();
        limit.saturating_sub(kept)
    }

    /// Whether a class above `class` was refused less than
    /// [`CLOSED_FOR`](Self::CLOSED_FOR) before `now`.
    fn closed(&self, class: Priority, now: Timestamp) -> bool {
        self.closed_until(class, now).is_some()
    }

    /// Until when `class` is closed by a refusal of a class above it, if
    /// it still is at `now`: a request of `class` waiting meanwhile can be
    /// admitted only then, whether or not a slot is released. A refusal
    /// dated more than [`CLOSED_FOR`](Self::CLOSED_FOR) after `now` (a
    /// clock that stepped back) closes nothing.
    pub fn closed_until(&self, class: Priority, now: Timestamp) -> Option<Timestamp> {
        let horizon = now.as_micros().saturating_add(Self::CLOSED_FOR_US);
        let until = class
            .above()
            .iter()
            .filter_map(|&above| self.refused_at[above.index()])
            .filter(|at| at.as_micros() < horizon)
            .map(|at| Timestamp::from_micros(at.as_micros().saturating_add(Self::CLOSED_FOR_US)))
            .max()?;
        (until > now).then_some(until)
    }

    /// When a request of `class` that may not run at `now` could run
    /// though no request ends: when its class reopens
    /// ([`closed_until`](Self::closed_until)), or else, while a warm-up's
    /// ceiling holds the limit down, when that ceiling next rises. `None`
    /// when only a request ending can make room. For a queue of waiting
    /// requests, which nothing else serves when none is in flight.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::{AdaptiveLimit, Concurrency, Priority, Timestamp};
    ///
    /// // From 1 to 101 over 10 s: one more every 100 ms.
    /// let limit = AdaptiveLimit::builder("api")
    ///     .bounds(1, 101)
    ///     .initial(101)
    ///     .warm_up(1, Duration::from_secs(10))
    ///     .build()?;
    /// let start = Timestamp::from_secs(1_700_000_000);
    /// let mut state = Concurrency::new(&limit, start);
    /// let _running = state.try_acquire(Priority::Default, start);
    /// let next = start + Duration::from_millis(100);
    /// assert_eq!(state.next_opening(Priority::Default, start), Some(next));
    /// assert!(state.try_acquire(Priority::Critical, next).is_some());
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    pub fn next_opening(&self, class: Priority, now: Timestamp) -> Option<Timestamp> {
        self.closed_until(class, now)
            .or_else(|| self.ceiling_rises_at(now))
    }

    /// When the warm-up's ceiling next rises by a request, if it holds the
    /// limit down at `now`.
    fn ceiling_rises_at(&self, now: Timestamp) -> Option<Timestamp> {
        let warm_up = self.config.warm_up?;
        let ceiling = self.ceiling(now);
        if self.estimator.limit() <= ceiling || ceiling >= self.config.max {
            return None;
        }
        // The ceiling is `from` plus the span times the share of the
        // warm-up gone, rounded down: it reaches `ceiling + 1` at that
        // share of the warm-up, rounded up to the µs.
        let span = u128::from(self.config.max - warm_up.from);
        let next = u128::from(ceiling - warm_up.from + 1);
        let over = warm_up.over.as_micros();
        let after = (over * next).div_ceil(span).min(over);
        let after = u64::try_from(after).unwrap_or(u64::MAX);
        Some(Timestamp::from_micros(
            self.started.as_micros().saturating_add(after),
        ))
    }

    /// Counts a request that waits for a slot, at `now`: the limit holds
    /// requests back (as a refusal tells the window it ran under), but
    /// nothing is refused and no class is closed.
    pub fn count_waiting(&mut self, now: Timestamp) {
        self.see(now);
        self.windows.refused();
    }

    /// Whether a request of `class` would be admitted at `now`.
    pub fn would_admit(&self, class: Priority, now: Timestamp) -> bool {
        self.in_flight() < self.ceiling_of(class, now)
    }

    /// Admits a request of `class` at `now`, or refuses it (counted) when
    /// the requests in flight already fill what its class may use, or a
    /// class above it is being refused. A refusal closes the classes below
    /// `class` for 100 ms.
    pub fn try_acquire(&mut self, class: Priority, now: Timestamp) -> Option<Permit> {
        self.see(now);
        if !self.would_admit(class, now) {
            self.refuse(class);
            return None;
        }
        Some(self.admit(class, now))
    }

    /// Counts a request of `class` refused at `now` without asking
    /// ([`would_admit`](Self::would_admit) said no, or it waited for a
    /// slot and its deadline passed). Like a refusal by
    /// [`try_acquire`](Self::try_acquire), it closes the classes below
    /// `class` for 100 ms.
    pub fn count_refused(&mut self, class: Priority, now: Timestamp) {
        self.see(now);
        self.refuse(class);
    }

    /// Moves the state's clock on to `now`, if later.
    fn see(&mut self, now: Timestamp) {
        self.seen = self.seen.max(now);
    }

    fn refuse(&mut self, class: Priority) {
        self.refused[class.index()] += 1;
        self.refused_at[class.index()] = Some(self.seen);
        self.windows.refused();
    }

    fn admit(&mut self, class: Priority, now: Timestamp) -> Permit {
        self.in_flight[class.index()] += 1;
        self.admitted += 1;
        let in_flight = self.in_flight();
        Permit {
            class,
            admitted: now,
            in_flight,
            window: self.windows.admit(now.as_micros(), in_flight),
            waited: false,
        }
    }

    /// Hands back the slot of `permit`, done at `now` as `completion`
    /// says, and learns from its latency.
    pub fn release(&mut self, permit: Permit, now: Timestamp, completion: Completion) {
        self.see(now);
        let count = &mut self.in_flight[permit.class.index()];
        *count = count.saturating_sub(1);
        let rtt = now
            .as_micros()
            .saturating_sub(permit.admitted.as_micros())
            .max(1);
        // The sample it is (dropped or not), if any, and whether it
        // counts towards its window's share of requests given up on.
        let (dropped, abandoned) = match completion {
            Completion::Served => (Some(false), false),
            Completion::Dropped => (Some(true), false),
            Completion::Abandoned => self.abandoned(&permit, rtt),
            Completion::Ignored => (None, false),
        };
        let sample = dropped.map(|dropped| Sample {
            rtt,
            in_flight: permit.in_flight,
            dropped,
            held_back: false,
            censored: false,
            given_up: false,
        });
        let taken = self
            .windows
            .release(permit.window, sample, abandoned, now.as_micros());
        if let Some(window) = taken {
            let ceiling = self.ceiling(now).max(self.config.min);
            self.estimator.update(window, self.config.min, ceiling);
            if self.estimator.probing() {
                self.windows.probe_next();
            }
        }
    }

    /// What a request abandoned after `rtt` µs tells: a latency sample
    /// of `rtt` (its latency was at least that) once it is longer than
    /// the latency the algorithm knows; and whether it counts towards its
    /// window's share of requests given up on: after half the typical
    /// latency at least (the one known, or the last window's if lower: an
    /// AIMD ceiling may be far above it; sooner, it is a fast error or a
    /// client's own haste), any time before any request came back, and
    /// never after waiting in a queue.
    fn abandoned(&self, permit: &Permit, rtt: u64) -> (Option<bool>, bool) {
        let known = self.estimator.known_latency();
        let sample = known.filter(|&known| rtt > known).map(|_| false);
        let typical = match (known, self.windows.last_average()) {
            (Some(known), Some(last)) => Some(known.min(last)),
            (known, last) => known.or(last),
        };
        let given_up =
            !permit.waited && typical.is_none_or(|typical| rtt.saturating_mul(2) >= typical);
        (sample, given_up)
    }

    /// What the state holds at `now`.
    pub fn snapshot(&self, now: Timestamp) -> ConcurrencySnapshot {
        ConcurrencySnapshot {
            limit: self.limit(now),
            in_flight: self.in_flight(),
            in_flight_by_class: self.in_flight,
            refused_by_class: self.refused,
            admitted: self.admitted,
        }
    }
}

/// `share` of `limit` in whole requests, rounded up.
fn reserved_slots(limit: u32, share: f64) -> u32 {
    let slots = f64::from(limit) * share;
    // A product a hair past a whole number is that number: 100 × 0.07 is
    // 7.000000000000001 in binary, and kept 8. Only a fraction of a
    // request rounds up. (A share is below 1, so the result is at most
    // `limit`, and the product's error at most a few parts in 10^16.)
    let whole = slots.round();
    let slots = match (slots - whole).abs() <= whole * 1e-12 {
        true => whole,
        false => slots.ceil(),
    };
    slots as u32
}

#[cfg(test)]
mod tests;
