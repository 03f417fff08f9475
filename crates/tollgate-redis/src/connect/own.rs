//! A connection of your own: [`RedisStoreBuilder::build`], where the
//! store of every connection mode starts (the server's version, the
//! scripts, and a start without Redis when it cannot be reached), and
//! redis-rs's own connections.

use std::sync::Arc;
use std::time::Instant;

use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::{Cmd, FromRedisValue};
use tollgate_core::ConfigError;

use crate::batch::Batchers;
use crate::breaker::CircuitBreaker;
use crate::builder::RedisStoreBuilder;
use crate::connect::connection::RedisConnection;
use crate::deny_cache::DenyCache;
use crate::error::RedisStoreError;
use crate::identity::{ServerIdentity, run_id, server_time, too_old};
use crate::keys::KeyNamer;
use crate::known::LastKnown;
use crate::lanes::Lanes;
use crate::script::Scripts;
use crate::store::{Inner, RedisStore};
use crate::wire::{RedisClock, Wire, WriteOrder};

impl RedisStoreBuilder {
    /// Builds a store on a connection of your own, and loads the scripts.
    ///
    /// # Errors
    ///
    /// On invalid settings, when the server is older than Redis 7.0
    /// ([`RedisStoreError::UnsupportedVersion`]), or when Redis refuses the
    /// scripts. A Redis that cannot be reached, or cannot serve yet (it is
    /// loading its data, say), is no error: the store starts without it,
    /// the failure policy answers until it can, and the scripts load on
    /// their first call.
    pub async fn build<C: RedisConnection>(
        self,
        connection: C,
    ) -> Result<RedisStore<C>, RedisStoreError> {
        let names = self.check()?;
        let scripts = Scripts::new();
        let budget = self.connect_timeout + self.response_timeout_or_default();
        let mut info = redis::cmd("INFO");
        info.arg("server");
        let info: Result<redis::Value, _> = tokio::time::timeout(budget, connection.query(&info))
            .await
            .unwrap_or(Err(RedisStoreError::Deadline(budget)))
            .map_err(crate::wire::reclassify);
        let info = match info {
            Ok(info) => info,
            // Redis is down: the store starts without it. Its version is
            // not known, and its scripts load on their first call (the
            // NOSCRIPT retry); until Redis answers, every call fails and the
            // failure policy answers.
            Err(error) if unreachable(&error) => {
                let unknown = ServerIdentity::new(None);
                return Ok(self.assemble(connection, names, scripts, unknown, None)?);
            }
            Err(error) => return Err(error),
        };
        if let Some(version) = too_old(&info) {
            return Err(RedisStoreError::UnsupportedVersion { version });
        }
        let server = ServerIdentity::new(run_id(&info).map(str::to_owned));
        for script in scripts.all() {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(script.source);
            let loaded: Result<String, _> = tokio::time::timeout(budget, connection.query(&load))
                .await
                .unwrap_or(Err(RedisStoreError::Deadline(budget)))
                .map_err(crate::wire::reclassify);
            let sha = match loaded {
                Ok(sha) => sha,
                // Redis answered INFO but cannot run commands yet (it is
                // loading its data, say), or went away since: the store
                // starts as it does without Redis, and the scripts load on
                // their first call.
                Err(error) if unreachable(&error) => break,
                Err(error) => return Err(error),
            };
            if sha != script.sha {
                return Err(RedisStoreError::Protocol(format!(
                    "SCRIPT LOAD returned {sha}, expected {}",
                    script.sha
                )));
            }
        }
        let store = self.assemble(connection, names, scripts, server, server_time(&info))?;
        Ok(store)
    }

    /// The store around `connection`, once the server is known or known
    /// to be unreachable; `seen` is Redis's clock, read before now.
    fn assemble<C: RedisConnection>(
        self,
        connection: C,
        names: KeyNamer,
        scripts: Scripts,
        server: ServerIdentity,
        seen: Option<u64>,
    ) -> Result<RedisStore<C>, ConfigError> {
        let connection_is_one_server = connection.is_one_server();
        let breakers = (0..self.breaker_ranges.max(1))
            .map(|_| CircuitBreaker::new(self.breaker_threshold, self.breaker_cooldown))
            .collect::<Result<_, _>>()?;
        let store = RedisStore {
            inner: Arc::new(Inner {
                wire: Wire {
                    connection,
                    scripts,
                    clock: self.clock,
                    order: WriteOrder::new(self.write_first),
                    redis_clock: RedisClock::new(),
                    local_origin: Instant::now(),
                },
                names,
                deadline: self.deadline,
                home: crate::patience::Home::here(),
                batchers: (self.batch_size > 1 && connection_is_one_server)
                    .then(|| Batchers::new(self.batch_size, self.deadline)),
                breakers,
                deny_cache: DenyCache::new(self.deny_cache),
                last_known: LastKnown::new(self.deny_cache),
                lanes: Lanes::default(),
                server,
                #[cfg(feature = "metrics")]
                latency: {
                    tollgate_core::telemetry::describe();
                    metrics::histogram!(tollgate_core::telemetry::STORE_LATENCY)
                },
                #[cfg(feature = "metrics")]
                hit_counters: crate::series::ByPolicy::default(),
            }),
        };
        store.inner.wire.saw_time(seen);
        Ok(store)
    }
}

/// Whether `error`, met while building the store, says Redis cannot be
/// reached now (rather than that it answered wrongly): the store is then
/// built without it.
fn unreachable(error: &RedisStoreError) -> bool {
    match error {
        // A pool's checkout times out when no connection can be made: at
        // build time nothing else holds one.
        RedisStoreError::Deadline(_)
        | RedisStoreError::NotConnected { .. }
        | RedisStoreError::PoolTimeout
        // A pool the app's own calls kept busy, or a reply our own busy
        // runtime did not read: no answer yet either.
        | RedisStoreError::PoolBusy
        | RedisStoreError::Late(_)
        // Redis answers, but cannot serve yet (`LOADING`, a replica whose
        // master is down, ...): as for every call, the failure policy
        // applies until it can.
        | RedisStoreError::Unavailable { .. } => true,
        RedisStoreError::Redis(e) => e.is_timeout() || error.is_connection_lost(),
        RedisStoreError::Config(_)
        | RedisStoreError::CircuitOpen
        | RedisStoreError::QueueFull
        | RedisStoreError::UnsupportedVersion { .. }
        | RedisStoreError::Protocol(_) => false,
    }
}

impl RedisConnection for ConnectionManager {
    fn is_one_server(&self) -> bool {
        true
    }

    async fn query<T: FromRedisValue + Send>(&self, cmd: &Cmd) -> Result<T, RedisStoreError> {
        Ok(cmd.query_async(&mut self.clone()).await?)
    }
}

impl RedisConnection for MultiplexedConnection {
    fn is_one_server(&self) -> bool {
        true
    }

    async fn query<T: FromRedisValue + Send>(&self, cmd: &Cmd) -> Result<T, RedisStoreError> {
        Ok(cmd.query_async(&mut self.clone()).await?)
    }
}

impl RedisConnection for redis::cluster_async::ClusterConnection {
    async fn query<T: FromRedisValue + Send>(&self, cmd: &Cmd) -> Result<T, RedisStoreError> {
        Ok(cmd.query_async(&mut self.clone()).await?)
    }
}
