//! The limit estimators: each turns the latency samples of finished
//! requests into a new limit, as Netflix's concurrency-limits does.

use std::time::Duration;

use super::config::LimitAlgorithm;

/// What a finished request, or a window of them, tells the estimator.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sample {
    /// From admission to completion, in microseconds (at least 1).
    pub(super) rtt: u64,
    /// The requests in flight when it was admitted, itself included.
    pub(super) in_flight: u32,
    /// It was dropped: it failed for want of capacity, or timed out.
    pub(super) dropped: bool,
    /// Requests were turned away, or waited for a slot, while it ran (a
    /// window's: from its first admission until it was taken in).
    pub(super) held_back: bool,
    /// Its latency is a lower bound: requests still out when it was taken
    /// in count at the least they had run. It can only lower the limit.
    pub(super) censored: bool,
    /// Clients gave up on a quarter or more of its requests (two at
    /// least), each after half their typical latency at least: a drop, if
    /// the window ran near the limit (far below it, the cause is not the
    /// limit).
    pub(super) given_up: bool,
}

#[cfg(test)]
impl Sample {
    /// A window of served requests, averaging `rtt` µs, with at most
    /// `in_flight` in flight: nothing dropped, held back or given up on.
    pub(super) fn served(rtt: u64, in_flight: u32) -> Self {
        Self {
            rtt,
            in_flight,
            dropped: false,
            held_back: false,
            censored: false,
            given_up: false,
        }
    }
}

/// An estimator's state, with the limit it has found so far.
#[derive(Debug, Clone)]
pub(super) struct Estimator {
    limit: f64,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Vegas(Vegas),
    Gradient2(Gradient2),
    Aimd { latency_ceiling: u64 },
}

impl Estimator {
    pub(super) fn new(algorithm: LimitAlgorithm, initial: u32) -> Self {
        let kind = match algorithm {
            LimitAlgorithm::Vegas => Kind::Vegas(Vegas::new()),
            LimitAlgorithm::Gradient2 => Kind::Gradient2(Gradient2::new()),
            LimitAlgorithm::Aimd { latency_ceiling } => Kind::Aimd {
                latency_ceiling: micros(latency_ceiling),
            },
        };
        Self {
            limit: f64::from(initial),
            kind,
        }
    }

    /// The limit found so far, in whole requests.
    pub(super) fn limit(&self) -> u32 {
        // Never negative or above the maximum: every update clamps it.
        self.limit as u32
    }

    /// Whether the limit was lowered to measure the no-load latency: the
    /// next sample is the measurement.
    pub(super) fn probing(&self) -> bool {
        match &self.kind {
            Kind::Vegas(vegas) => vegas.probing.is_some(),
            Kind::Gradient2(_) | Kind::Aimd { .. } => false,
        }
    }

    /// The latency the algorithm knows, in µs, to weigh an abandoned
    /// request against: Vegas's no-load latency, Gradient2's average, or
    /// AIMD's ceiling. None before the algorithm has one.
    pub(super) fn known_latency(&self) -> Option<u64> {
        match &self.kind {
            Kind::Vegas(vegas) => (vegas.rtt_noload > 0).then_some(vegas.rtt_noload),
            // A latency in µs, positive and far below u64::MAX.
            Kind::Gradient2(gradient) => (gradient.samples > 0).then_some(gradient.long_rtt as u64),
            Kind::Aimd { latency_ceiling } => Some(*latency_ceiling),
        }
    }

    /// Takes in `sample`, keeping the limit within `min..=max`.
    pub(super) fn update(&mut self, sample: Sample, min: u32, max: u32) {
        let limit = self.limit;
        let near = f64::from(sample.in_flight) * 2.0 >= limit;
        let sample = Sample {
            dropped: sample.dropped || (sample.given_up && near),
            ..sample
        };
        let next = match &mut self.kind {
            Kind::Vegas(vegas) => vegas.update(limit, sample),
            Kind::Gradient2(gradient) => gradient.update(limit, sample),
            Kind::Aimd { latency_ceiling } => aimd(limit, sample, *latency_ceiling),
        };
        if let Some(next) = next {
            self.limit = next.clamp(f64::from(min), f64::from(max));
        }
    }
}

/// Whole microseconds of `duration`, saturating.
fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// log₁₀ of `limit`, at least 1: Vegas's unit of change.
fn log10_step(limit: f64) -> f64 {
    limit.log10().floor().max(1.0)
}

/// Whether `sample` ran while the limit turned requests away: some were
/// refused meanwhile, or the requests in flight filled it. (With capacity
/// reserved for the classes above, the lower classes are refused below
/// the limit: the limit is rarely filled though it holds them back.)
fn held_back(limit: f64, sample: Sample) -> bool {
    sample.held_back || f64::from(sample.in_flight) >= limit
}

