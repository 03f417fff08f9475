//! Calendar periods on real Redis: the script decides the period from
//! Redis's own clock, among the boundaries the store sends; and a lease
//! of a calendar period ends at its boundary. (Memory and Redis decide
//! calendar periods alike in `redis_conformance`: the conformance suite's
//! calendar cases and boundaries, and the differential property tests,
//! one of them across calendar changes.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use futures::future::join_all;
use tollgate::{Algorithm, Calendar, FakeClock, Key, Policy, Store, Timestamp};
use tollgate_redis::testing::{script_args, script_source};
use tollgate_redis::{LeasedStore, RedisStore};
use tollgate_tests::{require_redis, unique_prefix};

const DAY_US: u64 = 86_400_000_000;

/// A memory store and a Redis store (under a prefix of `name`) on `clock`.
async fn both_stores(clock: &FakeClock, name: &str) -> (tollgate::MemoryStore, RedisStore) {
    let url = require_redis().await;
    let memory = tollgate::MemoryStore::builder()
        .clock(clock.clone())
        .build()
        .unwrap();
    let redis = RedisStore::builder()
        .prefix(unique_prefix(name))
        .deadline(Duration::from_secs(2))
        .test_clock(clock.clone())
        .connect(url.as_str())
        .await
        .unwrap();
    (memory, redis)
}

/// Runs the decision script of `policy` (one limit, per UTC day) on
/// Redis's clock, with the boundaries computed around `skew` µs before
/// Redis's time, as an instance whose clock is that far behind would.
async fn decide_behind(url: &str, policy: &Policy, skew: u64) -> redis::RedisResult<Vec<i64>> {
    let client = redis::Client::open(url).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
    let redis_now = secs * 1_000_000 + micros;
    let mut args = script_args(policy, 1);
    let p = &policy.params()[0];
    let [b1, b2, b3, b4] = p.calendar_bounds(redis_now - skew).unwrap();
    // Count, then the period with its calendar boundaries.
    assert_eq!(args[6].split(' ').count(), 5, "{args:?}");
    args[6] = format!("{} {b1} {b2} {b3} {b4}", p.period_us);
    let key = format!("{}:day", unique_prefix("calendar-clock"));
    redis::cmd("EVAL")
        .arg(script_source(policy))
        .arg(1)
        .arg(&key)
        .arg(&args)
        .query_async(&mut con)
        .await
}

#[tokio::test]
async fn the_script_takes_the_period_that_holds_redis_time() {
    let url = require_redis().await;
    let policy = Policy::builder("calendar-clock")
        .algorithm(Algorithm::FixedWindow)
        .limit("5/day")
        .calendar(Calendar::utc())
        .build()
        .unwrap();
    // Boundaries sent from a clock a day behind Redis's: the script still
    // counts in Redis's day, and resets at Redis's next UTC midnight.
    for skew in [0, DAY_US / 2, DAY_US] {
        let reply = decide_behind(&url, &policy, skew).await.unwrap();
        let [outcome, now, delay, remaining, reset, retry] = reply[..] else {
            panic!("{reply:?}");
        };
        let now = u64::try_from(now).unwrap();
        assert_eq!((outcome, delay, remaining, retry), (0, 0, 4, -1));
        assert_eq!(
            now + u64::try_from(reset).unwrap(),
            (now / DAY_US + 1) * DAY_US
        );
    }
    // Three days behind, no period sent holds Redis's time: an error (the
    // store's failure policy answers it), never a wrong window.
    let err = decide_behind(&url, &policy, 3 * DAY_US).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("outside the calendar periods sent"),
        "{err}"
    );
}

/// Berlin's midnight of 2027-03-28 (a 23-hour day), 2027-03-27 23:00 UTC.
const BOUNDARY: Timestamp = Timestamp::from_secs(1_806_188_400);

