//! A policy that shapes (a leaky bucket delays what it admits) costs the
//! replay no wall time: it runs on [`log_replay::runtime`], whose clock
//! jumps over the delays. (Bounded: the delays here add up to 10 s.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use log_replay::Replay;
use tollgate_sim::access::{AccessFormat, AccessLog};

const LEAKY: &str = r#"
[[route]]
method = "GET"
path = "/api/items"
name = "items-read"
key = "ip"
algorithm = "leaky_bucket"
limits = ["1/s"]
burst = 10
"#;

#[test]
fn a_leaky_buckets_delays_take_no_wall_time() {
    let config = axum_app::AppConfig::parse(LEAKY).unwrap();
    let mut replay = Replay::new(vec![("leaky".to_owned(), config)]).unwrap();
    let line =
        "198.51.100.7 - ada [20/Nov/2026:10:00:00 +0000] \"GET /api/items HTTP/1.1\" 200 12\n";
    // Delayed 0, 1, 2, 3 and 4 s: admitted, all of them.
    let text = line.repeat(5);
    let started = Instant::now();
    log_replay::runtime().unwrap().block_on(async {
        for record in AccessLog::new(text.as_bytes(), AccessFormat::Common) {
            replay.send(&record.unwrap()).await;
        }
    });
    let took = started.elapsed();
    assert_eq!(replay.replayed(), 5);
    let lane = replay.lanes().next().unwrap();
    assert_eq!(lane.refused(), 0);
    assert!(took < Duration::from_secs(5), "the replay slept {took:?}");
}