/// Vegas: the queue is `limit × (1 − rtt_noload / rtt)`; grow while it
/// is short, shrink when it is long, and probe for a new no-load latency
/// now and then (its old value may no longer be right).
///
/// Three departures from Netflix's Vegas, all for the same reason: Vegas
/// keeps a queue of `alpha` to `beta` requests on purpose, and latency is
/// noisy.
///
/// - A probe halves the limit for one window and takes that window's
///   latency as the no-load latency, then puts the limit back. It is made
///   only while the limit holds requests back (they are turned away in
///   part anyway); a window that ran at half the limit or less is a probe
///   by itself; in between, the probe waits, so that a service below its
///   limit never has requests turned away for a measurement. Netflix's
///   Vegas takes the latest sample instead, inflated by the queue Vegas
///   keeps: every probe let a longer queue in, and the limit ratcheted
///   up. At half the limit the queue is gone (unless the limit was more
///   than twice the backend's concurrency; then each probe halves the
///   excess).
/// - The limit grows by `beta` at once (no queue at all) only after a
///   window whose requests filled it; otherwise by one step, as for a
///   short queue. A window that did not fill the limit says little about
///   it: when the demand is about the capacity (a class shed while the
///   classes below are closed, or the requests that remain after a
///   reservation) the requests in flight dip below the limit now and
///   then, the queue is empty in those dips, and the limit, grown by
///   `beta` at each, drifted up by several steps.
/// - Between probes the no-load latency is not lowered to the least
///   latency seen: that least of many noisy windows is biased low, by
///   more the noisier the latency and the more windows were seen, and
///   every bit of that bias reads as a queue of `limit × bias` requests.
///   A probe is made at once instead when the limit has fallen or risen
///   by half again since the last one: the capacity changed, or the
///   no-load latency did (then every window reads as a long queue, or as
///   none).
#[derive(Debug, Clone)]
struct Vegas {
    rtt_noload: u64,
    probe_count: u64,
    probe_jitter: f64,
    random: u64,
    /// While probing: the limit to put back.
    probing: Option<f64>,
    /// The limit just after the last probe (or when the no-load latency
    /// was first learnt).
    probed_limit: f64,
}

impl Vegas {
    /// Updates per limit between probes, times a jitter from 0.5 to 1.
    const PROBE_MULTIPLIER: f64 = 30.0;
    /// A limit that moved by this factor since the last probe, either
    /// way, probes at once.
    const PROBE_ON_CHANGE: f64 = 1.5;

    fn new() -> Self {
        let mut vegas = Self {
            rtt_noload: 0,
            probe_count: 0,
            probe_jitter: 1.0,
            random: 0x9E37_79B9_7F4A_7C15,
            probing: None,
            probed_limit: 0.0,
        };
        vegas.new_jitter();
        vegas
    }

    /// A jitter from 0.5 to 1, from a xorshift: the same run of samples
    /// always gives the same limits.
    fn new_jitter(&mut self) {
        let mut x = self.random;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.random = x;
        self.probe_jitter = 0.5 + (x >> 11) as f64 / (1u64 << 53) as f64 / 2.0;
    }

