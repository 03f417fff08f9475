//! `GET /api/reports` of the bundled policy file: 100 reports per user
//! per calendar month in Europe/Berlin. Its `x-ratelimit-reset` is the
//! 1st of next month at 00:00 Berlin time, whether Berlin is on CET
//! (UTC+1) or CEST (UTC+2) then; a refused caller's `Retry-After` counts
//! to it. On the memory store and a fake clock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum_app::{AppConfig, app};
use http::Request;
use tollgate::{BoxStore, FakeClock, MemoryStore, Timestamp};
use tower::ServiceExt;

fn demo(clock: &FakeClock, config: &AppConfig) -> Router {
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    app(config, BoxStore::new(store))
        .layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 7], 5555))))
}

/// Status, then `x-ratelimit-{limit,remaining,reset,resource}` and
/// `retry-after` of `GET /api/reports` as `user`.
async fn reports(app: &Router, user: &str) -> (u16, [Option<String>; 5]) {
    let request = Request::get("/api/reports")
        .header("authorization", format!("Bearer demo-{user}"))
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(request).await.unwrap();
    let header = |name: &str| {
        res.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let headers = [
        header("x-ratelimit-limit"),
        header("x-ratelimit-remaining"),
        header("x-ratelimit-reset"),
        header("x-ratelimit-resource"),
        header("retry-after"),
    ];
    (res.status().as_u16(), headers)
}

fn some(values: [&str; 4]) -> [Option<String>; 5] {
    let [a, b, c, d] = values.map(|v| Some(v.to_owned()));
    [a, b, c, d, None]
}

#[tokio::test]
async fn the_monthly_quota_resets_on_the_first_of_next_month_in_berlin() {
    let config = AppConfig::parse(include_str!("../policies.toml")).unwrap();
    let clock = FakeClock::new(Timestamp::from_secs(0));
    let app = demo(&clock, &config);

    // 2027-10-15 10:00 UTC: November starts at 2027-11-01 00:00 CET,
    // 2027-10-31 23:00:00 UTC (1825023600), after the autumn change.
    clock.set(Timestamp::from_secs(1_823_594_400));
    assert_eq!(
        reports(&app, "ada").await,
        (200, some(["100", "99", "1825023600", "reports"]))
    );
    // 2027-03-15 10:00 UTC: April starts at 2027-04-01 00:00 CEST,
    // 2027-03-31 22:00:00 UTC (1806530400), after the spring change.
    clock.set(Timestamp::from_secs(1_805_104_800));
    assert_eq!(
        reports(&app, "grace").await,
        (200, some(["100", "99", "1806530400", "reports"]))
    );

    // A second before November in Berlin, October's last report; at
    // midnight, November's first, with the whole month's quota.
    clock.set(Timestamp::from_secs(1_825_023_599));
    assert_eq!(
        reports(&app, "ada").await,
        (200, some(["100", "98", "1825023600", "reports"]))
    );
    clock.advance(Duration::from_secs(1));
    // December starts at 2027-11-30 23:00:00 UTC (1827615600).
    assert_eq!(
        reports(&app, "ada").await,
        (200, some(["100", "99", "1827615600", "reports"]))
    );
}

/// A user who spent the month is refused until the 1st: `Retry-After`
/// counts to it. (A smaller quota, so that the per-IP limit of `/api/*`
/// does not refuse first.)
#[tokio::test]
async fn a_spent_month_is_refused_until_the_first() {
    let file = include_str!("../policies.toml").replace("\"100/month\"", "\"3/month\"");
    let config = AppConfig::parse(&file).unwrap();
    // 2027-10-31 22:00 UTC: an hour before November in Berlin.
    let clock = FakeClock::new(Timestamp::from_secs(1_825_020_000));
    let app = demo(&clock, &config);
    for remaining in ["2", "1", "0"] {
        let (status, headers) = reports(&app, "ada").await;
        assert_eq!(status, 200);
        assert_eq!(headers[1].as_deref(), Some(remaining));
    }
    let (status, headers) = reports(&app, "ada").await;
    assert_eq!(status, 429);
    assert_eq!(headers[2].as_deref(), Some("1825023600"));
    assert_eq!(headers[4].as_deref(), Some("3600"));
}

#[test]
fn a_bad_calendar_is_refused_naming_the_field() {
    let file = include_str!("../policies.toml");
    let zone = file.replace("zone = \"Europe/Berlin\"", "zone = \"Europe/Atlantis\"");
    let err = AppConfig::parse(&zone).unwrap_err().to_string();
    assert!(
        err.contains("field `calendar.zone`: invalid value \"Europe/Atlantis\": unknown time zone"),
        "{err}"
    );
    let offset = file.replace(
        "calendar = { zone = \"Europe/Berlin\" }",
        "calendar = { zone = \"Europe/Berlin\", offset = \"30d\" }",
    );
    let err = AppConfig::parse(&offset).unwrap_err().to_string();
    assert!(err.contains("field `calendar.offset`"), "{err}");
    assert!(err.contains("must be shorter than 2419200s"), "{err}");
    let algorithm = file.replace(
        "algorithm = \"fixed_window\"\nlimits = [\"100/month\"]",
        "algorithm = \"gcra\"\nlimits = [\"100/month\"]",
    );
    let err = AppConfig::parse(&algorithm).unwrap_err().to_string();
    assert!(
        err.contains("calendar periods need the fixed_window algorithm"),
        "{err}"
    );
}
