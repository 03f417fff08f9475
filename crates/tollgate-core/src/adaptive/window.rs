//! Windows of latency samples: the requests admitted over a span, taken
//! in as one sample once every one of them has come back.

use super::config::SampleWindow;
use super::estimate::Sample;

/// The window being gathered.
///
/// A window admits requests from its first admission until it holds
/// `min_samples` of them and `min_time` has passed; requests admitted
/// after that, until it is taken in, belong to no window. It is taken in
/// once every request it admitted has come back. So its latency is that
/// of all the requests admitted over a span, slow ones included: a window
/// closed at its first `n` completions would hold the fastest requests,
/// and read low. And every request of a window was admitted after the
/// limit last changed (each change comes from taking a window in), so it
/// tells how the limit in force does.
#[derive(Debug, Clone)]
pub(super) struct Windows {
    config: SampleWindow,
    /// The requests the current window admits at least.
    target: u32,
    /// The squared coefficient of variation of single latencies (their
    /// variance over their mean squared), averaged over windows; 0 until
    /// a window of two or more samples was taken in.
    spread: f64,
    /// The current window's number, which its permits carry.
    number: u64,
    /// When it admitted its first request, in µs.
    opened: u64,
    admitted: u32,
    /// When it stopped admitting, in µs.
    sealed: Option<u64>,
    returned: u32,
    samples: u32,
    rtt_sum: u128,
    rtt_squares: u128,
    max_in_flight: u32,
    /// The most requests in flight at one of its admissions.
    admitted_in_flight: u32,
    dropped: bool,
    /// A request was refused since the window opened.
    refused: bool,
}

impl Windows {
    /// A window holds enough requests for the standard error of its
    /// average latency to be at most this share of it, as far as the
    /// spread of latencies seen so far tells.
    const PRECISION: f64 = 0.1;
    /// The same for a probe's window, whose average is kept until the
    /// next probe.
    const PROBE_PRECISION: f64 = 0.05;
    /// The most requests a window holds, as a multiple of `min_samples`.
    const MAX_FACTOR: u32 = 50;

    /// A window whose requests are late by this many times their average
    /// latency is taken in without waiting for them (a permit that was
    /// never released, an outlier far out, or requests that run until
    /// their clients give up), after at least `LATE_FLOOR`: each counts
    /// as a sample of the time since the window stopped admitting, the
    /// least it has run.
    const LATE_FACTOR: u64 = 10;
    /// The least a window waits for its late requests, in µs.
    const LATE_FLOOR: u64 = 1_000_000;

    pub(super) fn new(config: SampleWindow) -> Self {
        Self {
            config,
            target: config.min_samples,
            spread: 0.0,
            number: 0,
            opened: 0,
            admitted: 0,
            sealed: None,
            returned: 0,
            samples: 0,
            rtt_sum: 0,
            rtt_squares: 0,
            max_in_flight: 0,
            admitted_in_flight: 0,
            dropped: false,
            refused: false,
        }
    }

    /// Makes the current window, which must not have admitted anything
    /// yet, a probe's: it holds enough requests to measure their average
    /// latency within [`PROBE_PRECISION`](Self::PROBE_PRECISION).
    pub(super) fn probe_next(&mut self) {
        self.target = self.target(Self::PROBE_PRECISION);
    }

    /// The requests a window holds for its average latency to be within
    /// `precision`, given the spread seen so far.
    fn target(&self, precision: f64) -> u32 {
        let needed = (self.spread / (precision * precision)).ceil();
        let most = self.config.min_samples.saturating_mul(Self::MAX_FACTOR);
        // Between 0 and `most`, a u32.
        let needed = needed.clamp(0.0, f64::from(most)) as u32;
        self.config.min_samples.max(needed)
    }

    /// A request was refused: the window ran while the limit held
    /// requests back.
    pub(super) fn refused(&mut self) {
        if self.admitted > 0 {
            self.refused = true;
        }
    }

    /// A request admitted at `now` (µs), with `in_flight` requests in
    /// flight (itself included): the number of the window it counts in,
    /// if one is admitting.
    pub(super) fn admit(&mut self, now: u64, in_flight: u32) -> Option<u64> {
        if self.sealed.is_some() {
            return None;
        }
        if self.admitted == 0 {
            self.opened = now;
        }
        self.admitted += 1;
        self.admitted_in_flight = self.admitted_in_flight.max(in_flight);
        let min_time = u64::try_from(self.config.min_time.as_micros()).unwrap_or(u64::MAX);
        if self.admitted >= self.target && now.saturating_sub(self.opened) >= min_time {
            self.sealed = Some(now);
        }
        Some(self.number)
    }

    /// A request of window `window` came back at `now` (µs), telling
    /// `sample` (none if its completion says nothing about capacity):
    /// the window's sample, when this completes it.
    pub(super) fn release(
        &mut self,
        window: Option<u64>,
        sample: Option<Sample>,
        now: u64,
    ) -> Option<Sample> {
        if window == Some(self.number) {
            self.returned += 1;
            if let Some(sample) = sample {
                self.samples += 1;
                self.rtt_sum += u128::from(sample.rtt);
                self.rtt_squares += u128::from(sample.rtt) * u128::from(sample.rtt);
                self.max_in_flight = self.max_in_flight.max(sample.in_flight);
                self.dropped |= sample.dropped;
            }
        }
        let sealed = self.sealed?;
        let patience = self
            .average()
            .map_or(0, |rtt| rtt.saturating_mul(Self::LATE_FACTOR))
            .max(Self::LATE_FLOOR);
        let waited = now.saturating_sub(sealed);
        let late = waited > patience;
        if self.returned < self.admitted && !late {
            return None;
        }
        // Requests still out count at the least they ran: a window taken
        // in without its slow requests would read fast, and in an overload
        // whose requests run until their clients give up, every window is
        // taken in that way, with nothing else in it.
        let out = self.admitted.saturating_sub(self.returned);
        if out > 0 {
            self.samples = self.samples.saturating_add(out);
            self.rtt_sum += u128::from(out) * u128::from(waited);
            self.rtt_squares += u128::from(out) * u128::from(waited) * u128::from(waited);
            self.max_in_flight = self.max_in_flight.max(self.admitted_in_flight);
        }
        let taken = self.average().map(|rtt| Sample {
            rtt,
            in_flight: self.max_in_flight,
            dropped: self.dropped,
            held_back: self.refused,
        });
        let spread = self.window_spread().map_or(self.spread, |spread| {
            if self.spread == 0.0 {
                spread
            } else {
                self.spread + (spread - self.spread) * Self::SPREAD_SMOOTHING
            }
        });
        *self = Self {
            number: self.number.wrapping_add(1),
            spread,
            ..Self::new(self.config)
        };
        self.target = self.target(Self::PRECISION);
        taken
    }

