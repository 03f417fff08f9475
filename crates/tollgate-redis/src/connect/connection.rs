//! The [`RedisConnection`] trait: what the store asks of a connection.

use std::future::Future;

use redis::{Cmd, FromRedisValue};

use crate::error::RedisStoreError;

/// A connection (or pool) that sends commands to Redis.
///
/// Implemented for this crate's [`ManagedConnection`](crate::ManagedConnection)
/// (the default) and [`ClusterConnection`](crate::ClusterConnection), and
/// for redis-rs's multiplexed
/// [`ConnectionManager`](redis::aio::ConnectionManager),
/// [`MultiplexedConnection`](redis::aio::MultiplexedConnection), cluster
/// connection and a bb8 [`Pool`](crate::Pool). Implement it to run the store on
/// anything else.
pub trait RedisConnection: Send + Sync + 'static {
    /// Sends `cmd` and returns its reply.
    fn query<T: FromRedisValue + Send>(
        &self,
        cmd: &Cmd,
    ) -> impl Future<Output = Result<T, RedisStoreError>> + Send;

    /// Sends `cmd`, which touches `key`, and returns its reply. Cluster
    /// connections route by the key's hash slot; the default ignores the key.
    fn query_for_key<T: FromRedisValue + Send>(
        &self,
        key: &str,
        cmd: &Cmd,
    ) -> impl Future<Output = Result<T, RedisStoreError>> + Send {
        let _ = key;
        self.query(cmd)
    }

    /// Whether every command reaches the same server, so that one script
    /// call may touch any keys. The store batches concurrent decisions into
    /// one call only then (see [`RedisStoreBuilder::batch_size`]). The
    /// default says no, which is always safe; this crate's single-server
    /// connections and the bb8 [`Pool`](crate::Pool) say yes.
    ///
    /// [`RedisStoreBuilder::batch_size`]: crate::RedisStoreBuilder::batch_size
    fn is_one_server(&self) -> bool {
        false
    }

    /// Called after a reply that says this connection reaches the wrong
    /// server (`READONLY`, `MASTERDOWN`, ...): replace it if you can. The
    /// default does nothing; cluster connections refresh their slot map by
    /// themselves.
    fn refresh(&self) {}
}
