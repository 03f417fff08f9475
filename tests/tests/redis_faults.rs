//! Redis faults, with servers of the tests' own: killed, restarted empty,
//! paused, and a pool too small for the load. Real time, in bounded periods.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::Request;
use tollgate::{
    Algorithm, FailureMode, HeaderKey, InFlightLimit, Key, Policy, RateLimitLayer, SlotStore, Store,
};
use tollgate_redis::{BreakerState, RedisStore, RedisStoreError};
use tollgate_tests::{RedisServer, StallMeter};
use tower::ServiceExt;

const DEADLINE: Duration = Duration::from_millis(50);
const SLACK: Duration = Duration::from_millis(50);
/// The store's hard ceiling on a call: four deadlines (`CEILING` in
/// tollgate-redis's `patience.rs`). A call waits past its deadline only
/// while our own runtime is too busy to tell Redis's lateness from its own
/// (the store's rule: our own load is not a store failure), which a loaded
/// machine makes common and the stall meter does not see; an idle one
/// keeps every request here within `DEADLINE + SLACK`.
const CEILING: Duration = Duration::from_millis(4 * 50);

/// The tests here bound latencies in real time, so they take turns: run
/// side by side, five tests with two runtime workers each would share two
/// cores, and one test's load would become another's stall.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn store(server: &RedisServer) -> RedisStore {
    store_with(server, 10_000).await
}

async fn store_with(server: &RedisServer, deny_cache: usize) -> RedisStore {
    RedisStore::builder()
        .deny_cache(deny_cache)
        .deadline(DEADLINE)
        .response_timeout(DEADLINE)
        .connect_timeout(DEADLINE)
        .circuit_breaker(3, Duration::from_millis(500))
        .connect(server.url())
        .await
        .unwrap()
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    started: Duration,
    latency: Duration,
    status: u16,
    headers: bool,
    limit: Option<u64>,
    breaker_open: bool,
}

/// `tasks` clients send requests for `run`, one at a time each, as 20
/// different users.
async fn hammer(app: Router, store: RedisStore, tasks: usize, run: Duration) -> Vec<Sample> {
    let origin = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (app, store) = (app.clone(), store.clone());
            tokio::spawn(async move {
                let mut samples = Vec::new();
                let mut i = 0;
                while origin.elapsed() < run {
                    i += 1;
                    let req = Request::get("/")
                        .header("x-client", format!("c{}", (t + i) % 20))
                        .body(Body::empty())
                        .unwrap();
                    let breaker_open = store.breaker_state() == BreakerState::Open;
                    let started = origin.elapsed();
                    let res = app.clone().oneshot(req).await.unwrap();
                    samples.push(Sample {
                        started,
                        latency: origin.elapsed() - started,
                        status: res.status().as_u16(),
                        headers: res.headers().contains_key("x-ratelimit-limit"),
                        limit: res
                            .headers()
                            .get("x-ratelimit-limit")
                            .and_then(|v| v.to_str().ok()?.parse().ok()),
                        breaker_open,
                    });
                    // Real requests arrive through I/O; a loop that never
                    // yields would starve the other tasks' timers.
                    tokio::task::yield_now().await;
                }
                samples
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("no task panicked"));
    }
    all
}

fn app(store: RedisStore, mode: FailureMode) -> Router {
    // High enough that no client is exhausted before the kill (the deny
    // cache would then answer it without asking Redis), low enough to be
    // reached in memory afterwards.
    let policy = Policy::new("faults", Algorithm::FixedWindow, "100/min").unwrap();
    let key = HeaderKey::new(http::HeaderName::from_static("x-client"));
    Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(policy, key)
            .store(store)
            .on_store_error(mode)
            // Ten instances: alone, each enforces a tenth.
            .local_divisor(std::num::NonZeroU64::new(10).unwrap()),
    )
}

