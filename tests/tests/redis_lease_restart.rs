//! Leases when Redis restarts or a subscription is lost: the instances
//! subscribe again and take leases again, an operator's reset or block
//! after the restart still reaches every instance, at once (each instance
//! publishes on a connection it keeps, which the restart left dead), and
//! no grant asked for while an instance could not hear invalidations
//! outlives a reset.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use tollgate::{Algorithm, FakeClock, Key, Policy, Store, Timestamp};
use tollgate_redis::{LeasedStore, RedisStore};
use tollgate_tests::{RedisServer, unique_prefix};

const START: Timestamp = Timestamp::from_secs(1_700_000_000);

/// Longer than any test here waits: a reset that waited for it was not
/// acknowledged.
const ACK_TIMEOUT: Duration = Duration::from_secs(20);

async fn instance(url: &str, prefix: &str, clock: &FakeClock) -> LeasedStore<RedisStore> {
    instance_with(url, prefix, clock, Duration::from_millis(8), 4).await
}

async fn instance_with(
    url: &str,
    prefix: &str,
    clock: &FakeClock,
    interval: Duration,
    share: u64,
) -> LeasedStore<RedisStore> {
    let redis = RedisStore::builder()
        .prefix(prefix)
        .test_clock(clock.clone())
        .deny_cache(0)
        .deadline(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("Redis at {url}: {e}"));
    LeasedStore::builder()
        .interval(interval)
        .share(share)
        .ack_timeout(ACK_TIMEOUT)
        .channel(format!("{prefix}:leases"))
        .test_clock(clock.clone())
        .connect(redis, url)
        .await
        .unwrap_or_else(|e| panic!("subscribing at {url}: {e}"))
}

