//! The Redis store.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManagerConfig;
use redis::{ErrorKind, IntoConnectionInfo, ServerErrorKind};
use tollgate_core::{
    Algorithm, BreakerState, CircuitBreaker, Clock, ConfigError, Decision, Key, LimitStatus,
    Outcome, Policy, PolicyState, Store, StoreError, Timestamp,
};

use crate::batch::{self, Batcher, Kind, Queued, Request, Turn};
use crate::cluster::ClusterConnection;
use crate::connection::{Pool, RedisConnection};
use crate::deny_cache::DenyCache;
use crate::error::RedisStoreError;
use crate::keys::KeyNamer;
use crate::managed::ManagedConnection;
use crate::script::{DecisionScript, Scripts};

/// A [`Store`] in Redis: every app server that points at the same Redis
/// shares one exact limit per key.
///
/// - **One round trip.** Each decision is one `EVALSHA` of a Lua script
///   that checks every limit of the policy and commits all or none. Under
///   concurrent load, decisions of single-limit GCRA, token-bucket and
///   leaky-bucket policies that arrive while a call is on its way share the
///   next call (see [`RedisStoreBuilder::batch_size`]).
/// - **Redis's clock.** Time is read with `TIME` inside the script, so app
///   servers' clocks do not matter. (One exception, to the microsecond:
///   a single-limit decision of a key that holds a time reports only how
///   far ahead that time was, which decides it exactly, and
///   [`Decision::now`] is then Redis's time as the store's recent replies
///   showed it, within about half a round trip.)
/// - **Same decisions as memory.** The scripts implement the reference
///   algorithms of [`tollgate_core::algorithm`] in exact integer arithmetic.
/// - **No leaks.** Every key written gets a TTL in the same script, exactly
///   as long as its state matters (rounded up to a millisecond).
/// - **Bounded waits.** Every decision has a deadline (50 ms by default);
///   a decision that misses it is a [`StoreError::Timeout`], never retried.
///
/// Keys are `<prefix>:<policy>:{<hash>}`, see [`RedisStoreBuilder::prefix`].
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
    inner: Arc<Inner<C>>,
}

pub(crate) struct Inner<C> {
    connection: C,
    names: KeyNamer,
    pub(crate) deadline: Duration,
    clock: Option<Arc<dyn Clock>>,
    scripts: Scripts,
    /// Share script calls among concurrent one-word decisions, and among
    /// concurrent window-word decisions; `None` when batching is off or
    /// the connection reaches several servers.
    batchers: Option<[Batcher; 2]>,
    /// One breaker, or one per range of 128 hash slots on a cluster, so
    /// that a failed master does not stop calls to the healthy ones.
    breakers: Vec<CircuitBreaker>,
    deny_cache: DenyCache,
    /// Each recent key's last decision, for a local fallback to take over.
    last_known: crate::known::LastKnown,
    /// The general scripts' requests waiting behind their key's call.
    pub(crate) lanes: crate::lanes::Lanes,
    /// Which server the deny cache's denials came from.
    server: ServerIdentity,
    /// Whether the one-word script writes or reads first.
    order: WriteOrder,
    /// Redis's clock, as its recent replies showed it.
    redis_clock: RedisClock,
    local_origin: Instant,
    /// Deny-cache hit counters by policy name, registered once each, so a
    /// hit allocates nothing.
    #[cfg(feature = "metrics")]
    hit_counters: std::sync::RwLock<std::collections::HashMap<Box<str>, metrics::Counter>>,
}

/// Which way the one-word script starts. Writing first (`SET ... NX GET`)
/// decides an idle key in one command but wastes work on a key that holds
/// a time; reading first (`GET`) costs an idle key one command more and
/// saves the rest more (`BENCHMARKS.md`, "Redis CPU per decision"). The
/// store writes first while fewer than a quarter of recent requests found
/// their key holding a time. Both ways decide exactly the same.
pub(crate) struct WriteOrder {
    fixed: Option<bool>,
    /// The share of recent requests whose key held a time, in 1/65,536,
    /// as a moving average over about 32 requests. Updated without a lock:
    /// a lost update only delays a switch.
    busy: AtomicU32,
}

impl WriteOrder {
    const SCALE: u32 = 1 << 16;
    /// A quarter. By the instruction counts in `BENCHMARKS.md`, writing
    /// first saves an idle key 3,500 and costs a busy key 5,900 and a
    /// denial 10,500: it pays while the busy share is below 0.37 for busy
    /// keys and below 0.25 for denials.
    const THRESHOLD: u32 = Self::SCALE / 4;

