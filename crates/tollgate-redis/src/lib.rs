//! The Redis store for [tollgate](https://docs.rs/tollgate): one exact
//! limit per key, shared by every app server that uses the same Redis.
//!
//! [`RedisStore`] implements [`tollgate_core::Store`] for all six
//! algorithms, with the same decisions as the in-memory store, in one
//! round trip per decision, using Redis `TIME` as the clock.
//!
//! ```no_run
//! use tollgate::{Algorithm, GlobalKey, Policy, RateLimitLayer};
//! use tollgate_redis::RedisStore;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let policy = Policy::new("api", Algorithm::Gcra, "100/min")?;
//! let layer = RateLimitLayer::new(policy, GlobalKey).store(store);
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! # Connections
//!
//! [`RedisStoreBuilder::connect`] uses redis-rs's multiplexed
//! `ConnectionManager` (the default), [`RedisStoreBuilder::connect_pool`] a
//! bb8 pool, and [`RedisStoreBuilder::connect_cluster`] a Redis Cluster.
//! Any [`RedisConnection`] works through [`RedisStoreBuilder::build`].
//!
//! # Keys
//!
//! `<prefix>:<policy>:{<hash>}`, where the hash is 128 bits of SHA-256 over
//! the length-prefixed policy name, key kind and key bytes (and an optional
//! secret). No raw identifier is stored, and every key of one decision is
//! in one cluster slot.

mod cluster;
mod connection;
mod deny_cache;
mod error;
mod keys;
mod managed;
mod script;
mod store;

pub use cluster::ClusterConnection;
pub use connection::{Pool, RedisConnection};
pub use error::RedisStoreError;
pub use managed::ManagedConnection;
pub use script::script_source;
pub use store::{RedisStore, RedisStoreBuilder};
