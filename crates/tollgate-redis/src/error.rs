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
    /// Redis cannot serve the request right now (`READONLY`, `MASTERDOWN`,
    /// `LOADING`, `CLUSTERDOWN`, `TRYAGAIN` or `OOM`): the connection is
    /// refreshed and the caller's failure policy applies.
    #[error("redis is unavailable ({code})")]
    Unavailable {
        /// The error code Redis replied with.
        code: String,
        /// Redis's reply.
        #[source]
        source: redis::RedisError,
    },
    /// The circuit breaker is open: Redis failed repeatedly and is not being
    /// called until it has had time to recover.
    #[error("redis circuit breaker is open")]
    CircuitOpen,
    /// Redis answered with an error, or the connection failed.
    #[error("redis command failed")]
    Redis(#[from] redis::RedisError),
    /// No pooled connection became free within the pool's checkout timeout.
    #[error("no pooled Redis connection became free within the checkout timeout")]
    PoolTimeout,
    /// More requests of one key are waiting behind its call than the store
    /// queues (see the Redis guide, "Bursts"): the failure policy applies,
    /// but the circuit breaker does not count it, as Redis did not fail.
    #[error("too many requests of one key are waiting for Redis")]
    QueueFull,
    /// The decision took longer than the per-decision deadline.
    #[error("redis did not decide within the deadline of {0:?}")]
    Deadline(Duration),
    /// The server is older than Redis 7.0, the oldest version the store is
    /// tested against. Found when the store is built.
    #[error("redis {version} is too old: tollgate needs Redis 7.0 or later")]
    UnsupportedVersion {
        /// The `redis_version` the server reported.
        version: String,
    },
    /// The script replied with something this version does not understand.
    #[error("unexpected reply from the decision script: {0}")]
    Protocol(String),
}

impl RedisStoreError {
    /// Whether the connection failed (and is being made anew), rather than
    /// Redis answering with an error.
    pub(crate) fn is_connection_lost(&self) -> bool {
        match self {
            Self::Redis(e) => {
                e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()
            }
            _ => false,
        }
    }

    /// The same error again, for each request of a failed batch.
    pub(crate) fn duplicate(&self) -> Self {
        match self {
            Self::Config(e) => Self::Config(e.clone()),
            Self::Unavailable { code, source } => Self::Unavailable {
                code: code.clone(),
                source: source.clone(),
            },
            Self::CircuitOpen => Self::CircuitOpen,
            Self::Redis(e) => Self::Redis(e.clone()),
            Self::PoolTimeout => Self::PoolTimeout,
            Self::QueueFull => Self::QueueFull,
            Self::Deadline(d) => Self::Deadline(*d),
            Self::UnsupportedVersion { version } => Self::UnsupportedVersion {
                version: version.clone(),
            },
            Self::Protocol(p) => Self::Protocol(p.clone()),
        }
    }
}

impl From<RedisStoreError> for StoreError {
    fn from(error: RedisStoreError) -> Self {
        match error {
            RedisStoreError::Deadline(d) => StoreError::Timeout(d),
            RedisStoreError::CircuitOpen => StoreError::CircuitOpen,
            other => StoreError::backend(other),
        }
    }
}

/// Error codes after which the connection reaches the wrong server or
/// Redis cannot serve for now.
const UNAVAILABLE: &[&str] = &[
    "READONLY",
    "MASTERDOWN",
    "LOADING",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "OOM",
];

/// Classifies a Redis error: `Unavailable` for the codes above.
pub(crate) fn classify(error: redis::RedisError) -> RedisStoreError {
    match error.code() {
        Some(code) if UNAVAILABLE.contains(&code) => RedisStoreError::Unavailable {
            code: code.to_owned(),
            source: error,
        },
        _ => RedisStoreError::Redis(error),
    }
}
