//! The wire: script calls by `EVALSHA` (with the `NOSCRIPT` retry), and
//! each form's arguments and replies (`words.rs` for the word scripts,
//! `general.rs` for the others). It knows nothing of deadlines, breakers
//! or caches: the store's decision path wraps every call in those.

use std::sync::Arc;
use std::time::Instant;

use redis::{ErrorKind, ServerErrorKind};
use tollgate_core::{Clock, Policy};

use crate::connect::RedisConnection;
use crate::error::RedisStoreError;
use crate::script::{DecisionScript, Scripts};
use crate::shape::Form;

mod general;
mod slots;
mod words;

pub(crate) use words::{RedisClock, WriteOrder};

/// What the script says of one request: Redis's `now` and the key's time
/// before the request (0 for an expired key), both in µs.
/// Redis's time and a request's old word (see the word scripts), both in
/// µs; the word flagged [`BLOCKED`] for a key blocked until then.
pub(crate) type Word = (u64, u64);

pub(crate) use crate::shape::BLOCKED;

/// One request to a word script: its state key and numbers (see
/// `script::tat_args` and `script::window_word_args`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request<'a> {
    pub(crate) key: &'a str,
    /// The window's period in µs (window words; 0 for one-time requests).
    pub(crate) period: u64,
    pub(crate) step: u64,
    pub(crate) slack: u64,
    /// The request's policy, whose descriptor the script writes the state
    /// under.
    pub(crate) policy: &'a Policy,
}

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
}

impl<C: RedisConnection> Wire<C> {
    /// Decides `requests` of a word form in one call of its script, in
    /// order, and returns each request's word.
    pub(crate) async fn send(
        &self,
        form: Form,
        requests: &[Request<'_>],
    ) -> Result<Vec<Word>, RedisStoreError> {
        match form {
            Form::Tat => self.send_tats(requests).await,
            Form::WindowWord => self.send_window_words(requests).await,
            Form::General => Err(RedisStoreError::Protocol(
                "a general policy has no word script".into(),
            )),
        }
    }

    /// Now in µs and the shortest TTL in ms to send to a script: both 0 on
    /// Redis's clock. Under a test clock, keys live at least
    /// TEST_CLOCK_MIN_TTL of real time: fake time does not pass with
    /// Redis's, and state that is still live in fake time must not expire
    /// in real time.
    fn test_time(&self) -> (u64, u64) {
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
    async fn eval(
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

fn reclassify(error: RedisStoreError) -> RedisStoreError {
    match error {
        RedisStoreError::Redis(e) => crate::error::classify(e),
        other => other,
    }
}

/// The shortest TTL under a test clock: ten minutes.
const TEST_CLOCK_MIN_TTL_MS: u64 = 600_000;
