//! The default connection: a multiplexed `ConnectionManager` that can be
//! replaced by a freshly connected one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, FromRedisValue};

use crate::builder::RedisStoreBuilder;
use crate::connect::connection::RedisConnection;
use crate::error::RedisStoreError;
use crate::running::Running;

/// A multiplexed [`ConnectionManager`] (which reconnects by itself after
/// I/O errors) that the store also replaces with a freshly connected one
/// after `READONLY`, `MASTERDOWN` and similar replies: after a failover
/// behind a DNS name or proxy, the new connection reaches the new master.
/// At most one replacement runs at a time, in the background; requests go
/// on with the current connection meanwhile.
///
/// A second in which no call went through (the store was idle, or Redis
/// failed), it sends Redis a `PING` in the background: so a connection
/// that died while the store was idle (Redis restarted) is found dead and
/// made anew before a request needs it, and one whose last attempt to
/// connect again was refused while Redis was down connects again within a
/// second of Redis answering, rather than failing the first request after
/// it with that old refusal. A connection that answers neither that `PING`
/// nor one more is replaced: one gone silent without an error (a host
/// that lost power, a partition, an address moved to another server)
/// would otherwise fail every call for good.
#[derive(Clone)]
pub struct ManagedConnection {
    client: redis::Client,
    config: ConnectionManagerConfig,
    swap: Swappable,
    /// Whether a call went through since the watch last looked (see
    /// [`ManagedConnection::watch`]).
    through: Arc<AtomicBool>,
}

/// How often a [`ManagedConnection`] that no call went through checks it.
const WATCH_EVERY: Duration = Duration::from_secs(1);

impl std::fmt::Debug for ManagedConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedConnection")
            .field("refreshing", &self.swap.refreshing())
            .finish_non_exhaustive()
    }
}

impl ManagedConnection {
    /// The settings of a connection manager to one server, from the
    /// builder's (also those of a Sentinel deployment's master).
    pub(crate) fn config(settings: &RedisStoreBuilder) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.connect_timeout))
            .set_response_timeout(Some(settings.response_timeout_or_default()))
            .set_number_of_retries(1)
            .set_max_delay(settings.connect_timeout)
    }

    /// Connects, or, when Redis cannot be reached, starts without a
    /// connection and makes one when a call needs it (see
    /// [`Swappable::connect`]).
    pub(crate) async fn connect(
        client: redis::Client,
        config: ConnectionManagerConfig,
        connect_budget: Duration,
    ) -> Self {
        let fresh = {
            let (client, config) = (client.clone(), config.clone());
            async move { ConnectionManager::new_with_config(client, config).await }
        };
        let connection = Self {
            client,
            config,
            swap: Swappable::connect(fresh, connect_budget).await,
            through: Arc::new(AtomicBool::new(false)),
        };
        connection.watch(connect_budget);
        connection
    }

    /// Starts the watch: every [`WATCH_EVERY`] in which no call went
    /// through, a `PING` through the connection manager (one more if it
    /// fails, which waits for the attempt to connect again that the first
    /// set off), or an attempt to connect while there is none. Each within
    /// `budget`. When neither `PING` is answered, a fresh connection
    /// replaces the manager's. It ends once the last clone of the
    /// connection is dropped.
    fn watch(&self, budget: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // Weak, so that the watch ends with the connection's last clone.
        let through = Arc::downgrade(&self.through);
        let (client, config, swap) = (self.client.clone(), self.config.clone(), self.swap.clone());
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(WATCH_EVERY).await;
                let Some(went_through) = through.upgrade() else {
                    return;
                };
                if went_through.swap(false, Ordering::Relaxed) {
                    continue;
                }
                drop(went_through);
                let Some(mut connection) = swap.current() else {
                    let (client, config) = (client.clone(), config.clone());
                    swap.refresh(async move {
                        ConnectionManager::new_with_config(client, config).await
                    });
                    continue;
                };
                let mut answered = false;
                for _ in 0..2 {
                    let ping = redis::cmd("PING");
                    let pinged =
                        tokio::time::timeout(budget, ping.query_async::<()>(&mut connection));
                    if matches!(pinged.await, Ok(Ok(()))) {
                        answered = true;
                        break;
                    }
                }
                // A connection that answers nothing, without an error of
                // its own (a host gone silent, a partition, an address
                // moved to another server), is never made anew by the
                // connection manager, which reconnects on errors only: a
                // fresh one replaces it.
                if !answered {
                    let (client, config) = (client.clone(), config.clone());
                    swap.refresh(async move {
                        ConnectionManager::new_with_config(client, config).await
                    });
                }
            }
        });
    }
}

impl ManagedConnection {
    /// The client every connection is made with: the server's address and
    /// the settings of its URL.
    pub(crate) fn client(&self) -> &redis::Client {
        &self.client
    }
}

