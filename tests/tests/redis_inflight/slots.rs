//! The slot operations (acquire, renew, release): the same answers on
//! memory and Redis, scripted and random, and renewals of slots Redis lost.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tollgate::{InFlightLimit, Key, MemoryStore, Renewal, SlotStore, Slots};
use tollgate_redis::RedisStore;
use tollgate_tests::{require_redis, unique_prefix};

use super::{GIVEN_BACK, slot_sets};

/// What a slot operation answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Acquired(Slots),
    Renewed(Renewal),
    Released,
}

/// A slot operation: 0 acquires, 1 renews, anything else releases.
async fn slot_op(
    store: &impl SlotStore,
    key: &Key,
    limit: &InFlightLimit,
    op: u8,
    holder: u64,
) -> Answer {
    match op {
        0 => Answer::Acquired(store.acquire(key, limit, holder).await.unwrap()),
        1 => Answer::Renewed(store.renew(key, limit, holder).await.unwrap()),
        _ => {
            store.release(key, limit, holder).await.unwrap();
            Answer::Released
        }
    }
}

/// Acquire, renew and release give the same answers on memory and Redis,
/// a renewal of a slot that is gone included: taken back within the limit
/// while there is room, past it while there is none.
#[tokio::test]
async fn memory_and_redis_hold_slots_alike() {
    let url = require_redis().await;
    let redis = RedisStore::builder()
        // A busy machine (CI beside two busy loops) may take longer than
        // the default 100 ms to connect: slowness, not what is tested.
        .connect_timeout(Duration::from_secs(5))
        .prefix(unique_prefix("inflight-same"))
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect(url.as_str())
        .await
        .unwrap();
    let memory = MemoryStore::new();
    let limit = InFlightLimit::new("same", 3).unwrap();
    let key = Key::user("ada");
    // Take 4 (3 fit), renew a holder and one that holds nothing (taken
    // back past the limit), release one (still 3 held: a new one is
    // refused), release another, renew one without a slot (taken back
    // within the limit), take again.
    let script = [
        (0, 1),
        (0, 2),
        (0, 3),
        (0, 4),
        (1, 2),
        (1, 4),
        (2, 2),
        (0, 5),
        (2, 1),
        (1, 6),
        (0, 7),
        (2, 9),
    ];
    let (mut on_memory, mut on_redis) = (Vec::new(), Vec::new());
    for (op, holder) in script {
        on_memory.push(slot_op(&memory, &key, &limit, op, holder).await);
        on_redis.push(slot_op(&redis, &key, &limit, op, holder).await);
    }
    assert_eq!(on_memory, on_redis);
    let slots = |acquired, held| Answer::Acquired(Slots { acquired, held });
    assert_eq!(
        on_redis,
        [
            slots(true, 1),
            slots(true, 2),
            slots(true, 3),
            slots(false, 3),
            Answer::Renewed(Renewal::Renewed),
            Answer::Renewed(Renewal::RetakenPastLimit),
            Answer::Released,
            slots(false, 3),
            Answer::Released,
            Answer::Renewed(Renewal::Retaken),
            slots(false, 3),
            Answer::Released,
        ]
    );
}

