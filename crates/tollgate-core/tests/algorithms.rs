//! Each algorithm's semantics, pinned exactly with a fake clock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use tollgate_core::{Algorithm, Decision, FakeClock, Key, MemoryStore, Outcome, Policy, Timestamp};

const MINUTE_START: u64 = 1_700_000_040; // a multiple of 60 seconds

struct Harness {
    clock: FakeClock,
    store: MemoryStore,
    policy: Policy,
    key: Key,
}

impl Harness {
    fn new(policy: Policy, start: Timestamp) -> Self {
        let clock = FakeClock::new(start);
        let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        Self {
            clock,
            store,
            policy,
            key: Key::user("ada"),
        }
    }

    fn check(&self, cost: u64) -> Decision {
        self.store
            .check_sync(&self.key, &self.policy, cost)
            .unwrap()
    }

    fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }
}

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn fixed_window_admits_exactly_n_per_aligned_window() {
    assert_eq!(MINUTE_START % 60, 0);
    let policy = Policy::new("fw", Algorithm::FixedWindow, "100/min").unwrap();
    // Start 30 s into an aligned minute.
    let h = Harness::new(policy, Timestamp::from_secs(MINUTE_START + 30));
    for i in 0..100 {
        let d = h.check(1);
        assert!(d.is_allowed(), "request {i}");
        assert_eq!(d.remaining(), 99 - i);
        assert_eq!(d.used(), i + 1);
        assert_eq!(d.limit(), 100);
        assert_eq!(d.reset(), Duration::from_secs(30));
        assert_eq!(d.reset_at(), Timestamp::from_secs(MINUTE_START + 60));
    }
    let denied = h.check(1);
    assert_eq!(
        denied.outcome(),
        Outcome::Limited {
            retry_after: Duration::from_secs(30)
        }
    );
    assert_eq!(denied.remaining(), 0);

    // One microsecond before the boundary: still the same window.
    h.advance(Duration::from_secs(30) - us(1));
    assert_eq!(h.check(1).retry_after(), Some(us(1)));
    // At the boundary the window resets: exactly 100 more.
    h.advance(us(1));
    let admitted = (0..150).filter(|_| h.check(1).is_allowed()).count();
    assert_eq!(admitted, 100);
    assert_eq!(h.check(1).retry_after(), Some(Duration::from_secs(60)));
}

#[test]
fn fixed_window_with_cost() {
    let policy = Policy::new("fw", Algorithm::FixedWindow, "10/s").unwrap();
    let h = Harness::new(policy, Timestamp::from_secs(MINUTE_START));
    assert_eq!(h.check(7).remaining(), 3);
    let d = h.check(4);
    assert_eq!(
        d.outcome(),
        Outcome::Limited {
            retry_after: Duration::from_secs(1)
        }
    );
    assert_eq!(d.remaining(), 3, "a denied request consumes nothing");
    assert_eq!(h.check(3).remaining(), 0);
    assert_eq!(
        h.check(11).outcome(),
        Outcome::CostExceedsCapacity {
            cost: 11,
            capacity: 10
        }
    );
}

#[test]
fn sliding_log_never_exceeds_n_in_any_period() {
    let policy = Policy::new("sl", Algorithm::SlidingLog, "3/10s").unwrap();
    let h = Harness::new(policy, Timestamp::from_secs(MINUTE_START + 7));
    // Admits at t = 0, 1, 2.
    for _ in 0..3 {
        assert!(h.check(1).is_allowed());
        h.advance(Duration::from_secs(1));
    }
    // t = 3: three admits in (t - 10 s, t], denied until the first leaves at t = 10.
    let d = h.check(1);
    assert_eq!(d.retry_after(), Some(Duration::from_secs(7)));
    assert_eq!(
        d.reset(),
        Duration::from_secs(9),
        "the last entry leaves at t = 12"
    );
    h.advance(Duration::from_secs(7) - us(1));
    assert!(!h.check(1).is_allowed());
    h.advance(us(1));
    assert!(h.check(1).is_allowed(), "t = 10");
    // The entry of t = 1 leaves at t = 11.
    assert_eq!(h.check(1).retry_after(), Some(Duration::from_secs(1)));
    // A cost-2 request needs the entries of t = 1 and t = 2 gone: t = 12.
    assert_eq!(h.check(2).retry_after(), Some(Duration::from_secs(2)));
}

