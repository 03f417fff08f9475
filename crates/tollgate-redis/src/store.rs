//! The store and its decision path: deny cache, then lanes or batches,
//! then breaker and deadline around each call on the wire.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tollgate_core::{Algorithm, Decision, Key, Policy, Settlement, Store, StoreError};

use crate::breaker::{BreakerState, CircuitBreaker};
use crate::builder::RedisStoreBuilder;

use crate::batch::{self, Batcher, Queued, Turn, WordCalls};
use crate::connect::ManagedConnection;
use crate::connect::RedisConnection;
use crate::deny_cache::DenyCache;
use crate::error::RedisStoreError;
use crate::identity::{ServerIdentity, run_id};
use crate::keys::KeyNamer;
use crate::known::LastKnown;
use crate::lanes::{self, GeneralCalls, Lanes};
use crate::patience;
use crate::shape::{Form, WordOp};
use crate::wire::{Request, Wire, Word};

/// A [`Store`] in Redis: every app server that points at the same Redis
/// shares one exact limit per key.
///
/// - **One round trip.** Each decision is one `EVALSHA` of a Lua script
///   that checks every limit of the policy and commits all or none. Under
///   concurrent load, decisions of single-limit GCRA, token-bucket and
///   leaky-bucket policies that arrive while a call is on its way share the
///   next call (see [`RedisStoreBuilder::batch_size`](crate::RedisStoreBuilder::batch_size)).
/// - **Redis's clock.** Time is read with `TIME` inside the script, so app
///   servers' clocks do not matter. (One exception, to the microsecond:
///   a single-limit decision of a key that holds a time reports only how
///   far ahead that time was, which decides it exactly, and
///   [`Decision::now`] is then Redis's time as the store's recent replies
///   showed it, within about half a round trip.)
/// - **Same decisions as memory.** The scripts implement the reference
///   algorithms of [`tollgate_core::state`] in exact integer arithmetic.
/// - **No leaks.** Every key written gets a TTL in the same script, exactly
///   as long as its state matters (rounded up to a millisecond).
/// - **Bounded waits.** Every decision has a deadline (50 ms by default);
///   a decision that misses it is a [`StoreError::Timeout`], never retried.
///   A deadline that fires late because the app's own runtime was too busy
///   to poll it is not Redis's failure: the decision waits on for its reply
///   (a reply already in is taken), up to 4 × the deadline, and only that
///   ceiling counts as a failure.
///
/// Keys are `<prefix>:<policy>:{<hash>}`, see [`RedisStoreBuilder::prefix`](crate::RedisStoreBuilder::prefix).
///
/// ```
/// use tollgate_core::{Algorithm, Key, Policy, Store};
/// use tollgate_redis::RedisStore;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
/// let store = RedisStore::connect(&url).await?;
/// let policy = Policy::new("doc-example", Algorithm::Gcra, "5/min")?;
/// let key = Key::user(format!("doc-{}", std::process::id()));
/// let decision = store.check(&key, &policy, 1).await?;
/// assert!(decision.is_allowed());
/// assert_eq!(decision.remaining(), 4);
/// # Ok(())
/// # }
/// ```
pub struct RedisStore<C = ManagedConnection> {
    pub(crate) inner: Arc<Inner<C>>,
}

pub(crate) struct Inner<C> {
    pub(crate) wire: Wire<C>,
    pub(crate) names: KeyNamer,
    pub(crate) deadline: Duration,
    /// Share script calls among concurrent one-time decisions, and among
    /// concurrent window-word decisions; `None` when batching is off or
    /// the connection reaches several servers.
    pub(crate) batchers: Option<[Batcher; 2]>,
    /// One breaker, or one per range of 128 hash slots on a cluster, so
    /// that a failed master does not stop calls to the healthy ones.
    pub(crate) breakers: Vec<CircuitBreaker>,
    pub(crate) deny_cache: DenyCache,
    /// Each recent key's last decision, for a local fallback to take over.
    pub(crate) last_known: LastKnown,
    /// The general scripts' requests waiting behind their key's call.
    pub(crate) lanes: Lanes,
    /// Which server the deny cache's denials came from.
    pub(crate) server: ServerIdentity,
    /// Deny-cache hit counters by policy name, registered once each, so a
    /// hit allocates nothing.
    /// The store-latency histogram, registered once.
    #[cfg(feature = "metrics")]
    pub(crate) latency: metrics::Histogram,
    #[cfg(feature = "metrics")]
    pub(crate) hit_counters:
        std::sync::RwLock<std::collections::HashMap<Box<str>, metrics::Counter>>,
}

