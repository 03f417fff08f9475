//! Configuring a [`RedisStore`] and connecting it: a single server, a
//! bb8 pool, a cluster, a Sentinel deployment's master, or a connection
//! of your own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::IntoConnectionInfo;
use redis::aio::ConnectionManagerConfig;
use redis::sentinel::SentinelNodeConnectionInfo;
use tollgate_core::{CircuitBreaker, Clock, ConfigError};

use crate::batch::Batcher;
use crate::cluster::ClusterConnection;
use crate::connection::{Pool, RedisConnection};
use crate::deny_cache::DenyCache;
use crate::error::RedisStoreError;
use crate::identity::{ServerIdentity, run_id, too_old};
use crate::keys::KeyNamer;
use crate::known::LastKnown;
use crate::lanes::Lanes;
use crate::managed::ManagedConnection;
use crate::script::Scripts;
use crate::sentinel::SentinelConnection;
use crate::store::{Inner, RedisStore};
use crate::wire::{RedisClock, Wire, WriteOrder};

impl RedisStore<ManagedConnection> {
    /// Connects to `url` with the default settings and a multiplexed
    /// [`ManagedConnection`].
    ///
    /// # Errors
    ///
    /// As [`RedisStoreBuilder::parse_url`] for a URL that cannot be used,
    /// and as [`RedisStoreBuilder::connect`] (a Redis that cannot be
    /// reached is not an error: the store connects when it answers).
    pub async fn connect(url: &str) -> Result<Self, RedisStoreError> {
        let info = RedisStoreBuilder::parse_url(url)?;
        Self::builder().connect(info).await
    }
}

impl RedisStore {
    /// Starts configuring a store.
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }
}

/// Configures a [`RedisStore`].
///
/// The defaults suit a request path: a decision waits at most 50 ms, a
/// response 50 ms, a new connection 100 ms and a pool checkout 25 ms.
#[derive(Debug)]
#[must_use = "call .connect(url) to get the store"]
pub struct RedisStoreBuilder {
    prefix: String,
    secret: Option<Vec<u8>>,
    deadline: Duration,
    connect_timeout: Duration,
    /// `None`: one deadline past the deadline's hard ceiling.
    response_timeout: Option<Duration>,
    pool_size: u32,
    checkout_timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    breaker_threshold: u32,
    breaker_cooldown: Duration,
    breaker_ranges: usize,
    deny_cache: usize,
    batch_size: usize,
    write_first: Option<bool>,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        Self {
            prefix: "tollgate".to_owned(),
            secret: None,
            deadline: Duration::from_millis(50),
            connect_timeout: Duration::from_millis(100),
            response_timeout: None,
            pool_size: 16,
            checkout_timeout: Duration::from_millis(25),
            clock: None,
            breaker_threshold: 5,
            breaker_cooldown: Duration::from_secs(1),
            breaker_ranges: 1,
            deny_cache: 10_000,
            batch_size: 64,
            write_first: None,
        }
    }
}

