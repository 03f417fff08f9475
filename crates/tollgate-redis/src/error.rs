//! Errors of the Redis store.

use std::time::Duration;

use tollgate_core::{ConfigError, StoreError};

/// Why the Redis store could not be built or could not decide.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisStoreError {
    /// A setting is invalid.
    #[error("invalid Redis store configuration")]
    Config(#[from] ConfigError),
    /// Redis answered with an error, or the connection failed.
    #[error("redis command failed")]
    Redis(#[from] redis::RedisError),
    /// No pooled connection became free within the pool's checkout timeout.
    #[error("no pooled Redis connection became free within the checkout timeout")]
    PoolTimeout,
    /// The decision took longer than the per-decision deadline.
    #[error("redis did not decide within the deadline of {0:?}")]
    Deadline(Duration),
    /// The script replied with something this version does not understand.
    #[error("unexpected reply from the decision script: {0}")]
    Protocol(String),
}

impl From<RedisStoreError> for StoreError {
    fn from(error: RedisStoreError) -> Self {
        match error {
            RedisStoreError::Deadline(d) => StoreError::Timeout(d),
            other => StoreError::backend(other),
        }
    }
}
