//! [`SentinelConnection`]: the master of a Redis Sentinel deployment,
//! followed through failovers.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, FromRedisValue, IntoConnectionInfo, RedisError};

use crate::connection::RedisConnection;
use crate::error::RedisStoreError;
use crate::managed::Swappable;

/// A connection to the master that Redis Sentinel names for a service,
/// which follows the master when Sentinel promotes a replica.
///
/// Made by [`RedisStoreBuilder::connect_sentinel`](crate::RedisStoreBuilder::connect_sentinel).
/// It holds a multiplexed `ConnectionManager` to the master it was last
/// told of. When a call finds that master gone (the connection lost or
/// refused) or demoted (`READONLY`), it fails, as any call to a failed
/// server does (the store's failure policy answers it), and the
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

/// A connection to the master the sentinels name now.
async fn master_of(
    sentinel: &tokio::sync::Mutex<SentinelClient>,
    config: &ConnectionManagerConfig,
) -> Result<ConnectionManager, RedisError> {
    let client = sentinel.lock().await.async_get_client().await?;
    ConnectionManager::new_with_config(client, config.clone()).await
}

/// Whether `error` says the master is gone or no longer the master.
fn master_lost(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || matches!(error.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
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

    /// Asks the sentinels for the master again, in the background, unless
    /// a question is already on its way.
    fn refresh(&self) {
        let (sentinel, config) = (self.sentinel.clone(), self.config.clone());
        self.swap
            .refresh(async move { master_of(&sentinel, &config).await });
    }
}
