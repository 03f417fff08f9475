//! Automatic batching: one-time decisions (and, apart from them,
//! window-word decisions) that arrive while earlier ones are on their way
//! to Redis share one script call.
//!
//! At most [`IN_FLIGHT`] calls are on their way at a time. A request that
//! finds a free place is sent at once, alone, exactly as without batching,
//! so an idle store adds no delay. A request that finds every place taken
//! queues; when a call returns and requests are queued, the place is not
//! given back but passed to a task that sends the queue (up to the batch
//! size) in one `EVALSHA` and goes on until no request young enough to
//! send is left (see [`take`]). Redis then
//! reads one command, runs one script and writes one reply for many
//! decisions, and the client encodes, sends and parses one.
//!
//! Every request is still decided by exactly one script call, atomically,
//! in the order it queued (but for the old requests [`take`] leaves
//! behind); requests whose callers stopped waiting (their deadline passed)
//! are left out before a call is sent, and a request taken into a call
//! waits for that call's outcome, which is its own.
//!
//! Waiting in the queue is our own queueing, not Redis's lateness: a
//! queued request waits on past its deadline as long as calls of its kind
//! keep coming back with Redis's reply, since each one moves the queue
//! ahead by a batch (see [`wait`]). It gives up at a deadline in which no
//! call was answered: then Redis is late, and the calls ahead, which have
//! the store's deadline and answer to the breaker, are failing too. A call
//! takes only the requests that have not waited a deadline since the
//! queue last moved, and leaves the older ones to their own wait (see
//! [`take`]), so that while Redis answers nothing none waits a ceiling in
//! the queue and another in a call. The queue holds at most [`MAX_QUEUED`] requests; one that finds it full
//! fails at once with [`RedisStoreError::QueueFull`]. So a queued request
//! waits at most for the calls ahead of it, each of which ends within the
//! store's ceiling: `MAX_QUEUED / (batch size × IN_FLIGHT)` calls.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use std::future::Future;

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tollgate_core::Policy;

use crate::error::RedisStoreError;
use crate::op::word::{BatchOf, Request, Word, WordForm};
use crate::patience::{self, Missed, Runtimes};
use crate::running;

/// What the queue needs of whoever owns it (the store): the batcher of a
/// form, and a call of queued requests under the store's deadline and
/// breaker.
pub(crate) trait WordCalls: Send + Sync + 'static {
    /// The batcher of `form`'s requests, if the store batches them.
    fn batcher(&self, form: &dyn WordForm) -> Option<&Batcher>;

    /// The runtime the store was built on.
    fn home(&self) -> &patience::Home;

    /// Decides `batch` in one call, in order: each request's word.
    fn call_queued(
        &self,
        form: &dyn WordForm,
        batch: &[Queued],
    ) -> impl Future<Output = Result<Vec<Word>, RedisStoreError>> + Send;
}

/// Calls of the batch script on their way at once.
pub(crate) const IN_FLIGHT: usize = 2;

/// The most requests waiting in a batcher's queue: as many as a key's lane
/// holds (see [`crate::lanes`]).
pub(crate) const MAX_QUEUED: usize = crate::lanes::MAX_QUEUED;

/// The word form of a batcher's requests.
type Kind = &'static dyn WordForm;

/// A request waiting for a place in a call.
pub(crate) struct Queued {
    key: String,
    period: u64,
    step: u64,
    slack: u64,
    policy: Policy,
    reply: oneshot::Sender<Result<Word, RedisStoreError>>,
    /// Its place in the order of the queue, from 1.
    seq: u64,
    /// When it queued (see [`take`]).
    queued: Instant,
}

impl Queued {
    pub(crate) fn request(&self) -> Request<'_> {
        Request {
            key: &self.key,
            period: self.period,
            step: self.step,
            slack: self.slack,
            policy: &self.policy,
        }
    }
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Queued>,
    /// The places among the calls on their way: a taken one holds the
    /// runtime its call runs on (see [`wait`]).
    places: [Option<Holder>; IN_FLIGHT],
    /// The `seq` of the last request queued.
    last_seq: u64,
}

