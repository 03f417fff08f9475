//! Connecting a store: one server, a pool, a cluster, or a Sentinel
//! deployment's master.

use redis::IntoConnectionInfo;
use redis::aio::ConnectionManagerConfig;
use redis::sentinel::SentinelNodeConnectionInfo;
use tollgate_core::ConfigError;

use super::RedisStoreBuilder;
use crate::cluster::ClusterConnection;
use crate::connection::Pool;
use crate::error::RedisStoreError;
use crate::managed::ManagedConnection;
use crate::sentinel::SentinelConnection;
use crate::store::RedisStore;

impl RedisStoreBuilder {
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
}