    /// The average latency of the samples so far, in µs (at least 1).
    fn average(&self) -> Option<u64> {
        (self.samples > 0).then(|| {
            let average = self.rtt_sum / u128::from(self.samples);
            u64::try_from(average).unwrap_or(u64::MAX).max(1)
        })
    }

    /// The weight of a window's spread in the running one.
    const SPREAD_SMOOTHING: f64 = 0.25;

    /// The squared coefficient of variation of this window's latencies.
    fn window_spread(&self) -> Option<f64> {
        if self.samples < 2 {
            return None;
        }
        let n = f64::from(self.samples);
        let mean = self.rtt_sum as f64 / n;
        let variance = (self.rtt_squares as f64 / n - mean * mean).max(0.0);
        Some(variance / (mean * mean))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn sample(rtt: u64, in_flight: u32) -> Option<Sample> {
        Some(Sample {
            rtt,
            in_flight,
            dropped: false,
            held_back: false,
        })
    }

    fn windows(min_samples: u32) -> Windows {
        Windows::new(SampleWindow {
            min_samples,
            min_time: Duration::ZERO,
        })
    }

    #[test]
    fn a_window_waits_for_its_slowest_request_and_averages_them_all() {
        let mut w = windows(3);
        let tags: Vec<Option<u64>> = (0..4).map(|i| w.admit(i, 1)).collect();
        assert_eq!(tags, [Some(0), Some(0), Some(0), None]); // full after 3
        assert!(w.release(tags[1], sample(1_000, 2), 1_001).is_none());
        assert!(w.release(tags[3], sample(5, 4), 1_002).is_none()); // no window's
        assert!(w.release(tags[2], sample(2_000, 3), 2_002).is_none());
        let taken = w.release(tags[0], sample(9_000, 1), 9_000);
        let taken = taken.map(|s| (s.rtt, s.in_flight, s.dropped));
        assert_eq!(taken, Some((4_000, 3, false)));
        assert_eq!(w.admit(9_001, 1), Some(1)); // the next window
    }

    #[test]
    fn windows_hold_enough_requests_for_the_spread_of_latencies() {
        let mut w = windows(2);
        // Latencies of 1 and 3 ms: a spread (variance over mean²) of 1/4.
        let (a, b) = (w.admit(0, 1), w.admit(0, 1));
        assert!(w.release(a, sample(1_000, 1), 1_000).is_none());
        assert!(w.release(b, sample(3_000, 2), 3_000).is_some());
        // Then a window holds 0.25 / 0.1² = 25 requests,
        let tags: Vec<Option<u64>> = (0..26).map(|i| w.admit(3_000 + i, 1)).collect();
        assert_eq!((tags[24], tags[25]), (Some(1), None));
        for (i, tag) in tags.into_iter().enumerate() {
            let rtt = if i % 2 == 0 { 1_000 } else { 3_000 };
            let _ = w.release(tag, sample(rtt, 1), 10_000);
        }
        // and a probe's 0.25 / 0.05² = 100.
        w.probe_next();
        let tags: Vec<Option<u64>> = (0..101).map(|i| w.admit(6_000 + i, 1)).collect();
        assert_eq!((tags[99], tags[100]), (Some(2), None));
    }

    #[test]
    fn a_window_of_ignored_requests_teaches_nothing() {
        let mut w = windows(2);
        let (a, b) = (w.admit(0, 1), w.admit(0, 1));
        assert!(w.release(a, None, 10).is_none());
        assert!(w.release(b, None, 20).is_none()); // complete, but empty
        assert_eq!(w.admit(30, 1), Some(1));
    }

    #[test]
    fn a_request_still_out_holds_its_window_only_so_long_and_counts_the_time_it_ran() {
        let mut w = windows(2);
        let (a, _lost) = (w.admit(0, 1), w.admit(0, 2));
        assert!(w.release(a, sample(1_000, 1), 1_000).is_none());
        // Ten times the average latency, but at least a second.
        assert!(w.release(None, None, 1_000_000).is_none());
        let taken = w.release(None, None, 1_000_001);
        // The one still out ran 1,000,001 µs at least: the average of it
        // and 1,000, with two in flight when it was admitted.
        assert_eq!(taken.map(|s| (s.rtt, s.in_flight)), Some((500_500, 2)));
        // A window of requests that are all still out, as when each runs
        // until its client gives up, reads as long as they have run.
        let mut w = windows(2);
        let (_, _) = (w.admit(2_000_000, 7), w.admit(2_000_000, 8));
        let taken = w.release(None, None, 3_500_000);
        assert_eq!(taken.map(|s| (s.rtt, s.in_flight)), Some((1_500_000, 8)));
    }
}
