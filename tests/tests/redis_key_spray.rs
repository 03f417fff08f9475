//! A million distinct keys: every one expires, and Redis's memory returns
//! to its baseline. Real time, bounded.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::{Algorithm, Key, Policy, Store};
use tollgate_redis::RedisStore;
use tollgate_tests::RedisServer;

fn used_memory(con: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("memory").query(con).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_keys_all_expire_and_memory_returns_to_baseline() {
    // A faster expiry cycle, so the test does not wait on Redis's default pace.
    let server = RedisServer::spawn_with(&["--hz", "100"]);
    let store = RedisStore::builder()
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect(server.url())
        .await
        .unwrap();
    let mut con = server.connection();
    let baseline = used_memory(&mut con);
    // Each key's state matters for at most a second.
    let policy = Arc::new(Policy::new("spray", Algorithm::FixedWindow, "10/s").unwrap());
    const TASKS: u64 = 64;
    const KEYS: u64 = 1_000_000;
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move {
                for i in (t..KEYS).step_by(TASKS as usize) {
                    let d = store
                        .check(&Key::custom(i.to_be_bytes()), &policy, 1)
                        .await
                        .unwrap();
                    assert!(d.is_allowed());
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let sprayed = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let keys: u64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
        if keys == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{keys} keys left 30 s after the spray"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The main dictionary shrinks back a moment after it empties.
    let settle = Instant::now() + Duration::from_secs(10);
    let mut now = used_memory(&mut con);
    while now > baseline + 512 * 1024 && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(100));
        now = used_memory(&mut con);
    }
    assert!(
        now <= baseline + 512 * 1024,
        "used_memory {now} bytes, baseline {baseline} (spray took {sprayed:?})"
    );
}