/// Random sequences of acquire, renew and release on random limits: the
/// memory store and Redis give the same answers, case by case, renewals
/// that take a slot back or find it lost included.
#[test]
fn slot_operations_agree_on_memory_and_redis_for_random_sequences() {
    use proptest::prelude::*;
    use std::sync::atomic::AtomicU64;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let redis = runtime.block_on(async {
        let url = require_redis().await;
        RedisStore::builder()
            // A busy machine (CI beside two busy loops) may take longer than
            // the default 100 ms to connect: slowness, not what is tested.
            .connect_timeout(Duration::from_secs(5))
            .prefix(unique_prefix("inflight-prop"))
            .deadline(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(5))
            .connect(url.as_str())
            .await
            .unwrap()
    });
    static CASE: AtomicU64 = AtomicU64::new(0);
    let ops = prop::collection::vec((0u8..3, 0u64..6), 1..40);
    let config = ProptestConfig {
        cases: 300,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let renewals = std::sync::Mutex::new(std::collections::HashSet::new());
    proptest!(config, |(max in 1u64..5, ops in ops)| {
        // A holder given back is not acquired again (SlotStore::release).
        let mut released = std::collections::HashSet::new();
        let ops: Vec<(u8, u64)> = ops
            .into_iter()
            .filter(|&(op, holder)| {
                if op == 2 {
                    released.insert(holder);
                }
                op != 0 || !released.contains(&holder)
            })
            .collect();
        let limit = InFlightLimit::new("prop", max).unwrap();
        let key = Key::user(format!("case-{}", CASE.fetch_add(1, Ordering::Relaxed)));
        let memory = MemoryStore::new();
        let (on_memory, on_redis) = runtime.block_on(async {
            let mut answers = (Vec::new(), Vec::new());
            for &(op, holder) in &ops {
                answers.0.push(slot_op(&memory, &key, &limit, op, holder).await);
                answers.1.push(slot_op(&redis, &key, &limit, op, holder).await);
            }
            answers
        });
        for answer in &on_redis {
            if let Answer::Renewed(renewal) = answer {
                renewals.lock().unwrap().insert(*renewal);
            }
        }
        prop_assert_eq!(on_memory, on_redis, "{:?}", ops);
    });
    // The cases met every answer of a renewal.
    let renewals = renewals.into_inner().unwrap();
    assert_eq!(
        renewals.len(),
        3,
        "renewed, retaken and retaken past the limit all met: {renewals:?}"
    );
}

/// A give-back that reaches Redis before its own acquire (a request
/// dropped while its slot was being taken, the two calls on two
/// connections of a pool) leaves no slot held: the acquire that arrives
/// after it takes nothing, for a lease. Before, it took the slot, held by
/// no one and renewed by no one, and a limit of 1 refused every request
/// for the whole lease. A give-back of a slot held remembers nothing.
#[tokio::test]
async fn an_acquire_that_arrives_after_its_give_back_takes_nothing() {
    // The two calls in the order a pool may deliver them.
    let (prefix, store, mut con) = store_and_connection("inflight-overtaken").await;
    let limit = a_minute_lease("overtaken", 1);
    let key = Key::user("ada");
    let given_back = |con: &mut redis::Connection| -> Vec<String> {
        redis::cmd("KEYS")
            .arg(format!("{prefix}:inflight/overtaken:*{GIVEN_BACK}"))
            .query(con)
            .unwrap()
    };
    // A slot taken and given back in order: nothing is remembered.
    assert!(store.acquire(&key, &limit, 1).await.unwrap().acquired);
    store.release(&key, &limit, 1).await.unwrap();
    assert!(given_back(&mut con).is_empty());
    // Holder 2's give-back arrives first, then its acquire.
    store.release(&key, &limit, 2).await.unwrap();
    assert_eq!(
        store.acquire(&key, &limit, 2).await.unwrap(),
        Slots {
            acquired: false,
            held: 0
        }
    );
    assert!(slot_sets(&mut con, &prefix, "overtaken").is_empty());
    // The one slot is free for the next request.
    assert_eq!(
        store.acquire(&key, &limit, 3).await.unwrap(),
        Slots {
            acquired: true,
            held: 1
        }
    );
    // Holder 2 is remembered for one lease, in a set that expires with it.
    let [set] = <[String; 1]>::try_from(given_back(&mut con)).unwrap();
    assert_eq!(members(&mut con, &set), ["2"]);
    let ttl: i64 = redis::cmd("PTTL").arg(&set).query(&mut con).unwrap();
    assert!((50_000..=60_000).contains(&ttl), "{ttl}");
}

/// The members of the sorted set `set`.
fn members(con: &mut redis::Connection, set: &str) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(set)
        .arg(0)
        .arg(-1)
        .query(con)
        .unwrap()
}

/// The in-flight limit `name` of `max` slots, each a lease of a minute.
fn a_minute_lease(name: &str, max: u64) -> InFlightLimit {
    InFlightLimit::new(name, max)
        .unwrap()
        .lease(Duration::from_secs(60))
        .unwrap()
}

/// A Redis store on a fresh prefix starting with `name`, the prefix, and
/// a plain connection to read its keys.
async fn store_and_connection(name: &str) -> (String, RedisStore, redis::Connection) {
    let url = require_redis().await;
    let prefix = unique_prefix(name);
    let store = RedisStore::builder()
        // A busy machine (CI beside two busy loops) may take longer than
        // the default 100 ms to connect: slowness, not what is tested.
        .connect_timeout(Duration::from_secs(5))
        .prefix(prefix.as_str())
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect(url.as_str())
        .await
        .unwrap();
    let con = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    (prefix, store, con)
}

