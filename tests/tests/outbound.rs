//! Workers in two instances share a partner's peak and daily quota, at
//! the partner's own figures, and the partner never answers 429: checked
//! from the partner's own counters.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use outbound::{
    Calls, DEFAULT_HEADROOM, Pacing, Partner, PartnerClient, PartnerLimits, PartnerQuota, Report,
};
use tollgate::{Jitter, Key, MemoryStore, Timestamp, TokioClock};
use tollgate_redis::RedisStore;
use tollgate_tests::{require_redis, unique_prefix};

/// Two instances of `workers` workers each, every worker calling the
/// partner of `account` through `limits(instance)` for `run`.
async fn two_instances<St, C>(
    limits: impl Fn(usize) -> PartnerLimits<St>,
    partner: impl Fn() -> C,
    workers: usize,
    run: Duration,
) -> Calls
where
    St: tollgate::Store + Clone + Send + Sync + 'static,
    C: outbound::CallPartner + 'static,
{
    let account = Key::custom("partner-account-7");
    let instances = (0..2).map(|i| {
        tokio::spawn(outbound::instance(
            limits(i),
            account.clone(),
            partner(),
            workers,
            run,
        ))
    });
    let mut calls = Calls::default();
    for instance in instances.collect::<Vec<_>>() {
        calls += instance.await.unwrap();
    }
    calls
}

/// The acceptance run on tokio's paused clock, 60 s of it: GCRA with a
/// burst of 1 lets the calls through exactly 100 ms apart, and the day's
/// 500 are spent 49.9 s in. The partner counts arrivals by the same
/// clock (in process, no network), so every figure is exact.
#[tokio::test(start_paused = true)]
async fn gcra_spends_the_day_exactly_at_the_peak_in_memory() {
    let clock = TokioClock::starting_at(Timestamp::from_secs(1_700_000_000));
    let partner = Partner::new(PartnerQuota::DEMO, clock);
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    let limits = |_| {
        PartnerLimits::new(
            PartnerQuota::DEMO,
            Pacing::Gcra,
            Jitter::default(),
            Duration::ZERO,
            store.clone(),
        )
        .unwrap()
    };
    let calls = two_instances(limits, || partner.clone(), 4, Duration::from_secs(60)).await;
    assert_eq!(
        calls,
        Calls {
            ok: 500,
            day_over: 8,
            ..Calls::default()
        }
    );
    let log = partner.log();
    assert_eq!((log.over_peak, log.over_daily), (0, 0));
    let start = log.accepted[0];
    let at: Vec<u64> = log.accepted.iter().map(|t| t - start).collect();
    let expected: Vec<u64> = (0..500).map(|n| n * 100_000).collect();
    assert_eq!(at, expected, "one call every 100 ms");
}

/// The same on a sliding log holding both limits, with the default
/// jitter: waiters wake apart, calls keep to the peak, and the day's 500
/// are spent within 60 s.
#[tokio::test(start_paused = true)]
async fn a_sliding_log_with_jitter_keeps_to_the_peak_in_memory() {
    let clock = TokioClock::starting_at(Timestamp::from_secs(1_700_000_000));
    let partner = Partner::new(PartnerQuota::DEMO, clock);
    let store = MemoryStore::builder().clock(clock).build().unwrap();
    let limits = |_| {
        let pacing = Pacing::SlidingLog;
        PartnerLimits::new(
            PartnerQuota::DEMO,
            pacing,
            Jitter::default(),
            Duration::ZERO,
            store.clone(),
        )
        .unwrap()
    };
    let calls = two_instances(limits, || partner.clone(), 4, Duration::from_secs(60)).await;
    assert_eq!((calls.ok, calls.rejected, calls.failed), (500, 0, 0));
    let log = partner.log();
    assert_eq!((log.over_peak, log.over_daily), (0, 0));
    assert_eq!(log.busiest(Duration::from_secs(1)), 10);
}

/// The acceptance at a sixth of its length, in real time: two instances
/// of four workers, each instance on a Redis connection of its own, call
/// the partner over HTTP for 10 s. The partner's day is a sixth of the
/// demo's too (83 calls), so that, as in the 60 s run, the day binds:
/// the partner answers no 429, and at least 95 % of its allowance is
/// used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_redis_keep_to_the_partners_limits_in_real_time() {
    let url = require_redis().await;
    let quota = PartnerQuota {
        daily: 83,
        ..PartnerQuota::DEMO
    };
    let run = Duration::from_secs(10);
    // Real time, but from a UTC noon: the run never crosses midnight, which
    // would start a new day for the partner and for the client's limits.
    let clock = TokioClock::starting_at(Timestamp::from_secs(1_699_963_200));
    let partner = Partner::new(quota, clock);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = partner.router();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let prefix = unique_prefix("outbound");
    let mut stores = Vec::new();
    for _ in 0..2 {
        // The subject is the partner's limits, not the store's latency. On
        // a loaded machine the shared redis-server can go without CPU past
        // the default 50 ms deadline, and the store rightly reports that as
        // a failure. Under three `yes` loops, 5 runs of 24 failed (2 of the
        // 10 with this test reniced to -10), and 0 of 10 with redis-server
        // reniced to -10 instead.
        let store = RedisStore::builder()
            .prefix(&prefix)
            .deadline(Duration::from_secs(2))
            .test_clock(clock)
            .connect(url.as_str())
            .await
            .unwrap();
        stores.push(store);
    }
    let limits = |i: usize| {
        PartnerLimits::new(
            quota,
            Pacing::Gcra,
            Jitter::default(),
            DEFAULT_HEADROOM,
            stores[i].clone(),
        )
        .unwrap()
    };
    let client = || PartnerClient::new(&base).unwrap();
    let calls = two_instances(limits, client, 4, run).await;
    let report = Report {
        quota,
        run,
        log: partner.log(),
        calls,
    };
    assert_eq!(report.log.rejected(), 0, "{report}");
    assert_eq!(report.log.accepted.len(), 83, "{report}");
    assert!(report.passed(), "{report}");
    assert_eq!(
        (calls.ok, calls.rejected, calls.failed, calls.day_over),
        (83, 0, 0, 8),
        "{report}"
    );
}
