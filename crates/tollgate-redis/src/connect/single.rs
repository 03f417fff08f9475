//! One server: [`RedisStore::connect`] and
//! [`RedisStoreBuilder::connect`] on a [`ManagedConnection`], and reading
//! a Redis URL, with the reason a URL is refused.

use redis::{ConnectionInfo, IntoConnectionInfo};
use tollgate_core::ConfigError;

use crate::builder::RedisStoreBuilder;
use crate::connect::managed::ManagedConnection;
use crate::error::RedisStoreError;
use crate::store::RedisStore;

impl RedisStore<ManagedConnection> {
    /// Connects to `url` with the default settings and a multiplexed
    /// [`ManagedConnection`].
    ///
    /// # Errors
    ///
    /// As [`RedisStoreBuilder::parse_url`] for a URL that cannot be used,
    /// and as [`RedisStoreBuilder::connect`] (a Redis that cannot be
    /// reached is not an error: the store connects when it answers).
    pub async fn connect(url: &str) -> Result<Self, RedisStoreError> {
        let info = RedisStoreBuilder::parse_url(url)?;
        Self::builder().connect(info).await
    }
}

impl RedisStoreBuilder {
    /// Connects with a [`ManagedConnection`]: redis-rs's multiplexed
    /// `ConnectionManager`, which reconnects by itself, replaced by a fresh
    /// one after `READONLY`-like replies. This is the default connection: it
    /// was the faster in our measurements (see `BENCHMARKS.md`).
    ///
    /// Redis need not be up: a store built while it cannot be reached
    /// starts without a connection, answers every call with
    /// [`RedisStoreError::NotConnected`] (so the caller's failure policy
    /// applies) and connects when a call finds Redis up; its version is
    /// checked, and its scripts loaded, only when Redis is reachable at
    /// build time. A Redis that answers but cannot serve yet (it is loading
    /// its data: `LOADING`) starts the store the same way, its calls
    /// failing with [`RedisStoreError::Unavailable`] until it can.
    /// [`RedisStore::health_check`] tells an orchestrator whether it is
    /// ready.
    ///
    /// # Errors
    ///
    /// On invalid settings, when the Redis it reaches is older than 7.0
    /// ([`RedisStoreError::UnsupportedVersion`]), or when it refuses the
    /// scripts.
    pub async fn connect(
        self,
        url: impl IntoConnectionInfo,
    ) -> Result<RedisStore<ManagedConnection>, RedisStoreError> {
        self.check()?;
        let client = redis::Client::open(url)?;
        let config = ManagedConnection::config(&self);
        let connection = ManagedConnection::connect(client, config, self.connect_budget()).await;
        self.build(connection).await
    }

    /// The connection settings of a `redis://`, `rediss://`,
    /// `redis+unix://` or `unix://` URL (and the `valkey` forms), to pass
    /// to [`connect`](Self::connect) or [`connect_pool`](Self::connect_pool).
    /// Unlike a URL passed to them as text, a URL refused here says why.
    ///
    /// ```
    /// use tollgate_redis::RedisStoreBuilder;
    ///
    /// assert!(RedisStoreBuilder::parse_url("redis://127.0.0.1:6379/2").is_ok());
    /// let err = RedisStoreBuilder::parse_url("foo://x").unwrap_err();
    /// assert!(err.to_string().contains("unknown URL scheme"), "{err}");
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidValue`] for an unknown scheme (naming it),
    /// [`ConfigError::InvalidSetting`] for a text that is not a URL, and
    /// [`RedisStoreError::Redis`] for a URL the redis crate refuses.
    pub fn parse_url(url: &str) -> Result<redis::ConnectionInfo, RedisStoreError> {
        connection_info(url)
    }
}

/// The schemes the redis crate connects with.
const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis+unix",
    "unix",
    "valkey",
    "valkeys",
    "valkey+unix",
];

/// The connection settings of `url`: an unknown scheme or a text that is
/// no URL is a [`ConfigError`] that says so (the redis crate says only
/// "Redis URL did not parse"); the rest is the redis crate's reading.
/// The URL itself is never part of the error: it may hold a password.
pub(crate) fn connection_info(url: &str) -> Result<ConnectionInfo, RedisStoreError> {
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(ConfigError::InvalidSetting {
            setting: "Redis URL",
            reason: "not a URL: expected redis://host:port, rediss://host:port or unix:///path",
        }
        .into());
    };
    if scheme == "redis+sentinel" {
        return Err(ConfigError::InvalidValue {
            setting: "Redis URL scheme",
            value: scheme.to_owned(),
            reason: "a Sentinel URL: connect with connect_sentinel_url",
        }
        .into());
    }
    if !SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) {
        return Err(ConfigError::InvalidValue {
            setting: "Redis URL scheme",
            value: scheme.to_owned(),
            reason: "unknown URL scheme: expected redis, rediss, redis+unix or unix \
                     (valkey, valkeys and valkey+unix too)",
        }
        .into());
    }
    Ok(url.into_connection_info()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_url_says_why() {
        let message = |url: &str| connection_info(url).unwrap_err().to_string();
        assert_eq!(
            message("foo://x"),
            "invalid Redis store configuration: invalid Redis URL scheme \"foo\": unknown URL \
             scheme: expected redis, rediss, redis+unix or unix (valkey, valkeys and valkey+unix too)"
        );
        assert_eq!(
            message("localhost"),
            "invalid Redis store configuration: invalid setting Redis URL: not a URL: expected \
             redis://host:port, rediss://host:port or unix:///path"
        );
        assert_eq!(
            message("redis+sentinel://10.0.0.1:26379/mymaster"),
            "invalid Redis store configuration: invalid Redis URL scheme \"redis+sentinel\": a \
             Sentinel URL: connect with connect_sentinel_url"
        );
        // A known scheme with a bad port: the redis crate's words.
        assert_eq!(
            message("redis://:s3cret@127.0.0.1:99999"),
            "invalid Redis client configuration: Redis URL did not parse - InvalidClientConfig"
        );
        assert!(connection_info("redis://127.0.0.1:6379/2").is_ok());
    }
}
