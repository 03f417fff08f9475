//! Errors of the Redis store.

use std::time::Duration;

use tollgate_core::{ConfigError, StoreError};

/// Why the Redis store could not be built or could not decide.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisStoreError {
    /// A setting is invalid; the message names it and why.
    #[error("invalid Redis store configuration: {0}")]
    Config(#[from] ConfigError),
    /// Redis cannot serve the request right now (`READONLY`, `MASTERDOWN`,
    /// `LOADING`, `CLUSTERDOWN`, `TRYAGAIN` or `OOM`): the connection is
    /// refreshed and the caller's failure policy applies.
    #[error("redis is unavailable ({code}): {source}")]
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
    /// Redis answered with an error, the connection failed, or the redis
    /// client refused its settings; the message says which, and why (such
    /// as "Connection refused").
    #[error("{kind}: {0}", kind = failure_of(.0))]
    Redis(#[from] redis::RedisError),
    /// The store has no connection to Redis yet: Redis was unreachable
    /// when the store was built and has not answered since. A connection
    /// is being made in the background; meanwhile the caller's failure
    /// policy applies.
    #[error("no connection to Redis yet: {reason}")]
    NotConnected {
        /// Why the last attempt to connect failed.
        reason: String,
    },
    /// No pooled connection became free within the pool's checkout timeout,
    /// while the pool handed none to any other call and our runtime ran its
    /// timer on time (or, at the store's ceiling, none during the whole
    /// wait): the pool's connections cannot be made, or do not answer its
    /// checks. It counts towards the circuit breaker.
    #[error("no pooled Redis connection became free within the checkout timeout")]
    PoolTimeout,
    /// Every pooled connection stayed in use by the app's other calls for
    /// the store's ceiling (four deadlines), while the pool kept handing
    /// them out: this call queued behind the app's own load. Also a wait
    /// whose timers our own runtime ran past the ceiling and a slack (a
    /// stall of the whole process), while Redis answered a call within the
    /// last second (see [`Late`](Self::Late)). (A call made
    /// outside a decision, such as a health check or a ledger flush, gives
    /// up after one checkout timeout.) As
    /// [`QueueFull`](Self::QueueFull), no failure policy decides it (as a
    /// `StoreError` it is [`Overloaded`](tollgate_core::StoreError::Overloaded))
    /// and the circuit breaker does not count it.
    #[error("every pooled Redis connection stayed in use by the app's other calls")]
    PoolBusy,
    /// More requests are waiting for Redis than the store queues: more of
    /// one key behind its call than its lane holds, or more single-limit
    /// requests than the batch queue holds (see the Redis guide,
    /// "Bursts"). The request was never sent: it is the app's own load,
    /// so no failure policy decides it (as a `StoreError` it is
    /// [`Overloaded`](tollgate_core::StoreError::Overloaded), which is
    /// refused under every mode) and the circuit breaker does not count it.
    #[error("too many requests are waiting for Redis")]
    QueueFull,
    /// The decision took longer than the per-decision deadline.
    #[error("redis did not decide within the deadline of {0:?}")]
    Deadline(Duration),
    /// The call's reply was not read within the store's ceiling (four
    /// deadlines) because our own runtime was too busy to run it: at the
    /// ceiling, and at a last look a quarter of a deadline after, its
    /// timer fired late or ready tasks waited for a worker, while Redis
    /// answered a call within the last second (or two ceilings; else it
    /// is a [`Deadline`](Self::Deadline)). Also a request that waited two
    /// ceilings for a place among the general script's calls so. The
    /// app's own load: as a `StoreError` it is
    /// [`Late`](tollgate_core::StoreError::Late), which no failure policy
    /// decides, and the circuit breaker does not count it. Redis may have
    /// run the call.
    #[error("our runtime was too busy to read redis's reply within {0:?}")]
    Late(Duration),
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
            Self::NotConnected { .. } => true,
            Self::Config(_)
            | Self::Unavailable { .. }
            | Self::CircuitOpen
            | Self::PoolTimeout
            | Self::PoolBusy
            | Self::QueueFull
            | Self::Deadline(_)
            | Self::Late(_)
            | Self::UnsupportedVersion { .. }
            | Self::Protocol(_) => false,
        }
    }

    /// Whether Redis answered the call, in time, with an error about the
    /// data it was asked of (`WRONGTYPE`: a key under the prefix that a
    /// foreign writer gave a type of its own): not a sign of a Redis in
    /// trouble, which the breaker counts, but of that key alone.
    pub(crate) fn is_data_error(&self) -> bool {
        match self {
            Self::Redis(e) => e.code() == Some("WRONGTYPE"),
            Self::Config(_)
            | Self::Unavailable { .. }
            | Self::NotConnected { .. }
            | Self::CircuitOpen
            | Self::PoolTimeout
            | Self::PoolBusy
            | Self::QueueFull
            | Self::Deadline(_)
            | Self::Late(_)
            | Self::UnsupportedVersion { .. }
            | Self::Protocol(_) => false,
        }
    }

    /// Whether the connection should be made anew: Redis turned the call
    /// away (a replica after a failover, a server still loading, ...), so
    /// the server behind the address may have changed.
    pub(crate) fn wants_refresh(&self) -> bool {
        match self {
            Self::Unavailable { .. } => true,
            Self::Config(_)
            | Self::Redis(_)
            | Self::NotConnected { .. }
            | Self::CircuitOpen
            | Self::PoolTimeout
            | Self::PoolBusy
            | Self::QueueFull
            | Self::Deadline(_)
            | Self::Late(_)
            | Self::UnsupportedVersion { .. }
            | Self::Protocol(_) => false,
        }
    }

    /// Whether Redis may have run the call before this error: it missed
    /// its deadline, the connection failed on the way, or Redis answered
    /// something other than a reply. Not when the call was never sent.
    pub(crate) fn may_have_acted(&self) -> bool {
        match self {
            Self::Redis(e) => !e.is_connection_refusal(),
            Self::Deadline(_) | Self::Late(_) | Self::Protocol(_) => true,
            Self::Config(_)
            | Self::Unavailable { .. }
            | Self::CircuitOpen
            | Self::NotConnected { .. }
            | Self::PoolTimeout
            | Self::PoolBusy
            | Self::QueueFull
            | Self::UnsupportedVersion { .. } => false,
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
            Self::NotConnected { reason } => Self::NotConnected {
                reason: reason.clone(),
            },
            Self::PoolTimeout => Self::PoolTimeout,
            Self::PoolBusy => Self::PoolBusy,
            Self::QueueFull => Self::QueueFull,
            Self::Deadline(d) => Self::Deadline(*d),
            Self::Late(d) => Self::Late(*d),
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
            RedisStoreError::Late(d) => StoreError::Late(d),
            RedisStoreError::CircuitOpen => StoreError::CircuitOpen,
            // The store's own queue, or the pool's: the app's load, which
            // no failure policy decides.
            RedisStoreError::QueueFull | RedisStoreError::PoolBusy => StoreError::Overloaded,
            // Never run: no connection, or Redis turned the call away.
            other @ (RedisStoreError::Unavailable { .. }
            | RedisStoreError::NotConnected { .. }
            | RedisStoreError::PoolTimeout) => StoreError::unavailable(other),
            RedisStoreError::Redis(e) if e.is_connection_refusal() => {
                StoreError::unavailable(RedisStoreError::Redis(e))
            }
            other @ (RedisStoreError::Config(_)
            | RedisStoreError::Redis(_)
            | RedisStoreError::UnsupportedVersion { .. }
            | RedisStoreError::Protocol(_)) => StoreError::backend(other),
        }
    }
}

