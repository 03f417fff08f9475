//! The memory ledger passes the ledger suite, and the calendar places
//! instants in the right buckets at month ends, leap days and both
//! daylight-saving changes.
#![cfg(feature = "testing")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use tollgate_core::ledger::{
    Granularity, Ledger, LedgerSettings, MAX_BUCKET_UNITS, MemoryLedger, MeteredStore, UsageQuery,
};
use tollgate_core::testing::check_ledger;
use tollgate_core::{FakeClock, Key, MemoryStore, Timestamp};

fn at(text: &str) -> Timestamp {
    let ts: jiff::Timestamp = text.parse().unwrap();
    Timestamp::from_secs(ts.as_second().try_into().unwrap())
}

fn start(settings: &LedgerSettings, g: Granularity, text: &str) -> Timestamp {
    settings.bucket_start(g, at(text))
}

#[tokio::test]
async fn the_memory_ledger_passes_the_suite() {
    let clock = FakeClock::default();
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let store = MeteredStore::new(store, MemoryLedger::new());
    let report = check_ledger(&store, &clock).await.unwrap();
    assert!(report.admitted > 200, "{report:?}");
    assert!(report.denied > 10, "{report:?}");
    assert!(report.settlements > 50, "{report:?}");
    assert!(report.buckets > 50, "{report:?}");
}

#[test]
fn months_and_leap_days_in_utc() {
    let utc = LedgerSettings::new();
    let month = |t| start(&utc, Granularity::Month, t);
    assert_eq!(month("2028-02-29T23:59:59Z"), at("2028-02-01T00:00:00Z"));
    assert_eq!(month("2028-03-01T00:00:00Z"), at("2028-03-01T00:00:00Z"));
    let feb = at("2028-02-01T00:00:00Z");
    assert_eq!(
        utc.next_bucket(Granularity::Month, feb),
        at("2028-03-01T00:00:00Z")
    );
    let leap_day = at("2028-02-29T00:00:00Z");
    assert_eq!(
        utc.next_bucket(Granularity::Day, leap_day),
        at("2028-03-01T00:00:00Z")
    );
    assert_eq!(
        start(&utc, Granularity::Hour, "2026-12-31T23:59:59.999Z"),
        at("2026-12-31T23:00:00Z")
    );
}

#[test]
fn days_follow_daylight_saving_in_the_zone() {
    let berlin = LedgerSettings::new().time_zone("Europe/Berlin").unwrap();
    // Spring: 2026-03-29 has 23 hours in Berlin.
    let day = start(&berlin, Granularity::Day, "2026-03-29T12:00:00Z");
    assert_eq!(day, at("2026-03-28T23:00:00Z"));
    assert_eq!(
        berlin.next_bucket(Granularity::Day, day),
        at("2026-03-29T22:00:00Z")
    );
    // Autumn: 2026-10-25 has 25 hours, and the repeated hour is two buckets.
    let day = start(&berlin, Granularity::Day, "2026-10-25T12:00:00Z");
    assert_eq!(day, at("2026-10-24T22:00:00Z"));
    assert_eq!(
        berlin.next_bucket(Granularity::Day, day),
        at("2026-10-25T23:00:00Z")
    );
    let first = start(&berlin, Granularity::Hour, "2026-10-25T00:30:00Z");
    let second = start(&berlin, Granularity::Hour, "2026-10-25T01:30:00Z");
    assert_eq!(
        (first, second),
        (at("2026-10-25T00:00:00Z"), at("2026-10-25T01:00:00Z"))
    );
    // Months begin at midnight in Berlin: the UTC evening before.
    let month = start(&berlin, Granularity::Month, "2026-10-31T23:30:00Z");
    assert_eq!(month, at("2026-10-31T23:00:00Z"));
    // A half-hour zone: hours begin at :30 UTC.
    let kolkata = LedgerSettings::new().time_zone("Asia/Kolkata").unwrap();
    let hour = start(&kolkata, Granularity::Hour, "2026-05-05T10:10:00Z");
    assert_eq!(hour, at("2026-05-05T09:30:00Z"));
}

