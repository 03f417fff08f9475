//! One cell of the matrix: the compositions and faults, a private Redis
//! with its stores, and what every cell does (requests, signals to the
//! server, waiting for recovery).

use std::process::Command;
use std::time::{Duration, Instant};

use tollgate::{Algorithm, FailureMode, FallbackStore, Key, MemoryStore, Policy, Store};
use tollgate_redis::{LeasedStore, RedisStore};
use tollgate_tests::{RedisServer, unique_prefix};

use super::{LIMIT, RECOVERY, SHARE, USED};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Composition {
    Redis,
    Leased,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    Killed,
    Paused,
    RestartedEmpty,
    FlushAll,
    ScriptFlush,
    AppSaturated,
    Reset,
    Block,
    LimitChange,
}

impl Fault {
    /// What the guide documents may be admitted beyond the limit, over
    /// the whole cell, with `USED` admitted before the fault, by
    /// `composition`.
    pub(crate) fn bound(self, composition: Composition) -> u64 {
        // Units a lease holds were counted in the Redis that lost them, and
        // are still spent: at most two leases of a limit's share.
        let leased = match composition {
            Composition::Redis => 0,
            Composition::Leased => 2 * (LIMIT / SHARE),
        };
        match self {
            Fault::FlushAll => USED + leased,
            // The local fallback, seeded with what Redis last said, admits
            // the rest of the limit while Redis is away; Redis never learns
            // of those admissions.
            Fault::Paused => LIMIT - USED,
            // Killed, and restarted without persistence: the fallback's
            // share, and the count Redis lost.
            Fault::Killed => LIMIT - USED + USED,
            // Redis lost what it counted: the count starts again (above).
            // The same, and while the connection is made anew the
            // fallback admits its share.
            Fault::RestartedEmpty => USED + (LIMIT - USED),
            // Not a store failure: nothing beyond the limit.
            Fault::ScriptFlush | Fault::AppSaturated | Fault::LimitChange => 0,
            // The operator gives the key a fresh allowance.
            Fault::Reset => USED,
            // Nothing is admitted once the block returns.
            Fault::Block => 0,
        }
    }
}

/// One cell's Redis, its store, and, for the leased composition, the
/// leased store over it.
pub(crate) struct Cell {
    pub(crate) server: RedisServer,
    pub(crate) redis: RedisStore,
    pub(crate) leased: Option<LeasedStore<RedisStore>>,
}

impl Cell {
    pub(crate) async fn new(composition: Composition) -> Self {
        let server = RedisServer::spawn();
        let url = server.url();
        let prefix = unique_prefix("matrix");
        let redis = RedisStore::builder()
            .prefix(prefix.as_str())
            .deadline(Duration::from_millis(100))
            .circuit_breaker(5, Duration::from_millis(200))
            .connect(url.as_str())
            .await
            .unwrap();
        let leased = match composition {
            Composition::Redis => None,
            Composition::Leased => Some(
                LeasedStore::builder()
                    .interval(Duration::from_millis(100))
                    .share(SHARE)
                    .ack_timeout(Duration::from_millis(500))
                    .channel(format!("{prefix}:leases"))
                    .connect(redis.clone(), url.as_str())
                    .await
                    .unwrap(),
            ),
        };
        Self {
            server,
            redis,
            leased,
        }
    }
}

/// `store` behind the local fallback.
pub(crate) fn local<S: Store>(store: S) -> FallbackStore<S> {
    FallbackStore::new(store)
        .on_store_error(FailureMode::Local)
        .local_fallback(MemoryStore::new())
}

/// `n` requests of `key`, each decided (a failure is a defect here): how
/// many were admitted.
pub(crate) async fn requests(store: &impl Store, key: &Key, policy: &Policy, n: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..n {
        let decision = store.check(key, policy, 1).await;
        let decision = decision.unwrap_or_else(|e| panic!("a failure reached the caller: {e}"));
        admitted += u64::from(decision.is_allowed());
    }
    admitted
}

pub(crate) fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits until decisions go through Redis again: the canary of the
/// health check, then the breaker closed by a decision of another key;
/// how long it took.
pub(crate) async fn recovery(cell: &Cell, store: &impl Store) -> Duration {
    let started = Instant::now();
    let (probe, policy) = (
        Key::user("probe"),
        Policy::new("probe", Algorithm::Gcra, "1000/s").unwrap(),
    );
    while cell.redis.health_check().await.is_err()
        || cell.redis.breaker_state() != tollgate_redis::BreakerState::Closed
    {
        assert!(
            started.elapsed() < RECOVERY,
            "no recovery within {RECOVERY:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        let _ = store.check(&probe, &policy, 1).await;
    }
    started.elapsed()
}

impl Cell {
    pub(crate) async fn store_reset(&self, key: &Key, policy: &Policy) {
        match &self.leased {
            Some(leased) => leased.reset(key, policy).await.unwrap(),
            None => self.redis.reset(key, policy).await.unwrap(),
        }
    }

    pub(crate) async fn store_block(&self, key: &Key, policy: &Policy) {
        let hour = Duration::from_secs(3600);
        match &self.leased {
            Some(leased) => leased.block(key, policy, hour).await.unwrap(),
            None => self.redis.block(key, policy, hour).await.unwrap(),
        }
    }
}
