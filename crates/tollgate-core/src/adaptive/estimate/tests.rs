//! The estimators, sample by sample: how each moves the limit, what it
//! learns its latency from, and what it only compares with.

use super::*;

fn sample(rtt: u64, in_flight: u32) -> Sample {
    Sample::served(rtt, in_flight)
}

#[test]
fn vegas_grows_without_a_queue_and_shrinks_with_one() {
    let mut vegas = Estimator::new(LimitAlgorithm::Vegas, 20);
    vegas.update(sample(10_000, 20), 1, 1_000); // learns the no-load latency
    assert_eq!(vegas.limit(), 20);
    vegas.update(sample(10_000, 20), 1, 1_000); // no queue: + 6 log10(20)
    assert_eq!(vegas.limit(), 26);
    // Twice the no-load latency: a queue of half the limit, 13 > 6.
    vegas.update(sample(20_000, 26), 1, 1_000);
    assert_eq!(vegas.limit(), 25);
    // Within the bounds whatever the samples say.
    for _ in 0..100 {
        vegas.update(sample(100_000, 25), 22, 1_000);
    }
    assert_eq!(vegas.limit(), 22);
}

#[test]
fn a_vegas_limit_that_fell_by_a_third_probes_at_half_and_learns_the_latency_there() {
    let mut vegas = Estimator::new(LimitAlgorithm::Vegas, 20);
    vegas.update(sample(10_000, 20), 1, 1_000); // no-load latency 10 ms
    // Ten times that: a long queue, one less per sample, down to 13,
    // below 20 / 1.5.
    for _ in 0..7 {
        vegas.update(sample(100_000, 20), 1, 1_000);
    }
    assert_eq!(vegas.limit(), 13);
    vegas.update(sample(100_000, 13), 1, 1_000);
    assert!(vegas.probing());
    assert_eq!(vegas.limit(), 6); // half, for one sample
    vegas.update(sample(40_000, 6), 1, 1_000);
    assert!(!vegas.probing());
    assert_eq!(vegas.limit(), 13); // put back
    // 40 ms is the no-load latency now: no queue, + 6 log10(13).
    vegas.update(sample(40_000, 13), 1, 1_000);
    assert_eq!(vegas.limit(), 19);
}

#[test]
fn a_vegas_probe_waits_until_the_limit_holds_requests_back() {
    let mut vegas = Estimator::new(LimitAlgorithm::Vegas, 20);
    vegas.update(sample(10_000, 20), 1, 1_000);
    for _ in 0..7 {
        vegas.update(sample(100_000, 20), 1, 1_000);
    }
    assert_eq!(vegas.limit(), 13);
    // A probe is due, but 10 of 13 in flight and none refused: halving
    // would turn away what the limit admits. It waits (the long queue
    // takes one off meanwhile).
    vegas.update(sample(100_000, 10), 1, 1_000);
    assert!(!vegas.probing());
    assert_eq!(vegas.limit(), 12);
    // Requests were refused in this window: now it probes.
    let refused = Sample {
        held_back: true,
        ..sample(100_000, 10)
    };
    vegas.update(refused, 1, 1_000);
    assert!(vegas.probing());
    assert_eq!(vegas.limit(), 6);
    // A window at half the limit or less is a probe by itself.
    let mut quiet = Estimator::new(LimitAlgorithm::Vegas, 20);
    quiet.update(sample(10_000, 20), 1, 1_000);
    for _ in 0..7 {
        quiet.update(sample(100_000, 20), 1, 1_000);
    }
    quiet.update(sample(30_000, 6), 1, 1_000);
    assert!(!quiet.probing());
    assert_eq!(quiet.limit(), 13);
    // 30 ms is the no-load latency now: at 31 ms, no queue to speak of.
    quiet.update(sample(31_000, 13), 1, 1_000);
    assert_eq!(quiet.limit(), 19);
}

#[test]
fn a_vegas_sample_below_the_no_load_latency_does_not_lower_it() {
    let mut vegas = Estimator::new(LimitAlgorithm::Vegas, 20);
    vegas.update(sample(10_000, 20), 1, 1_000);
    vegas.update(sample(5_000, 20), 1, 1_000); // no queue: + 6
    assert_eq!(vegas.limit(), 26);
    // Still no queue against 10 ms (against 5 ms it would read as 13).
    vegas.update(sample(10_000, 26), 1, 1_000);
    assert_eq!(vegas.limit(), 32);
}