/// The renewal script: after the slot set is deleted, a renewal re-adds
/// its holder with a fresh lease; once the set is full of other holders, a
/// renewal of a holder whose slot is gone re-adds it past the limit, so
/// that a new request waits until fewer than the limit are held. (It added
/// nothing, and new requests took each slot freed between its renewals.)
#[tokio::test]
async fn a_renewal_after_the_slots_are_deleted_re_adds_the_holder() {
    let (prefix, store, mut con) = store_and_connection("inflight-renew").await;
    let limit = a_minute_lease("renew", 2);
    let key = Key::user("ada");
    assert!(store.acquire(&key, &limit, 11).await.unwrap().acquired);
    let [set] = <[String; 1]>::try_from(slot_sets(&mut con, &prefix, "renew")).unwrap();
    let _: () = redis::cmd("DEL").arg(&set).query(&mut con).unwrap();
    assert_eq!(
        store.renew(&key, &limit, 11).await.unwrap(),
        Renewal::Retaken
    );
    assert_eq!(members(&mut con, &set), ["11"]);
    // With a fresh lease, and the set expiring with it.
    let ttl: i64 = redis::cmd("PTTL").arg(&set).query(&mut con).unwrap();
    assert!((59_000..=60_000).contains(&ttl), "{ttl}");
    assert_eq!(
        store.renew(&key, &limit, 11).await.unwrap(),
        Renewal::Renewed
    );
    // Deleted again, and two other requests take both slots first.
    let _: () = redis::cmd("DEL").arg(&set).query(&mut con).unwrap();
    assert!(store.acquire(&key, &limit, 12).await.unwrap().acquired);
    assert!(store.acquire(&key, &limit, 13).await.unwrap().acquired);
    assert_eq!(
        store.renew(&key, &limit, 11).await.unwrap(),
        Renewal::RetakenPastLimit
    );
    let held: u64 = redis::cmd("ZCARD").arg(&set).query(&mut con).unwrap();
    assert_eq!(held, 3);
    // One of the others ends: 11 still runs, so a new request waits.
    store.release(&key, &limit, 12).await.unwrap();
    assert!(!store.acquire(&key, &limit, 14).await.unwrap().acquired);
    store.release(&key, &limit, 13).await.unwrap();
    assert!(store.acquire(&key, &limit, 14).await.unwrap().acquired);
}

/// Holders of one limit's name with leases of different lengths (a
/// deploy that changed the lease): the set lives as long as the longest.
/// A shorter lease set the set's expiry to its own, and Redis dropped the
/// longer holders' slots with it.
#[tokio::test]
async fn the_slots_live_as_long_as_the_longest_lease() {
    let (prefix, store, mut con) = store_and_connection("inflight-leases").await;
    let long = a_minute_lease("leases", 5);
    let short = long.clone().lease(Duration::from_secs(1)).unwrap();
    let key = Key::user("ada");
    assert!(store.acquire(&key, &long, 1).await.unwrap().acquired);
    let [set] = <[String; 1]>::try_from(slot_sets(&mut con, &prefix, "leases")).unwrap();
    let ttl =
        |con: &mut redis::Connection| -> i64 { redis::cmd("PTTL").arg(&set).query(con).unwrap() };
    for holder in [2, 3] {
        assert!(store.acquire(&key, &short, holder).await.unwrap().acquired);
        assert!(
            (59_000..=60_000).contains(&ttl(&mut con)),
            "{}",
            ttl(&mut con)
        );
        assert_eq!(
            store.renew(&key, &short, holder).await.unwrap(),
            Renewal::Renewed
        );
        assert!(
            (59_000..=60_000).contains(&ttl(&mut con)),
            "{}",
            ttl(&mut con)
        );
    }
    // Once the long lease is given back, the set lives as long as the
    // short ones.
    store.release(&key, &long, 1).await.unwrap();
    assert_eq!(
        store.renew(&key, &short, 2).await.unwrap(),
        Renewal::Renewed
    );
    assert!((0..=1_000).contains(&ttl(&mut con)), "{}", ttl(&mut con));
}