#[test]
fn bad_settings_and_ranges_are_typed_errors() {
    let error = LedgerSettings::new()
        .time_zone("Europe/Atlantis")
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid time zone \"Europe/Atlantis\": not a time zone of the IANA database"
    );
    let zero = LedgerSettings::new().retention(Granularity::Hour, Duration::ZERO);
    assert_eq!(
        zero.unwrap_err().to_string(),
        "invalid setting retention: keep buckets from 1 second to 10 years"
    );
    let t = at("2026-01-01T00:00:00Z");
    let later = at("2026-02-01T00:00:00Z");
    let backwards = UsageQuery::new(Granularity::Day, later, t).unwrap_err();
    assert_eq!(
        backwards.to_string(),
        "invalid setting range: the end is before the start"
    );
    let far = Timestamp::from_secs(u64::MAX / 2_000_000);
    assert!(UsageQuery::new(Granularity::Hour, t, far).is_err());
    assert!(UsageQuery::new(Granularity::Month, Timestamp::from_secs(0), far).is_err());
}

#[tokio::test]
async fn huge_amounts_saturate() {
    let ledger = MemoryLedger::new();
    let key = Key::user("whale");
    let t = at("2026-01-01T00:00:00Z");
    for _ in 0..5_000 {
        ledger.record(&key, "p", t, u64::MAX);
    }
    let query = UsageQuery::new(Granularity::Hour, t, at("2026-01-01T01:00:00Z")).unwrap();
    let usage = ledger.usage(&key, "p", query).await.unwrap();
    assert_eq!(usage.total(), MAX_BUCKET_UNITS.unsigned_abs());
    // Refunds beyond what was recorded show 0, never less.
    let other = Key::user("refunded");
    ledger.refund(&other, "p", t, 10);
    let usage = ledger.usage(&other, "p", query).await.unwrap();
    assert_eq!((usage.total(), usage.buckets().len()), (0, 0));
    // Extreme instants are placed without a panic.
    ledger.record(&key, "p", Timestamp::from_micros(u64::MAX), 1);
    ledger.record(&key, "p", Timestamp::from_secs(0), 1);
}

/// A record dated far ahead (a store clock that stepped, a reservation's
/// time in the wrong unit) does not make the ledger's buckets look past
/// their retention: the sweep it comes with keeps them. It swept them all,
/// the month's billing of every key with them.
#[tokio::test]
async fn a_record_dated_far_ahead_does_not_sweep_the_ledger() {
    let ledger = MemoryLedger::new();
    let t = at("2026-01-01T00:00:00Z");
    ledger.record(&Key::user("a"), "p", t, 7);
    for _ in 0..4_094 {
        ledger.record(&Key::user("b"), "p", t, 1);
    }
    // The 4,096th record, and a sweep with it.
    ledger.record(&Key::user("c"), "p", at("8999-01-01T00:00:00Z"), 1);
    let query = UsageQuery::new(Granularity::Month, t, at("2026-02-01T00:00:00Z")).unwrap();
    let usage = ledger.usage(&Key::user("a"), "p", query).await.unwrap();
    assert_eq!(usage.total(), 7);
    assert_eq!(ledger.len(), 3);
}

#[tokio::test]
async fn a_full_ledger_counts_what_it_dropped_and_old_buckets_go() {
    let settings = LedgerSettings::new()
        .retention(Granularity::Hour, Duration::from_secs(3_600))
        .unwrap();
    let ledger = MemoryLedger::with_settings(settings, 2);
    let t = at("2026-01-01T00:00:00Z");
    ledger.record(&Key::user("a"), "p", t, 1);
    ledger.record(&Key::user("b"), "p", t, 1);
    ledger.record(&Key::user("c"), "p", t, 1);
    assert_eq!((ledger.len(), ledger.dropped()), (2, 1));
    // A year on, after enough records to sweep twice, January's buckets
    // are gone. (A sweep's now is the earliest instant recorded since the
    // one before: the first one's is January's.)
    let later = at("2027-06-01T00:00:00Z");
    for _ in 0..8_192 {
        ledger.record(&Key::user("a"), "p", later, 1);
    }
    assert_eq!(ledger.len(), 1);
}

