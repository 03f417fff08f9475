//! Heap allocations of one decision in the Redis store, counted exactly
//! by a counting global allocator on this thread (the test's runtime has
//! one thread, so the connection's own task is counted too).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use tollgate_core::{Algorithm, Key, Policy, Store};
use tollgate_redis::RedisStore;
use tollgate_tests::{require_redis, unique_prefix};

/// A decision sent alone (nothing else on its way, so no batching), on an
/// idle key: 8 allocations, of which tollgate makes 4 and redis-rs 4.
/// - tollgate: the key's name; the command's argument list and its buffer,
///   each made once at its full size (grown argument by argument they
///   were reallocated 5 times more); the list of replies.
/// - redis-rs: the packed command, `ConnectionManager`'s boxed future,
///   the oneshot channel of the reply, and one in its reply parser.
///
/// The bound allows a reply split across two reads, which costs the
/// parser more.
#[test]
fn a_decision_sent_alone_allocates_eight_times() {
    const DECISIONS: usize = 1_000;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = runtime.block_on(require_redis());
    let store = runtime
        .block_on(
            RedisStore::builder()
                .prefix(unique_prefix("allocations"))
                .deadline(Duration::from_secs(2))
                .connect(url.as_str()),
        )
        .unwrap();
    let policy = Policy::new("alloc", Algorithm::Gcra, "100000/s").unwrap();
    let keys: Vec<Key> = (0..DECISIONS + 10)
        .map(|i| Key::user(format!("k{i}")))
        .collect();
    let (warm, counted) = keys.split_at(10);
    runtime.block_on(async {
        for key in warm {
            assert!(store.check(key, &policy, 1).await.unwrap().is_allowed());
        }
    });
    let mut admitted = 0;
    let allocations = allocation_counter::measure(|| {
        runtime.block_on(async {
            for key in counted {
                admitted += usize::from(store.check(key, &policy, 1).await.unwrap().is_allowed());
            }
        });
    })
    .count_total;
    assert_eq!(admitted, DECISIONS);
    println!("{allocations} allocations for {DECISIONS} decisions");
    assert!(
        (8 * DECISIONS as u64..8 * DECISIONS as u64 + DECISIONS as u64 / 10).contains(&allocations),
        "{allocations} allocations for {DECISIONS} decisions"
    );
}
