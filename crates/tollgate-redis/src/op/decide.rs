//! Deciding: the decision path (the deny cache, then a key's lane for
//! the general form or the batch of its word form, then breaker and
//! deadline around each call), and a decision's script and arguments.

use tollgate_core::{Decision, Key, Policy};

use crate::batch::{self, Batcher, Queued, Turn, WordCalls};
use crate::connect::RedisConnection;
use crate::deny_cache::Cached;
use crate::error::RedisStoreError;
use crate::identity::{run_id, server_time};
use crate::lanes::{self, GeneralCalls, Lanes};
use crate::op::form::Form;
use crate::op::general::{Arg, general_args};
use crate::op::word::{Request, Word, WordForm, WordOp, decision};
use crate::patience::Home;
use crate::store::{Inner, RedisStore};

impl<C: RedisConnection> RedisStore<C> {
    /// Decides like [`Store::check`](tollgate_core::Store::check), keeping the Redis-specific error.
    ///
    /// A cost-1 request to a single-limit policy whose key Redis recently
    /// denied is denied from the local deny cache until that denial
    /// expires, for at most a second after the denial's call was sent, or
    /// until the store finds that Redis restarted or the connection failed
    /// (see the Redis guide); anything else is one round trip, unless the
    /// circuit breaker is open. When Redis cannot decide, a denial it made
    /// that is still in force (of this cost or less, and not followed by
    /// an admission of such a cost) is the answer rather than the error: a
    /// key Redis cut off is not handed a fresh quota by the failure
    /// policy.
    ///
    /// # Errors
    ///
    /// A [`RedisStoreError`] when Redis fails, the deadline passes or the
    /// circuit breaker is open.
    pub async fn decide(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> Result<Decision, RedisStoreError> {
        let decision = self.decided(key, policy, cost).await?;
        Ok(decision.with_cost(cost))
    }

    /// [`RedisStore::decide`], but for the cost in the decision.
    async fn decided(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> Result<Decision, RedisStoreError> {
        let inner = &*self.inner;
        let state_key = inner.names.state_key(policy, key);
        let sent_at = inner.local_now();
        let sent = inner.deny_cache.sent(&state_key);
        let standing = match inner.deny_cache.lookup(&state_key, policy, cost, sent_at) {
            Cached::Denial(denied) => {
                #[cfg(feature = "metrics")]
                inner.count_hit(policy.name());
                self.check_server_identity();
                return Ok(denied);
            }
            Cached::Standing => true,
            Cached::Nothing => false,
        };
        let result = match Form::word_of(policy) {
            Some(form) => self.decide_word(form, &state_key, policy, cost).await,
            None => lanes::decide(&self.inner, &state_key, policy, cost).await,
        };
        match result {
            Ok(decision) => {
                if decision.is_allowed() {
                    if standing {
                        inner.deny_cache.admitted(&state_key, cost, sent_at);
                    }
                } else {
                    inner.deny_cache.insert(
                        &state_key,
                        policy,
                        cost,
                        (sent_at, inner.local_now(), sent),
                        &decision,
                    );
                }
                inner
                    .last_known
                    .record(&state_key, policy, &decision, sent_at);
                Ok(decision)
            }
            // A key Redis cut off stays cut off while Redis cannot answer:
            // a denial from the deny cache, counted as one (the failure is
            // not the caller's: its request is answered).
            Err(error) => {
                let denied = (inner.deny_cache)
                    .lookup_on_failure(&state_key, policy, cost, inner.local_now())
                    .ok_or(error)?;
                #[cfg(feature = "metrics")]
                inner.count_hit(policy.name());
                Ok(denied)
            }
        }
    }

    /// While the deny cache answers, asks Redis now and then which server
    /// it is, and clears the cache if it is another one (see
    /// [`ServerIdentity`]). Runs in the background: the denial is answered
    /// at once.
    fn check_server_identity(&self) {
        let inner = &*self.inner;
        let now_ms =
            u64::try_from(inner.wire.local_origin.elapsed().as_millis()).unwrap_or(u64::MAX / 2);
        if !inner.wire.connection.is_one_server() {
            return;
        }
        let Some(running) = inner.server.due(now_ms) else {
            return;
        };
        let Some(runtime) = crate::running::hand_on_runtime(&inner.home) else {
            return;
        };
        let inner = self.inner.clone();
        runtime.spawn(async move {
            let _running = running;
            let mut info = redis::cmd("INFO");
            info.arg("server");
            let reply =
                tokio::time::timeout(inner.deadline, inner.wire.connection.query(&info)).await;
            let moved = match reply {
                Ok(Ok(info)) => {
                    inner.wire.saw_time(server_time(&info));
                    run_id(&info).is_some_and(|id| inner.server.saw(id))
                }
                Ok(Err(error)) => error.is_connection_lost(),
                Err(_) => false,
            };
            if moved {
                inner.deny_cache.forget();
            }
        });
    }

    /// Decides a one-time or window-word request: sent at once, alone,
    /// when a place is free (or the store does not batch), else in the
    /// next call of the queued requests of its kind. The call has the
    /// store's deadline and answers to the breaker; a request that waits
    /// in the queue waits on while the calls ahead are answered (see
    /// [`batch::wait`]), and its wait is no failure of Redis: the breaker
    /// does not count it.
    async fn decide_word(
        &self,
        form: &'static dyn WordForm,
        state_key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Result<Decision, RedisStoreError> {
        let inner = &self.inner;
        let request = word_request(form, state_key, policy, cost);
        let (now, word) = match batch::enter(inner, form, request) {
            Turn::Full => return Err(RedisStoreError::QueueFull),
            Turn::Queued(reply, seq) => match inner.batcher(form) {
                Some(batcher) => {
                    let handed_out = || inner.wire.connection.handed_out();
                    batch::wait(batcher, &inner.home, reply, seq, handed_out).await?
                }
                None => {
                    return Err(RedisStoreError::Protocol(
                        "a queued request of a kind the store does not batch".into(),
                    ));
                }
            },
            // Sent alone, exactly as without batching, holding its place
            // until the reply is in.
            Turn::Now(place) => {
                // Unbatched (batching off, or a cluster), a call takes a
                // place among the store's unbatched calls on their way.
                let requests = [request];
                let call = inner.wire.send(form, &requests);
                let words = match inner.batcher(form) {
                    Some(_) => inner.guarded(state_key, call).await,
                    None => inner.gated(state_key, call).await,
                };
                if words.is_ok() {
                    place.answered();
                }
                drop(place);
                words?
                    .first()
                    .copied()
                    .ok_or_else(|| RedisStoreError::Protocol("no word in the reply".into()))?
            }
        };
        decided(form, policy, now, word, cost)
    }
}

/// The word-script request of a decision of `cost` under `policy`.
pub(crate) fn word_request<'a>(
    form: &dyn WordForm,
    state_key: &'a str,
    policy: &'a Policy,
    cost: u64,
) -> Request<'a> {
    let (period, step, slack) = form.check_args(policy, cost);
    Request {
        key: state_key,
        period,
        step,
        slack,
        policy,
    }
}

/// The decision on a word the script replied, at Redis's `now`.
pub(crate) fn decided(
    form: &dyn WordForm,
    policy: &Policy,
    now: u64,
    word: u64,
    cost: u64,
) -> Result<Decision, RedisStoreError> {
    decision(form, policy, now, word, WordOp::Check(cost))
        .ok_or_else(|| RedisStoreError::Protocol("a word for a general policy".into()))
}

impl<C: RedisConnection> WordCalls for Inner<C> {
    fn batcher(&self, form: &dyn WordForm) -> Option<&Batcher> {
        Some(self.batchers.as_ref()?.of(form.batcher()))
    }