impl<C> Inner<C> {
    /// Counts a denial answered from the deny cache.
    #[cfg(feature = "metrics")]
    fn count_hit(&self, policy: &str) {
        use std::sync::PoisonError;
        let counters = self
            .hit_counters
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(counter) = counters.get(policy) {
            counter.increment(1);
            return;
        }
        drop(counters);
        let counter = metrics::counter!(
            tollgate_core::telemetry::DENY_CACHE_HITS,
            "policy" => policy.to_owned()
        );
        counter.increment(1);
        self.hit_counters
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(policy.into(), counter);
    }
}

impl<C> Inner<C> {
    fn breaker(&self, state_key: &str) -> Option<&CircuitBreaker> {
        let range = if self.breakers.len() > 1 {
            usize::from(crate::keys::hash_slot(state_key) >> 7)
        } else {
            0
        };
        self.breakers
            .get(range.min(self.breakers.len().saturating_sub(1)))
    }

    pub(crate) fn local_now(&self) -> u64 {
        self.wire.local_now()
    }
}

impl RedisStore {
    /// Starts configuring a store.
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }
}

impl<C> RedisStore<C> {
    /// The connection the store runs on.
    pub fn connection(&self) -> &C {
        &self.inner.wire.connection
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        self.inner.names.prefix()
    }

    /// The state of the circuit breaker: on a cluster, the worst of the
    /// per-slot-range breakers.
    pub fn breaker_state(&self) -> BreakerState {
        let states = self.inner.breakers.iter().map(CircuitBreaker::state);
        states
            .max_by_key(|s| match s {
                BreakerState::Closed => 0,
                BreakerState::HalfOpen => 1,
                BreakerState::Open => 2,
            })
            .unwrap_or(BreakerState::Closed)
    }

    /// How many denials the local deny cache holds.
    pub fn deny_cache_len(&self) -> usize {
        self.inner.deny_cache.len()
    }

    /// The Redis key holding the state of `key` under `policy`. Sliding-log
    /// policies also use `<state key>:<limit index>`, one sorted set per limit.
    pub fn state_key(&self, policy: &Policy, key: &Key) -> String {
        self.inner.names.state_key(policy, key)
    }
}

