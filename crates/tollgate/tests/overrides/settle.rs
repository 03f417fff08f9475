//! A limiter's settlement after the key's override changed: a refund gives
//! no limit units it never counted.

use std::time::Duration;

use tollgate::{Key, RateLimiter};

use super::App;

/// Requests of cost 1 the limiter admits of `key` now, in a row.
async fn drain(limiter: &RateLimiter<tollgate::MemoryStore>, key: &Key) -> u64 {
    let mut admitted = 0;
    while limiter.check(key).await.unwrap().is_allowed() {
        admitted += 1;
        assert!(admitted <= 100);
    }
    admitted
}

#[tokio::test]
async fn a_refund_after_an_override_added_a_limit_gives_that_limit_nothing() {
    let app = App::new();
    let limiter = RateLimiter::with_store(app.policy.clone(), app.store.clone())
        .overrides(app.overrides.clone());
    let key = Key::header("acme");
    // 5 reserved under the plan's 10 a minute.
    let reservation = limiter.check_n(&key, 5).await.unwrap();
    assert!(reservation.is_allowed());
    // An override adds 12 a day, which counts from now; over the next two
    // minutes the key spends it.
    app.set("acme", "10/min 12/day", None).await;
    app.clock.advance(Duration::from_secs(60));
    assert_eq!(drain(&limiter, &key).await, 10);
    app.clock.advance(Duration::from_secs(60));
    assert_eq!(drain(&limiter, &key).await, 2);
    // The work reserved under the plan used nothing. Its 5 were never in
    // the day's 12: refunded there, they would be 5 more that day.
    let settled = limiter.settle(&key, &reservation, 5, 0).await.unwrap();
    assert_eq!(settled, reservation);
    app.clock.advance(Duration::from_secs(60));
    assert_eq!(drain(&limiter, &key).await, 0, "the day's limit holds");
}