    fn new(fixed: Option<bool>) -> Self {
        Self {
            fixed,
            busy: AtomicU32::new(0),
        }
    }

    fn write_first(&self) -> bool {
        self.fixed
            .unwrap_or_else(|| self.busy.load(Ordering::Relaxed) < Self::THRESHOLD)
    }

    fn observe(&self, words: &[batch::Word]) {
        let mut share = self.busy.load(Ordering::Relaxed);
        for &(now, old) in words {
            share -= share / 32;
            if old > now {
                share += Self::SCALE / 32;
            }
        }
        self.busy.store(share, Ordering::Relaxed);
    }
}

/// The server the deny cache's denials came from, by its `run_id`, which
/// a restart changes. While the cache answers, the store asks Redis for
/// its `run_id` at most once per [`ServerIdentity::INTERVAL`] and clears the
/// cache when it changed (a restart, or a failover behind one address), so
/// a denial never outlives the state it mirrors by more than that plus a
/// round trip. A `FLUSHALL` on the same server keeps the `run_id`: such
/// denials last until they expire.
pub(crate) struct ServerIdentity {
    run_id: std::sync::Mutex<Option<String>>,
    /// When the last check started, in ms since the store's origin, plus 1.
    checked_at: std::sync::atomic::AtomicU64,
    checking: std::sync::atomic::AtomicBool,
}

impl ServerIdentity {
    /// How often at most a store asks for the `run_id`.
    pub(crate) const INTERVAL: Duration = Duration::from_millis(500);

