//! Reading a Redis URL, with the reason a URL is refused.

use redis::{ConnectionInfo, IntoConnectionInfo};
use tollgate_core::ConfigError;

use crate::error::RedisStoreError;

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