async fn leased(url: &str, prefix: &str, clock: &FakeClock) -> LeasedStore<RedisStore> {
    let redis = RedisStore::builder()
        .prefix(prefix.to_owned())
        .test_clock(clock.clone())
        .deny_cache(0)
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .unwrap();
    LeasedStore::builder()
        .interval(Duration::from_millis(8))
        .share(16)
        .channel(format!("{prefix}:leases"))
        .test_clock(clock.clone())
        .connect(redis, url)
        .await
        .unwrap()
}

async fn burst(stores: &[LeasedStore<RedisStore>], key: &Key, policy: &Policy, n: usize) -> u64 {
    let calls = stores
        .iter()
        .flat_map(|s| (0..n).map(move |_| s.check(key, policy, 1)));
    join_all(calls)
        .await
        .into_iter()
        .map(|d| u64::from(d.unwrap().is_allowed()))
        .sum()
}

/// Two instances lease a hot key's daily quota just before Berlin's
/// midnight: no unit leased on the 27th is spent on the 28th, whose whole
/// quota is then admitted or held, exactly; its reset is the next local
/// midnight, 23 hours after this one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_ends_at_the_calendar_boundary() {
    let url = require_redis().await;
    let clock = FakeClock::new(BOUNDARY - Duration::from_millis(20));
    let prefix = unique_prefix("calendar-lease");
    let stores = [
        leased(&url, &prefix, &clock).await,
        leased(&url, &prefix, &clock).await,
    ];
    let policy = Policy::builder("calendar-lease")
        .algorithm(Algorithm::FixedWindow)
        .limit("4000/day")
        .calendar(Calendar::new("Europe/Berlin").unwrap())
        .build()
        .unwrap();
    let key = Key::user("hot");
    // 20 a millisecond for the last 20 ms of the 27th.
    let mut before = 0;
    for _ in 0..20 {
        before += burst(&stores, &key, &policy, 10).await;
        clock.advance(Duration::from_millis(1));
    }
    assert_eq!(before, 400, "the 27th had room for all");
    for store in &stores {
        store.wait_for_grants().await;
    }
    // Leases were taken on the 27th. (Whether one is still held now is a
    // race: the clock is at their end, and each store's sweep, every
    // interval of real time, gives back what ended.)
    let grants: u64 = stores.iter().map(|s| s.calls().grants).sum();
    assert!(grants > 0, "leases taken on the 27th");
    // The 28th: demand of 40 a millisecond for 200 ms, twice its quota.
    assert_eq!(tollgate::Clock::now(&clock), BOUNDARY);
    let mut admitted = 0;
    for _ in 0..200 {
        admitted += burst(&stores, &key, &policy, 20).await;
        clock.advance(Duration::from_millis(1));
    }
    for store in &stores {
        store.wait_for_grants().await;
    }
    let held: u64 = stores.iter().map(|s| s.outstanding().1).sum();
    assert_eq!(admitted + held, 4000, "{admitted} admitted, {held} held");
    let status = stores[0].status(&key, &policy).await.unwrap();
    let elapsed = Duration::from_millis(200);
    assert_eq!(
        status.binding().reset(),
        Duration::from_secs(23 * 3600) - elapsed
    );
}

/// Mid-October 2027 in Berlin, and November's start (00:00 CET).
const MID_OCTOBER: Timestamp = Timestamp::from_secs(1_823_594_400);
const NOVEMBER: Timestamp = Timestamp::from_secs(1_825_023_600);

fn monthly(count: u64) -> Policy {
    Policy::builder("calendar-features")
        .algorithm(Algorithm::FixedWindow)
        .limit(tollgate::Limit::per_month(count).unwrap())
        .calendar(Calendar::new("Europe/Berlin").unwrap())
        .build()
        .unwrap()
}

