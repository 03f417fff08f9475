//! `Concurrency` at the instants each call gives: who is admitted, what
//! each way a request ends teaches the limit, and the closures of lower
//! classes.

use std::time::Duration;

use super::super::LimitAlgorithm;
use super::*;

fn fixed(limit: u32) -> AdaptiveLimit {
    AdaptiveLimit::builder("test")
        .fixed(limit)
        .reserve(Priority::Critical, 0.2)
        .reserve(Priority::Default, 0.1)
        .build()
        .unwrap_or_else(|error| unreachable!("{error}"))
}

/// A limit found by `algorithm` from `initial`, between 1 and 1,000,
/// taking in windows of `size` requests.
fn windowed(algorithm: LimitAlgorithm, initial: u32, size: u32) -> AdaptiveLimit {
    AdaptiveLimit::builder("test")
        .algorithm(algorithm)
        .bounds(1, 1_000)
        .initial(initial)
        .sample_window(Duration::ZERO, size)
        .build()
        .unwrap_or_else(|error| unreachable!("{error}"))
}

/// `n` default requests admitted at `at`: every one of them.
fn admit_all(state: &mut Concurrency, n: usize, at: Timestamp) -> Vec<Permit> {
    let permits: Vec<Permit> = (0..n)
        .filter_map(|_| state.try_acquire(Priority::Default, at))
        .collect();
    assert_eq!(permits.len(), n);
    permits
}

const T0: Timestamp = Timestamp::from_secs(1_000);

#[test]
fn each_class_stops_at_the_limit_less_what_is_kept_above_it() {
    let mut state = Concurrency::new(&fixed(10), T0);
    let count = |state: &mut Concurrency, class| {
        let mut held = Vec::new();
        while let Some(permit) = state.try_acquire(class, T0) {
            held.push(permit);
        }
        held
    };
    let sheddable = count(&mut state, Priority::Sheddable);
    assert_eq!(sheddable.len(), 7);
    let default = count(&mut state, Priority::Default);
    assert_eq!(default.len(), 1);
    let critical = count(&mut state, Priority::Critical);
    assert_eq!(critical.len(), 2);
    assert_eq!(state.snapshot(T0).in_flight_by_class, [2, 1, 7]);
    assert_eq!(state.snapshot(T0).refused_by_class, [1, 1, 1]);
}

#[test]
fn a_refused_class_closes_the_classes_below_it_for_100_ms() {
    let mut state = Concurrency::new(&fixed(10), T0);
    let mut held: Vec<Permit> = (0..10)
        .filter_map(|_| state.try_acquire(Priority::Critical, T0))
        .collect();
    assert_eq!(held.len(), 10);
    assert!(state.try_acquire(Priority::Critical, T0).is_none());
    // Two slots free again: critical requests may take them, the
    // classes below may not, until 100 ms after the refusal.
    let later = T0 + Duration::from_millis(99);
    for permit in held.drain(..2) {
        state.release(permit, later, Completion::Ignored);
    }
    assert!(state.try_acquire(Priority::Sheddable, later).is_none());
    assert!(state.try_acquire(Priority::Default, later).is_none());
    assert_eq!(state.ceiling_of(Priority::Default, later), 0);
    let critical = state.try_acquire(Priority::Critical, later);
    assert!(critical.is_some());
    // Default requests open at 100 ms, but 9 are in flight where they
    // stop at 8: this one is refused, and closes sheddable ones until
    // 200 ms.
    let open = T0 + Duration::from_millis(100);
    assert!(state.try_acquire(Priority::Default, open).is_none());
    let done = T0 + Duration::from_millis(150);
    for permit in held.drain(..4) {
        state.release(permit, done, Completion::Ignored);
    }
    assert!(state.try_acquire(Priority::Default, done).is_some());
    assert!(state.try_acquire(Priority::Sheddable, done).is_none());
    let reopened = T0 + Duration::from_millis(250);
    assert!(state.try_acquire(Priority::Sheddable, reopened).is_some());
    assert_eq!(state.snapshot(reopened).refused_by_class, [1, 2, 2]);
}

#[test]
fn warm_up_raises_the_ceiling_linearly() {
    let config = AdaptiveLimit::builder("test")
        .bounds(1, 100)
        .initial(100)
        .warm_up(10, Duration::from_secs(10))
        .build()
        .unwrap_or_else(|error| unreachable!("{error}"));
    let state = Concurrency::new(&config, T0);
    assert_eq!(state.limit(T0), 10);
    assert_eq!(state.limit(T0 + Duration::from_secs(5)), 55);
    assert_eq!(state.limit(T0 + Duration::from_secs(10)), 100);
}

