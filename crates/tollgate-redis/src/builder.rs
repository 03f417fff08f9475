//! Configuring a [`RedisStore`](crate::RedisStore): the settings and their checks. Each
//! connection mode connects in its own file of `connect/`.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Clock, ConfigError};

use crate::breaker::CircuitBreaker;

use crate::keys::KeyNamer;

/// Configures a [`RedisStore`](crate::RedisStore).
///
/// The defaults suit a request path: a decision waits at most 50 ms (the
/// connection's response timeout, a backstop behind it, is 1 s), a new
/// connection 100 ms and a pool checkout 25 ms.
#[derive(Debug)]
#[must_use = "call .connect(url) to get the store"]
pub struct RedisStoreBuilder {
    pub(crate) prefix: String,
    pub(crate) secret: Option<Vec<u8>>,
    pub(crate) deadline: Duration,
    pub(crate) connect_timeout: Duration,
    /// `None`: one deadline past the deadline's hard ceiling.
    pub(crate) response_timeout: Option<Duration>,
    pub(crate) pool_size: u32,
    pub(crate) checkout_timeout: Duration,
    pub(crate) clock: Option<Arc<dyn Clock>>,
    pub(crate) breaker_threshold: u32,
    pub(crate) breaker_cooldown: Duration,
    pub(crate) breaker_ranges: usize,
    pub(crate) deny_cache: usize,
    pub(crate) batch_size: usize,
    pub(crate) write_first: Option<bool>,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        Self {
            prefix: "tollgate".to_owned(),
            secret: None,
            deadline: Duration::from_millis(50),
            connect_timeout: Duration::from_millis(100),
            response_timeout: None,
            pool_size: 16,
            checkout_timeout: Duration::from_millis(25),
            clock: None,
            breaker_threshold: 5,
            breaker_cooldown: Duration::from_secs(1),
            breaker_ranges: 1,
            deny_cache: 10_000,
            batch_size: 64,
            write_first: None,
        }
    }
}

