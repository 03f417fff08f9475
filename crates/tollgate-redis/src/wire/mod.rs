//! The wire: script calls by `EVALSHA` (with the `NOSCRIPT` retry), the
//! time sent to them under a test clock, and the estimates the word
//! scripts' calls keep. Each operation's arguments and replies are in
//! its own file of `op/`. It knows nothing of deadlines, breakers or
//! caches: the store wraps every call in those.

use std::sync::Arc;
use std::time::Instant;

use redis::{ErrorKind, ServerErrorKind};
use tollgate_core::Clock;

use crate::connect::RedisConnection;
use crate::error::RedisStoreError;
use crate::script::{DecisionScript, Scripts};

mod estimates;

pub(crate) use estimates::{RedisClock, WriteOrder};

/// Sends script calls on one connection.
pub(crate) struct Wire<C> {
    pub(crate) connection: C,
    pub(crate) scripts: Scripts,
    /// A test clock, whose time the scripts are sent instead of reading
    /// Redis's.
    pub(crate) clock: Option<Arc<dyn Clock>>,
    /// Whether the one-time script writes or reads first.
    pub(crate) order: WriteOrder,
    /// Redis's clock, as its recent replies showed it.
    pub(crate) redis_clock: RedisClock,
    pub(crate) local_origin: Instant,
}

impl<C> Wire<C> {
    /// Local time in µs: the test clock's if there is one, otherwise
    /// monotonic time since the store was built.
    pub(crate) fn local_now(&self) -> u64 {
        match &self.clock {
            Some(clock) => clock.now().as_micros(),
            None => u64::try_from(self.local_origin.elapsed().as_micros()).unwrap_or(u64::MAX / 2),
        }
    }

    /// Redis's clock read `redis_now` in a reply read just now (if it was
    /// read, and not under a test clock, whose time Redis does not keep).
    pub(crate) fn saw_time(&self, redis_now: Option<u64>) {
        if let (Some(redis_now), None) = (redis_now, &self.clock) {
            self.redis_clock.saw(redis_now, self.local_now());
        }
    }
}

impl<C: RedisConnection> Wire<C> {
    /// Now in µs and the shortest TTL in ms to send to a script: both 0 on
    /// Redis's clock. Under a test clock, keys live at least
    /// TEST_CLOCK_MIN_TTL of real time: fake time does not pass with
    /// Redis's, and state that is still live in fake time must not expire
    /// in real time.
    pub(crate) fn test_time(&self) -> (u64, u64) {
        match &self.clock {
            Some(clock) => (clock.now().as_micros(), TEST_CLOCK_MIN_TTL_MS),
            None => (0, 0),
        }
    }

    /// Runs `script` by `EVALSHA`, with the keys and arguments `args` adds,
    /// on the server of `key`. On `NOSCRIPT`, which means nothing ran
    /// (Redis restarted, failed over or flushed its scripts), sends the
    /// source once, which runs the script and caches it in a single step
    /// that no flush can race.
    pub(crate) async fn eval(
        &self,
        key: &str,
        script: &DecisionScript,
        (count, bytes): (usize, usize),
        args: impl Fn(&mut redis::Cmd),
    ) -> Result<redis::Value, RedisStoreError> {
        let call = |command: &str, script: &str| {
            // Room for everything at once: a command grown argument by
            // argument reallocates its buffers four or five times.
            let mut cmd =
                redis::Cmd::with_capacity(2 + count, command.len() + script.len() + bytes);
            cmd.arg(command).arg(script);
            args(&mut cmd);
            cmd
        };
        match self
            .connection
            .query_for_key(key, &call("EVALSHA", &script.sha))
            .await
        {
            Err(RedisStoreError::Redis(e))
                if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
            {
                self.connection
                    .query_for_key(key, &call("EVAL", script.source))
                    .await
                    .map_err(reclassify)
            }
            other => other.map_err(reclassify),
        }
    }
}

/// `error`, with Redis's refusals that mean the server cannot serve now
/// (`READONLY`, `OOM`, ...) told apart (see [`crate::error::classify`]).
pub(crate) fn reclassify(error: RedisStoreError) -> RedisStoreError {
    match error {
        RedisStoreError::Redis(e) => crate::error::classify(e),
        other @ (RedisStoreError::Config(_)
        | RedisStoreError::Unavailable { .. }
        | RedisStoreError::CircuitOpen
        | RedisStoreError::NotConnected { .. }
        | RedisStoreError::PoolTimeout
        | RedisStoreError::PoolBusy
        | RedisStoreError::QueueFull
        | RedisStoreError::Deadline(_)
        | RedisStoreError::Late(_)
        | RedisStoreError::UnsupportedVersion { .. }
        | RedisStoreError::Protocol(_)) => other,
    }
}

/// The shortest TTL under a test clock: ten minutes.
const TEST_CLOCK_MIN_TTL_MS: u64 = 600_000;