/// What kind of failure `error` is, in words: the start of its message.
fn failure_of(error: &redis::RedisError) -> &'static str {
    match error.kind() {
        redis::ErrorKind::InvalidClientConfig => "invalid Redis client configuration",
        redis::ErrorKind::MasterNameNotFoundBySentinel => "no sentinel knows the service",
        redis::ErrorKind::EmptySentinelList => "no sentinel to ask",
        _ if error.is_timeout() => "redis did not answer in time",
        _ if error.is_connection_refusal()
            || error.is_io_error()
            || error.is_connection_dropped() =>
        {
            "redis connection failed"
        }
        // redis's `ErrorKind` is not ours, and grows: any other kind is
        // an answer from Redis.
        _ => "redis command failed",
    }
}

/// Error codes after which the connection reaches the wrong server or
/// Redis cannot serve for now. Redis refuses with each before the call, or
/// a script's first write, makes a change: too few replicas for
/// `min-replicas-to-write` (`NOREPLICAS`, a master cut off from its
/// replicas) and a failed save under `stop-writes-on-bgsave-error`
/// (`MISCONF`) as memory at its limit (`OOM`) does; a script of another
/// client's running past `busy-reply-threshold` (`BUSY`) turns every call
/// away unrun, as loading data does (`LOADING`).
const UNAVAILABLE: &[&str] = &[
    "READONLY",
    "MASTERDOWN",
    "LOADING",
    "BUSY",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "OOM",
    "NOREPLICAS",
    "MISCONF",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_cause() {
        let config = RedisStoreError::from(ConfigError::InvalidSetting {
            setting: "batch_size",
            reason: "must be at least 1 (1 turns batching off)",
        });
        assert_eq!(
            config.to_string(),
            "invalid Redis store configuration: invalid setting batch_size: must be at least 1 \
             (1 turns batching off)"
        );
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused here");
        assert_eq!(
            RedisStoreError::from(redis::RedisError::from(refused)).to_string(),
            "redis connection failed: refused here"
        );
        let unknown = redis::RedisError::from((
            redis::ErrorKind::MasterNameNotFoundBySentinel,
            "Master with given name not found in sentinel",
        ));
        assert_eq!(
            RedisStoreError::from(unknown).to_string(),
            "no sentinel knows the service: Master with given name not found in sentinel - \
             MasterNameNotFoundBySentinel"
        );
        let bad_url = redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "Redis URL did not parse",
        ));
        assert_eq!(
            RedisStoreError::from(bad_url).to_string(),
            "invalid Redis client configuration: Redis URL did not parse - InvalidClientConfig"
        );
        let readonly = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        let unavailable = classify(readonly);
        assert!(matches!(unavailable, RedisStoreError::Unavailable { .. }));
        assert!(
            unavailable
                .to_string()
                .starts_with("redis is unavailable (READONLY): "),
            "{unavailable}"
        );
        assert!(
            unavailable.to_string().contains("read only replica"),
            "{unavailable}"
        );
        // The store error a layer logs says it too.
        let store = StoreError::from(RedisStoreError::from(ConfigError::ZeroBurst));
        assert_eq!(
            store.to_string(),
            "store backend failed: invalid Redis store configuration: burst must be at least 1, got 0"
        );
    }

    /// The store error a layer sees says what the Redis error says of
    /// whether Redis may have run the call, for every error a call can end
    /// with: a refused connection, no connection yet, an empty pool or a
    /// call Redis turned away ran nowhere (they were all `Backend`, which
    /// "may have acted": a refused refund counted against a lease for
    /// 10 s, and a refused in-flight acquire was given back).
    #[test]
    fn a_store_error_may_have_acted_as_its_redis_error_says() {
        let io = |kind, message| {
            RedisStoreError::from(redis::RedisError::from(std::io::Error::new(kind, message)))
        };
        let readonly = classify(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        )));
        let script = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "ERR user_script:1: boom",
        ));
        let calls = [
            (
                io(std::io::ErrorKind::ConnectionRefused, "refused"),
                "unavailable",
            ),
            (io(std::io::ErrorKind::ConnectionReset, "reset"), "backend"),
            (io(std::io::ErrorKind::BrokenPipe, "broken pipe"), "backend"),
            (readonly, "unavailable"),
            (RedisStoreError::Redis(script), "backend"),
            (
                RedisStoreError::NotConnected {
                    reason: "refused".into(),
                },
                "unavailable",
            ),
            (RedisStoreError::PoolTimeout, "unavailable"),
            (
                RedisStoreError::Deadline(Duration::from_millis(5)),
                "timeout",
            ),
            (RedisStoreError::Protocol("no decision".into()), "backend"),
            (RedisStoreError::CircuitOpen, "circuit_open"),
            (RedisStoreError::QueueFull, "overloaded"),
            (RedisStoreError::PoolBusy, "overloaded"),
        ];
        for (error, kind) in calls {
            let acted = error.may_have_acted();
            let message = error.to_string();
            let store = StoreError::from(error);
            assert_eq!(store.kind(), kind, "{message}");
            assert_eq!(store.may_have_acted(), acted, "{message}");
        }
    }

    /// A server that is not there: the operating system's reason, whatever
    /// connects to it (this asks the redis crate directly, so that it holds
    /// however the store's own connect treats an unreachable server).
    #[tokio::test]
    async fn an_unreachable_server_is_named_as_refused() {
        // Port 1 (tcpmux) has no listener on any machine the tests run on.
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let error = client
            .get_multiplexed_async_connection()
            .await
            .map(drop)
            .unwrap_err();
        let message = RedisStoreError::from(error).to_string();
        assert!(
            message.starts_with("redis connection failed: "),
            "{message}"
        );
        assert!(message.contains("Connection refused"), "{message}");
    }
}