/// Windows of ten requests from a limit of `initial`, admitted together: the
/// first all served in 10 ms; in each after, `n` end `after` later as
/// `completion`, and the rest are served in 10 ms. The limit after
/// each window.
fn windows_of_ten(
    algorithm: LimitAlgorithm,
    initial: u32,
    after: &[(usize, Duration, Completion)],
) -> Vec<u32> {
    let mut state = Concurrency::new(&windowed(algorithm, initial, 10), T0);
    let mut at = T0;
    let served = Duration::from_millis(10);
    let first = (0, served, Completion::Served);
    let mut limits = Vec::new();
    for &(n, rtt, completion) in std::iter::once(&first).chain(after) {
        let permits = admit_all(&mut state, 10, at);
        for (i, permit) in permits.into_iter().enumerate() {
            if i < n {
                state.release(permit, at + rtt, completion);
            } else {
                state.release(permit, at + served, Completion::Served);
            }
        }
        at = at + rtt.max(served);
        limits.push(state.limit(at));
    }
    limits
}

#[test]
fn an_abandoned_request_is_a_latency_sample_once_past_the_latency_known_and_a_quarter_a_drop() {
    use Completion::{Abandoned, Ignored};
    use LimitAlgorithm;
    let ms = Duration::from_millis;
    // Vegas, no-load latency 10 ms, from 20 with ten in flight.
    let vegas = |window| windows_of_ten(LimitAlgorithm::Vegas, 20, &[window]);
    // One abandoned at 16 ms is a sample, not a drop: an average of
    // 10.6 ms, a queue of 2, one more (a drop would be one less).
    assert_eq!(vegas((1, ms(16), Abandoned)), [20, 21]);
    // One at 60 ms: an average of 15 ms, a queue of 7, one less (not
    // counted, no queue and one more).
    assert_eq!(vegas((1, ms(60), Abandoned)), [20, 19]);
    // Three of ten abandoned after half the no-load latency or more
    // are a drop: one less.
    assert_eq!(vegas((3, ms(9), Abandoned)), [20, 19]);
    // Ignored ones never count, however many or long.
    assert_eq!(vegas((10, ms(500), Ignored)), [20, 20]);
    // AIMD over 15 ms, from 19: 20 after the first window, where ten
    // in flight are near the limit. One abandoned at 100 ms makes an
    // average of 19 ms, above the ceiling: a tenth less. Three at
    // 12 ms, below it, are a drop all the same, and so are three at
    // 5 ms: half the latency of the last window (10 ms, far below the
    // ceiling). Three at 4 ms (fast errors, hasty clients) or two at
    // 12 ms are not: one more.
    let aimd = |initial, window| {
        let algorithm = LimitAlgorithm::Aimd {
            latency_ceiling: ms(15),
        };
        windows_of_ten(algorithm, initial, &[window])
    };
    assert_eq!(aimd(19, (1, ms(100), Abandoned)), [20, 18]);
    assert_eq!(aimd(19, (3, ms(12), Abandoned)), [20, 18]);
    assert_eq!(aimd(19, (3, ms(5), Abandoned)), [20, 18]);
    assert_eq!(aimd(19, (3, ms(4), Abandoned)), [20, 21]);
    assert_eq!(aimd(19, (2, ms(12), Abandoned)), [20, 21]);
    // From 20 (21 after the first window), ten in flight are under
    // half the limit: given up on, but not for the limit's sake.
    assert_eq!(aimd(20, (3, ms(12), Abandoned)), [21, 21]);
}

#[test]
fn clients_giving_up_before_any_answer_at_the_start_are_a_drop() {
    // Vegas from 20, nothing known yet: ten requests, all given up on
    // after a second. No latency, but given up on in numbers near the
    // limit: one less.
    let config = windowed(LimitAlgorithm::Vegas, 20, 10);
    let mut state = Concurrency::new(&config, T0);
    let permits = admit_all(&mut state, 10, T0);
    let later = T0 + Duration::from_secs(1);
    for permit in permits {
        state.release(permit, later, Completion::Abandoned);
    }
    assert_eq!(state.limit(later), 19);
}