impl RedisConnection for ManagedConnection {
    async fn query<T: FromRedisValue + Send>(&self, cmd: &Cmd) -> Result<T, RedisStoreError> {
        let Some(mut connection) = self.swap.current() else {
            self.refresh();
            return Err(self.swap.not_connected());
        };
        let reply = cmd.query_async(&mut connection).await?;
        // Read first: most calls find it set, and leave its line shared.
        if !self.through.load(Ordering::Relaxed) {
            self.through.store(true, Ordering::Relaxed);
        }
        Ok(reply)
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
/// [`SentinelConnection`](crate::SentinelConnection) share. It may have
/// none yet: a store built while Redis is down starts without one, and
/// gets one the first time a call finds Redis up again.
#[derive(Clone)]
pub(crate) struct Swappable {
    current: Arc<Mutex<Result<ConnectionManager, String>>>,
    refreshing: Arc<AtomicBool>,
    connect_budget: Duration,
    home: crate::patience::Home,
}

impl Swappable {
    /// Makes the first connection with `fresh`, within the budget; when
    /// that fails, starts without one, remembering why, and logs a
    /// warning: the store answers by the failure policy until Redis does.
    pub(crate) async fn connect(
        fresh: impl Future<Output = Result<ConnectionManager, redis::RedisError>>,
        connect_budget: Duration,
    ) -> Self {
        let first = match tokio::time::timeout(connect_budget, fresh).await {
            Ok(Ok(manager)) => Ok(manager),
            Ok(Err(error)) => Err(RedisStoreError::from(error).to_string()),
            Err(_) => Err(format!("no connection within {connect_budget:?}")),
        };
        if let Err(reason) = &first {
            tracing::warn!(
                reason = reason.as_str(),
                "redis is unreachable; the store starts without it, answers by the failure policy, and connects when Redis answers"
            );
        }
        Self {
            current: Arc::new(Mutex::new(first)),
            refreshing: Arc::new(AtomicBool::new(false)),
            connect_budget,
            home: crate::patience::Home::here(),
        }
    }

    /// The connection now, if there is one.
    pub(crate) fn current(&self) -> Option<ConnectionManager> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .ok()
            .cloned()
    }

    /// The error of a call made while there is no connection.
    pub(crate) fn not_connected(&self) -> RedisStoreError {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let reason = match &*current {
            Ok(_) => "the connection is being replaced".to_owned(),
            Err(reason) => reason.clone(),
        };
        RedisStoreError::NotConnected { reason }
    }

    pub(crate) fn refreshing(&self) -> bool {
        self.refreshing.load(Ordering::Relaxed)
    }

    /// Replaces the connection with the one `fresh` makes, in the
    /// background and within the budget, unless a replacement is already
    /// on its way; a failed one leaves the connection as it was (and, while
    /// there is none, the reason why).
    pub(crate) fn refresh(
        &self,
        fresh: impl Future<Output = Result<ConnectionManager, redis::RedisError>> + Send + 'static,
    ) {
        let Some(running) = Running::take(&self.refreshing) else {
            return;
        };
        let this = self.clone();
        let Some(runtime) = crate::running::hand_on_runtime(&self.home) else {
            return;
        };
        runtime.spawn(async move {
            let _running = running;
            let made = tokio::time::timeout(this.connect_budget, fresh).await;
            {
                let mut current = this.current.lock().unwrap_or_else(PoisonError::into_inner);
                match made {
                    Ok(Ok(manager)) => *current = Ok(manager),
                    Ok(Err(error)) if current.is_err() => {
                        *current = Err(RedisStoreError::from(error).to_string());
                    }
                    Err(_) if current.is_err() => {
                        *current = Err(format!("no connection within {:?}", this.connect_budget));
                    }
                    // A connection that failed to be replaced stays.
                    Ok(Err(_)) | Err(_) => {}
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> impl Future<Output = Result<ConnectionManager, redis::RedisError>> {
        std::future::ready(Err(std::io::Error::other("refused").into()))
    }

    #[test]
    fn a_replacement_its_runtime_never_runs_lets_the_next_one_start() {
        let live = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut swap = live.block_on(Swappable::connect(refused(), Duration::from_millis(100)));
        assert!(swap.current().is_none());
        let handle = crate::running::shut_down_runtime();
        {
            // A store whose home runtime shut down.
            let home = std::mem::replace(&mut swap.home, crate::patience::Home::of(handle.clone()));
            let _inside = handle.enter();
            swap.refresh(refused());
            swap.home = home;
        }
        assert!(
            !swap.refreshing(),
            "a replacement dropped unrun is no longer on its way"
        );
        live.block_on(async {
            swap.refresh(refused());
            assert!(swap.refreshing());
            while swap.refreshing() {
                tokio::task::yield_now().await;
            }
        });
    }
}
