//! [`SentinelConnection`]: the master of a Redis Sentinel deployment,
//! followed through failovers, and [`RedisStoreBuilder::connect_sentinel`]
//! with its URL form.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, FromRedisValue, IntoConnectionInfo, RedisError};
use tollgate_core::ConfigError;

use crate::builder::RedisStoreBuilder;
use crate::connect::connection::RedisConnection;
use crate::connect::managed::{ManagedConnection, Swappable};
use crate::error::RedisStoreError;
use crate::store::RedisStore;

/// A connection to the master that Redis Sentinel names for a service,
/// which follows the master when Sentinel promotes a replica.
///
/// Made by [`RedisStoreBuilder::connect_sentinel`](crate::RedisStoreBuilder::connect_sentinel).
/// It holds a multiplexed `ConnectionManager` to the master it was last
/// told of. When a call finds that master gone (the connection lost or
/// refused), demoted (`READONLY`) or silent (a call past the store's
/// deadline: hung, or cut off without a reset), it fails, as any call to a
/// failed server does (the store's failure policy answers it), and the
/// connection asks the sentinels for the master again, in the background,
/// one question at a time: once Sentinel has promoted a replica, the next
/// calls go to it.
#[derive(Clone)]
pub struct SentinelConnection {
    sentinel: Arc<tokio::sync::Mutex<SentinelClient>>,
    config: ConnectionManagerConfig,
    swap: Swappable,
}

impl std::fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelConnection")
            .field("refreshing", &self.swap.refreshing())
            .finish_non_exhaustive()
    }
}

impl SentinelConnection {
    /// Asks `sentinels` for the master of `service` and connects to it.
    pub(crate) async fn connect<I: IntoConnectionInfo>(
        sentinels: Vec<I>,
        service: &str,
        master: SentinelNodeConnectionInfo,
        config: ConnectionManagerConfig,
        connect_budget: Duration,
    ) -> Result<Self, RedisStoreError> {
        let sentinel = SentinelClient::build(
            sentinels,
            service.to_owned(),
            Some(master),
            SentinelServerType::Master,
        )?;
        let sentinel = Arc::new(tokio::sync::Mutex::new(sentinel));
        // While no sentinel answers, or none knows a master, the store
        // starts without one and asks again when a call needs it.
        let swap = Swappable::connect(master_of(&sentinel, &config), connect_budget).await;
        Ok(Self {
            sentinel,
            config,
            swap,
        })
    }
}

impl RedisStoreBuilder {
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
    /// Neither the sentinels nor the master need be up: while no sentinel
    /// answers, or none names a master for `service`, the store starts
    /// without one, its calls fail with
    /// [`RedisStoreError::NotConnected`] (the failure policy answers them),
    /// and it asks again when a call needs a master. A service name no
    /// sentinel knows shows in [`RedisStore::health_check`]'s error ("no
    /// sentinel knows the service"), not at build: a readiness probe
    /// catches a mistyped name.
    ///
    /// # Errors
    ///
    /// On invalid settings or sentinel URLs, and as
    /// [`RedisStoreBuilder::connect`] for the master it reaches.
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
        let config = ManagedConnection::config(&self);
        let budget = self.connect_budget();
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
}

/// A connection to the master the sentinels name now.
async fn master_of(
    sentinel: &tokio::sync::Mutex<SentinelClient>,
    config: &ConnectionManagerConfig,
) -> Result<ConnectionManager, RedisError> {
    let client = sentinel.lock().await.async_get_client().await?;
    ConnectionManager::new_with_config(client, config.clone()).await
}

/// Whether `error` says the master is gone or no longer the master: also
/// `NOREPLICAS`, of a master cut off from its replicas, which the
/// sentinels may have replaced.
fn master_lost(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || matches!(
            error.code(),
            Some("READONLY" | "MASTERDOWN" | "LOADING" | "NOREPLICAS")
        )
}

impl RedisConnection for SentinelConnection {
    async fn query<T: FromRedisValue + Send>(&self, cmd: &Cmd) -> Result<T, RedisStoreError> {
        let Some(mut connection) = self.swap.current() else {
            self.refresh();
            return Err(self.swap.not_connected());
        };
        match cmd.query_async(&mut connection).await {
            Ok(value) => Ok(value),
            Err(error) => {
                if master_lost(&error) {
                    self.refresh();
                }
                Err(error.into())
            }
        }
    }

    fn is_one_server(&self) -> bool {
        true
    }

    /// A master that stopped answering (hung, or cut off) may have been
    /// replaced by the sentinels: asked again, as after an error.
    fn late(&self) {
        self.refresh();
    }

    /// Asks the sentinels for the master again, in the background, unless
    /// a question is already on its way.
    fn refresh(&self) {
        let (sentinel, config) = (self.sentinel.clone(), self.config.clone());
        self.swap
            .refresh(async move { master_of(&sentinel, &config).await });
    }
}