fn percentile(mut v: Vec<Duration>, p: usize) -> Duration {
    v.sort_unstable();
    v.get((v.len() * p / 100).min(v.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_follows_each_failure_policy_within_the_deadline() {
    let _turn = ONE_AT_A_TIME.lock().await;
    for mode in FailureMode::ALL {
        let mut server = RedisServer::spawn();
        // Without the deny cache: the clients exhaust their limits before
        // the kill, and cached denials would answer them without Redis.
        let store = store_with(&server, 0).await;
        let app = app(store.clone(), mode);
        let killer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            // Reaping the killed process blocks; on a runtime worker it
            // would hold up the requests queued there, which no store
            // can prevent.
            tokio::task::spawn_blocking(move || {
                server.kill();
                server
            })
            .await
            .unwrap()
        });
        let stalls = StallMeter::start();
        let samples = hammer(app, store, 16, Duration::from_millis(1_500)).await;
        let stall = stalls.stop();
        drop(killer.await.unwrap());

        let slowest = samples.iter().map(|s| s.latency).max().unwrap();
        assert!(
            slowest <= CEILING + SLACK + stall,
            "{mode:?}: a request took {slowest:?} (the machine stalled the process for up to {stall:?})"
        );
        let before: Vec<_> = samples
            .iter()
            .filter(|s| s.started < Duration::from_millis(250))
            .collect();
        assert!(
            !before.is_empty() && before.iter().all(|s| s.headers),
            "{mode:?}: Redis decided at first"
        );
        // Once the breaker is open, Redis is not asked and the policy applies.
        let open: Vec<_> = samples.iter().filter(|s| s.breaker_open).collect();
        assert!(
            open.len() > 100,
            "{mode:?}: only {} requests while open",
            open.len()
        );
        match mode {
            FailureMode::Open => assert!(open.iter().all(|s| s.status == 200 && !s.headers)),
            FailureMode::Closed => assert!(open.iter().all(|s| s.status == 503)),
            FailureMode::Local => {
                // Limiting goes on in memory, at this instance's share: 10
                // per minute per client, then 429.
                let limits: std::collections::BTreeMap<Option<u64>, usize> =
                    open.iter().fold(Default::default(), |mut m, s| {
                        *m.entry(s.limit).or_default() += 1;
                        m
                    });
                assert!(
                    open.iter().all(|s| s.limit == Some(10)),
                    "{mode:?}: {limits:?}"
                );
                let statuses: std::collections::BTreeMap<u16, usize> =
                    open.iter().fold(Default::default(), |mut m, s| {
                        *m.entry(s.status).or_default() += 1;
                        m
                    });
                assert!(
                    open.iter().any(|s| s.status == 429),
                    "{mode:?}: {statuses:?}"
                );
            }
        }
        let p95 = percentile(open.iter().map(|s| s.latency).collect(), 95);
        assert!(
            p95 < Duration::from_millis(5),
            "{mode:?}: p95 {p95:?} with the breaker open"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_empty_limiting_is_back_on_redis_within_two_seconds() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut server = RedisServer::spawn();
    let store = store(&server).await;
    // A key that lives 6 s after a request, long enough to look at.
    let policy = Policy::new("restart", Algorithm::Gcra, "10/min").unwrap();
    assert!(
        store
            .check(&Key::user("k"), &policy, 1)
            .await
            .unwrap()
            .is_allowed()
    );

    server.restart();
    let restarted = Instant::now();
    let back = loop {
        match store.decide(&Key::user("k"), &policy, 1).await {
            Ok(d) => break d,
            Err(RedisStoreError::Redis(e)) if e.code() == Some("NOSCRIPT") => {
                panic!("NOSCRIPT reached a caller: {e}")
            }
            Err(e) => assert!(
                restarted.elapsed() < Duration::from_secs(2),
                "still failing: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        restarted.elapsed() < Duration::from_secs(2),
        "back after {:?}",
        restarted.elapsed()
    );
    assert!(back.is_allowed());
    // The state is in the new, empty server.
    let mut con = server.connection();
    let exists: bool = redis::cmd("EXISTS")
        .arg(store.state_key(&policy, &Key::user("k")))
        .query(&mut con)
        .unwrap();
    assert!(exists);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_opens_the_circuit_and_it_closes_after_the_pause() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::spawn();
    let store = store(&server).await;
    let app = app(store.clone(), FailureMode::Local);
    let mut con = server.connection();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(5_000)
        .arg("ALL")
        .query(&mut con)
        .unwrap();
    let paused_at = Instant::now();
    let watcher = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut opened = None;
            let mut closed_after = None;
            while paused_at.elapsed() < Duration::from_millis(7_500) {
                match store.breaker_state() {
                    BreakerState::Open if opened.is_none() => opened = Some(paused_at.elapsed()),
                    BreakerState::Closed
                        if opened.is_some() && paused_at.elapsed() > Duration::from_secs(5) =>
                    {
                        closed_after.get_or_insert(paused_at.elapsed());
                    }
                    _ => {}
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (opened, closed_after)
        })
    };
    let stalls = StallMeter::start();
    let samples = hammer(app, store, 8, Duration::from_millis(7_500)).await;
    let stall = stalls.stop();
    let (opened, closed) = watcher.await.unwrap();
    let slowest = samples.iter().map(|s| s.latency).max().unwrap();
    assert!(
        slowest <= CEILING + SLACK + stall,
        "a request took {slowest:?} (the machine stalled the process for up to {stall:?})"
    );
    assert!(
        opened.is_some_and(|t| t < Duration::from_secs(1)),
        "opened at {opened:?}"
    );
    assert!(
        closed.is_some_and(|t| t < Duration::from_millis(7_000)),
        "closed at {closed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// A request waits for a pooled connection at most the ceiling and one more
/// checkout (the pool serving the app's other calls meanwhile), then its
/// call at most the ceiling.
async fn a_small_pool_under_load_never_waits_past_its_bounds() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::spawn();
    let checkout = Duration::from_millis(25);
    let pool = RedisStore::builder()
        .pool_size(4)
        .pool_checkout_timeout(checkout)
        .deadline(DEADLINE)
        .connect_pool(server.url())
        .await
        .unwrap();
    let policy = Arc::new(Policy::new("pool", Algorithm::SlidingWindow, "1000000/min").unwrap());
    let stalls = StallMeter::start();
    let tasks: Vec<_> = (0..500)
        .map(|i| {
            let (pool, policy) = (pool.clone(), policy.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let result = pool.check(&Key::user(format!("p{i}")), &policy, 1).await;
                (started.elapsed(), result.is_ok())
            })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let stall = stalls.stop();
    let mut ok = 0;
    for (latency, success) in results {
        assert!(
            latency <= CEILING + checkout + CEILING + SLACK + stall,
            "waited {latency:?} (the machine stalled the process for up to {stall:?})"
        );
        ok += usize::from(success);
    }
    assert!(ok > 0, "the pool served some requests");
}

/// `CONFIG SET name value` on `con`.
fn config_set(con: &mut redis::Connection, name: &str, value: impl redis::ToRedisArgs) {
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(con)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readonly_oom_and_noreplicas_are_unavailable_and_health_checks_run_the_script() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut server = RedisServer::spawn();
    let store = store(&server).await;
    let policy = Policy::new("classify", Algorithm::Gcra, "10/s").unwrap();
    assert!(store.health_check().await.is_ok());
    // A store of its own for a slot, so that its failure below does not
    // count towards this one's breaker.
    let slot_store = self::store(&server).await;
    let slots = InFlightLimit::new("classify", 1).unwrap();
    assert!(
        slot_store
            .acquire(&Key::user("r"), &slots, 7)
            .await
            .unwrap()
            .acquired
    );

    // A demoted master: writes are refused with READONLY.
    let mut con = server.connection();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(1)
        .query(&mut con)
        .unwrap();
    match store.decide(&Key::user("r"), &policy, 1).await {
        Err(RedisStoreError::Unavailable { code, .. }) => assert_eq!(code, "READONLY"),
        other => panic!("expected READONLY, got {other:?}"),
    }
    // A slot's give-back too (a plain `ZREM` until it became a script):
    // it was a bare Redis error, which refreshes no connection.
    let released = slot_store
        .release(&Key::user("r"), &slots, 7)
        .await
        .unwrap_err();
    let source =
        std::error::Error::source(&released).and_then(|e| e.downcast_ref::<RedisStoreError>());
    assert!(
        matches!(source, Some(RedisStoreError::Unavailable { code, .. }) if code == "READONLY"),
        "{released:?}"
    );
    // PING would still answer; the health check runs the script, and fails.
    assert!(matches!(
        store.health_check().await,
        Err(RedisStoreError::Unavailable { .. })
    ));
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut con)
        .unwrap();

    // Out of memory: writes are refused with OOM.
    config_set(&mut con, "maxmemory-policy", "noeviction");
    config_set(&mut con, "maxmemory", 1);
    match store.decide(&Key::user("o"), &policy, 1).await {
        Err(RedisStoreError::Unavailable { code, .. }) => assert_eq!(code, "OOM"),
        other => panic!("expected OOM, got {other:?}"),
    }
    assert!(store.health_check().await.is_err());
    config_set(&mut con, "maxmemory", 0);
    assert!(store.decide(&Key::user("o"), &policy, 1).await.is_ok());

    // Too few replicas for `min-replicas-to-write` (a master cut off from
    // its replicas, as Sentinel's guard against a split brain has it):
    // writes are refused with NOREPLICAS before any is made. It was a bare
    // Redis error, taken for one that may have acted.
    config_set(&mut con, "min-replicas-to-write", 1);
    match store.decide(&Key::user("n"), &policy, 1).await {
        Err(RedisStoreError::Unavailable { code, .. }) => assert_eq!(code, "NOREPLICAS"),
        other => panic!("expected NOREPLICAS, got {other:?}"),
    }
    let released = slot_store
        .release(&Key::user("r"), &slots, 7)
        .await
        .unwrap_err();
    assert!(!released.may_have_acted(), "{released:?}");
    config_set(&mut con, "min-replicas-to-write", 0);
    assert!(store.decide(&Key::user("n"), &policy, 1).await.is_ok());

    assert!(store.health_check().await.is_ok());
    // A dead server fails it too.
    server.kill();
    assert!(store.health_check().await.is_err());
}

/// A proxy on a free loopback port to `to`'s port; once `silenced`, the
/// connections made before answer nothing, without an error (a host gone
/// silent, a partition, an address moved to another server), and new ones
/// go to `then`'s port.
async fn silencing_proxy(to: u16, then: u16, silenced: Arc<std::sync::atomic::AtomicBool>) -> u16 {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let old = !silenced.load(Ordering::SeqCst);
            let target = if old { to } else { then };
            let Ok(upstream) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                continue;
            };
            let (client_read, client_write) = client.into_split();
            let (upstream_read, upstream_write) = upstream.into_split();
            for (mut from, mut into) in [
                (
                    Box::new(client_read) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
                    Box::new(upstream_write) as Box<dyn tokio::io::AsyncWrite + Unpin + Send>,
                ),
                (Box::new(upstream_read), Box::new(client_write)),
            ] {
                let silenced = silenced.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0; 16 * 1024];
                    while let Ok(n @ 1..) = from.read(&mut buf).await {
                        let silent = old && silenced.load(Ordering::SeqCst);
                        if !silent && into.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        }
    });
    port
}

/// A connection gone silent without an error is replaced: the store's
/// watch finds neither of its `PING`s answered and connects afresh, and
/// the store is back on Redis within the watch's second, the two `PING`s'
/// budget and the breaker's cooldown. Before, the connection manager,
/// which reconnects on errors only, kept the silent connection, and every
/// call failed for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_gone_silent_is_replaced() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (old, new) = (RedisServer::spawn(), RedisServer::spawn());
    let silenced = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let port = silencing_proxy(old.port(), new.port(), silenced.clone()).await;
    let store = RedisStore::builder()
        .deadline(DEADLINE)
        .connect(format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap();
    let policy = Policy::new("silent", Algorithm::Gcra, "1000/h").unwrap();
    let key = Key::user("k");
    assert_eq!(
        store.check(&key, &policy, 1).await.unwrap().remaining(),
        999
    );
    silenced.store(true, std::sync::atomic::Ordering::SeqCst);
    let (stalls, silent_at) = (StallMeter::start(), Instant::now());
    let back = loop {
        if let Ok(decision) = store.check(&key, &policy, 1).await {
            break decision;
        }
        assert!(silent_at.elapsed() < Duration::from_secs(20), "never back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (took, stall) = (silent_at.elapsed(), stalls.stop());
    // Decided by the new server, which never saw the key.
    assert_eq!(back.remaining(), 999);
    // The watch's first look may find the call before the silence; its
    // second pings twice, within the connect budget (2 × 100 ms) each;
    // then the breaker's cooldown (1 s), a request's poll (50 ms).
    let bound = Duration::from_millis(2 * 1_000 + 2 * 200 + 200 + 1_000 + 50) + stall * 4;
    assert!(took <= bound, "back after {took:?}, bound {bound:?}");
}