    fn new(run_id: Option<String>) -> Self {
        Self {
            run_id: std::sync::Mutex::new(run_id),
            checked_at: std::sync::atomic::AtomicU64::new(0),
            checking: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether a check should start now (`now_ms` since the origin); if
    /// so, marks it started.
    fn due(&self, now_ms: u64) -> bool {
        let last = self.checked_at.load(Ordering::Acquire);
        let interval = u64::try_from(Self::INTERVAL.as_millis()).unwrap_or(u64::MAX);
        if last != 0 && now_ms + 1 < last.saturating_add(interval) {
            return false;
        }
        if self.checking.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.checked_at.store(now_ms + 1, Ordering::Release);
        true
    }

    /// Records the `run_id` Redis reported; whether it differs from the
    /// one known before.
    fn saw(&self, run_id: &str) -> bool {
        let mut known = self
            .run_id
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let changed = known.as_deref().is_some_and(|known| known != run_id);
        if known.as_deref() != Some(run_id) {
            *known = Some(run_id.to_owned());
        }
        changed
    }
}

/// Redis's clock as the store last saw it, for stamping the decisions
/// whose reply leaves out Redis's time: the one-word script answers a
/// single key whose time is ahead with the gap alone (see `one_word.lua`),
/// which decides the request exactly; only [`Decision::now`] comes from
/// here. Kept as the offset in µs of Redis `TIME` from the store's
/// monotonic clock, taken from every reply that carries Redis's time, so
/// the estimate is within about half a round trip (plus, on a cluster, the
/// skew between nodes). Until such a reply, the system clock stands in.
pub(crate) struct RedisClock {
    offset: std::sync::atomic::AtomicI64,
}

impl RedisClock {
    /// Starts from the system clock, as the store's monotonic clock
    /// starts at 0.
    fn new() -> Self {
        let system = tollgate_core::SystemClock.now().as_micros();
        Self {
            offset: i64::try_from(system).unwrap_or(i64::MAX).into(),
        }
    }

    /// Redis said it was `redis_now` at about `local_now`.
    fn saw(&self, redis_now: u64, local_now: u64) {
        let offset = i64::try_from(redis_now)
            .unwrap_or(i64::MAX)
            .saturating_sub_unsigned(local_now);
        self.offset.store(offset, Ordering::Relaxed);
    }

    /// Redis's time at `local_now`, as estimated.
    fn at(&self, local_now: u64) -> u64 {
        local_now.saturating_add_signed(self.offset.load(Ordering::Relaxed))
    }
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

    /// Local time in µs for the deny cache: the test clock's if there is
    /// one, otherwise monotonic time since the store was built.
    fn local_now(&self) -> u64 {
        match &self.clock {
            Some(clock) => clock.now().as_micros(),
            None => u64::try_from(self.local_origin.elapsed().as_micros()).unwrap_or(u64::MAX / 2),
        }
    }
}

impl RedisStore<ManagedConnection> {
    /// Connects to `url` with the default settings and a multiplexed
    /// [`ManagedConnection`].
    ///
    /// # Errors
    ///
    /// When Redis cannot be reached or the scripts cannot be loaded.
    pub async fn connect(url: &str) -> Result<Self, RedisStoreError> {
        Self::builder().connect(url).await
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
        &self.inner.connection
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
                _ => 2,
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
        let result = if PolicyState::is_one_word(policy) || PolicyState::is_window_word(policy) {
            self.decide_word(&state_key, policy, cost).await
        } else {
            crate::lanes::decide(&self.inner, &state_key, policy, cost).await
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
            u64::try_from(inner.local_origin.elapsed().as_millis()).unwrap_or(u64::MAX / 2);
        if !inner.connection.is_one_server() || !inner.server.due(now_ms) {
            return;
        }
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let mut info = redis::cmd("INFO");
            info.arg("server");
            let reply = tokio::time::timeout(inner.deadline, inner.connection.query(&info)).await;
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
        if PolicyState::is_one_word(policy) || PolicyState::is_window_word(policy) {
            let (kind, request) = word_request(state_key, policy, cost);
            let words = self.inner.send(kind, &[request]).await?;
            let &(now, word) = words
                .first()
                .ok_or_else(|| RedisStoreError::Protocol("no word in the reply".into()))?;
            return Ok(decide_word(kind, policy, now, word, cost));
        }
        self.inner
            .general(state_key, policy, &[cost])
            .await?
            .pop()
            .ok_or_else(|| RedisStoreError::Protocol("no decision in the reply".into()))
    }

    /// Decides a one-word or window-word request: sent at once, alone,
    /// when a place is free (or the store does not batch), else in the
    /// next call of the queued requests of its kind. The call has the
    /// store's deadline and answers to the breaker; a request that waits
    /// in the queue gives up at the deadline too, but its wait is no
    /// failure of Redis and the breaker does not count it.
    async fn decide_word(
        &self,
        state_key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Result<Decision, RedisStoreError> {
        let inner = &self.inner;
        let (kind, request) = word_request(state_key, policy, cost);
        let (now, word) = match batch::enter(inner, kind, request) {
            Turn::Queued(reply) => match tokio::time::timeout(inner.deadline, reply).await {
                Ok(Ok(word)) => word?,
                Ok(Err(_)) => {
                    return Err(RedisStoreError::Protocol(
                        "the batch of this request was dropped".into(),
                    ));
                }
                Err(_) => return Err(RedisStoreError::Deadline(inner.deadline)),
            },
            // Sent alone, exactly as without batching, holding its place
            // until the reply is in.
            Turn::Now(place) => {
                let words = inner.guarded(state_key, inner.send(kind, &[request])).await;
                drop(place);
                words?
                    .first()
                    .copied()
                    .ok_or_else(|| RedisStoreError::Protocol("no word in the reply".into()))?
            }
        };
        Ok(decide_word(kind, policy, now, word, cost))
    }
}

/// The word-script request of a decision of `cost` under `policy`.
fn word_request<'a>(state_key: &'a str, policy: &'a Policy, cost: u64) -> (Kind, Request<'a>) {
    if PolicyState::is_one_word(policy) {
        let (step, slack) = crate::script::one_word_args(policy, cost);
        let request = Request {
            key: state_key,
            period: 0,
            step,
            slack,
            policy,
        };
        (Kind::OneWord, request)
    } else {
        let (period, step, slack) = crate::script::window_word_args(policy, cost);
        let request = Request {
            key: state_key,
            period,
            step,
            slack,
            policy,
        };
        (Kind::WindowWord, request)
    }
}

/// The decision on a word the script replied, at Redis's `now`.
fn decide_word(kind: Kind, policy: &Policy, now: u64, mut word: u64, cost: u64) -> Decision {
    let now = Timestamp::from_micros(now);
    match kind {
        Kind::OneWord => PolicyState::decide_word(policy, &mut word, now, cost),
        Kind::WindowWord => PolicyState::decide_window_word(policy, &mut word, now, cost),
    }
}

impl<C: RedisConnection> Inner<C> {
    /// Runs `call`, a script call for `state_key`, under the store's
    /// deadline and breaker: an open breaker fails it at once, and its
    /// outcome counts towards the breaker.
    pub(crate) async fn guarded<T>(
        &self,
        state_key: &str,
        call: impl std::future::Future<Output = Result<T, RedisStoreError>>,
    ) -> Result<T, RedisStoreError> {
        let permit = self
            .breaker(state_key)
            .and_then(CircuitBreaker::try_acquire)
            .ok_or(RedisStoreError::CircuitOpen)?;
        let result = match tokio::time::timeout(self.deadline, call).await {
            Ok(result) => result,
            Err(_) => Err(RedisStoreError::Deadline(self.deadline)),
        };
        match &result {
            Ok(_) => permit.success(),
            Err(error) => {
                permit.failure();
                if matches!(error, RedisStoreError::Unavailable { .. }) {
                    self.connection.refresh();
                }
                if error.is_connection_lost() && self.connection.is_one_server() {
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

    /// Decides requests of `costs` for `state_key` under `policy`, a
    /// general-script policy, in turn, in one call of its script.
    pub(crate) async fn general(
        &self,
        state_key: &str,
        policy: &Policy,
        costs: &[u64],
    ) -> Result<Vec<Decision>, RedisStoreError> {
        let script = self.scripts.get(policy).ok_or_else(|| {
            RedisStoreError::Protocol(format!("no script for algorithm {}", policy.algorithm()))
        })?;
        let params = policy.params();
        let (now, min_ttl_ms) = self.test_time();
        let text: String;
        let costs_arg = match costs {
            [] => return Ok(Vec::new()),
            [cost] => crate::script::Arg::Number(*cost),
            _ => {
                text = costs
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(" ");
                crate::script::Arg::Text(&text)
            }
        };
        // A size hint (arguments, bytes): 16 arguments of 16 bytes or so,
        // besides the key names and the costs, hold most policies.
        let bytes = 256 + 2 * state_key.len() + 2 * costs.len();
        let reply = self
            .eval(state_key, script, (16, bytes), |cmd| {
                general_keys(cmd, state_key, policy);
                crate::script::general_args(policy, costs_arg, now, min_ttl_ms, |arg| {
                    cmd.arg(arg);
                });
            })
            .await?;
        decisions_from_reply(policy, costs, &reply, params.len())
    }

    /// The batcher of `kind`'s requests, if the store batches.
    pub(crate) fn batcher(&self, kind: Kind) -> Option<&Batcher> {
        let batchers = self.batchers.as_ref()?;
        Some(match kind {
            Kind::OneWord => &batchers[0],
            Kind::WindowWord => &batchers[1],
        })
    }

    /// Decides `requests` of `kind` in one call of its script, in order,
    /// and returns each request's word.
    pub(crate) async fn send(
        &self,
        kind: Kind,
        requests: &[Request<'_>],
    ) -> Result<Vec<batch::Word>, RedisStoreError> {
        match kind {
            Kind::OneWord => self.send_one_word(requests).await,
            Kind::WindowWord => self.send_window_words(requests).await,
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

    /// Decides `requests` of one-word policies in one call of the one-word
    /// script, in order, and returns each request's word.
    async fn send_one_word(
        &self,
        requests: &[Request<'_>],
    ) -> Result<Vec<batch::Word>, RedisStoreError> {
        let Some(first) = requests.first() else {
            return Ok(Vec::new());
        };
        let (now, min_ttl_ms) = self.test_time();
        // The key count, then per request its key, two numbers of up to 20
        // digits and a descriptor, then (test clock) two more numbers.
        let count = 3 + 4 * requests.len();
        let bytes = 60
            + requests
                .iter()
                .map(|r| r.key.len() + 40 + r.policy.state_descriptor().len())
                .sum::<usize>();
        let reply = self
            .eval(
                first.key,
                self.scripts.one_word(self.order.write_first()),
                (count, bytes),
                |cmd| {
                    cmd.arg(requests.len());
                    for r in requests {
                        cmd.arg(r.key);
                    }
                    for r in requests {
                        cmd.arg(r.step)
                            .arg(r.slack)
                            .arg(r.policy.state_descriptor());
                    }
                    if now > 0 {
                        cmd.arg(now).arg(min_ttl_ms);
                    }
                },
            )
            .await?;
        let words = match batch::words(&reply, requests.len())? {
            batch::Reply::Words(words) => {
                if let (0, Some(&(redis_now, _))) = (now, words.first()) {
                    self.redis_clock.saw(redis_now, self.local_now());
                }
                words
            }
            batch::Reply::Ahead(gap) => {
                // Under a test clock the script decided at the `now` sent.
                let now = match now {
                    0 => self.redis_clock.at(self.local_now()),
                    sent => sent,
                };
                let old = now.checked_add(gap).ok_or_else(|| {
                    RedisStoreError::Protocol(format!("a time {gap} µs ahead of {now}"))
                })?;
                vec![(now, old)]
            }
        };
        self.order.observe(&words);
        Ok(words)
    }

    /// Decides `requests` of window-word policies in one call of the
    /// window-word script, in order, and returns each request's word (0
    /// where its key held no count of the current window).
    async fn send_window_words(
        &self,
        requests: &[Request<'_>],
    ) -> Result<Vec<batch::Word>, RedisStoreError> {
        let Some(first) = requests.first() else {
            return Ok(Vec::new());
        };
        let (now, min_ttl_ms) = self.test_time();
        // The key count, then per request its key, three numbers of up to
        // 20 digits and a descriptor, then (test clock) two more numbers.
        let count = 3 + 5 * requests.len();
        let bytes = 60
            + requests
                .iter()
                .map(|r| r.key.len() + 60 + r.policy.state_descriptor().len())
                .sum::<usize>();
        let reply = self
            .eval(
                first.key,
                &self.scripts.window_word,
                (count, bytes),
                |cmd| {
                    cmd.arg(requests.len());
                    for r in requests {
                        cmd.arg(r.key);
                    }
                    for r in requests {
                        cmd.arg(r.period)
                            .arg(r.step)
                            .arg(r.slack)
                            .arg(r.policy.state_descriptor());
                    }
                    if now > 0 {
                        cmd.arg(now).arg(min_ttl_ms);
                    }
                },
            )
            .await?;
        // The script never replies a negative number (a gap), which only
        // the one-word script does.
        match batch::words(&reply, requests.len())? {
            batch::Reply::Words(words) => Ok(words),
            batch::Reply::Ahead(_) => Err(RedisStoreError::Protocol(format!("{reply:?}"))),
        }
    }

    /// [`Inner::send`] for queued requests.
    pub(crate) async fn send_batch(
        &self,
        kind: Kind,
        batch: &[Queued],
    ) -> Result<Vec<batch::Word>, RedisStoreError> {
        let requests: Vec<Request<'_>> = batch.iter().map(Queued::request).collect();
        self.send(kind, &requests).await
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

/// The keys of a general script's call: the state key, and a sliding log's
/// sorted set per limit, named after the limit's period so that a changed
/// configuration finds the log of that period.
fn general_keys(cmd: &mut redis::Cmd, state_key: &str, policy: &Policy) {
    let params = policy.params();
    if policy.algorithm() == Algorithm::SlidingLog {
        cmd.arg(1 + params.len()).arg(state_key);
        for p in params {
            cmd.arg(format!("{state_key}:{}", p.period_us));
        }
    } else {
        cmd.arg(1).arg(state_key);
    }
}

/// Turns the general script's reply into a [`Decision`] per request.
fn decisions_from_reply(
    policy: &Policy,
    costs: &[u64],
    reply: &redis::Value,
    limits: usize,
) -> Result<Vec<Decision>, RedisStoreError> {
    let reply: Vec<i64> = redis::FromRedisValue::from_redis_value(reply.clone())
        .map_err(|e| RedisStoreError::Protocol(e.to_string()))?;
    let each = 3 + 3 * limits;
    if reply.len() != each * costs.len() {
        return Err(RedisStoreError::Protocol(format!("{reply:?}")));
    }
    reply
        .chunks_exact(each)
        .zip(costs)
        .map(|(chunk, &cost)| decision_from_reply(policy, cost, chunk))
        .collect()
}

/// Turns the general script's reply into a [`Decision`].
fn decision_from_reply(
    policy: &Policy,
    cost: u64,
    reply: &[i64],
) -> Result<Decision, RedisStoreError> {
    let params = policy.params();
    let bad = || RedisStoreError::Protocol(format!("{reply:?}"));
    if reply.len() != 3 + 3 * params.len() {
        return Err(bad());
    }
    let micros = |v: i64| u64::try_from(v).map_err(|_| bad());
    let now = Timestamp::from_micros(micros(reply[1])?);
    let delay = Duration::from_micros(micros(reply[2])?);
    let mut statuses = Vec::with_capacity(params.len());
    let mut longest_retry = 0;
    for (i, (p, chunk)) in params.iter().zip(reply[3..].chunks_exact(3)).enumerate() {
        let retry = match chunk[2] {
            -1 => None,
            r => Some(micros(r)?),
        };
        longest_retry = longest_retry.max(retry.unwrap_or(0));
        statuses.push(LimitStatus::new(
            i,
            p.limit,
            p.capacity,
            micros(chunk[0])?,
            Duration::from_micros(micros(chunk[1])?),
            retry.map(Duration::from_micros),
        ));
    }
    let outcome = match reply[0] {
        0 => Outcome::Allowed,
        1 => Outcome::Limited {
            retry_after: Duration::from_micros(longest_retry),
        },
        2 => Outcome::CostExceedsCapacity {
            cost,
            capacity: params
                .iter()
                .find(|p| cost > p.capacity)
                .map_or(0, |p| p.capacity),
        },
        _ => return Err(bad()),
    };
    Ok(Decision::new(policy, outcome, now, delay, statuses))
}

impl<C: RedisConnection> Store for RedisStore<C> {
    async fn check(&self, key: &Key, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        Ok(self.decide(key, policy, cost).await?)
    }

    /// The last decision Redis made for `key` under `policy`, while a limit
    /// of it has not reset: remembered for as many keys as the deny cache
    /// holds denials ([`RedisStoreBuilder::deny_cache`]).
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
            .field("clock", &self.inner.clock)
            .finish()
    }
}

/// Configures a [`RedisStore`].
///
/// The defaults suit a request path: a decision waits at most 50 ms, a
/// response 50 ms, a new connection 100 ms and a pool checkout 25 ms.
#[derive(Debug)]
#[must_use = "call .connect(url) to get the store"]
pub struct RedisStoreBuilder {
    prefix: String,
    secret: Option<Vec<u8>>,
    deadline: Duration,
    connect_timeout: Duration,
    response_timeout: Duration,
    pool_size: u32,
    checkout_timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    breaker_threshold: u32,
    breaker_cooldown: Duration,
    breaker_ranges: usize,
    deny_cache: usize,
    batch_size: usize,
    write_first: Option<bool>,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        Self {
            prefix: "tollgate".to_owned(),
            secret: None,
            deadline: Duration::from_millis(50),
            connect_timeout: Duration::from_millis(100),
            response_timeout: Duration::from_millis(50),
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

    /// The longest a decision may take, from call to reply (default 50 ms).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// How long establishing a connection may take (default 100 ms).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long Redis may take to answer a command (default 50 ms).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// The size of a bb8 pool (default 16).
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// How long a request waits for a pooled connection (default 25 ms,
    /// never bb8's 30 s).
    pub fn pool_checkout_timeout(mut self, timeout: Duration) -> Self {
        self.checkout_timeout = timeout;
        self
    }

    /// The circuit breaker: open after `threshold` consecutive failures or
    /// missed deadlines (default 5), for `cooldown` (default 1 s) before one
    /// probe goes through. While open, decisions fail at once with
    /// [`RedisStoreError::CircuitOpen`], adding no latency, and the
    /// caller's failure policy applies.
    pub fn circuit_breaker(mut self, threshold: u32, cooldown: Duration) -> Self {
        self.breaker_threshold = threshold;
        self.breaker_cooldown = cooldown;
        self
    }

    /// The most denials the local deny cache holds (default 10,000; 0
    /// turns it off). A key denied until a time is denied locally until
    /// then, without asking Redis: a client hammering an exhausted limit
    /// costs Redis nothing, and decisions stay exact. The store remembers
    /// the last decision of as many keys for a local fallback to take over
    /// ([`Store::last_known`]).
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
    /// to one server ([`RedisConnection::is_one_server`]): on a cluster,
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

    /// **Test hook.** Makes the one-word script always write first
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
    pub fn test_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    fn check(&self) -> Result<KeyNamer, ConfigError> {
        CircuitBreaker::new(self.breaker_threshold, self.breaker_cooldown)?;
        let positive = [
            ("deadline", self.deadline),
            ("connect_timeout", self.connect_timeout),
            ("response_timeout", self.response_timeout),
            ("pool_checkout_timeout", self.checkout_timeout),
        ];
        for (setting, value) in positive {
            if value.is_zero() {
                return Err(ConfigError::InvalidSetting {
                    setting,
                    reason: "must be greater than zero",
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

    /// Connects with a [`ManagedConnection`]: redis-rs's multiplexed
    /// `ConnectionManager`, which reconnects by itself, replaced by a fresh
    /// one after `READONLY`-like replies. This is the default connection: it
    /// was the faster in our measurements (see `BENCHMARKS.md`).
    ///
    /// # Errors
    ///
    /// On invalid settings, when Redis cannot be reached, when it is older
    /// than 7.0 ([`RedisStoreError::UnsupportedVersion`]), or when the
    /// scripts cannot be loaded.
    pub async fn connect(
        self,
        url: impl IntoConnectionInfo,
    ) -> Result<RedisStore<ManagedConnection>, RedisStoreError> {
        self.check()?;
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(1)
            .set_max_delay(self.connect_timeout);
        let connection =
            ManagedConnection::connect(client, config, self.connect_timeout * 2).await?;
        self.build(connection).await
    }

    /// Connects through a bb8 pool of multiplexed connections.
    ///
    /// # Errors
    ///
    /// As [`RedisStoreBuilder::connect`].
    pub async fn connect_pool(
        self,
        url: impl IntoConnectionInfo,
    ) -> Result<RedisStore<Pool>, RedisStoreError> {
        self.check()?;
        let manager = bb8_redis::RedisConnectionManager::new(url)?;
        let pool = bb8::Pool::builder()
            .max_size(self.pool_size)
            .connection_timeout(self.checkout_timeout)
            .build(manager)
            .await?;
        self.build(pool).await
    }

    /// Connects to a Redis Cluster through any of `nodes` (URLs such as
    /// `redis://10.0.0.1:6379`), with a [`ClusterConnection`]: each decision
    /// goes to its slot's master, a failed master affects only its slots,
    /// and the circuit breaker is kept per range of 128 slots.
    ///
    /// Keep the response timeout under the deadline, as by default.
    ///
    /// # Errors
    ///
    /// As [`RedisStoreBuilder::connect`].
    pub async fn connect_cluster<I: IntoConnectionInfo>(
        self,
        nodes: impl IntoIterator<Item = I>,
    ) -> Result<RedisStore<ClusterConnection>, RedisStoreError> {
        self.check()?;
        let mut seeds = Vec::new();
        for node in nodes {
            let info = node.into_connection_info()?;
            seeds.push(info.addr().to_string());
        }
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout));
        let connection = ClusterConnection::connect(seeds, config, self.connect_timeout).await?;
        Self {
            breaker_ranges: 128,
            ..self
        }
        .build(connection)
        .await
    }

    /// Builds a store on a connection of your own, and loads the scripts.
    ///
    /// # Errors
    ///
    /// On invalid settings, when the server is older than Redis 7.0
    /// ([`RedisStoreError::UnsupportedVersion`]), or when the scripts cannot
    /// be loaded.
    pub async fn build<C: RedisConnection>(
        self,
        connection: C,
    ) -> Result<RedisStore<C>, RedisStoreError> {
        let names = self.check()?;
        let scripts = Scripts::new();
        let budget = self.connect_timeout + self.response_timeout;
        let mut info = redis::cmd("INFO");
        info.arg("server");
        let info: redis::Value = tokio::time::timeout(budget, connection.query(&info))
            .await
            .map_err(|_| RedisStoreError::Deadline(budget))??;
        if let Some(version) = too_old(&info) {
            return Err(RedisStoreError::UnsupportedVersion { version });
        }
        let server = ServerIdentity::new(run_id(&info).map(str::to_owned));
        for script in scripts.all() {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(script.source);
            let sha: String = tokio::time::timeout(budget, connection.query(&load))
                .await
                .map_err(|_| RedisStoreError::Deadline(budget))??;
            if sha != script.sha {
                return Err(RedisStoreError::Protocol(format!(
                    "SCRIPT LOAD returned {sha}, expected {}",
                    script.sha
                )));
            }
        }
        let connection_is_one_server = connection.is_one_server();
        let breakers = (0..self.breaker_ranges.max(1))
            .map(|_| CircuitBreaker::new(self.breaker_threshold, self.breaker_cooldown))
            .collect::<Result<_, _>>()?;
        Ok(RedisStore {
            inner: Arc::new(Inner {
                connection,
                names,
                deadline: self.deadline,
                clock: self.clock,
                scripts,
                batchers: (self.batch_size > 1 && connection_is_one_server)
                    .then(|| [Batcher::new(self.batch_size), Batcher::new(self.batch_size)]),
                breakers,
                deny_cache: DenyCache::new(self.deny_cache),
                last_known: crate::known::LastKnown::new(self.deny_cache),
                lanes: crate::lanes::Lanes::default(),
                server,
                order: WriteOrder::new(self.write_first),
                redis_clock: RedisClock::new(),
                #[cfg(feature = "metrics")]
                hit_counters: std::sync::RwLock::default(),
                local_origin: Instant::now(),
            }),
        })
    }
}

/// The value of `field` in an `INFO` reply.
fn info_field<'a>(info: &'a redis::Value, field: &str) -> Option<&'a str> {
    let text = match info {
        redis::Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?,
        redis::Value::VerbatimString { text, .. } => text.as_str(),
        redis::Value::SimpleString(text) => text.as_str(),
        _ => return None,
    };
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

/// The `run_id` in an `INFO server` reply: a random id that a restarted
/// server draws anew.
fn run_id(info: &redis::Value) -> Option<&str> {
    info_field(info, "run_id")
}

/// The `redis_version` in an `INFO server` reply, if it is older than 7.0.
/// A reply without a readable version (a Redis-compatible server that
/// leaves it out) is not refused.
fn too_old(info: &redis::Value) -> Option<String> {
    let version = info_field(info, "redis_version")?;
    let major: u32 = version.split('.').next()?.parse().ok()?;
    (major < 7).then(|| version.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_run_id_is_noticed_and_checks_are_spaced() {
        let info = redis::Value::BulkString(
            b"# Server\r\nredis_version:7.0.15\r\nrun_id:3f2a\r\ntcp_port:6379\r\n".to_vec(),
        );
        assert_eq!(run_id(&info), Some("3f2a"));
        let server = ServerIdentity::new(Some("3f2a".into()));
        assert!(!server.saw("3f2a"));
        assert!(server.saw("77b1"), "a restarted server");
        assert!(!server.saw("77b1"));
        // At most one check per interval, and one at a time.
        assert!(server.due(10_000));
        assert!(!server.due(10_001), "one is running");
        server.checking.store(false, Ordering::Release);
        assert!(!server.due(10_001), "too soon");
        assert!(server.due(10_000 + 500));
    }

    #[test]
    fn servers_older_than_redis_7_are_refused() {
        let info = |text: &str| redis::Value::BulkString(text.as_bytes().to_vec());
        let v6 = info("# Server\r\nredis_version:6.2.14\r\nredis_mode:standalone\r\n");
        assert_eq!(too_old(&v6).as_deref(), Some("6.2.14"));
        assert_eq!(
            RedisStoreError::UnsupportedVersion {
                version: "6.2.14".into()
            }
            .to_string(),
            "redis 6.2.14 is too old: tollgate needs Redis 7.0 or later"
        );
        assert_eq!(too_old(&info("# Server\r\nredis_version:7.0.15\r\n")), None);
        // Valkey reports the Redis version it is compatible with.
        let valkey = info("redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.1\r\n");
        assert_eq!(too_old(&valkey), None);
        assert_eq!(too_old(&info("# Server\r\n")), None);
        assert_eq!(too_old(&redis::Value::Nil), None);
    }

    #[test]
    fn bad_settings_are_typed_errors() {
        let err = RedisStore::builder()
            .deadline(Duration::ZERO)
            .check()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid setting deadline: must be greater than zero"
        );
        let err = RedisStore::builder().pool_size(0).check().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid setting pool_size: must be at least 1"
        );
        let err = RedisStore::builder().prefix("a{b").check().unwrap_err();
        assert!(
            err.to_string().starts_with("invalid setting prefix"),
            "{err}"
        );
    }

    #[test]
    fn malformed_replies_are_protocol_errors() {
        let policy = Policy::new("p", Algorithm::Gcra, "1/s").unwrap();
        assert!(matches!(
            decision_from_reply(&policy, 1, &[0, 1, 0]),
            Err(RedisStoreError::Protocol(_))
        ));
        assert!(matches!(
            decision_from_reply(&policy, 1, &[7, 1, 0, 1, 0, -1]),
            Err(RedisStoreError::Protocol(_))
        ));
        assert!(matches!(
            decision_from_reply(&policy, 1, &[0, -5, 0, 1, 0, -1]),
            Err(RedisStoreError::Protocol(_))
        ));
        let ok = decision_from_reply(&policy, 1, &[0, 5_000_000, 0, 0, 1_000_000, -1]).unwrap();
        assert!(ok.is_allowed());
        assert_eq!(ok.reset_at(), Timestamp::from_secs(6));
    }
}