/// A taken place: the runtime of the task whose call holds it, none
/// outside a runtime. Until that runtime polls the call again, its reply
/// in or not, the place is not handed on: that runtime's lateness is the
/// queue's too.
struct Holder(Option<Handle>);

impl Queue {
    /// Takes a free place for a call run on the current runtime: its
    /// index, or none if every place is taken.
    fn take_place(&mut self) -> Option<usize> {
        let slot = self.places.iter().position(Option::is_none)?;
        self.places[slot] = Some(Holder(Handle::try_current().ok()));
        Some(slot)
    }

    /// The runtimes whose calls hold places.
    fn holders(&self) -> Vec<Handle> {
        self.places
            .iter()
            .flatten()
            .filter_map(|holder| holder.0.clone())
            .collect()
    }
}

/// The store's batchers, one per word form.
pub(crate) struct Batchers {
    tat: Batcher,
    window_word: Batcher,
}

impl Batchers {
    /// Batchers of at most `max_keys` requests per call, of a store whose
    /// calls have `deadline`.
    pub(crate) fn new(max_keys: usize, deadline: Duration) -> Self {
        Self {
            tat: Batcher::new(max_keys, deadline),
            window_word: Batcher::new(max_keys, deadline),
        }
    }

    /// The batcher of `of`.
    pub(crate) fn of(&self, of: BatchOf) -> &Batcher {
        match of {
            BatchOf::Tat => &self.tat,
            BatchOf::WindowWord => &self.window_word,
        }
    }
}

/// The queue of one store.
pub(crate) struct Batcher {
    max_keys: usize,
    /// The store's deadline.
    deadline: Duration,
    queue: Mutex<Queue>,
    /// Calls of this batcher's kind that came back with Redis's reply.
    answered: AtomicU64,
    /// When the last of them came back, in microseconds since `origin`.
    answered_at: AtomicU64,
    origin: Instant,
}

/// Where a request goes: sent alone at once (holding a place, if the store
/// batches, until the [`Place`] is dropped), or queued for a batch.
pub(crate) enum Turn<S: WordCalls> {
    Now(Place<S>),
    /// Queued, with its `seq` (see [`wait`]).
    Queued(oneshot::Receiver<Result<Word, RedisStoreError>>, u64),
    /// The queue holds [`MAX_QUEUED`] requests already.
    Full,
}

/// A place among the calls on their way; dropping it (when the call has
/// returned, or its caller stopped waiting) hands it to the queue.
pub(crate) struct Place<S: WordCalls> {
    /// The store, the kind of its batcher, and the index of the place.
    inner: Option<(Arc<S>, Kind, usize)>,
}

impl<S: WordCalls> Place<S> {
    fn new(inner: Option<(Arc<S>, Kind, usize)>) -> Self {
        Self { inner }
    }

    /// Records that the call sent in this place came back with Redis's
    /// reply: the queue behind it is moving.
    pub(crate) fn answered(&self) {
        if let Some((inner, kind, _)) = &self.inner
            && let Some(batcher) = inner.batcher(*kind)
        {
            batcher.answered();
        }
    }
}

impl<S: WordCalls> Drop for Place<S> {
    fn drop(&mut self) {
        if let Some((inner, kind, slot)) = &self.inner {
            release(inner, *kind, *slot);
        }
    }
}

impl Batcher {
    /// A batcher of at most `max_keys` requests per call, of a store
    /// whose calls have `deadline`.
    pub(crate) fn new(max_keys: usize, deadline: Duration) -> Self {
        Self {
            max_keys,
            deadline,
            queue: Mutex::default(),
            answered: AtomicU64::new(0),
            answered_at: AtomicU64::new(0),
            origin: Instant::now(),
        }
    }

    /// Records a call that came back with Redis's reply.
    fn answered(&self) {
        self.answered.fetch_add(1, Ordering::Relaxed);
        let at = u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.answered_at.fetch_max(at, Ordering::Relaxed);
    }