impl RedisStoreBuilder {
    /// The first part of every key (default `tollgate`): 1 to 64 visible
    /// ASCII characters without braces.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Mixes a secret into the key hashes, so that key names cannot be
    /// linked to identities (such as IPv4 addresses) by hashing guesses.
    /// All servers sharing limits need the same secret.
    pub fn key_secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.secret = Some(secret.into());
        self
    }

    /// The longest a decision may take, from call to reply (default 50 ms).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// How long establishing a connection may take (default 100 ms).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long the connection waits for Redis to answer a command before
    /// it fails the command itself (default: 5 × the deadline, one past
    /// the deadline's hard ceiling, so the store's own deadline judges
    /// first).
    ///
    /// The store tells a late Redis from a late app: a deadline that fires
    /// late because the app's runtime was too busy to poll it is no
    /// failure, and the request waits on for its reply up to 4 × the
    /// deadline. The connection's response timeout cannot tell them apart,
    /// so a response timeout under that ceiling counts the app's own
    /// overload as Redis's failure again.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_redis::RedisStore;
    ///
    /// let builder = RedisStore::builder()
    ///     .deadline(Duration::from_millis(20))
    ///     .response_timeout(Duration::from_millis(100));
    /// # let _ = builder;
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = Some(timeout);
        self
    }

    /// The connection's response timeout: as set, or one deadline past
    /// the deadline's hard ceiling.
    fn response_timeout_or_default(&self) -> Duration {
        self.response_timeout
            .unwrap_or_else(|| crate::patience::backstop(self.deadline))
    }

    /// The size of a bb8 pool (default 16).
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// How long a request waits for a pooled connection (default 25 ms,
    /// never bb8's 30 s).
    pub fn pool_checkout_timeout(mut self, timeout: Duration) -> Self {
        self.checkout_timeout = timeout;
        self
    }

    /// The circuit breaker: open after `threshold` consecutive failures or
    /// missed deadlines (default 5), for `cooldown` (default 1 s) before one
    /// probe goes through. While open, decisions fail at once with
    /// [`RedisStoreError::CircuitOpen`], adding no latency, and the
    /// caller's failure policy applies.
    pub fn circuit_breaker(mut self, threshold: u32, cooldown: Duration) -> Self {
        self.breaker_threshold = threshold;
        self.breaker_cooldown = cooldown;
        self
    }

    /// The most denials the local deny cache holds (default 10,000; 0
    /// turns it off). A key denied until a time is denied locally until
    /// then, without asking Redis: a client hammering an exhausted limit
    /// costs Redis nothing, and decisions stay exact. The store remembers
    /// the last decision of as many keys for a local fallback to take over
    /// ([`Store::last_known`](tollgate_core::Store::last_known)).
    pub fn deny_cache(mut self, max_entries: usize) -> Self {
        self.deny_cache = max_entries;
        self
    }

    /// The most requests one script call decides (default 64; 1 turns
    /// batching off). While a store has calls on their way to Redis,
    /// further requests of single-limit GCRA, token-bucket and
    /// leaky-bucket policies queue and go together in the next call, in
    /// the order they came, each decided as if alone; so do those of
    /// single fixed-window limits, in calls of their own. A store without
    /// concurrent requests sends each alone at once. Under load this
    /// divides Redis's CPU per decision and the client's work per
    /// round trip by the batch (see `BENCHMARKS.md`). Only on connections
    /// to one server ([`RedisConnection::is_one_server`]): on a cluster,
    /// keys of different slots cannot share a script call.
    ///
    /// ```
    /// use tollgate_redis::RedisStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    /// let store = RedisStore::builder().batch_size(16).connect(url.as_str()).await?;
    /// # drop(store);
    /// // 1 turns batching off; 0 is no batch size.
    /// let err = RedisStore::builder().batch_size(0).connect(url.as_str()).await.unwrap_err();
    /// assert!(err.to_string().contains("invalid Redis store configuration"));
    /// # Ok(())
    /// # }
    /// ```
    pub fn batch_size(mut self, max_requests: usize) -> Self {
        self.batch_size = max_requests;
        self
    }

    /// **Test hook.** Makes the one-time script always write first
    /// (`true`: `SET ... NX GET`) or always read first (`false`: `GET`),
    /// instead of choosing by how many recent requests found their key
    /// busy, so that tests can hold both ways to the same results.
    #[doc(hidden)]
    pub fn test_write_first(mut self, write_first: bool) -> Self {
        self.write_first = Some(write_first);
        self
    }

    /// **Test hook.** Sends `clock`'s time to the scripts instead of letting
    /// them read Redis `TIME`, so tests can drive Redis with a
    /// [`FakeClock`](tollgate_core::FakeClock). Keys then live at least ten
    /// minutes of real time, because fake time does not pass with Redis's.
    /// Never use it in production: servers' clocks disagree.
    pub fn test_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    fn check(&self) -> Result<KeyNamer, ConfigError> {
        CircuitBreaker::new(self.breaker_threshold, self.breaker_cooldown)?;
        let positive = [
            ("deadline", self.deadline),
            ("connect_timeout", self.connect_timeout),
            ("response_timeout", self.response_timeout_or_default()),
            ("pool_checkout_timeout", self.checkout_timeout),
        ];
        for (setting, value) in positive {
            if value.is_zero() {
                return Err(ConfigError::InvalidSetting {
                    setting,
                    reason: "must be greater than zero",
                });
            }
        }
        if self.batch_size == 0 {
            return Err(ConfigError::InvalidSetting {
                setting: "batch_size",
                reason: "must be at least 1 (1 turns batching off)",
            });
        }
        if self.pool_size == 0 {
            return Err(ConfigError::InvalidSetting {
                setting: "pool_size",
                reason: "must be at least 1",
            });
        }
        KeyNamer::new(&self.prefix, self.secret.clone())
    }

    /// Connects with a [`ManagedConnection`]: redis-rs's multiplexed
    /// `ConnectionManager`, which reconnects by itself, replaced by a fresh
    /// one after `READONLY`-like replies. This is the default connection: it
    /// was the faster in our measurements (see `BENCHMARKS.md`).
    ///
    /// Redis need not be up: a store built while it cannot be reached
    /// starts without a connection, answers every call with
    /// [`RedisStoreError::NotConnected`] (so the caller's failure policy
    /// applies) and connects when a call finds Redis up; its version is
    /// checked, and its scripts loaded, only when Redis is reachable at
    /// build time. [`RedisStore::health_check`] tells an orchestrator
    /// whether it is ready.
    ///
    /// # Errors
    ///
    /// On invalid settings, when the Redis it reaches is older than 7.0
    /// ([`RedisStoreError::UnsupportedVersion`]), or when the scripts
    /// cannot be loaded.
    pub async fn connect(
        self,
        url: impl IntoConnectionInfo,
    ) -> Result<RedisStore<ManagedConnection>, RedisStoreError> {
        self.check()?;
        let client = redis::Client::open(url)?;
        let config = self.manager_config();
        let connection = ManagedConnection::connect(client, config, self.connect_timeout * 2).await;
        self.build(connection).await
    }

    /// Connects to the master that Redis Sentinel names `service`, asking
    /// any of `sentinels` (URLs such as `redis://10.0.0.1:26379`, with the
    /// sentinels' own credentials if they need any), with a
    /// [`SentinelConnection`], which follows the master through failovers:
    /// calls that find the master gone fail (the failure policy answers
    /// them, within the deadline) while the connection asks the sentinels
    /// again, and go to the new master once Sentinel has promoted one.
    /// See [`connect_sentinel_with`](Self::connect_sentinel_with) for a
    /// master that needs a password, a database or TLS, and
    /// [`connect_sentinel_url`](Self::connect_sentinel_url) for the URL form.
    ///
    /// # Errors
    ///
    /// As [`RedisStoreBuilder::connect`], and when no sentinel names a
    /// master for `service`.
    pub async fn connect_sentinel<I: IntoConnectionInfo>(
        self,
        service: &str,
        sentinels: impl IntoIterator<Item = I>,
    ) -> Result<RedisStore<SentinelConnection>, RedisStoreError> {
        let master = SentinelNodeConnectionInfo::default();
        self.connect_sentinel_with(service, sentinels, master).await
    }

    /// As [`connect_sentinel`](Self::connect_sentinel), connecting to the
    /// master with `master`'s settings: its credentials and database
    /// (`set_redis_connection_info`), and TLS (`set_tls_mode`, with one of
    /// the redis crate's TLS features).
    ///
    /// # Errors
    ///
    /// As [`connect_sentinel`](Self::connect_sentinel).
    pub async fn connect_sentinel_with<I: IntoConnectionInfo>(
        self,
        service: &str,
        sentinels: impl IntoIterator<Item = I>,
        master: SentinelNodeConnectionInfo,
    ) -> Result<RedisStore<SentinelConnection>, RedisStoreError> {
        self.check()?;
        let sentinels: Vec<I> = sentinels.into_iter().collect();
        if sentinels.is_empty() {
            return Err(ConfigError::InvalidSetting {
                setting: "sentinels",
                reason: "at least one sentinel address",
            }
            .into());
        }
        let config = self.manager_config();
        let budget = self.connect_timeout * 2;
        let connection =
            SentinelConnection::connect(sentinels, service, master, config, budget).await?;
        self.build(connection).await
    }

    /// As [`connect_sentinel`](Self::connect_sentinel), from one URL:
    /// `redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]`.
    /// The hosts are the sentinels; the credentials and the database are
    /// the master's.
    ///
    /// ```
    /// use tollgate_redis::RedisStoreBuilder;
    ///
    /// let (service, sentinels, _master) = RedisStoreBuilder::parse_sentinel_url(
    ///     "redis+sentinel://:s3cret@10.0.0.1:26379,10.0.0.2:26379/mymaster/2",
    /// )?;
    /// assert_eq!(service, "mymaster");
    /// assert_eq!(sentinels, ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"]);
    /// # Ok::<(), tollgate_redis::RedisStoreError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`connect_sentinel`](Self::connect_sentinel), and
    /// [`ConfigError::InvalidSetting`] for a URL of another form.
    pub async fn connect_sentinel_url(
        self,
        url: &str,
    ) -> Result<RedisStore<SentinelConnection>, RedisStoreError> {
        let (service, sentinels, master) = Self::parse_sentinel_url(url)?;
        self.connect_sentinel_with(&service, sentinels, master)
            .await
    }

    /// The connection settings of a `redis://`, `rediss://`,
    /// `redis+unix://` or `unix://` URL (and the `valkey` forms), to pass
    /// to [`connect`](Self::connect) or [`connect_pool`](Self::connect_pool).
    /// Unlike a URL passed to them as text, a URL refused here says why.
    ///
    /// ```
    /// use tollgate_redis::RedisStoreBuilder;
    ///
    /// assert!(RedisStoreBuilder::parse_url("redis://127.0.0.1:6379/2").is_ok());
    /// let err = RedisStoreBuilder::parse_url("foo://x").unwrap_err();
    /// assert!(err.to_string().contains("unknown URL scheme"), "{err}");
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidValue`] for an unknown scheme (naming it),
    /// [`ConfigError::InvalidSetting`] for a text that is not a URL, and
    /// [`RedisStoreError::Redis`] for a URL the redis crate refuses.
    pub fn parse_url(url: &str) -> Result<redis::ConnectionInfo, RedisStoreError> {
        crate::url::connection_info(url)
    }

    /// The service, the sentinels' URLs and the master's settings of a
    /// `redis+sentinel://` URL (see
    /// [`connect_sentinel_url`](Self::connect_sentinel_url)).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] for a URL of another form.
    pub fn parse_sentinel_url(
        url: &str,
    ) -> Result<(String, Vec<String>, SentinelNodeConnectionInfo), RedisStoreError> {
        let bad = |reason| ConfigError::InvalidSetting {
            setting: "sentinel URL",
            reason,
        };
        let rest = url
            .strip_prefix("redis+sentinel://")
            .ok_or_else(|| bad("expected redis+sentinel://host:port[,host:port...]/service"))?;
        let (credentials, rest) = match rest.rsplit_once('@') {
            Some((credentials, rest)) => (Some(credentials), rest),
            None => (None, rest),
        };
        let (hosts, path) = rest
            .split_once('/')
            .ok_or_else(|| bad("no service name after the sentinels' addresses"))?;
        let mut path = path.split('/');
        let service = path.next().filter(|s| !s.is_empty());
        let service =
            service.ok_or_else(|| bad("no service name after the sentinels' addresses"))?;
        let db = path.next().filter(|d| !d.is_empty());
        let sentinels: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("redis://{h}"))
            .collect();
        if sentinels.is_empty() {
            return Err(bad("at least one sentinel address").into());
        }
        // The master's settings, read by the redis crate from a URL of its
        // own form (it decodes the credentials and checks the database).
        let master_url = format!(
            "redis://{}localhost/{}",
            credentials.map(|c| format!("{c}@")).unwrap_or_default(),
            db.unwrap_or("0")
        );
        let info = master_url.as_str().into_connection_info()?;
        let master = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(info.redis_settings().clone());
        Ok((service.to_owned(), sentinels, master))
    }

    /// The settings of a connection manager to one server.
    fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout_or_default()))
            .set_number_of_retries(1)
            .set_max_delay(self.connect_timeout)
    }

    /// Connects through a bb8 pool of multiplexed connections.
    ///
    /// # Errors
    ///
    /// As [`RedisStoreBuilder::connect`].
    pub async fn connect_pool(
        self,
        url: impl IntoConnectionInfo,
    ) -> Result<RedisStore<Pool>, RedisStoreError> {
        self.check()?;
        let manager = bb8_redis::RedisConnectionManager::new(url)?;
        let pool = bb8::Pool::builder()
            .max_size(self.pool_size)
            .connection_timeout(self.checkout_timeout)
            .build(manager)
            .await?;
        self.build(pool).await
    }

    /// Connects to a Redis Cluster through any of `nodes` (URLs such as
    /// `redis://10.0.0.1:6379`), with a [`ClusterConnection`]: each decision
    /// goes to its slot's master, a failed master affects only its slots,
    /// and the circuit breaker is kept per range of 128 slots.
    ///
    /// Keep the response timeout at most the deadline, as by default (on
    /// a cluster it defaults to the deadline, not to its ceiling: a
    /// cluster connection's own timeout then fails a call that our busy
    /// runtime kept waiting past the deadline).
    ///
    /// # Errors
    ///
    /// As [`RedisStoreBuilder::connect`].
    pub async fn connect_cluster<I: IntoConnectionInfo>(
        self,
        nodes: impl IntoIterator<Item = I>,
    ) -> Result<RedisStore<ClusterConnection>, RedisStoreError> {
        self.check()?;
        let mut seeds = Vec::new();
        for node in nodes {
            let info = node.into_connection_info()?;
            seeds.push(info.addr().to_string());
        }
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout.unwrap_or(self.deadline)));
        let connection = ClusterConnection::connect(seeds, config, self.connect_timeout).await?;
        Self {
            breaker_ranges: 128,
            ..self
        }
        .build(connection)
        .await
    }

    /// Builds a store on a connection of your own, and loads the scripts.
    ///
    /// # Errors
    ///
    /// On invalid settings, when the server is older than Redis 7.0
    /// ([`RedisStoreError::UnsupportedVersion`]), or when the scripts cannot
    /// be loaded.
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
            .unwrap_or(Err(RedisStoreError::Deadline(budget)));
        let info = match info {
            Ok(info) => info,
            // Redis is down: the store starts without it. Its version is
            // not known, and its scripts load on their first call (the
            // NOSCRIPT retry); until Redis answers, every call fails and the
            // failure policy answers.
            Err(error) if unreachable(&error) => {
                return Ok(self.assemble(connection, names, scripts, ServerIdentity::new(None))?);
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
            let sha: String = tokio::time::timeout(budget, connection.query(&load))
                .await
                .map_err(|_| RedisStoreError::Deadline(budget))??;
            if sha != script.sha {
                return Err(RedisStoreError::Protocol(format!(
                    "SCRIPT LOAD returned {sha}, expected {}",
                    script.sha
                )));
            }
        }
        Ok(self.assemble(connection, names, scripts, server)?)
    }

    /// The store around `connection`, once the server is known or known
    /// to be unreachable.
    fn assemble<C: RedisConnection>(
        self,
        connection: C,
        names: KeyNamer,
        scripts: Scripts,
        server: ServerIdentity,
    ) -> Result<RedisStore<C>, ConfigError> {
        let connection_is_one_server = connection.is_one_server();
        let breakers = (0..self.breaker_ranges.max(1))
            .map(|_| CircuitBreaker::new(self.breaker_threshold, self.breaker_cooldown))
            .collect::<Result<_, _>>()?;
        Ok(RedisStore {
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
                batchers: (self.batch_size > 1 && connection_is_one_server)
                    .then(|| [Batcher::new(self.batch_size), Batcher::new(self.batch_size)]),
                breakers,
                deny_cache: DenyCache::new(self.deny_cache),
                last_known: LastKnown::new(self.deny_cache),
                lanes: Lanes::default(),
                server,
                #[cfg(feature = "metrics")]
                latency: {
                    metrics::describe_histogram!(
                        tollgate_core::telemetry::STORE_LATENCY,
                        metrics::Unit::Seconds,
                        tollgate_core::telemetry::STORE_LATENCY_HELP
                    );
                    metrics::histogram!(tollgate_core::telemetry::STORE_LATENCY)
                },
                #[cfg(feature = "metrics")]
                hit_counters: std::sync::RwLock::default(),
            }),
        })
    }
}

/// Whether `error`, met while building the store, says Redis cannot be
/// reached now (rather than that it answered wrongly): the store is then
/// built without it.
fn unreachable(error: &RedisStoreError) -> bool {
    error.is_connection_lost()
        || matches!(
            error,
            RedisStoreError::Deadline(_) | RedisStoreError::NotConnected { .. }
        )
        || matches!(error, RedisStoreError::Redis(e) if e.is_timeout())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_typed_errors() {
        let err = RedisStore::builder()
            .deadline(Duration::ZERO)
            .check()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid setting deadline: must be greater than zero"
        );
        let err = RedisStore::builder().pool_size(0).check().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid setting pool_size: must be at least 1"
        );
        let err = RedisStore::builder().prefix("a{b").check().unwrap_err();
        assert!(
            err.to_string().starts_with("invalid setting prefix"),
            "{err}"
        );
    }
}
