//! The default connection: a multiplexed `ConnectionManager` that can be
//! replaced by a freshly connected one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, FromRedisValue};

use crate::connection::RedisConnection;
use crate::error::RedisStoreError;

/// A multiplexed [`ConnectionManager`] (which reconnects by itself after
/// I/O errors) that the store also replaces with a freshly connected one
/// after `READONLY`, `MASTERDOWN` and similar replies: after a failover
/// behind a DNS name or proxy, the new connection reaches the new master.
/// At most one replacement runs at a time, in the background; requests go
/// on with the current connection meanwhile.
#[derive(Clone)]
pub struct ManagedConnection {
    client: redis::Client,
    config: ConnectionManagerConfig,
    swap: Swappable,
}

impl std::fmt::Debug for ManagedConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedConnection")
            .field("refreshing", &self.swap.refreshing())
            .finish_non_exhaustive()
    }
}

impl ManagedConnection {
    pub(crate) async fn connect(
        client: redis::Client,
        config: ConnectionManagerConfig,
        connect_budget: Duration,
    ) -> Result<Self, RedisStoreError> {
        let manager = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
        Ok(Self {
            client,
            config,
            swap: Swappable::new(manager, connect_budget),
        })
    }
}

impl RedisConnection for ManagedConnection {
    async fn query<T: FromRedisValue + Send>(&self, cmd: &Cmd) -> Result<T, RedisStoreError> {
        Ok(cmd.query_async(&mut self.swap.current()).await?)
    }

    fn is_one_server(&self) -> bool {
        true
    }

    fn refresh(&self) {
        let (client, config) = (self.client.clone(), self.config.clone());
        self.swap
            .refresh(async move { ConnectionManager::new_with_config(client, config).await });
    }
}

/// A connection manager that a fresh one replaces, made in the background
/// within a budget, one at a time: what [`ManagedConnection`] and
/// [`SentinelConnection`](crate::SentinelConnection) share.
#[derive(Clone)]
pub(crate) struct Swappable {
    current: Arc<Mutex<ConnectionManager>>,
    refreshing: Arc<AtomicBool>,
    connect_budget: Duration,
}

impl Swappable {
    pub(crate) fn new(manager: ConnectionManager, connect_budget: Duration) -> Self {
        Self {
            current: Arc::new(Mutex::new(manager)),
            refreshing: Arc::new(AtomicBool::new(false)),
            connect_budget,
        }
    }

    /// The connection now.
    pub(crate) fn current(&self) -> ConnectionManager {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn refreshing(&self) -> bool {
        self.refreshing.load(Ordering::Relaxed)
    }

    /// Replaces the connection with the one `fresh` makes, in the
    /// background and within the budget, unless a replacement is already
    /// on its way; a failed one leaves the connection as it was.
    pub(crate) fn refresh(
        &self,
        fresh: impl Future<Output = Result<ConnectionManager, redis::RedisError>> + Send + 'static,
    ) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            if let Ok(Ok(manager)) = tokio::time::timeout(this.connect_budget, fresh).await {
                *this.current.lock().unwrap_or_else(PoisonError::into_inner) = manager;
            }
            this.refreshing.store(false, Ordering::Release);
        });
    }
}