    /// When a call last came back with Redis's reply (the batcher's
    /// creation if none has).
    fn last_answered(&self) -> Instant {
        let at = Duration::from_micros(self.answered_at.load(Ordering::Relaxed));
        self.origin.checked_add(at).unwrap_or(self.origin)
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Takes a place for `request`, or queues it.
pub(crate) fn enter<S: WordCalls>(inner: &Arc<S>, kind: Kind, request: Request<'_>) -> Turn<S> {
    let Some(batcher) = inner.batcher(kind) else {
        return Turn::Now(Place::new(None));
    };
    let mut queue = batcher.queue();
    // A returning call that finds a queue keeps its place for it; only
    // requests it left behind, too old to send (see `take`), can be queued
    // while a place is free, and this one goes before them.
    if let Some(slot) = queue.take_place() {
        return Turn::Now(Place::new(Some((inner.clone(), kind, slot))));
    }
    if queue.waiting.len() >= MAX_QUEUED {
        return Turn::Full;
    }
    let (reply, receiver) = oneshot::channel();
    queue.last_seq += 1;
    let seq = queue.last_seq;
    queue.waiting.push(Queued {
        key: request.key.to_owned(),
        period: request.period,
        step: request.step,
        slack: request.slack,
        policy: request.policy.clone(),
        reply,
        seq,
        queued: Instant::now(),
    });
    Turn::Queued(receiver, seq)
}

/// Waits for the word of the request queued in `batcher` as `seq`. The
/// request gives up with [`RedisStoreError::Deadline`] at a deadline
/// (judged as [`patience::within`] judges it, with the store's `home`
/// runtime and those of the calls holding places, see [`Ahead`]) in which
/// no call of the batcher was answered; while calls come back, the queue moves and it
/// waits on. When it gives up, its caller stops waiting, so it is left out
/// of the next call, never sent late. Once taken into a call it no longer
/// gives up: that call's outcome is its own (Redis may have decided it),
/// and the call ends within the store's ceiling. A call takes it only
/// within a deadline of the queue last moving (see [`take`]), so while
/// Redis answers nothing a request ends within its ceiling in the queue,
/// or a deadline and its call's ceiling if a call took it (and the
/// runtime's lateness in running the call).
///
/// On a pool ([`handed_out`](crate::RedisConnection::handed_out) is
/// `Some`), the batcher's calls may themselves wait for a connection while
/// the pool serves the app's other calls: a deadline in which the pool
/// handed out connections is the app's own load too, and the request waits
/// on, up to the store's ceiling, then fails with
/// [`RedisStoreError::PoolBusy`].
pub(crate) async fn wait(
    batcher: &Batcher,
    home: &patience::Home,
    mut reply: oneshot::Receiver<Result<Word, RedisStoreError>>,
    seq: u64,
    handed_out: impl Fn() -> Option<u64>,
) -> Result<Word, RedisStoreError> {
    let deadline = batcher.deadline;
    let queued = Instant::now();
    let dropped = || RedisStoreError::Protocol("the batch of this request was dropped".into());
    loop {
        let seen = batcher.answered.load(Ordering::Relaxed);
        let pool = handed_out();
        let ahead = Ahead { home, batcher };
        match patience::within(deadline, &ahead, &mut reply).await {
            Ok(Ok(word)) => return word,
            Ok(Err(_)) => return Err(dropped()),
            // Judged by the queue's progress alone: while Redis answers
            // nothing, its own queue, many requests whose timers fire
            // at once, keeps the runtime backlogged, which here says
            // nothing of the app's load.
            Err(Missed::Deadline | Missed::Ceiling | Missed::Busy) => {}
        }
        let pool_served = pool.is_some() && handed_out() != pool;
        // Still queued (looked up under the queue's lock, so that no call
        // takes it meanwhile), or taken into a call.
        let taken = {
            let mut queue = batcher.queue();
            match queue.waiting.iter().position(|q| q.seq == seq) {
                None => true,
                Some(_) if batcher.answered.load(Ordering::Relaxed) != seen => false,
                Some(_) if pool_served && queued.elapsed() < patience::ceiling(deadline) => false,
                Some(at) => {
                    queue.waiting.remove(at);
                    return Err(match pool_served {
                        true => RedisStoreError::PoolBusy,
                        false => RedisStoreError::Deadline(queued.elapsed()),
                    });
                }
            }
        };
        if taken {
            return (&mut reply).await.unwrap_or_else(|_| Err(dropped()));
        }
    }
}

/// The runtimes a queued request's wait is judged on: the store's and the
/// caller's, and those of the calls holding the places ahead of it. One
/// too busy to poll its call again holds its place, reply in or not, and
/// the queue does not move: our own lateness, not Redis's.
struct Ahead<'a> {
    home: &'a patience::Home,
    batcher: &'a Batcher,
}

impl Runtimes for Ahead<'_> {
    fn runtimes(&self) -> Vec<Handle> {
        let mut all = self.home.runtimes();
        for holder in self.batcher.queue().holders() {
            if all.iter().all(|known| known.id() != holder.id()) {
                all.push(holder);
            }
        }
        all
    }
}