    fn home(&self) -> &Home {
        &self.home
    }

    async fn call_queued(
        &self,
        form: &dyn WordForm,
        batch: &[Queued],
    ) -> Result<Vec<Word>, RedisStoreError> {
        let key = batch.first().map_or("", |q| q.request().key);
        let requests: Vec<Request<'_>> = batch.iter().map(Queued::request).collect();
        self.guarded(key, self.wire.send(form, &requests)).await
    }
}

impl<C: RedisConnection> GeneralCalls for Inner<C> {
    fn lanes(&self) -> &Lanes {
        &self.lanes
    }

    fn home(&self) -> &Home {
        &self.home
    }

    async fn call_general(
        &self,
        key: &str,
        policy: &Policy,
        costs: &[u64],
    ) -> Result<Vec<Decision>, RedisStoreError> {
        self.gated(key, self.wire.general(key, policy, costs)).await
    }
}

/// The source of the script that decides for `policy`, as sent (see
/// `testing::script_source`).
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) fn source(policy: &Policy) -> &'static str {
    match Form::word_of(policy) {
        Some(form) => form.source(),
        None => crate::algorithm::unit(policy.algorithm()).script,
    }
}

/// Feeds the `ARGV` of one decision to `arg`: `now` in µs, or 0 for Redis
/// TIME, and the shortest TTL in ms.
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) fn for_each_arg(
    policy: &Policy,
    cost: u64,
    now: u64,
    min_ttl_ms: u64,
    mut arg: impl FnMut(Arg<'_>),
) {
    let Some(form) = Form::word_of(policy) else {
        // Calendar periods around now, or around this machine's clock when
        // the script reads Redis's.
        let around = if now > 0 {
            now
        } else {
            tollgate_core::Clock::now(&tollgate_core::SystemClock).as_micros()
        };
        return general_args(policy, Arg::Number(cost), (now, around), min_ttl_ms, arg);
    };
    // The request's one argument.
    let request = form.check_arg(&word_request(form, "", policy, cost));
    arg(Arg::Text(&request.to_text()));
    // On Redis's clock, the script needs nothing more.
    if now > 0 {
        arg(Arg::Number(now));
        arg(Arg::Number(min_ttl_ms));
    }
}