/// A monthly quota where features meet, with the same numbers on `store`
/// (memory or Redis, on `clock`): a settled cost, a status, a limit raised
/// mid-month that keeps the month's usage, a block, a reset, the boundary.
async fn features_meet(store: &impl Store, clock: &FakeClock) {
    let key = Key::user("billing");
    let (fifty, hundred) = (monthly(50_000), monthly(100_000));
    clock.set(MID_OCTOBER);
    let to_november = Duration::from_secs(1_825_023_600 - 1_823_594_400);
    let reserved = store.check(&key, &fifty, 30_000).await.unwrap();
    assert!(reserved.is_allowed());
    assert_eq!(reserved.binding().reset(), to_november);
    // The response cost 20,000, not 30,000: 10,000 come back.
    let settlement = tollgate::Settlement::of(&reserved, 30_000, 20_000);
    let settled = store.settle(&key, &fifty, settlement).await.unwrap();
    assert_eq!(settled.binding().remaining(), 30_000);
    let status = store.status(&key, &fifty).await.unwrap();
    assert_eq!(
        (status.binding().remaining(), status.binding().reset()),
        (30_000, to_november)
    );
    // Raised to 100,000 a month: October's 20,000 stay used.
    let raised = store.check(&key, &hundred, 1).await.unwrap();
    assert_eq!(raised.binding().remaining(), 79_999);
    assert_eq!(raised.binding().limit().to_string(), "100000/month");
    let over = store.check(&key, &hundred, 80_000).await.unwrap();
    assert_eq!(over.retry_after(), Some(to_november));
    // An hour's block, then the key starts afresh.
    let hour = Duration::from_secs(3_600);
    store.block(&key, &hundred, hour).await.unwrap();
    let blocked = store.check(&key, &hundred, 1).await.unwrap();
    assert_eq!(blocked.retry_after(), Some(hour));
    clock.advance(hour);
    store.check(&key, &hundred, 99_999).await.unwrap();
    store.reset(&key, &hundred).await.unwrap();
    let fresh = store.check(&key, &hundred, 1).await.unwrap();
    assert_eq!(fresh.binding().remaining(), 99_999);
    // November: the whole quota again, until December (2027-11-30 23:00 UTC).
    clock.set(NOVEMBER);
    let november = store.check(&key, &hundred, 100_000).await.unwrap();
    assert!(november.is_allowed());
    assert_eq!(november.binding().reset(), Duration::from_secs(30 * 86_400));
}

#[tokio::test]
async fn settle_status_carry_over_block_and_reset_meet_on_memory_and_redis() {
    let clock = FakeClock::new(MID_OCTOBER);
    let (memory, redis) = both_stores(&clock, "calendar-features").await;
    features_meet(&memory, &clock).await;
    features_meet(&redis, &clock).await;
}