#[test]
fn fast_failures_at_the_start_count_only_until_a_latency_is_known() {
    // Vegas from 20, windows of ten, each with three requests failing
    // in 1 ms and seven served in 10 ms. The first window, with no
    // latency known, is a drop; from then on the last window's 10 ms
    // is the typical latency, 1 ms is far under half of it, and the
    // no-load latency is learnt.
    let config = windowed(LimitAlgorithm::Vegas, 20, 10);
    let mut state = Concurrency::new(&config, T0);
    let mut at = T0;
    let mut limits = Vec::new();
    for _ in 0..3 {
        let permits = admit_all(&mut state, 10, at);
        for (i, permit) in permits.into_iter().enumerate() {
            if i < 3 {
                state.release(permit, at + Duration::from_millis(1), Completion::Abandoned);
            } else {
                state.release(permit, at + Duration::from_millis(10), Completion::Served);
            }
        }
        at = at + Duration::from_millis(10);
        limits.push(state.limit(at));
    }
    assert_eq!(limits, [19, 19, 20]);
}

#[test]
fn a_request_that_waited_in_a_queue_never_counts_towards_the_given_up_share() {
    // Vegas from 20, windows of ten: the first served in 10 ms. In the
    // second, three of ten given up on at 9 ms are a drop, unless they
    // had waited in a queue first (its length, not the service, may have
    // spent their clients' budget): then no queue, one more.
    let run = |waited: bool| {
        let mut state = Concurrency::new(&windowed(LimitAlgorithm::Vegas, 20, 10), T0);
        let served = Duration::from_millis(10);
        for permit in admit_all(&mut state, 10, T0) {
            state.release(permit, T0 + served, Completion::Served);
        }
        let at = T0 + served;
        for (i, permit) in admit_all(&mut state, 10, at).into_iter().enumerate() {
            if i < 3 {
                let permit = if waited {
                    permit.after_waiting()
                } else {
                    permit
                };
                state.release(permit, at + Duration::from_millis(9), Completion::Abandoned);
            } else {
                state.release(permit, at + served, Completion::Served);
            }
        }
        state.limit(at + served)
    };
    assert_eq!(run(false), 19);
    assert_eq!(run(true), 21);
}

#[test]
fn requests_that_run_until_their_clients_give_up_seconds_later_still_shrink_the_limit() {
    // AIMD over 100 ms, windows of two: ten requests run until their
    // clients give up at 5 s, the last admitted first. The window's
    // two are still out when it is taken in (the first release comes
    // past its patience of a second): they count as that second.
    let aimd = LimitAlgorithm::Aimd {
        latency_ceiling: Duration::from_millis(100),
    };
    let config = windowed(aimd, 10, 2);
    let mut state = Concurrency::new(&config, T0);
    let permits = admit_all(&mut state, 10, T0);
    let gave_up = T0 + Duration::from_secs(5);
    for permit in permits.into_iter().rev() {
        state.release(permit, gave_up, Completion::Abandoned);
    }
    assert_eq!((state.in_flight(), state.limit(gave_up)), (0, 9));
}

#[test]
fn a_request_waiting_for_a_slot_tells_the_window_the_limit_holds_requests_back() {
    // Vegas from 20, windows of ten requests: 10 ms without a queue,
    // then 100 ms (a long queue) until the limit fell by a third, to
    // 13: a probe is due, but with 10 of 13 in flight it waits until
    // the limit holds requests back.
    let config = windowed(LimitAlgorithm::Vegas, 20, 10);
    let run = |waiting: bool| {
        let mut state = Concurrency::new(&config, T0);
        let mut at = T0;
        for window in 0..9 {
            let permits = admit_all(&mut state, 10, at);
            if waiting && window == 8 {
                state.count_waiting(at);
            }
            let rtt = Duration::from_millis(if window == 0 { 10 } else { 100 });
            for permit in permits {
                state.release(permit, at + rtt, Completion::Served);
            }
            at = at + rtt;
        }
        (state.limit(at), state.snapshot(at).refused_by_class)
    };
    assert_eq!(run(false), (12, [0, 0, 0]));
    // One request waited in the last window: the probe halves it.
    assert_eq!(run(true), (6, [0, 0, 0]));
}

#[test]
fn a_class_closed_by_a_refusal_above_says_until_when() {
    let mut state = Concurrency::new(&fixed(10), T0);
    assert_eq!(state.closed_until(Priority::Sheddable, T0), None);
    state.count_refused(Priority::Default, T0);
    let reopens = T0 + Duration::from_millis(100);
    assert_eq!(state.closed_until(Priority::Sheddable, T0), Some(reopens));
    assert_eq!(state.closed_until(Priority::Default, T0), None);
    assert_eq!(state.ceiling_of(Priority::Sheddable, T0), 0);
    assert_eq!(state.closed_until(Priority::Sheddable, reopens), None);
    assert_eq!(state.ceiling_of(Priority::Sheddable, reopens), 7);
    // A clock stepped back by a second closes nothing for that second.
    let later = T0 + Duration::from_secs(10);
    state.count_refused(Priority::Default, later);
    let back = later - Duration::from_secs(1);
    assert_eq!(state.closed_until(Priority::Sheddable, back), None);
    assert_eq!(state.ceiling_of(Priority::Sheddable, back), 7);
    // Stepped back by less than the closure: closed until it ends.
    let just_back = later - Duration::from_millis(50);
    let reopens = later + Duration::from_millis(100);
    assert_eq!(
        state.closed_until(Priority::Sheddable, just_back),
        Some(reopens)
    );
}