/// Lord Howe Island moves its clocks by half an hour: from UTC+10:30 to
/// +11:00 at 2 a.m. on 2025-10-05 (15:30 UTC the day before), and back at
/// 2 a.m. on 2026-04-05 (15:00 UTC the day before). Hour buckets are its
/// local hours, and a query reads every one of them: its hours were read
/// an hour apart from the first, so after a change every bucket of the
/// other half hour was left out (1 unit of 111 read, for the spring).
/// Records made out of order land in the bucket of their own instant.
#[tokio::test]
async fn hours_across_a_half_hour_change_of_offset_are_all_read() {
    let settings = LedgerSettings::new()
        .time_zone("Australia/Lord_Howe")
        .unwrap();
    // The change, and the local hours of the instants 10 min before and
    // after it: 1 a.m. and 2 a.m. in spring (the clocks jump from 2 to
    // 2:30), 1:30 a.m. at +11:00 and 1 a.m. at +10:30 in autumn (from 2
    // back to 1:30).
    for (change, before_hour, after_hour) in [
        (
            "2025-10-04T15:30:00Z",
            "2025-10-04T14:30:00Z",
            "2025-10-04T15:00:00Z",
        ),
        (
            "2026-04-04T15:00:00Z",
            "2026-04-04T14:00:00Z",
            "2026-04-04T14:30:00Z",
        ),
    ] {
        let ledger = MemoryLedger::with_settings(settings.clone(), 1_000);
        let ada = Key::user("ada");
        let change = at(change);
        let secs = |s: i64| {
            let us = change
                .as_micros()
                .checked_add_signed(s * 1_000_000)
                .unwrap();
            Timestamp::from_micros(us)
        };
        // After the change first, then before it, then three hours on.
        ledger.record(&ada, "api", secs(600), 10);
        ledger.record(&ada, "api", secs(-600), 1);
        ledger.record(&ada, "api", secs(3 * 3_600), 100);
        let query = |g| UsageQuery::new(g, secs(-86_400), secs(86_400)).unwrap();
        let hours = ledger.usage(&ada, "api", query(Granularity::Hour)).await;
        let hours = hours.unwrap();
        let days = ledger.usage(&ada, "api", query(Granularity::Day)).await;
        assert_eq!(days.unwrap().total(), 111);
        // Each record in the bucket of its own local hour; the hour of the
        // change ends at it, where the next begins to hold instants.
        let buckets: Vec<_> = (hours.buckets().iter())
            .map(|b| (b.start(), b.end(), b.units()))
            .collect();
        let (before, after) = (at(before_hour), at(after_hour));
        let hour = Duration::from_secs(3_600);
        let later = settings.bucket_start(Granularity::Hour, secs(3 * 3_600));
        assert_eq!(
            buckets,
            [
                (before, change, 1),
                (after, after + hour, 10),
                (later, later + hour, 100)
            ],
            "{change:?}"
        );
        assert_eq!(settings.next_bucket(Granularity::Hour, before), after);
        assert_eq!(settings.bucket_start(Granularity::Hour, secs(600)), after);
        // A query that ends before the change reads the hour before it
        // only: the next is named for a time before the change, and holds
        // instants after it.
        let until_the_change = UsageQuery::new(Granularity::Hour, secs(-1_200), secs(-60)).unwrap();
        assert_eq!(
            until_the_change.bucket_starts(&settings),
            [before],
            "{change:?}"
        );
        let across = UsageQuery::new(Granularity::Hour, secs(-1_200), secs(60)).unwrap();
        assert_eq!(
            across.bucket_starts(&settings),
            [before, after],
            "{change:?}"
        );
    }
}
