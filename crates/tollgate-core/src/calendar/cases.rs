//! The calendar cases of the conformance suite (`crate::testing`): where
//! calendars are hard, with the exact numbers expected there.

use crate::time::Timestamp;

/// A UTC time written as RFC 3339, such as `"2027-03-27T23:00:00Z"`.
pub(crate) fn at(rfc3339: &str) -> Timestamp {
    let micros = rfc3339
        .parse::<jiff::Timestamp>()
        .map(|t| t.as_microsecond())
        .unwrap_or_default();
    Timestamp::from_micros(u64::try_from(micros).unwrap_or_default())
}

/// Calendar cases: zone, offset in hours, configurations served in turn
/// (each a list of limits), and a boundary the case starts within the hour
/// before.
pub(crate) type CalendarCase = (
    &'static str,
    u64,
    Vec<&'static [&'static str]>,
    &'static str,
);

pub(crate) fn calendar_cases() -> Vec<CalendarCase> {
    vec![
        // Across the months of 2028, February's leap day first.
        (
            "Europe/Berlin",
            0,
            vec![&["30/month"]],
            "2028-01-31T23:00:00Z",
        ),
        (
            "Europe/Berlin",
            0,
            vec![&["20/day"]],
            "2027-03-27T23:00:00Z",
        ),
        (
            "Europe/Berlin",
            0,
            vec![&["20/day", "3/min"]],
            "2027-03-27T23:00:00Z",
        ),
        (
            "Europe/Berlin",
            0,
            vec![&["20/day", "3/min"]],
            "2027-10-30T22:00:00Z",
        ),
        (
            "Europe/Berlin",
            2,
            vec![&["25/week"]],
            "2027-10-25T00:00:00Z",
        ),
        // A limit raised mid-month keeps the month's usage.
        (
            "Europe/Berlin",
            0,
            vec![&["50/month"], &["100/month"]],
            "2027-01-31T23:00:00Z",
        ),
        (
            "America/Santiago",
            0,
            vec![&["10/day", "2/min"]],
            "2027-09-05T04:00:00Z",
        ),
        (
            "UTC",
            8,
            vec![&["12/day"], &["12/day", "40/month"]],
            "2027-12-31T08:00:00Z",
        ),
    ]
}

/// Calendar changes: configurations served in turn, each with its own
/// calendar (zone, offset in hours, limits; no calendar for a zone of
/// `""`), and a boundary the case starts within the hour before. A window
/// begun under one calendar stands for the other's window that starts
/// nearest it.
pub(crate) type CalendarChange = (
    Vec<(&'static str, u64, &'static [&'static str])>,
    &'static str,
);

pub(crate) fn calendar_changes() -> Vec<CalendarChange> {
    vec![
        // Months from midnight and from 06:00 UTC.
        (
            vec![("UTC", 0, &["40/month"]), ("UTC", 6, &["40/month"])],
            "2027-01-31T23:00:00Z",
        ),
        // Berlin's days and plain ones (a single limit's compact form).
        (
            vec![("Europe/Berlin", 0, &["20/day"]), ("", 0, &["20/day"])],
            "2027-03-27T23:00:00Z",
        ),
        // Berlin's days and UTC's, with a limit per minute beside them.
        (
            vec![
                ("Europe/Berlin", 0, &["20/day", "3/min"]),
                ("UTC", 0, &["20/day", "3/min"]),
            ],
            "2027-03-27T23:00:00Z",
        ),
    ]
}

/// Calendar boundaries checked exactly: zone, offset in hours, limit, the
/// boundary (UTC) and the length in hours of the period it starts.
pub(crate) const BOUNDARIES: &[(&str, u64, &str, &str, u64)] = &[
    // March 2028 in Berlin: 31 days less the hour of the spring change.
    (
        "Europe/Berlin",
        0,
        "5/month",
        "2028-02-29T23:00:00Z",
        31 * 24 - 1,
    ),
    // February 2028: a leap month.
    (
        "Europe/Berlin",
        0,
        "5/month",
        "2028-01-31T23:00:00Z",
        29 * 24,
    ),
    ("UTC", 0, "5/month", "2027-04-01T00:00:00Z", 30 * 24),
    ("UTC", 0, "5/month", "2027-02-01T00:00:00Z", 28 * 24),
    // Berlin's spring day is 23 hours, its autumn day 25.
    ("Europe/Berlin", 0, "5/day", "2027-03-27T23:00:00Z", 23),
    ("Europe/Berlin", 0, "5/day", "2027-10-30T22:00:00Z", 25),
    // Every day at 08:00 UTC.
    ("UTC", 8, "5/day", "2027-05-10T08:00:00Z", 24),
    // Santiago's 2027-09-05 00:00 does not exist: that day starts at
    // 01:00 (-03), and lasts 23 hours.
    ("America/Santiago", 0, "5/day", "2027-09-05T04:00:00Z", 23),
    // A week from Monday 2027-03-29 00:00 CEST.
    ("Europe/Berlin", 0, "5/week", "2027-03-28T22:00:00Z", 7 * 24),
];