#[test]
fn an_ignored_completion_frees_its_slot_and_teaches_nothing() {
    // One sample is taken in at once, so that the one served request
    // below moves the limit by itself.
    let aimd = LimitAlgorithm::Aimd {
        latency_ceiling: Duration::from_millis(10),
    };
    let config = windowed(aimd, 10, 1);
    let mut state = Concurrency::new(&config, T0);
    let permit = state.try_acquire(Priority::Default, T0);
    let later = T0 + Duration::from_secs(1);
    if let Some(permit) = permit {
        state.release(permit, later, Completion::Ignored);
    }
    assert_eq!((state.in_flight(), state.limit(later)), (0, 10));
    let permit = state.try_acquire(Priority::Default, T0);
    if let Some(permit) = permit {
        state.release(permit, later, Completion::Served);
    }
    assert_eq!(state.limit(later), 9);
}

/// A share whose product with the limit is a whole number in decimal
/// keeps exactly that many requests: the product is a hair past it in
/// binary (100 × 0.07 is 7.000000000000001), and 8 were kept, so the
/// classes below got one slot fewer than the share says (92 default
/// requests of 100, where 93 are documented). A fraction still rounds up.
#[test]
fn a_share_of_a_whole_number_of_requests_keeps_that_many() {
    for limit in 1..=1_000 {
        for percent in 1..100 {
            let share = f64::from(percent) / 100.0;
            let exact = limit * percent;
            assert_eq!(
                reserved_slots(limit, share),
                exact.div_ceil(100),
                "{percent}% of {limit}"
            );
        }
    }
    let state = Concurrency::new(
        &AdaptiveLimit::builder("test")
            .fixed(100)
            .reserve(Priority::Critical, 0.07)
            .build()
            .unwrap_or_else(|error| unreachable!("{error}")),
        T0,
    );
    assert_eq!(state.ceiling_of(Priority::Default, T0), 93);
}

/// While a warm-up's ceiling holds the limit down, the next opening is
/// the instant it next rises, exactly: then one more request runs, and not
/// a µs before. Once the estimate is below the ceiling, or the warm-up is
/// over, only a request ending makes room.
#[test]
fn a_warm_up_opens_a_slot_each_time_its_ceiling_rises() {
    // From 1 to 8 over 1 s: 7 rises, every 142,857.14 µs.
    let config = AdaptiveLimit::builder("test")
        .bounds(1, 8)
        .initial(8)
        .warm_up(1, Duration::from_secs(1))
        .build()
        .unwrap_or_else(|error| unreachable!("{error}"));
    let mut state = Concurrency::new(&config, T0);
    let mut held = vec![state.try_acquire(Priority::Default, T0)];
    let mut at = T0;
    let mut rises = Vec::new();
    while let Some(next) = state.next_opening(Priority::Default, at) {
        assert!(next > at);
        let just_before = Timestamp::from_micros(next.as_micros() - 1);
        assert_eq!(state.limit(just_before), state.limit(at));
        assert_eq!(state.limit(next), state.limit(at) + 1);
        held.push(state.try_acquire(Priority::Default, next));
        rises.push(next.as_micros() - T0.as_micros());
        at = next;
    }
    assert_eq!(
        rises,
        [
            142_858, 285_715, 428_572, 571_429, 714_286, 857_143, 1_000_000
        ]
    );
    assert!(held.iter().all(Option::is_some));
    assert_eq!(state.in_flight(), 8);
    // An estimate below the ceiling: a rise changes nothing.
    let low = AdaptiveLimit::builder("test")
        .bounds(1, 8)
        .initial(2)
        .warm_up(1, Duration::from_secs(1))
        .build()
        .unwrap_or_else(|error| unreachable!("{error}"));
    let state = Concurrency::new(&low, T0);
    let later = T0 + Duration::from_millis(500);
    assert_eq!(state.limit(later), 2);
    assert_eq!(state.next_opening(Priority::Default, later), None);
}