    fn update(&mut self, limit: f64, sample: Sample) -> Option<f64> {
        // A window with a drop never gives the no-load latency (its
        // latency may be that of fast refusals, a 503 from inside), nor
        // one whose latency is only a lower bound.
        let unknown = sample.dropped || sample.censored || sample.given_up;
        if let Some(restore) = self.probing.take() {
            self.probed_limit = restore;
            if sample.dropped {
                // Dropped even at half the limit: the limit, less a step.
                return Some(restore - log10_step(restore));
            }
            if sample.censored || sample.given_up {
                // Requests still out, or given up on, at half the limit:
                // the limit is put back, and the no-load latency kept.
                return Some(restore);
            }
            // Admitted under half the limit: no queue in front of it.
            self.rtt_noload = sample.rtt;
            return Some(restore);
        }
        if self.rtt_noload == 0 {
            if sample.dropped {
                return Some(limit - log10_step(limit));
            }
            if sample.censored || sample.given_up {
                return None;
            }
            self.rtt_noload = sample.rtt;
            self.probed_limit = limit;
            return None;
        }
        self.probe_count += 1;
        let moved = limit <= self.probed_limit / Self::PROBE_ON_CHANGE
            || limit >= self.probed_limit * Self::PROBE_ON_CHANGE;
        let due = self.probe_jitter * Self::PROBE_MULTIPLIER * limit <= self.probe_count as f64;
        if moved || due {
            if f64::from(sample.in_flight) * 2.0 <= limit && !unknown {
                // This window ran at half the limit or less: it is the
                // probe, and nothing had to be turned away for it.
                self.new_jitter();
                self.probe_count = 0;
                self.rtt_noload = sample.rtt;
                self.probed_limit = limit;
                return None;
            }
            if held_back(limit, sample) {
                // The limit holds requests back: halving it turns away
                // what would be turned away in part anyway. Below the
                // limit, a probe would shed requests the limit admits;
                // it waits for either.
                self.new_jitter();
                self.probe_count = 0;
                self.probing = Some(limit);
                return Some((limit / 2.0).floor().max(1.0));
            }
        }
        let step = log10_step(limit);
        if sample.dropped {
            return Some(limit - step);
        }
        if f64::from(sample.in_flight) * 2.0 < limit {
            // Far from the limit: latency says nothing about it.
            return None;
        }
        let queue = (limit * (1.0 - self.rtt_noload as f64 / sample.rtt as f64)).ceil();
        let (threshold, alpha, beta) = (step, 3.0 * step, 6.0 * step);
        if sample.censored {
            // A lower bound says only that latency is at least this.
            return (queue > beta).then_some(limit - step);
        }
        // The requests filled the limit, and no queue formed: it is too
        // low. (Refusals alone do not say so: with capacity reserved for
        // the classes above, the classes below are refused under the
        // limit, and each dip of the demand would add `beta`.)
        let filled = f64::from(sample.in_flight) >= limit;
        if queue <= threshold && filled {
            Some(limit + beta)
        } else if queue < alpha {
            Some(limit + step)
        } else if queue > beta {
            Some(limit - step)
        } else {
            None
        }
    }
}

/// Gradient2: the limit times the ratio of a long-term average latency to
/// the latest, plus a little headroom, smoothed.
///
/// Unlike Netflix's, a window with a drop lowers the limit by a tenth: a
/// service that answers 503 at once has no latency that says it is
/// overloaded.
#[derive(Debug, Clone)]
struct Gradient2 {
    long_rtt: f64,
    samples: u32,
}

impl Gradient2 {
    const TOLERANCE: f64 = 1.5;
    const SMOOTHING: f64 = 0.2;
    const QUEUE: f64 = 4.0;
    /// The long-term average's window, in samples, and the samples
    /// averaged plainly before it becomes exponential.
    const WINDOW: f64 = 600.0;
    const WARM_UP: u32 = 10;

    fn new() -> Self {
        Self {
            long_rtt: 0.0,
            samples: 0,
        }
    }

    fn update(&mut self, limit: f64, sample: Sample) -> Option<f64> {
        if sample.dropped {
            // A tenth less, as AIMD, whatever the window's latency was
            // (fast refusals read as a fast service). Not averaged in.
            return Some(limit * 0.9);
        }
        let short = sample.rtt as f64;
        if sample.censored {
            // A lower bound: not averaged in, and only a latency past the
            // tolerance says anything.
            let past = short > Self::TOLERANCE * self.long_rtt;
            let next = if past { self.next(limit, sample) } else { None };
            // Its headroom would raise a small limit.
            return next.filter(|&next| next < limit);
        }
        if self.samples < Self::WARM_UP {
            self.samples += 1;
            self.long_rtt += (short - self.long_rtt) / f64::from(self.samples);
        } else {
            let factor = 2.0 / (Self::WINDOW + 1.0);
            self.long_rtt = self.long_rtt * (1.0 - factor) + short * factor;
        }
        if self.long_rtt / short > 2.0 {
            // Latency fell a long way: let the average follow faster.
            self.long_rtt *= 0.95;
        }
        self.next(limit, sample)
    }

    /// The limit after `sample`, against the long-term average.
    fn next(&self, limit: f64, sample: Sample) -> Option<f64> {
        if f64::from(sample.in_flight) < limit / 2.0 || self.samples == 0 {
            return None;
        }
        let gradient = (Self::TOLERANCE * self.long_rtt / sample.rtt as f64).clamp(0.5, 1.0);
        let next = limit * gradient + Self::QUEUE;
        Some(limit * (1.0 - Self::SMOOTHING) + next * Self::SMOOTHING)
    }
}

/// AIMD: one more per sample while the limit is in use, 10 % less on a
/// drop or a latency above the ceiling.
fn aimd(limit: f64, sample: Sample, latency_ceiling: u64) -> Option<f64> {
    if sample.dropped || sample.rtt > latency_ceiling {
        Some((limit * 0.9).floor())
    } else if sample.censored {
        // A lower bound under the ceiling says nothing.
        None
    } else if f64::from(sample.in_flight) * 2.0 >= limit {
        Some(limit + 1.0)
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