async fn wait_listening(store: &LeasedStore<RedisStore>, want: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.is_listening() != want {
        assert!(Instant::now() < deadline, "listening never became {want}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Restarts `server` and waits until every instance has subscribed again
/// and its store answers.
async fn restart(server: &mut RedisServer, instances: &[&LeasedStore<RedisStore>]) {
    let (key, policy) = (
        Key::user("probe"),
        Policy::new("probe", Algorithm::Gcra, "9/s").unwrap(),
    );
    server.restart();
    for s in instances {
        wait_listening(s, false).await;
    }
    for s in instances {
        wait_listening(s, true).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.get_ref().check(&key, &policy, 1).await.is_err() {
            assert!(Instant::now() < deadline, "the store never answered again");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// 10 requests a (fake) millisecond for 10 ms: the key's rate is known
/// and a lease is taken.
async fn warm(store: &LeasedStore<RedisStore>, clock: &FakeClock, key: &Key, policy: &Policy) {
    for _ in 0..10 {
        for _ in 0..10 {
            store.check(key, policy, 1).await.unwrap();
        }
        clock.advance(Duration::from_millis(1));
    }
    store.wait_for_grants().await;
}

/// A block after the restart returns `Ok`, and the other instance, which
/// took a lease after the restart, admits nothing more from it once the
/// block has returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_after_redis_restarted_reaches_every_instance() {
    let mut server = RedisServer::spawn();
    let (url, clock) = (server.url(), FakeClock::new(START));
    let prefix = unique_prefix("lease-restart-block");
    let a = instance(&url, &prefix, &clock).await;
    let b = instance(&url, &prefix, &clock).await;
    let policy = Policy::new("restart", Algorithm::Gcra, "6000/s").unwrap();
    let (key, other) = (Key::user("ada"), Key::user("bob"));
    // Both instances publish once (a reset, and the acknowledgements).
    a.reset(&other, &policy).await.unwrap();
    b.reset(&other, &policy).await.unwrap();

    restart(&mut server, &[&a, &b]).await;
    warm(&b, &clock, &key, &policy).await;
    assert!(b.outstanding().1 > 0, "b holds a lease after the restart");

    a.block(&key, &policy, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(b.outstanding(), (0, 0), "b dropped its lease");
    assert!(!b.check(&key, &policy, 1).await.unwrap().is_allowed());
}

/// The first reset after the restart returns `Ok`, acknowledged by every
/// instance, not after the acknowledgements' timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_reset_after_redis_restarted_is_acknowledged() {
    let mut server = RedisServer::spawn();
    let (url, clock) = (server.url(), FakeClock::new(START));
    let prefix = unique_prefix("lease-restart-reset");
    let a = instance(&url, &prefix, &clock).await;
    let b = instance(&url, &prefix, &clock).await;
    let policy = Policy::new("restart", Algorithm::Gcra, "6000/s").unwrap();
    let key = Key::user("ada");
    a.reset(&key, &policy).await.unwrap();

    restart(&mut server, &[&a, &b]).await;
    let started = Instant::now();
    a.reset(&key, &policy).await.unwrap();
    let took = started.elapsed();
    assert!(
        took < ACK_TIMEOUT / 2,
        "the reset waited {took:?} for acknowledgements"
    );
}

/// A store whose answers to checks come `delay` late (once `delay` is
/// set): the check itself reaches Redis at once, unless `held` holds it
/// back first (counted in `waiting` while it does).
struct LateAnswers {
    inner: RedisStore,
    delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    held: std::sync::Arc<std::sync::atomic::AtomicBool>,
    waiting: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Store for LateAnswers {
    async fn check(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> Result<tollgate::Decision, tollgate::StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.held.load(SeqCst) {
            self.waiting.fetch_add(1, SeqCst);
            while self.held.load(SeqCst) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let answer = self.inner.check(key, policy, cost).await;
        let delay = self.delay_ms.load(std::sync::atomic::Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        answer
    }
    async fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: tollgate::Settlement,
    ) -> Result<tollgate::Decision, tollgate::StoreError> {
        self.inner.settle(key, policy, settlement).await
    }
    async fn reset(&self, key: &Key, policy: &Policy) -> Result<(), tollgate::StoreError> {
        self.inner.reset(key, policy).await
    }
    async fn block(
        &self,
        key: &Key,
        policy: &Policy,
        duration: Duration,
    ) -> Result<(), tollgate::StoreError> {
        self.inner.block(key, policy, duration).await
    }
}

/// The fence: "once `reset` returns, no instance admits from a lease
/// granted before it"; "an instance that is not subscribed drops its
/// leases and takes no new one until it is subscribed again".
///
/// A grant that instance B asked for ahead while subscribed reaches Redis
/// only after B lost its subscription (its answer is slow). A reset
/// through A lands after Redis granted it; A's invalidation reaches no
/// one but A (B is not subscribed), so the reset returns at once. B
/// subscribes again before the grant's answer comes back: the lease,
/// granted before the reset, must not be kept (subscribing starts a new
/// generation of invalidations) nor spent.
#[test]
fn a_grant_asked_for_while_unsubscribed_is_not_kept_across_a_reset() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let server = RedisServer::spawn();
    let url = server.url();
    let port = server.port();
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "busr", "on", ">pw", "~*", "&*", "+@all"][..])
        .query(&mut admin)
        .unwrap();
    let b_channel_url = format!("redis://busr:pw@127.0.0.1:{port}");

    let r1 = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let r2 = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clock = FakeClock::new(START);
    let prefix = unique_prefix("lease-unsubscribed-grant");
    let interval = Duration::from_millis(8);
    let delay_ms = Arc::new(AtomicU64::new(0));
    let held = Arc::new(AtomicBool::new(false));
    let waiting = Arc::new(AtomicU64::new(0));
    let (a, b) = r1.block_on(async {
        let a = instance_with(&url, &prefix, &clock, interval, 64).await;
        let redis_b = RedisStore::builder()
            .prefix(&prefix)
            .test_clock(clock.clone())
            .deny_cache(0)
            .deadline(Duration::from_secs(10))
            .response_timeout(Duration::from_secs(10))
            .connect(url.as_str())
            .await
            .unwrap();
        let b = LeasedStore::builder()
            .interval(interval)
            .share(64)
            .channel(format!("{prefix}:leases"))
            .test_clock(clock.clone())
            .connect(
                LateAnswers {
                    inner: redis_b,
                    delay_ms: Arc::clone(&delay_ms),
                    held: Arc::clone(&held),
                    waiting: Arc::clone(&waiting),
                },
                &b_channel_url,
            )
            .await
            .unwrap();
        assert!(b.is_listening());
        (a, b)
    });
    let policy = Policy::new("unsub", Algorithm::Gcra, "6000/s").unwrap();
    let key = Key::user("ada");

    // B's requests run on r2; the grants they ask for ahead run on r1,
    // B's own runtime.
    r2.block_on(async {
        for _ in 0..10 {
            for _ in 0..10 {
                b.check(&key, &policy, 1).await.unwrap();
            }
            clock.advance(Duration::from_millis(1));
        }
        b.wait_for_grants().await;
    });
    assert!(b.outstanding().1 > 0, "B holds a lease");
    // Spend from the lease, one request a block_on, until a grant is
    // asked for ahead: it is held back before it reaches Redis.
    held.store(true, Ordering::SeqCst);
    let mut spawned = false;
    for _ in 0..1000 {
        let d = r2.block_on(b.check(&key, &policy, 1)).unwrap();
        assert!(d.is_allowed());
        // The grant's task, on r1, reaches the hold at once: a request
        // past it would wait for the lease it brings.
        std::thread::sleep(Duration::from_millis(2));
        if waiting.load(Ordering::SeqCst) > 0 {
            spawned = true;
            break;
        }
    }
    assert!(spawned, "no grant was asked for ahead");

    // B loses its subscription, and cannot make it again for now.
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "busr", "off"][..])
        .query(&mut admin)
        .unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "USER", "busr"][..])
        .query(&mut admin)
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while b.is_listening() {
        assert!(std::time::Instant::now() < deadline, "loss unnoticed");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(b.outstanding(), (0, 0), "B dropped its leases");

    delay_ms.store(1500, Ordering::SeqCst);
    let grants_before = b.calls().grants;
    held.store(false, Ordering::SeqCst);
    r2.block_on(async {
        // The grant asked for ahead runs now: B, which cannot hear
        // invalidations, asks for nothing, or Redis decides it, and its
        // answer comes back 1.5 s later.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let sent = b.calls().grants - grants_before;
        assert!(sent <= 1, "{sent} grants");
        // The reset lands after the grant, and returns: B is not
        // subscribed, so only A is waited for.
        a.reset(&key, &policy).await.unwrap();
        let _: () = redis::cmd("ACL")
            .arg(&["SETUSER", "busr", "on"][..])
            .query(&mut admin)
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !b.is_listening() {
            assert!(
                std::time::Instant::now() < deadline,
                "B never subscribed again"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The grant's answer comes back.
        b.wait_for_grants().await;
    });
    let held = b.outstanding();
    let direct_before = b.calls().direct;
    let grants_now = b.calls().grants;
    let admitted = r2.block_on(b.check(&key, &policy, 1)).unwrap();
    let from_lease = b.calls().direct == direct_before && b.calls().grants == grants_now;
    // What Redis's fresh state counts: not B's lease.
    let fresh = r1.block_on(a.get_ref().status(&key, &policy)).unwrap();
    eprintln!(
        "Redis after the reset: remaining {} of 6000",
        fresh.remaining()
    );
    assert!(
        held == (0, 0) && !(admitted.is_allowed() && from_lease),
        "after the reset returned, B holds {held:?} from a grant Redis made before it, and admits from it: {}",
        admitted.is_allowed() && from_lease
    );
    drop(r2);
    drop(r1);
}