impl RedisStoreBuilder {
    /// The first part of every key (default `tollgate`): 1 to 64 visible
    /// ASCII characters without braces.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Mixes a secret into the key hashes, so that key names cannot be
    /// linked to identities (such as IPv4 addresses) by hashing guesses.
    /// All servers sharing limits need the same secret.
    pub fn key_secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.secret = Some(secret.into());
        self
    }

    /// The longest a decision may take, from call to reply (default 50 ms);
    /// on a bb8 pool, from the moment the call has its connection.
    ///
    /// This and the other timeouts must be above zero and at most a day:
    /// building the store fails with a
    /// [`ConfigError::InvalidSetting`](tollgate_core::ConfigError::InvalidSetting)
    /// naming the setting otherwise.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// How long establishing a connection may take (default 100 ms).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long the connection waits for Redis to answer a command before
    /// it fails the command itself (default: 5 × the deadline, one past
    /// the deadline's hard ceiling, and at least 1 s, so the store's own
    /// deadline judges first, on a single server and on a cluster; a bb8
    /// pool's connections keep the redis crate's own).
    ///
    /// The store tells a late Redis from a late app: a deadline that fires
    /// late because the app's runtime was too busy to poll it is no
    /// failure, and the request waits on for its reply up to 4 × the
    /// deadline, and, if the app was stalled past that, a quarter of a
    /// deadline more once it runs again. The connection's response timeout
    /// cannot tell them apart, so a response timeout under that ceiling
    /// counts the app's own overload as Redis's failure again; and one
    /// that fires in a call the app was too stalled to poll drops a reply
    /// that may have been in.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_redis::RedisStore;
    ///
    /// let builder = RedisStore::builder()
    ///     .deadline(Duration::from_millis(20))
    ///     .response_timeout(Duration::from_millis(100));
    /// # let _ = builder;
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = Some(timeout);
        self
    }

    /// The connection's response timeout: as set, or one deadline past
    /// the deadline's hard ceiling, and at least a second.
    pub(crate) fn response_timeout_or_default(&self) -> Duration {
        self.response_timeout
            .unwrap_or_else(|| crate::patience::backstop(self.deadline))
    }

    /// How long making a connection manager's connection may take in all,
    /// the first one or a replacement: two connect timeouts.
    pub(crate) fn connect_budget(&self) -> Duration {
        self.connect_timeout * 2
    }

    /// The size of a bb8 pool (default 16).
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// How long one checkout of a pooled connection waits (default 25 ms,
    /// never bb8's 30 s). A checkout that times out while the pool handed
    /// out no connection is a failure; one that times out while the pool
    /// served the app's other calls is the app's own load, and the request
    /// waits again, up to the store's ceiling (see
    /// [`RedisStoreError::PoolBusy`](crate::RedisStoreError::PoolBusy)).
    pub fn pool_checkout_timeout(mut self, timeout: Duration) -> Self {
        self.checkout_timeout = timeout;
        self
    }

    /// The circuit breaker: open after `threshold` consecutive failures or
    /// missed deadlines (default 5), for `cooldown` (default 1 s) before one
    /// probe goes through. While open, decisions fail at once with
    /// [`RedisStoreError::CircuitOpen`](crate::RedisStoreError::CircuitOpen), adding no latency, and the
    /// caller's failure policy applies. `threshold` must be at least 1, and
    /// `cooldown` above zero and at most a day.
    pub fn circuit_breaker(mut self, threshold: u32, cooldown: Duration) -> Self {
        self.breaker_threshold = threshold;
        self.breaker_cooldown = cooldown;
        self
    }

    /// The most denials the local deny cache holds (default 10,000; 0
    /// turns it off). While Redis answers, it answers locally only the
    /// denials of requests of cost 1 under a policy of one limit (it keeps
    /// the others to answer while Redis fails): such a key denied until a
    /// time is denied locally until then, asking Redis again about once a
    /// second: a client hammering an exhausted limit costs Redis next to
    /// nothing, and decisions stay
    /// exact, but for what another app server did to the key (a reset, a
    /// block, a refund, a changed configuration), which reaches this one
    /// within a second. The store remembers
    /// the last decision of as many keys for a local fallback to take over
    /// ([`Store::last_known`](tollgate_core::Store::last_known)).
    pub fn deny_cache(mut self, max_entries: usize) -> Self {
        self.deny_cache = max_entries;
        self
    }

    /// The most requests one script call decides (default 64; 1 turns
    /// batching off). While a store has calls on their way to Redis,
    /// further requests of single-limit GCRA, token-bucket and
    /// leaky-bucket policies queue and go together in the next call, in
    /// the order they came, each decided as if alone; so do those of
    /// single fixed-window limits, in calls of their own. A store without
    /// concurrent requests sends each alone at once. Under load this
    /// divides Redis's CPU per decision and the client's work per
    /// round trip by the batch (see `BENCHMARKS.md`). Only on connections
    /// to one server ([`RedisConnection::is_one_server`](crate::RedisConnection::is_one_server)): on a cluster,
    /// keys of different slots cannot share a script call.
    ///
    /// ```
    /// use tollgate_redis::RedisStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    /// let store = RedisStore::builder().batch_size(16).connect(url.as_str()).await?;
    /// # drop(store);
    /// // 1 turns batching off; 0 is no batch size.
    /// let err = RedisStore::builder().batch_size(0).connect(url.as_str()).await.unwrap_err();
    /// assert!(err.to_string().contains("invalid Redis store configuration"));
    /// # Ok(())
    /// # }
    /// ```
    pub fn batch_size(mut self, max_requests: usize) -> Self {
        self.batch_size = max_requests;
        self
    }

    /// **Test hook.** Makes the one-time script always write first
    /// (`true`: `SET ... NX GET`) or always read first (`false`: `GET`),
    /// instead of choosing by how many recent requests found their key
    /// busy, so that tests can hold both ways to the same results.
    #[doc(hidden)]
    pub fn test_write_first(mut self, write_first: bool) -> Self {
        self.write_first = Some(write_first);
        self
    }

    /// **Test hook.** Sends `clock`'s time to the scripts instead of letting
    /// them read Redis `TIME`, so tests can drive Redis with a
    /// [`FakeClock`](tollgate_core::FakeClock). Keys then live at least ten
    /// minutes of real time, because fake time does not pass with Redis's.
    /// Never use it in production: servers' clocks disagree.
    ///
    /// Not Tokio's paused clock: under `start_paused`, a runtime waiting on
    /// Redis's reply has nothing else to do, so Tokio moves its clock past
    /// the store's deadline at once, and every call fails as late. Drive
    /// limiter time with this clock, on a runtime whose clock runs.
    pub fn test_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Checks the settings: the key namer they make, or why they cannot.
    pub(crate) fn check(&self) -> Result<KeyNamer, ConfigError> {
        CircuitBreaker::new(self.breaker_threshold, self.breaker_cooldown)?;
        // The response timeout's default, from the deadline, needs no check
        // of its own.
        let positive = [
            ("deadline", Some(self.deadline)),
            ("connect_timeout", Some(self.connect_timeout)),
            ("response_timeout", self.response_timeout),
            ("pool_checkout_timeout", Some(self.checkout_timeout)),
        ];
        for (setting, value) in positive.into_iter().filter_map(|(s, v)| Some((s, v?))) {
            if value.is_zero() {
                return Err(ConfigError::InvalidSetting {
                    setting,
                    reason: "must be greater than zero",
                });
            }
            // Waits are added to clock readings (a deadline's ceiling is
            // four of it): a day keeps every sum far from overflow.
            if value > crate::patience::MAX_WAIT {
                return Err(ConfigError::InvalidSetting {
                    setting,
                    reason: "must be at most a day",
                });
            }
        }
        if self.batch_size == 0 {
            return Err(ConfigError::InvalidSetting {
                setting: "batch_size",
                reason: "must be at least 1 (1 turns batching off)",
            });
        }
        if self.pool_size == 0 {
            return Err(ConfigError::InvalidSetting {
                setting: "pool_size",
                reason: "must be at least 1",
            });
        }
        KeyNamer::new(&self.prefix, self.secret.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_typed_errors() {
        let err = RedisStoreBuilder::default()
            .deadline(Duration::ZERO)
            .check()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid setting deadline: must be greater than zero"
        );
        // "No deadline" is not one: a store's wait always ends.
        let err = RedisStoreBuilder::default()
            .deadline(Duration::MAX)
            .check()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid setting deadline: must be at most a day"
        );
        let err = RedisStoreBuilder::default()
            .pool_checkout_timeout(Duration::from_secs(86_401))
            .check()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid setting pool_checkout_timeout: must be at most a day"
        );
        let day = Duration::from_secs(86_400);
        RedisStoreBuilder::default()
            .deadline(day)
            .connect_timeout(day)
            .pool_checkout_timeout(day)
            .check()
            .unwrap();
        let err = RedisStoreBuilder::default()
            .circuit_breaker(5, Duration::MAX)
            .check()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid setting breaker_cooldown: must be at most a day"
        );
        let err = RedisStoreBuilder::default()
            .pool_size(0)
            .check()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid setting pool_size: must be at least 1"
        );
        let err = RedisStoreBuilder::default()
            .prefix("a{b")
            .check()
            .unwrap_err();
        assert!(
            err.to_string().starts_with("invalid setting prefix"),
            "{err}"
        );
    }
}