#[test]
fn vegas_grows_by_one_step_after_a_window_that_did_not_fill_the_limit() {
    let mut vegas = Estimator::new(LimitAlgorithm::Vegas, 20);
    vegas.update(sample(10_000, 20), 1, 1_000);
    // No queue, but at most 15 of 20 in flight: one step, not six.
    vegas.update(sample(10_000, 15), 1, 1_000);
    assert_eq!(vegas.limit(), 21);
    vegas.update(sample(10_000, 21), 1, 1_000);
    assert_eq!(vegas.limit(), 27);
}

fn dropped(rtt: u64, in_flight: u32) -> Sample {
    Sample {
        dropped: true,
        ..sample(rtt, in_flight)
    }
}

#[test]
fn vegas_never_takes_its_no_load_latency_from_a_window_with_a_drop() {
    // Fast refusals first: a step less, and nothing learnt.
    let mut vegas = Estimator::new(LimitAlgorithm::Vegas, 20);
    vegas.update(dropped(1_000, 20), 1, 1_000);
    assert_eq!(vegas.limit(), 19);
    vegas.update(sample(10_000, 19), 1, 1_000); // learns 10 ms
    vegas.update(sample(10_000, 19), 1, 1_000); // no queue: + 6
    assert_eq!(vegas.limit(), 25);
    // A probe whose window had fast refusals keeps the 10 ms, and
    // puts the limit back less a step.
    let mut probe = Estimator::new(LimitAlgorithm::Vegas, 20);
    probe.update(sample(10_000, 20), 1, 1_000);
    for _ in 0..8 {
        probe.update(sample(100_000, 20), 1, 1_000);
    }
    assert!(probe.probing());
    probe.update(dropped(1_000, 6), 1, 1_000);
    assert!(!probe.probing());
    assert_eq!(probe.limit(), 12);
    // Still 10 ms: at 10 ms, no queue (against 1 ms, one of 11).
    probe.update(sample(10_000, 12), 1, 1_000);
    assert_eq!(probe.limit(), 18);
    // A quiet window (a probe by itself) with a drop is no probe.
    let mut quiet = Estimator::new(LimitAlgorithm::Vegas, 20);
    quiet.update(sample(10_000, 20), 1, 1_000);
    for _ in 0..7 {
        quiet.update(sample(100_000, 20), 1, 1_000);
    }
    quiet.update(dropped(1_000, 6), 1, 1_000);
    assert_eq!(quiet.limit(), 12);
    // So the probe is still due: the next window that fills the
    // limit is halved for it.
    quiet.update(sample(10_000, 12), 1, 1_000);
    assert!(quiet.probing());
    assert_eq!(quiet.limit(), 6);
}

fn censored(rtt: u64, in_flight: u32) -> Sample {
    Sample {
        censored: true,
        ..sample(rtt, in_flight)
    }
}

#[test]
fn a_window_whose_latency_is_a_lower_bound_is_compared_never_learnt() {
    // Vegas learns no no-load latency from it: the next window does.
    let mut vegas = Estimator::new(LimitAlgorithm::Vegas, 20);
    vegas.update(censored(1_000_000, 20), 1, 1_000);
    assert_eq!(vegas.limit(), 20);
    vegas.update(sample(10_000, 20), 1, 1_000); // learns 10 ms
    vegas.update(sample(10_000, 20), 1, 1_000); // no queue: + 6
    assert_eq!(vegas.limit(), 26);
    // A lower bound at or a little over the no-load latency says
    // nothing (it would grow the limit, or keep it, as a sample).
    vegas.update(censored(1, 26), 1, 1_000);
    vegas.update(censored(10_000, 26), 1, 1_000);
    vegas.update(censored(12_000, 26), 1, 1_000);
    assert_eq!(vegas.limit(), 26);
    // Against 10 ms, a lower bound of 1 s is a long queue.
    vegas.update(censored(1_000_000, 26), 1, 1_000);
    assert_eq!(vegas.limit(), 25);
    // AIMD: a lower bound under the ceiling says nothing; over it, a
    // tenth less.
    let mut aimd = Estimator::new(
        LimitAlgorithm::Aimd {
            latency_ceiling: Duration::from_millis(50),
        },
        20,
    );
    aimd.update(censored(1, 20), 1, 100);
    aimd.update(censored(40_000, 20), 1, 100);
    assert_eq!(aimd.limit(), 20);
    aimd.update(censored(60_000, 20), 1, 100);
    assert_eq!(aimd.limit(), 18);
    // Gradient2 compares it with its average and shrinks, but does
    // not take it in.
    let mut gradient = Estimator::new(LimitAlgorithm::Gradient2, 100);
    for _ in 0..10 {
        gradient.update(sample(10_000, 100), 1, 1_000);
    }
    let before = gradient.limit();
    gradient.update(censored(1_000_000, before), 1, 1_000);
    let after = gradient.limit();
    assert!(after < before, "{after} after {before}");
    let long_rtt = |estimator: &Estimator| match &estimator.kind {
        Kind::Gradient2(gradient) => gradient.long_rtt,
        Kind::Vegas(_) | Kind::Aimd { .. } => f64::NAN,
    };
    assert_eq!(long_rtt(&gradient), 10_000.0);
    // Past the tolerance but near it, or at a small limit, its
    // headroom of 4 would raise the limit: it stays.
    let mut small = Estimator::new(LimitAlgorithm::Gradient2, 6);
    small.update(sample(10_000, 6), 1, 1_000);
    let before = small.limit;
    small.update(censored(16_000, 6), 1, 1_000);
    small.update(censored(12_000, 6), 1, 1_000);
    assert_eq!(small.limit, before);
}