/// Gives the place `slot` back, or hands it to a task that sends the
/// queue.
fn release<S: WordCalls>(inner: &Arc<S>, kind: Kind, slot: usize) {
    let Some(batcher) = inner.batcher(kind) else {
        return;
    };
    let batch = take(batcher, slot);
    if batch.is_empty() {
        return;
    }
    let runtime = running::hand_on_runtime(inner.home());
    batcher.queue().places[slot] = runtime.clone().map(|runtime| Holder(Some(runtime)));
    match runtime {
        Some(runtime) => {
            // The place goes with the batch: the task hands it on when it
            // is dropped mid-call or unrun (a runtime shutting down).
            let place = Place::new(Some((inner.clone(), kind, slot)));
            running::hand_on(&runtime, drive(place, batch));
        }
        // With no runtime to send on (outside any, of a store whose home
        // is not known, or inside a spawn that dropped the place unrun):
        // the batch's requests fail (their senders are dropped) and the
        // place is given back (above).
        None => drop(batch),
    }
}

/// The next batch from the queue, leaving out requests nobody waits for;
/// an empty batch gives the place `slot` back.
///
/// A call takes only the requests that have not waited a deadline since
/// the queue last moved (since they queued, or since a call was last
/// answered, whichever is later). An older one stays queued, and its own
/// wait decides it (see [`wait`]): it gives up within its ceiling unless
/// a call is answered meanwhile, which makes it young again. Taken, it
/// would wait for its call up to another ceiling: while Redis answers
/// nothing, a request ends within a deadline and a call's ceiling of its
/// queueing. So a place can be given back while old requests wait in the
/// queue; a request that finds it free is sent at once, alone.
fn take(batcher: &Batcher, slot: usize) -> Vec<Queued> {
    let mut queue = batcher.queue();
    queue.waiting.retain(|q| !q.reply.is_closed());
    let now = Instant::now();
    let moved = batcher.last_answered();
    let deadline = batcher.deadline;
    let young = |q: &Queued| now.saturating_duration_since(q.queued.max(moved)) < deadline;
    let batch: Vec<Queued> = queue
        .waiting
        .extract_if(.., |q| young(q))
        .take(batcher.max_keys)
        .collect();
    if batch.is_empty() {
        queue.places[slot] = None;
    }
    batch
}

/// Sends batches in `place` until no request young enough to send is
/// queued (see [`take`]), then gives the place back. Dropped before (mid-call, or unrun), the place hands the
/// queue on, or is given back.
async fn drive<S: WordCalls>(mut place: Place<S>, mut batch: Vec<Queued>) {
    let Some((inner, kind, slot)) = place.inner.clone() else {
        return;
    };
    let Some(batcher) = inner.batcher(kind) else {
        return;
    };
    loop {
        // The call, not the wait in the queue, answers to the deadline and
        // the breaker: one failed call is one failure, however many
        // requests it carried.
        let result = inner.call_queued(kind, &batch).await;
        match result {
            Ok(words) => {
                batcher.answered();
                for (queued, word) in batch.drain(..).zip(words) {
                    let _ = queued.reply.send(Ok(word));
                }
            }
            Err(error) => {
                for queued in batch.drain(..) {
                    let _ = queued.reply.send(Err(error.duplicate()));
                }
            }
        }
        batch = take(batcher, slot);
        if batch.is_empty() {
            // `take` gave the place back.
            place.inner = None;
            return;
        }
    }
}

#[cfg(test)]
mod tests;
