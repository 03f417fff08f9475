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
    connect_budget: Duration,
    current: Arc<Mutex<ConnectionManager>>,
    refreshing: Arc<AtomicBool>,
}

impl std::fmt::Debug for ManagedConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedConnection")
            .field("refreshing", &self.refreshing.load(Ordering::Relaxed))
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
            connect_budget,
            current: Arc::new(Mutex::new(manager)),
            refreshing: Arc::new(AtomicBool::new(false)),
        })
    }

    fn current(&self) -> ConnectionManager {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl RedisConnection for ManagedConnection {
    async fn query<T: FromRedisValue + Send>(&self, cmd: &Cmd) -> Result<T, RedisStoreError> {
        Ok(cmd.query_async(&mut self.current()).await?)
    }

    fn is_one_server(&self) -> bool {
        true
    }

    fn refresh(&self) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let fresh = tokio::time::timeout(
                this.connect_budget,
                ConnectionManager::new_with_config(this.client.clone(), this.config.clone()),
            )
            .await;
            if let Ok(Ok(manager)) = fresh {
                *this.current.lock().unwrap_or_else(PoisonError::into_inner) = manager;
            }
            this.refreshing.store(false, Ordering::Release);
        });
    }
}
