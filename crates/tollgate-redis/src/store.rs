//! The store: what it holds, and the breaker and deadline around each
//! of its calls. Its operations are in `op/`, one file each.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Key, Policy};

use crate::batch::Batchers;
use crate::breaker::{BreakerState, CircuitBreaker};
use crate::builder::RedisStoreBuilder;
use crate::connect::{ManagedConnection, RedisConnection, after_checkout};
use crate::deny_cache::DenyCache;
use crate::error::RedisStoreError;
use crate::identity::ServerIdentity;
use crate::keys::KeyNamer;
use crate::known::LastKnown;
use crate::lanes::Lanes;
use crate::patience::{self, Home, Missed};
use crate::wire::Wire;

/// A [`Store`](tollgate_core::Store) in Redis: every app server that points at the same Redis
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
///   [`Decision::now`](tollgate_core::Decision::now) is then Redis's time as the store's recent replies
///   showed it, within about half a round trip.)
/// - **Same decisions as memory.** The scripts implement the reference
///   algorithms of [`tollgate_core::state`] in exact integer arithmetic.
/// - **No leaks.** Every key written gets a TTL in the same script, exactly
///   as long as its state matters (rounded up to a millisecond).
/// - **Bounded waits.** Every decision has a deadline (50 ms by default);
///   a decision that misses it is a [`StoreError::Timeout`](tollgate_core::StoreError::Timeout), never retried.
///   A deadline that fires late because the app's own runtime was too busy
///   to poll it is not Redis's failure: the decision waits on for its reply
///   (a reply already in is taken), up to 4 × the deadline, and only that
///   ceiling counts as a failure. A decision queued for a batch call waits
///   while the calls ahead come back with Redis's reply; while none does,
///   it gives up within that ceiling, or, taken into a call within a
///   deadline of queueing, waits for that call: at most 5 × the deadline,
///   and the app runtime's own lateness.
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
    /// The runtime the store was built on, where its connection's tasks
    /// run: its lateness is our own too.
    pub(crate) home: Home,
    /// Share script calls among concurrent one-time decisions, and among
    /// concurrent window-word decisions; `None` when batching is off or
    /// the connection reaches several servers.
    pub(crate) batchers: Option<Batchers>,
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
    /// The store-latency histogram, registered once.
    #[cfg(feature = "metrics")]
    pub(crate) latency: metrics::Histogram,
    /// Deny-cache hit counters by policy name, registered once each, so a
    /// hit allocates nothing.
    #[cfg(feature = "metrics")]
    pub(crate) hit_counters: crate::series::ByPolicy<metrics::Counter>,
}

