//! Keys under the store's prefix that a foreign writer gave a type of its
//! own (a list where the store keeps a string or a hash): the key's own
//! requests start afresh, as for a key holding nothing of ours, and its
//! state replaces the foreign value; the other requests of its batch are
//! decided as ever; and an error about such a key's data (`WRONGTYPE`)
//! never opens the breaker, since Redis answered in time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;

use tollgate::{Algorithm, Key, Policy, Settlement, Store};
use tollgate_redis::{BreakerState, RedisStore};
use tollgate_tests::{RedisServer, unique_prefix};

/// A list at `key`'s state key under `policy`.
fn foreign_list(server: &RedisServer, name: &str) {
    let mut con = server.connection();
    let _: () = redis::cmd("RPUSH")
        .arg(name)
        .arg("x")
        .query(&mut con)
        .unwrap();
}

fn key_type(server: &RedisServer, name: &str) -> String {
    redis::cmd("TYPE")
        .arg(name)
        .query(&mut server.connection())
        .unwrap()
}

/// Under a word script (GCRA, a fixed window: batched with other keys)
/// and the general script (two limits): 400 requests at once, four of
/// them of the foreign key. Before, the word scripts raised on the
/// foreign key, failing every request of its batch (252 of 396 healthy
/// ones in one run), and the general script failed the key's requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_starts_afresh_and_its_batch_is_decided() {
    let server = RedisServer::spawn();
    let store = RedisStore::builder()
        .prefix(unique_prefix("foreign"))
        .connect(server.url())
        .await
        .unwrap();
    let policies = [
        (
            Policy::new("f-gcra", Algorithm::Gcra, "100/h").unwrap(),
            "string",
        ),
        (
            Policy::new("f-window", Algorithm::FixedWindow, "100/h").unwrap(),
            "string",
        ),
        (
            Policy::builder("f-general")
                .limit("100/h")
                .limit("1000/d")
                .build()
                .unwrap(),
            "hash",
        ),
    ];
    let store = Arc::new(store);
    for (policy, kept_as) in policies {
        let foreign = Key::user("foreign");
        let state_key = store.state_key(&policy, &foreign);
        foreign_list(&server, &state_key);
        let tasks: Vec<_> = (0..400)
            .map(|i| {
                let (store, policy) = (store.clone(), policy.clone());
                let key = match i % 100 {
                    50 => Key::user("foreign"),
                    _ => Key::user(format!("healthy-{i}")),
                };
                tokio::spawn(async move { store.check(&key, &policy, 1).await })
            })
            .collect();
        let mut admitted = 0;
        for task in tasks {
            let decision = task
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("{policy}: {e}"));
            assert!(decision.is_allowed(), "{policy}: {decision:?}");
            admitted += 1;
        }
        assert_eq!(admitted, 400, "{policy}");
        // Its four, from a fresh start: 96 left.
        let status = store.status(&foreign, &policy).await.unwrap();
        assert_eq!(status.remaining(), 96, "{policy}");
        assert_eq!(key_type(&server, &state_key), kept_as, "{policy}");
        assert_eq!(store.breaker_state(), BreakerState::Closed, "{policy}");
    }
}

/// A refund reads its key's fence key: a foreign list there fails the
/// refund with `WRONGTYPE`, ten times over, and the breaker stays closed
/// (before, five such errors opened it for every key).
#[tokio::test]
async fn an_error_about_a_foreign_keys_data_never_opens_the_breaker() {
    let server = RedisServer::spawn();
    let store = RedisStore::builder()
        .prefix(unique_prefix("foreign-fence"))
        .connect(server.url())
        .await
        .unwrap();
    let policy = Policy::new("fenced", Algorithm::Gcra, "100/h").unwrap();
    let key = Key::user("fenced");
    foreign_list(
        &server,
        &format!("{}:fence", store.state_key(&policy, &key)),
    );
    let admitted = store.check(&key, &policy, 20).await.unwrap();
    // Ten in a row, twice the breaker's threshold.
    for _ in 0..10 {
        let refund = Settlement::of(&admitted, 20, 19);
        let refund = store.settle(&key, &policy, refund).await;
        let error = refund.expect_err("the fence key is a list").to_string();
        assert!(error.contains("WRONGTYPE"), "{error}");
    }
    assert_eq!(store.breaker_state(), BreakerState::Closed);
    let other = store.check(&Key::user("other"), &policy, 1).await.unwrap();
    assert!(other.is_allowed());
}
