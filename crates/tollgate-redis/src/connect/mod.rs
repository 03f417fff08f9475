//! The connections a [`RedisStore`](crate::RedisStore) can run on, one
//! file per mode, each with its connect path: one server (`single.rs`,
//! on the default [`ManagedConnection`] of `managed.rs`), a bb8 pool
//! (`pool.rs`), a Redis Cluster (`cluster.rs`), a Sentinel deployment's
//! master (`sentinel.rs`), or a connection of your own (`own.rs`, where
//! every mode's store starts).

mod cluster;
pub(crate) mod connection;
pub(crate) mod managed;
mod own;
mod pool;
mod sentinel;
mod single;

pub use cluster::ClusterConnection;
pub use connection::RedisConnection;
pub use managed::ManagedConnection;
pub use pool::Pool;
pub(crate) use pool::after_checkout;
pub use sentinel::SentinelConnection;