impl<C: RedisConnection> RedisStore<C> {
    /// Decides like [`Store::check`], keeping the Redis-specific error.
    ///
    /// A cost-1 request to a single-limit policy whose key Redis recently
    /// denied is denied from the local deny cache until that denial
    /// expires, or until the store finds that Redis restarted or the
    /// connection failed (see the Redis guide); anything else is one round
    /// trip, unless the circuit breaker is open. When Redis cannot decide,
    /// a denial it made that is still in force (of this cost or less) is
    /// the answer rather than the error: a key Redis cut off is not handed
    /// a fresh quota by the failure policy.
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
        let inner = &*self.inner;
        let state_key = inner.names.state_key(policy, key);
        let sent_at = inner.local_now();
        if let Some(denied) = inner.deny_cache.lookup(&state_key, policy, cost, sent_at) {
            #[cfg(feature = "metrics")]
            inner.count_hit(policy.name());
            self.check_server_identity();
            return Ok(denied);
        }
        let result = match Form::of(policy) {
            Form::General => lanes::decide(&self.inner, &state_key, policy, cost).await,
            form => self.decide_word(form, &state_key, policy, cost).await,
        };
        match result {
            Ok(decision) => {
                inner
                    .deny_cache
                    .insert(&state_key, policy, cost, sent_at, &decision);
                inner
                    .last_known
                    .record(state_key, policy, &decision, sent_at);
                Ok(decision)
            }
            // A key Redis cut off stays cut off while Redis cannot answer.
            Err(error) => inner
                .deny_cache
                .lookup_on_failure(&state_key, policy, cost, inner.local_now())
                .ok_or(error),
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
        if !inner.wire.connection.is_one_server() || !inner.server.due(now_ms) {
            return;
        }
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let mut info = redis::cmd("INFO");
            info.arg("server");
            let reply =
                tokio::time::timeout(inner.deadline, inner.wire.connection.query(&info)).await;
            let moved = match reply {
                Ok(Ok(info)) => run_id(&info).is_some_and(|id| inner.server.saw(id)),
                Ok(Err(error)) => error.is_connection_lost(),
                Err(_) => false,
            };
            if moved {
                inner.deny_cache.forget();
            }
            inner.server.checking.store(false, Ordering::Release);
        });
    }

    /// Readiness: runs the real decision script on a canary key, bypassing
    /// the circuit breaker and the deny cache, and returns how long it
    /// took. The canary writes a key that lives one millisecond, so unlike
    /// `PING` the check fails wherever decisions would: a read-only replica,
    /// `OOM`, a script that cannot be loaded.
    ///
    /// # Errors
    ///
    /// As [`RedisStore::decide`], except for an open breaker.
    pub async fn health_check(&self) -> Result<Duration, RedisStoreError> {
        let started = Instant::now();
        // One unit of a million per second: the key expires after 1 ms.
        let canary = Policy::new("tollgate-health", Algorithm::Gcra, "1000000/s")?;
        let state_key = self.inner.names.state_key(&canary, &Key::global());
        match tokio::time::timeout(self.inner.deadline, self.run(&state_key, &canary, 1)).await {
            Ok(Ok(_)) => Ok(started.elapsed()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(RedisStoreError::Deadline(self.inner.deadline)),
        }
    }

    /// Decides without the deny cache, lanes or breaker: for the health
    /// check.
    async fn run(
        &self,
        state_key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Result<Decision, RedisStoreError> {
        let form = Form::of(policy);
        if form == Form::General {
            return self
                .inner
                .wire
                .general(state_key, policy, &[cost])
                .await?
                .pop()
                .ok_or_else(|| RedisStoreError::Protocol("no decision in the reply".into()));
        }
        let request = word_request(form, state_key, policy, cost);
        let words = self.inner.wire.send(form, &[request]).await?;
        let &(now, word) = words
            .first()
            .ok_or_else(|| RedisStoreError::Protocol("no word in the reply".into()))?;
        decided(form, policy, now, word, cost)
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
        form: Form,
        state_key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Result<Decision, RedisStoreError> {
        let inner = &self.inner;
        let request = word_request(form, state_key, policy, cost);
        let (now, word) = match batch::enter(inner, form, request) {
            Turn::Full => return Err(RedisStoreError::QueueFull),
            Turn::Queued(reply) => match inner.batcher(form) {
                Some(batcher) => batch::wait(batcher, inner.deadline, reply).await?,
                None => {
                    return Err(RedisStoreError::Protocol(
                        "a queued request of a kind the store does not batch".into(),
                    ));
                }
            },
            // Sent alone, exactly as without batching, holding its place
            // until the reply is in.
            Turn::Now(place) => {
                let words = inner
                    .guarded(state_key, inner.wire.send(form, &[request]))
                    .await;
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
fn word_request<'a>(form: Form, state_key: &'a str, policy: &'a Policy, cost: u64) -> Request<'a> {
    let (period, step, slack) = crate::script::word_args(form, policy, cost);
    Request {
        key: state_key,
        period,
        step,
        slack,
        policy,
    }
}

/// The decision on a word the script replied, at Redis's `now`.
fn decided(
    form: Form,
    policy: &Policy,
    now: u64,
    word: u64,
    cost: u64,
) -> Result<Decision, RedisStoreError> {
    form.decide_word(policy, now, word, WordOp::Check(cost))
        .ok_or_else(|| RedisStoreError::Protocol("a word for a general policy".into()))
}

impl<C: RedisConnection> Inner<C> {
    /// Runs `call`, a script call for `state_key`, under the store's
    /// deadline and breaker: an open breaker fails it at once, and its
    /// outcome counts towards the breaker. A deadline that fired late,
    /// because our own runtime was too busy to run the call, is not
    /// counted: the call waits on for its reply, up to the hard ceiling
    /// (see [`patience`]).
    pub(crate) async fn guarded<T>(
        &self,
        state_key: &str,
        call: impl std::future::Future<Output = Result<T, RedisStoreError>>,
    ) -> Result<T, RedisStoreError> {
        let permit = self
            .breaker(state_key)
            .and_then(CircuitBreaker::try_acquire)
            .ok_or(RedisStoreError::CircuitOpen)?;
        let sent = tokio::time::Instant::now();
        let result = match patience::within(self.deadline, call).await {
            Ok(result) => {
                // Redis answered (a reply or an error reply): its latency,
                // as this app observed it.
                #[cfg(feature = "metrics")]
                self.latency.record(sent.elapsed().as_secs_f64());
                #[cfg(not(feature = "metrics"))]
                let _ = sent;
                result
            }
            Err(missed) => Err(RedisStoreError::Deadline(missed.waited(self.deadline))),
        };
        match &result {
            Ok(_) => permit.success(),
            Err(error) => {
                permit.failure();
                if matches!(error, RedisStoreError::Unavailable { .. }) {
                    self.wire.connection.refresh();
                }
                if error.is_connection_lost() && self.wire.connection.is_one_server() {
                    // The connection is being made anew, perhaps to another
                    // server or to one that lost its data. (On a cluster,
                    // one node's failure says nothing of the others' keys,
                    // and the replica that takes over holds the state.)
                    self.deny_cache.forget();
                }
            }
        }
        result
    }
}

impl<C: RedisConnection> WordCalls for Inner<C> {
    fn batcher(&self, form: Form) -> Option<&Batcher> {
        let batchers = self.batchers.as_ref()?;
        match form {
            Form::Tat => Some(&batchers[0]),
            Form::WindowWord => Some(&batchers[1]),
            Form::General => None,
        }
    }

    async fn call_queued(
        &self,
        form: Form,
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

    async fn call_general(
        &self,
        key: &str,
        policy: &Policy,
        costs: &[u64],
    ) -> Result<Vec<Decision>, RedisStoreError> {
        self.guarded(key, self.wire.general(key, policy, costs))
            .await
    }
}

impl<C: RedisConnection> Store for RedisStore<C> {
    async fn check(&self, key: &Key, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        Ok(self.decide(key, policy, cost).await?)
    }

    async fn reset(&self, key: &Key, policy: &Policy) -> Result<(), StoreError> {
        Ok(self.reset_key(key, policy).await?)
    }

    async fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: Settlement,
    ) -> Result<Decision, StoreError> {
        Ok(self.settle_key(key, policy, &settlement).await?)
    }

    async fn block(
        &self,
        key: &Key,
        policy: &Policy,
        duration: Duration,
    ) -> Result<(), StoreError> {
        self.block_key(key, policy, duration).await?;
        Ok(())
    }

    /// The last decision Redis made for `key` under `policy`, while a limit
    /// of it has not reset: remembered for as many keys as the deny cache
    /// holds denials ([`RedisStoreBuilder::deny_cache`](crate::RedisStoreBuilder::deny_cache)).
    fn last_known(&self, key: &Key, policy: &Policy) -> Option<Decision> {
        let inner = &*self.inner;
        let state_key = inner.names.state_key(policy, key);
        inner.last_known.get(&state_key, policy, inner.local_now())
    }
}

impl<C> Clone for RedisStore<C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<C> fmt::Debug for RedisStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("connection", &std::any::type_name::<C>())
            .field("names", &self.inner.names)
            .field("deadline", &self.inner.deadline)
            .field("clock", &self.inner.wire.clock)
            .finish()
    }
}
