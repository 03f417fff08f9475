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
    /// The latency of the requests back in the last window taken in with
    /// any, in µs.
    last_average: Option<u64>,
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
    /// Its requests given up on (their callers went away, or they failed)
    /// after half their typical latency at least.
    abandoned: u32,
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
    /// latency (or the last window's, if none of its own is back) is taken
    /// in without waiting for them (a permit that was never released, an
    /// outlier far out, or requests that run until their clients give
    /// up), after at least `LATE_FLOOR`: each counts as a sample of that
    /// patience, the least it has run, and the window's latency is a
    /// lower bound.
    const LATE_FACTOR: u64 = 10;
    /// A window one request in this many of which was given up on (and at
    /// least `ABANDONED_LEAST`) tells that clients give up in numbers.
    const ABANDONED_SHARE: u32 = 4;
    const ABANDONED_LEAST: u32 = 2;

    /// The least a window waits for its late requests, in µs.
    const LATE_FLOOR: u64 = 1_000_000;

    pub(super) fn new(config: SampleWindow) -> Self {
        Self {
            config,
            target: config.min_samples,
            spread: 0.0,
            last_average: None,
            number: 0,
            opened: 0,
            admitted: 0,
            sealed: None,
            returned: 0,
            samples: 0,
            rtt_sum: 0,
            rtt_squares: 0,
            max_in_flight: 0,
            abandoned: 0,
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
    /// `sample` (none if its completion says nothing about capacity), and
    /// whether it was `abandoned`: the window's sample, when this
    /// completes it.
    pub(super) fn release(
        &mut self,
        window: Option<u64>,
        sample: Option<Sample>,
        abandoned: bool,
        now: u64,
    ) -> Option<Sample> {
        if window == Some(self.number) {
            self.returned += 1;
            self.abandoned += u32::from(abandoned);
            if let Some(sample) = sample {
                self.samples += 1;
                self.rtt_sum += u128::from(sample.rtt);
                self.rtt_squares += u128::from(sample.rtt) * u128::from(sample.rtt);
                self.max_in_flight = self.max_in_flight.max(sample.in_flight);
                self.dropped |= sample.dropped;
            }
        }
        let sealed = self.sealed?;
        // Measured against the latency known, this window's or the last
        // one's: a window of slow requests none of which is back yet is
        // not late at the floor.
        let patience = self
            .average()
            .or(self.last_average)
            .map_or(0, |rtt| rtt.saturating_mul(Self::LATE_FACTOR))
            .max(Self::LATE_FLOOR);
        let late = now.saturating_sub(sealed) > patience;
        if self.returned < self.admitted && !late {
            return None;
        }
        // The latency of the requests back, for the next window's
        // patience (with those still out at this one's patience in it,
        // each window's patience could be ten times the last's).
        let returned = self.average();
        let spread = self.window_spread().map_or(self.spread, |spread| {
            if self.spread == 0.0 {
                spread
            } else {
                self.spread + (spread - self.spread) * Self::SPREAD_SMOOTHING
            }
        });
        // Requests still out count at the patience: each was admitted by
        // the time the window stopped admitting, so it has run that long
        // at least (however long the wait for a release that shows it was
        // late). A window taken in without them would read fast, and in an
        // overload whose requests run until their clients give up after
        // more than the patience, every window is taken in that way.
        let out = self.admitted.saturating_sub(self.returned);
        if out > 0 {
            self.samples = self.samples.saturating_add(out);
            self.rtt_sum += u128::from(out) * u128::from(patience);
            self.max_in_flight = self.max_in_flight.max(self.admitted_in_flight);
        }
        // Clients giving up in numbers is overload, whatever the latency
        // of what was served (a deadline shorter than the latency the
        // algorithm aims for hides it); a few are the tail's.
        let given_up = self.abandoned >= Self::ABANDONED_LEAST
            && self.abandoned.saturating_mul(Self::ABANDONED_SHARE) >= self.admitted;
        // Requests given up on at the peak count towards how near the
        // limit the window ran, though they left no sample.
        let in_flight = if given_up {
            self.max_in_flight.max(self.admitted_in_flight)
        } else {
            self.max_in_flight
        };
        let taken = match self.average() {
            Some(rtt) => Some(Sample {
                rtt,
                in_flight,
                dropped: self.dropped,
                held_back: self.refused,
                censored: out > 0,
                given_up,
            }),
            // Every request given up on before its latency could tell: a
            // drop if near the limit, with a latency (a lower bound of
            // 1 µs) that tells nothing.
            None => given_up.then_some(Sample {
                rtt: 1,
                in_flight: self.admitted_in_flight,
                dropped: false,
                held_back: self.refused,
                censored: true,
                given_up,
            }),
        };
        let last_average = returned.or(self.last_average);
        *self = Self {
            number: self.number.wrapping_add(1),
            spread,
            last_average,
            ..Self::new(self.config)
        };
        self.target = self.target(Self::PRECISION);
        taken
    }

    /// The latency of the last window's requests that came back, in µs.
    pub(super) fn last_average(&self) -> Option<u64> {
        self.last_average
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
        Some(Sample::served(rtt, in_flight))
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
        assert!(w.release(tags[1], sample(1_000, 2), false, 1_001).is_none());
        assert!(w.release(tags[3], sample(5, 4), false, 1_002).is_none()); // no window's
        assert!(w.release(tags[2], sample(2_000, 3), false, 2_002).is_none());
        let taken = w.release(tags[0], sample(9_000, 1), false, 9_000);
        let taken = taken.map(|s| (s.rtt, s.in_flight, s.dropped));
        assert_eq!(taken, Some((4_000, 3, false)));
        assert_eq!(w.admit(9_001, 1), Some(1)); // the next window
    }

    #[test]
    fn windows_hold_enough_requests_for_the_spread_of_latencies() {
        let mut w = windows(2);
        // Latencies of 1 and 3 ms: a spread (variance over mean²) of 1/4.
        let (a, b) = (w.admit(0, 1), w.admit(0, 1));
        assert!(w.release(a, sample(1_000, 1), false, 1_000).is_none());
        assert!(w.release(b, sample(3_000, 2), false, 3_000).is_some());
        // Then a window holds 0.25 / 0.1² = 25 requests,
        let tags: Vec<Option<u64>> = (0..26).map(|i| w.admit(3_000 + i, 1)).collect();
        assert_eq!((tags[24], tags[25]), (Some(1), None));
        for (i, tag) in tags.into_iter().enumerate() {
            let rtt = if i % 2 == 0 { 1_000 } else { 3_000 };
            let _ = w.release(tag, sample(rtt, 1), false, 10_000);
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
        assert!(w.release(a, None, false, 10).is_none());
        assert!(w.release(b, None, false, 20).is_none()); // complete, but empty
        assert_eq!(w.admit(30, 1), Some(1));
    }

    #[test]
    fn a_request_still_out_holds_its_window_only_so_long_and_counts_at_its_patience() {
        let mut w = windows(2);
        let (a, _lost) = (w.admit(0, 1), w.admit(0, 2));
        assert!(w.release(a, sample(1_000, 1), false, 1_000).is_none());
        // Ten times the average latency, but at least a second.
        assert!(w.release(None, None, false, 1_000_000).is_none());
        let taken = w.release(None, None, false, 1_000_001);
        // The one still out ran a second at least: the average of that
        // and 1,000 µs, a lower bound, with two in flight at admission.
        let seen = |taken: Option<Sample>| taken.map(|s| (s.rtt, s.in_flight, s.censored));
        assert_eq!(seen(taken), Some((500_500, 2, true)));
        // Requests all still out, as when each runs until its client gives
        // up, read as the patience, however long the wait for a release
        // that shows them late (an idle minute here).
        let mut w = windows(2);
        let (_, _) = (w.admit(2_000_000, 7), w.admit(2_000_000, 8));
        let taken = w.release(None, None, false, 62_000_000);
        assert_eq!(seen(taken), Some((1_000_000, 8, true)));
    }

    #[test]
    fn the_patience_follows_the_latency_of_the_last_window() {
        // A service whose requests take 3 s: the window after the first
        // is not late at 2.5 s, with none of its requests back yet.
        let mut w = windows(1);
        let a = w.admit(0, 1);
        let taken = w.release(a, sample(3_000_000, 1), false, 3_000_000);
        assert_eq!(taken.map(|s| (s.rtt, s.censored)), Some((3_000_000, false)));
        let b = w.admit(3_000_000, 1);
        assert!(w.release(None, None, false, 5_500_000).is_none());
        let taken = w.release(b, sample(3_000_000, 1), false, 6_000_000);
        assert_eq!(taken.map(|s| (s.rtt, s.censored)), Some((3_000_000, false)));
    }

    #[test]
    fn a_window_a_quarter_of_whose_requests_were_given_up_on_says_so() {
        // Of five requests, one given up on is the tail's; two are not.
        let run = |abandoned: usize| {
            let mut w = windows(5);
            let tags: Vec<Option<u64>> = (0..5).map(|i| w.admit(i, 1)).collect();
            let mut taken = None;
            for (i, tag) in tags.into_iter().enumerate() {
                // One given up on, too short to be a latency sample.
                let (sample, gave_up) = if i < abandoned {
                    (None, true)
                } else {
                    (sample(1_000, 5), false)
                };
                taken = w.release(tag, sample, gave_up, 1_000);
            }
            taken.map(|s| (s.rtt, s.given_up, s.censored))
        };
        assert_eq!(run(0), Some((1_000, false, false)));
        assert_eq!(run(1), Some((1_000, false, false)));
        assert_eq!(run(2), Some((1_000, true, false)));
        // All of them: no latency to read, a lower bound of 1 µs.
        assert_eq!(run(5), Some((1, true, true)));
        // Of four, one is a quarter, but two at least are needed.
        let mut w = windows(4);
        let tags: Vec<Option<u64>> = (0..4).map(|i| w.admit(i, 1)).collect();
        let mut taken = None;
        for (i, tag) in tags.into_iter().enumerate() {
            taken = w.release(tag, sample(1_000, 4), i == 0, 1_000);
        }
        assert_eq!(taken.map(|s| s.given_up), Some(false));
    }

    #[test]
    fn a_window_with_no_latency_leaves_the_last_ones_as_the_patience() {
        // Two requests of 3 s each.
        let mut w = windows(2);
        let (a, b) = (w.admit(0, 1), w.admit(0, 2));
        assert!(
            w.release(a, sample(3_000_000, 1), false, 3_000_000)
                .is_none()
        );
        assert!(
            w.release(b, sample(3_000_000, 2), false, 3_000_000)
                .is_some()
        );
        // Two given up on at once, with no latency: 1 µs, a lower bound.
        let (c, d) = (w.admit(3_000_000, 1), w.admit(3_000_000, 2));
        assert!(w.release(c, None, true, 3_001_000).is_none());
        let taken = w.release(d, None, true, 3_001_000);
        assert_eq!(taken.map(|s| (s.rtt, s.given_up)), Some((1, true)));
        // The next window's requests, out for 25 s, are not late: the
        // patience is still ten times 3 s (not a second, the floor over
        // ten times 1 µs).
        let (e, f) = (w.admit(4_000_000, 1), w.admit(4_000_000, 2));
        assert!(w.release(None, None, false, 29_000_000).is_none());
        assert!(
            w.release(e, sample(3_000_000, 1), false, 29_000_001)
                .is_none()
        );
        let taken = w.release(f, sample(3_000_000, 2), false, 29_000_002);
        assert_eq!(taken.map(|s| (s.rtt, s.censored)), Some((3_000_000, false)));
    }
}