/// Calendars changed under a key, on memory and on Redis alike:
/// - a month counted from midnight UTC, redeployed mid-month to count from
///   06:00 (an offset), then to Berlin's months, and back: the month's use
///   stays with the key until the month it began in ends, then the key
///   starts afresh. A window that began earlier than the new calendar's
///   current one was taken for an ended one, and the key had its month
///   afresh; a first fix carried its count into the new calendar's window
///   and, changed back, into the next month too.
/// - a calendar changed after the key's month ended under the old one: the
///   new calendar's month, which the old one stands for, runs on (six hours
///   more under the offset), then the key starts afresh.
/// - Berlin's months redeployed as UTC's: Berlin's March, begun on Feb 28
///   at 23:00 UTC, stands for UTC's March, not February, and its use holds
///   until April. Taken as long as February, it ended on Mar 28 and the
///   key had a second month's quota.
/// - a day from 06:00 UTC, redeployed as a plain day (its compact form):
///   the day's use is counted in the UTC day that holds its start, where
///   the six hours between were read as use, and every key was denied.
async fn calendar_changes<S: Store>(store: &S, clock: &FakeClock) -> Vec<(bool, u64)> {
    let policy = |limit: &str, calendar: Option<Calendar>| {
        let builder = Policy::builder("calendar-change")
            .algorithm(Algorithm::FixedWindow)
            .limit(limit);
        match calendar {
            Some(calendar) => builder.calendar(calendar),
            None => builder,
        }
        .build()
        .unwrap()
    };
    let six = || {
        Calendar::new("UTC")
            .unwrap()
            .with_offset(Duration::from_secs(6 * 3_600))
    };
    let utc = policy("100/month", Some(Calendar::new("UTC").unwrap()));
    let at_six = policy("100/month", Some(six()));
    let berlin = policy("100/month", Some(Calendar::new("Europe/Berlin").unwrap()));
    let (day_at_six, plain_day) = (policy("100/day", Some(six())), policy("100/day", None));
    let prefix = unique_prefix("calendar-change");
    let (ada, bob, cy, dora) = (
        Key::user(format!("{prefix}-ada")),
        Key::user(format!("{prefix}-bob")),
        Key::user(format!("{prefix}-cy")),
        Key::user(format!("{prefix}-dora")),
    );
    let mut seen = Vec::new();
    let mut check = async |key: &Key, policy: &Policy, cost| {
        let decision = store.check(key, policy, cost).await.unwrap();
        seen.push((decision.is_allowed(), decision.remaining()));
        (decision.is_allowed(), decision.remaining())
    };
    // 2027-01-15 07:00 UTC, then 08:00.
    clock.set(Timestamp::from_secs(1_799_996_400));
    assert_eq!(check(&cy, &day_at_six, 60).await, (true, 40));
    clock.set(Timestamp::from_secs(1_800_000_000));
    assert_eq!(
        check(&cy, &plain_day, 1).await,
        (true, 39),
        "the day's use kept"
    );
    // 12:00.
    clock.set(Timestamp::from_secs(1_800_014_400));
    assert_eq!(check(&ada, &utc, 90).await, (true, 10));
    assert_eq!(
        check(&ada, &at_six, 5).await,
        (true, 5),
        "the month's use kept"
    );
    assert_eq!(check(&ada, &berlin, 5).await, (true, 0), "and again");
    assert_eq!(check(&ada, &utc, 1).await, (false, 0));
    assert_eq!(check(&bob, &utc, 100).await, (true, 0));
    // 2027-01-16 00:30: a new UTC day.
    clock.set(Timestamp::from_secs(1_800_059_400));
    assert_eq!(check(&cy, &plain_day, 1).await, (true, 99));
    // 2027-01-20 12:00.
    clock.set(Timestamp::from_secs(1_800_446_400));
    assert_eq!(check(&ada, &at_six, 1).await, (false, 0));
    // 2027-02-01 00:30: January has ended.
    clock.set(Timestamp::from_secs(1_801_441_800));
    assert_eq!(
        check(&ada, &utc, 1).await,
        (true, 99),
        "back to UTC: afresh"
    );
    // 03:00: a calendar changed after UTC's January ended.
    clock.set(Timestamp::from_secs(1_801_450_800));
    assert_eq!(check(&bob, &at_six, 1).await, (false, 0), "until 06:00");
    // 07:00: Bob's month from 06:00 has begun; Ada's month begun at 00:00
    // runs on under the offset calendar.
    clock.set(Timestamp::from_secs(1_801_465_200));
    assert_eq!(check(&bob, &at_six, 1).await, (true, 99));
    assert_eq!(check(&ada, &at_six, 1).await, (true, 98));
    // 2027-03-10 12:00: Dora spends Berlin's March.
    clock.set(Timestamp::from_secs(1_804_680_000));
    assert_eq!(check(&dora, &berlin, 100).await, (true, 0));
    // 2027-03-29 00:00, redeployed in UTC: still March's use.
    clock.set(Timestamp::from_secs(1_806_278_400));
    assert_eq!(check(&dora, &utc, 1).await, (false, 0), "a second March");
    // 2027-04-01 00:30.
    clock.set(Timestamp::from_secs(1_806_539_400));
    assert_eq!(check(&dora, &utc, 1).await, (true, 99));
    seen
}

#[tokio::test]
async fn a_calendar_changed_mid_month_keeps_the_months_use_on_memory_and_redis() {
    let clock = FakeClock::default();
    let (memory, redis) = both_stores(&clock, "calendar-change").await;
    let on_memory = calendar_changes(&memory, &clock).await;
    assert_eq!(calendar_changes(&redis, &clock).await, on_memory);
}