#[test]
fn sliding_window_counter_matches_the_weighted_formula() {
    let policy = Policy::new("sw", Algorithm::SlidingWindow, "10/min").unwrap();
    let start = Timestamp::from_secs(MINUTE_START);
    let h = Harness::new(policy, start + Duration::from_secs(10));
    for _ in 0..8 {
        assert!(h.check(1).is_allowed());
    }
    // Next window, 15 s in: the previous 8 weigh 8 * 45/60 = 6.
    h.clock.set(start + Duration::from_secs(75));
    let d = h.check(0);
    assert_eq!(d.remaining(), 4);
    for _ in 0..4 {
        assert!(h.check(1).is_allowed());
    }
    // curr = 4: admitted again when 8 * (60 - e)/60 + 4 + 1 <= 10, i.e. e >= 22.5 s.
    let d = h.check(1);
    assert_eq!(d.retry_after(), Some(Duration::from_millis(7_500)));
    h.advance(Duration::from_millis(7_500) - us(1));
    assert!(!h.check(1).is_allowed());
    h.advance(us(1));
    assert!(h.check(1).is_allowed());

    // Check the estimate at many offsets against the formula itself.
    for e_ms in (0..60_000).step_by(997) {
        let policy = Policy::new("sw2", Algorithm::SlidingWindow, "10/min").unwrap();
        let h = Harness::new(policy, start);
        for _ in 0..7 {
            h.check(1);
        }
        h.clock.set(start + Duration::from_secs(60) + ms(e_ms));
        h.check(2);
        // remaining = floor(10 - 2 - 7 * (60000 - e) / 60000)
        let expected = (10.0 - 2.0 - 7.0 * (60_000 - e_ms) as f64 / 60_000.0).floor();
        assert_eq!(
            h.check(0).remaining() as f64,
            expected.max(0.0),
            "e = {e_ms} ms"
        );
    }
}

#[test]
fn token_bucket_refills_continuously() {
    let policy = Policy::new("tb", Algorithm::TokenBucket, "10/s").unwrap();
    let t0 = Timestamp::from_secs(MINUTE_START) + ms(123);
    let h = Harness::new(policy, t0);
    assert_eq!(h.check(10).remaining(), 0);
    let d = h.check(1);
    assert_eq!(d.retry_after(), Some(ms(100)));
    assert_eq!(d.reset(), Duration::from_secs(1));
    h.advance(ms(100) - us(1));
    assert_eq!(h.check(0).remaining(), 0);
    h.advance(us(1));
    assert_eq!(h.check(0).remaining(), 1);
    // Partial progress is kept: 150 ms in, one token is there and half of
    // the next; after taking it the next arrives at 200 ms, not 250 ms.
    h.advance(ms(50));
    assert!(h.check(1).is_allowed());
    assert_eq!(h.check(1).retry_after(), Some(ms(50)));
    // Full after a second of no use, and no fuller.
    h.advance(Duration::from_secs(5));
    let d = h.check(0);
    assert_eq!((d.remaining(), d.reset()), (10, Duration::ZERO));
}

#[test]
fn token_bucket_burst_sets_capacity() {
    let policy = Policy::builder("tb")
        .algorithm(Algorithm::TokenBucket)
        .limit("10/s")
        .burst(3)
        .build()
        .unwrap();
    let h = Harness::new(policy, Timestamp::from_secs(MINUTE_START));
    assert_eq!(h.check(1).limit(), 3);
    assert!(h.check(2).is_allowed());
    assert_eq!(h.check(1).retry_after(), Some(ms(100)));
}

#[test]
fn leaky_bucket_spaces_delays_by_the_interval_and_rejects_when_full() {
    let policy = Policy::new("lb", Algorithm::LeakyBucket, "5/s").unwrap();
    let h = Harness::new(policy, Timestamp::from_secs(MINUTE_START));
    let delays: Vec<Duration> = (0..5)
        .map(|_| {
            let d = h.check(1);
            assert!(d.is_allowed());
            d.delay()
        })
        .collect();
    assert_eq!(delays, vec![ms(0), ms(200), ms(400), ms(600), ms(800)]);
    let full = h.check(1);
    assert_eq!(
        full.outcome(),
        Outcome::Limited {
            retry_after: ms(200)
        }
    );
    assert_eq!(full.remaining(), 0);
    assert_eq!(
        full.reset(),
        Duration::from_secs(1),
        "the queue drains at t = 1 s"
    );
    h.advance(ms(200) - us(1));
    assert!(!h.check(1).is_allowed());
    h.advance(us(1));
    let d = h.check(1);
    assert!(d.is_allowed());
    assert_eq!(d.delay(), ms(800), "it leaves after the four still queued");
}