#[test]
fn vegas_takes_no_no_load_latency_from_a_window_given_up_on() {
    // Given up on far from the limit (not a drop): the 1 ms of what
    // came back is not the no-load latency. The next window sets it.
    let mut vegas = Estimator::new(LimitAlgorithm::Vegas, 20);
    let given_up = Sample {
        given_up: true,
        ..sample(1_000, 5)
    };
    vegas.update(given_up, 1, 1_000);
    assert_eq!(vegas.limit(), 20);
    vegas.update(sample(10_000, 20), 1, 1_000); // learns 10 ms
    vegas.update(sample(10_000, 20), 1, 1_000); // no queue: + 6
    assert_eq!(vegas.limit(), 26);
}

#[test]
fn gradient2_lowers_its_limit_on_a_drop_whatever_the_latency() {
    // 503s answered in 1 ms: a drop, not a fast service. A tenth less.
    let mut gradient = Estimator::new(LimitAlgorithm::Gradient2, 100);
    gradient.update(dropped(1_000, 100), 1, 1_000);
    assert_eq!(gradient.limit(), 90);
    // Not averaged in: against an average of 10 ms, 14 ms is within
    // the tolerance and the limit grows (with the 1 ms in, the
    // average would be 9.1 ms, and 14 ms past 1.5 times it).
    for _ in 0..9 {
        gradient.update(sample(10_000, 90), 1, 1_000);
    }
    let before = gradient.limit();
    gradient.update(sample(14_000, 90), 1, 1_000);
    assert!(
        gradient.limit() > before,
        "{} after {before}",
        gradient.limit()
    );
    // Below 8 too (its headroom of 4 would raise a small limit).
    let mut small = Estimator::new(LimitAlgorithm::Gradient2, 5);
    small.update(dropped(1_000, 5), 1, 1_000);
    assert_eq!(small.limit(), 4);
}

#[test]
fn aimd_backs_off_by_a_tenth_above_its_ceiling() {
    let mut aimd = Estimator::new(
        LimitAlgorithm::Aimd {
            latency_ceiling: Duration::from_millis(50),
        },
        20,
    );
    aimd.update(sample(10_000, 10), 1, 100);
    assert_eq!(aimd.limit(), 21);
    aimd.update(sample(10_000, 5), 1, 100); // barely used: unchanged
    assert_eq!(aimd.limit(), 21);
    aimd.update(sample(60_000, 21), 1, 100);
    assert_eq!(aimd.limit(), 18);
}

#[test]
fn gradient2_shrinks_when_latency_passes_its_tolerance() {
    let mut gradient = Estimator::new(LimitAlgorithm::Gradient2, 100);
    for _ in 0..20 {
        gradient.update(sample(10_000, 100), 1, 1_000);
    }
    let before = gradient.limit();
    assert!(before >= 100, "{before}");
    gradient.update(sample(40_000, 100), 1, 1_000);
    assert!(gradient.limit() < before, "{}", gradient.limit());
}