/// A daily limit (with a per-minute one) on plain UTC days, then on New
/// York's (UTC-5), whose day 2027-01-10 05:00 to 01-11 05:00 UTC holds a
/// request made at 22:00 UTC on the 10th.
fn redeployed(zone: Option<&str>) -> Policy {
    let policy = Policy::builder("calendar-read")
        .algorithm(Algorithm::FixedWindow)
        .limit("1/day")
        .limit("5/min");
    match zone {
        Some(zone) => policy.calendar(Calendar::new(zone).unwrap()),
        None => policy,
    }
    .build()
    .unwrap()
}

/// A request at 22:00 UTC on plain days; at 00:00:30 a read of the key
/// (`read`: none, a peek, a status) on the same days; at 00:01 a request
/// on New York's days. The read, which consumes nothing, stores nothing
/// either: New York's day holds the first request, and the second is
/// refused.
async fn read_then_redeploy(store: &impl Store, clock: &FakeClock, read: u8) -> (bool, u64) {
    let key = Key::user(format!("read-{read}"));
    let (plain, new_york) = (redeployed(None), redeployed(Some("America/New_York")));
    let jan11 = 1_799_625_600; // 2027-01-11T00:00:00Z
    clock.set(Timestamp::from_secs(jan11 - 2 * 3600));
    assert!(store.check(&key, &plain, 1).await.unwrap().is_allowed());
    clock.set(Timestamp::from_secs(jan11 + 30));
    match read {
        0 => {}
        1 => assert!(store.check(&key, &plain, 0).await.unwrap().is_allowed()),
        _ => assert!(store.status(&key, &plain).await.unwrap().is_allowed()),
    }
    clock.set(Timestamp::from_secs(jan11 + 60));
    let decision = store.check(&key, &new_york, 1).await.unwrap();
    (decision.is_allowed(), decision.limits()[0].remaining())
}

#[tokio::test]
async fn a_read_before_a_calendar_change_stores_nothing_on_memory_or_redis() {
    let clock = FakeClock::default();
    let (memory, redis) = both_stores(&clock, "calendar-read").await;
    for read in 0..3 {
        assert_eq!(
            read_then_redeploy(&memory, &clock, read).await,
            (false, 0),
            "memory, read {read}"
        );
        assert_eq!(
            read_then_redeploy(&redis, &clock, read).await,
            (false, 0),
            "Redis, read {read}"
        );
    }
}

/// A key written while the clock read three days ahead, then decided once
/// it stepped back: its window, two periods and more ahead of the bounds
/// the store sends, is moved to now's with its count kept, on both stores
/// alike (the script failed every request of the key until it expired).
async fn clock_stepped_back(store: &impl Store, clock: &FakeClock) -> Vec<(bool, u64)> {
    let key = Key::user("stepped-back");
    let berlin = Policy::builder("calendar-back")
        .algorithm(Algorithm::FixedWindow)
        .limit("5/day")
        .limit("50/month")
        .calendar(Calendar::new("Europe/Berlin").unwrap())
        .build()
        .unwrap();
    let t = 1_810_000_000; // 2027-05-10
    let mut seen = Vec::new();
    for (at, cost) in [(t + 3 * 86_400, 1), (t, 1), (t + 1, 0), (t + 86_400, 1)] {
        clock.set(Timestamp::from_secs(at));
        let decision = store.check(&key, &berlin, cost).await.unwrap();
        seen.push((decision.is_allowed(), decision.limits()[0].remaining()));
    }
    seen
}

#[tokio::test]
async fn a_clock_stepped_back_days_keeps_the_keys_use_on_memory_and_redis() {
    let clock = FakeClock::default();
    let (memory, redis) = both_stores(&clock, "calendar-back").await;
    // Counted on the 13th; on the 10th the count is kept (3 left after a
    // second request), a peek reads it, and on the 11th a new day starts.
    let expected = vec![(true, 4), (true, 3), (true, 3), (true, 4)];
    assert_eq!(
        clock_stepped_back(&memory, &clock).await,
        expected,
        "memory"
    );
    assert_eq!(clock_stepped_back(&redis, &clock).await, expected, "Redis");
}