impl<C> Inner<C> {
    /// Counts a denial answered from the deny cache.
    #[cfg(feature = "metrics")]
    pub(crate) fn count_hit(&self, policy: &str) {
        let make = |label: &str| {
            metrics::counter!(
                tollgate_core::telemetry::DENY_CACHE_HITS,
                "policy" => label.to_owned()
            )
        };
        self.hit_counters
            .with(policy, make, |counter| counter.increment(1));
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

impl<C: RedisConnection> Inner<C> {
    /// The ceiling of a call and the slack after it: a call that ends
    /// later was run late by our own runtime (see [`patience`]).
    fn past_ceiling(&self) -> std::time::Duration {
        patience::ceiling(self.deadline).saturating_add(patience::slack(self.deadline))
    }

    /// Runs `call` as [`Inner::guarded`] does, once it has a place among
    /// the store's unbatched calls on their way ([`Gate`](crate::lanes::Gate)): a
    /// burst of them (a spray of new keys, the settlements of many
    /// responses at once, in-flight slots) waits in our own queue, rather
    /// than meeting its deadline on the connection behind its own head and
    /// opening the breaker with Redis healthy.
    pub(crate) async fn gated<T>(
        &self,
        state_key: &str,
        call: impl std::future::Future<Output = Result<T, RedisStoreError>>,
    ) -> Result<T, RedisStoreError> {
        let _place = self.lanes.gate.enter(self.deadline, &self.home).await?;
        self.guarded(state_key, call).await
    }

    /// Runs `call`, a script call for `state_key`, under the store's
    /// deadline and breaker: an open breaker fails it at once, and its
    /// outcome counts towards the breaker. A deadline that fired late,
    /// because our own runtime was too busy to run the call, is not
    /// counted: the call waits on for its reply, up to the hard ceiling
    /// (see [`patience`]). On a pool, the deadline starts once the call has
    /// its connection; a wait for one that the app's own calls made too
    /// long is not counted either ([`RedisStoreError::PoolBusy`]; see
    /// [`RedisConnection::handed_out`]).
    pub(crate) async fn guarded<T>(
        &self,
        state_key: &str,
        call: impl std::future::Future<Output = Result<T, RedisStoreError>>,
    ) -> Result<T, RedisStoreError> {
        let breaker = self
            .breaker(state_key)
            .ok_or(RedisStoreError::CircuitOpen)?;
        let permit = breaker.try_acquire().ok_or(RedisStoreError::CircuitOpen)?;
        // A reply our own busy runtime did not read by the ceiling and its
        // last look: the app's own load if Redis answered lately; with no
        // sign of life from Redis for that long (hung, on an app whose
        // runtime stays busy), a missed deadline, which the breaker counts.
        let unread = || match breaker.answered_within(patience::lately(self.deadline)) {
            true => RedisStoreError::Late(patience::ceiling(self.deadline)),
            false => RedisStoreError::Deadline(patience::ceiling(self.deadline)),
        };
        let mut sent = tokio::time::Instant::now();
        // (`sent` moves to where a pooled call's deadline starts.)
        let began = sent;
        let outcome = match self.wire.connection.handed_out() {
            None => patience::within(self.deadline, &self.home, call).await,
            Some(_) => after_checkout(self.deadline, &self.home, &mut sent, call).await,
        };
        let result = match outcome {
            // No connection was had: Redis was not asked. A checkout whose
            // timers our own runtime ran past the ceiling and its slack (a
            // stall of the whole process) met the app's own load if Redis
            // answered lately, as a reply left unread does.
            Ok(Err(RedisStoreError::PoolTimeout))
                if began.elapsed() > self.past_ceiling()
                    && breaker.answered_within(patience::lately(self.deadline)) =>
            {
                Err(RedisStoreError::PoolBusy)
            }
            Ok(result @ Err(RedisStoreError::PoolBusy | RedisStoreError::PoolTimeout)) => result,
            Ok(result) => {
                // Redis answered (a reply or an error reply): its latency,
                // as this app observed it. Not a connection that failed
                // (refused, dropped, broken): nothing answered, and an
                // outage would pull the figures towards nothing.
                #[cfg(feature = "metrics")]
                if answered(&result) {
                    self.latency.record(sent.elapsed().as_secs_f64());
                }
                #[cfg(not(feature = "metrics"))]
                let _ = sent;
                result
            }
            Err(missed @ (Missed::Deadline | Missed::Ceiling)) => {
                Err(RedisStoreError::Deadline(missed.waited(self.deadline)))
            }
            Err(Missed::Busy) => Err(unread()),
        };
        // The connection's own response timeout (see `patience::backstop`)
        // beat the ceiling's judgment: its timer fired in the call, which
        // our runtime polled past the ceiling. Our own lateness as well.
        let result = match result {
            Err(RedisStoreError::Redis(e))
                if e.is_timeout() && sent.elapsed() > self.past_ceiling() =>
            {
                Err(unread())
            }
            other => other,
        };
        match &result {
            // Redis answered in time (of a key a foreign writer gave a
            // type of its own, which fails alone).
            Ok(_) => permit.success(),
            Err(error) if error.is_data_error() => permit.success(),
            // Queued behind the app's own calls in the pool (Redis was not
            // asked), or its reply left unread by our own busy runtime: the
            // permit reports nothing (a probe's lets the next call probe).
            Err(RedisStoreError::PoolBusy | RedisStoreError::Late(_)) => drop(permit),
            Err(error) => {
                permit.failure();
                if error.wants_refresh() {
                    self.wire.connection.refresh();
                }
                if let RedisStoreError::Deadline(_) = error {
                    self.wire.connection.late();
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

/// Whether `result` is Redis's answer (a reply, or an error reply), not a
/// call that never had one (its connection refused, dropped or broken,
/// or no connection at all).
#[cfg(feature = "metrics")]
fn answered<T>(result: &Result<T, RedisStoreError>) -> bool {
    match result {
        Ok(_)
        | Err(
            RedisStoreError::Unavailable { .. }
            | RedisStoreError::Protocol(_)
            | RedisStoreError::UnsupportedVersion { .. },
        ) => true,
        Err(RedisStoreError::Redis(e)) => !(e.is_io_error() || e.is_connection_dropped()),
        Err(
            RedisStoreError::Config(_)
            | RedisStoreError::CircuitOpen
            | RedisStoreError::NotConnected { .. }
            | RedisStoreError::PoolTimeout
            | RedisStoreError::PoolBusy
            | RedisStoreError::QueueFull
            | RedisStoreError::Deadline(_)
            | RedisStoreError::Late(_),
        ) => false,
    }
}
