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

    /// For a pool, whose calls can queue in the app for a connection: how
    /// many calls it has handed a connection so far. `None` (the default):
    /// calls do not queue for this connection.
    ///
    /// While the count grows, the pool is serving the app's calls, and a
    /// call that waits for a connection meanwhile waits on the app's own
    /// load, not on Redis: its wait does not count towards the store's
    /// deadline, up to the store's ceiling of four deadlines, after which
    /// it fails with [`RedisStoreError::PoolBusy`], which the circuit breaker
    /// does not count. The bb8 [`Pool`](crate::Pool) tells the store when a
    /// call has its connection, and its deadline starts then; for any other
    /// connection that returns `Some`, at the ceiling.
    fn handed_out(&self) -> Option<u64> {
        None
    }

    /// Called after a reply that says this connection reaches the wrong
    /// server (`READONLY`, `MASTERDOWN`, ...): replace it if you can. The
    /// default does nothing; cluster connections refresh their slot map by
    /// themselves.
    fn refresh(&self) {}

    /// Called after a call missed the store's deadline with no error of
    /// the connection's own: a server that stopped answering (hung, or cut
    /// off without a reset) sends none, and may have been replaced. The
    /// default does nothing; a
    /// [`SentinelConnection`](crate::SentinelConnection) asks the
    /// sentinels for the master again.
    fn late(&self) {}
}