#[test]
fn gcra_admits_burst_then_the_rate() {
    let policy = Policy::builder("g").limit("10/s").burst(4).build().unwrap();
    let h = Harness::new(policy, Timestamp::from_secs(MINUTE_START));
    for i in 0..4 {
        let d = h.check(1);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 3 - i);
    }
    let d = h.check(1);
    assert_eq!(d.retry_after(), Some(ms(100)));
    assert_eq!(d.reset(), ms(400));
    h.advance(ms(100));
    assert!(h.check(1).is_allowed());
    assert!(!h.check(1).is_allowed());
    assert_eq!(
        h.check(5).outcome(),
        Outcome::CostExceedsCapacity {
            cost: 5,
            capacity: 4
        }
    );
}

#[test]
fn cost_zero_is_a_peek_for_every_algorithm() {
    for algorithm in Algorithm::ALL {
        let policy = Policy::new("peek", algorithm, "2/s").unwrap();
        let h = Harness::new(policy, Timestamp::from_secs(MINUTE_START));
        let d = h.check(0);
        assert!(d.is_allowed(), "{algorithm}");
        assert_eq!(d.remaining(), 2, "{algorithm}");
        assert_eq!(h.store.len(), 0, "{algorithm}: a peek creates no state");
        h.check(1);
        for _ in 0..3 {
            assert_eq!(h.check(0).remaining(), 1, "{algorithm}");
        }
        assert!(h.check(1).is_allowed(), "{algorithm}");
        assert!(!h.check(1).is_allowed(), "{algorithm}");
        assert!(
            h.check(0).is_allowed(),
            "{algorithm}: a peek at an empty limit"
        );
    }
}

#[test]
fn cost_above_capacity_never_succeeds_for_every_algorithm() {
    for algorithm in Algorithm::ALL {
        let policy = Policy::builder("big")
            .algorithm(algorithm)
            .limit("5/s")
            .limit("100/min")
            .build()
            .unwrap();
        let h = Harness::new(policy, Timestamp::from_secs(MINUTE_START));
        let d = h.check(6);
        assert_eq!(
            d.outcome(),
            Outcome::CostExceedsCapacity {
                cost: 6,
                capacity: 5
            },
            "{algorithm}"
        );
        assert_eq!(d.retry_after(), None);
        assert_eq!(d.binding().limit().to_string(), "5/s");
        // The leaky bucket's joint queue moves 600 ms a request (the
        // minute's interval): a second of queue holds two.
        let room = if algorithm == Algorithm::LeakyBucket {
            2
        } else {
            5
        };
        assert_eq!(
            h.check(0).remaining(),
            room,
            "{algorithm}: nothing consumed"
        );
    }
}

#[test]
fn multi_limit_reports_every_limit_and_binds_the_tightest() {
    let policy = Policy::builder("search")
        .algorithm(Algorithm::FixedWindow)
        .limit("25/5s")
        .limit("300/min")
        .build()
        .unwrap();
    let h = Harness::new(policy, Timestamp::from_secs(MINUTE_START));
    let d = h.check(1);
    assert_eq!(d.limits().len(), 2);
    assert_eq!(d.limits()[0].remaining(), 24);
    assert_eq!(d.limits()[1].remaining(), 299);
    assert_eq!(d.binding().index(), 0);
    assert_eq!((d.limit(), d.remaining()), (25, 24));
}

/// A sliding window seeded from a decision that shows nothing left may
/// hide a debt: 100 settled into a window of 10 a minute weighs 25 at
/// 45 s into the next window. The seeded state holds the limit until the
/// window's end rather than admit then (it admitted 5: a share of the use
/// seen, 10, decayed as 20 in the previous window).
#[test]
fn a_seeded_sliding_window_keeps_a_hidden_debt_until_its_window_ends() {
    use tollgate_core::Settlement;
    use tollgate_core::state::PolicyState;
    let policy = Policy::new("debt", Algorithm::SlidingWindow, "10/min").unwrap();
    let start = Timestamp::from_secs(MINUTE_START);
    let mut state = PolicyState::new(&policy, start);
    let reserved = state.decide(&policy, start, 1);
    state.settle(&policy, start, &Settlement::of(&reserved, 1, 100));
    let at = |secs| Timestamp::from_secs(MINUTE_START + secs);
    let last = state.clone().decide(&policy, at(90), 0);
    assert_eq!(last.remaining(), 0);
    let mut seeded = PolicyState::seeded(&policy, &last);
    assert!(!state.decide(&policy, at(105), 1).is_allowed());
    assert!(!seeded.decide(&policy, at(105), 1).is_allowed());
    assert!(!seeded.decide(&policy, at(119), 1).is_allowed());
    assert!(seeded.decide(&policy, at(120), 1).is_allowed());
}
