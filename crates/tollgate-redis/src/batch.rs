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

use tokio::sync::oneshot;
use tokio::time::Instant;
use tollgate_core::Policy;

use crate::error::RedisStoreError;
use crate::op::word::{BatchOf, Request, Word, WordForm};
use crate::patience::{self, Missed};
use crate::running;

/// What the queue needs of whoever owns it (the store): the batcher of a
/// form, and a call of queued requests under the store's deadline and
/// breaker.
pub(crate) trait WordCalls: Send + Sync + 'static {
    /// The batcher of `form`'s requests, if the store batches them.
    fn batcher(&self, form: &dyn WordForm) -> Option<&Batcher>;

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
    in_flight: usize,
    /// The `seq` of the last request queued.
    last_seq: u64,
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
    inner: Option<(Arc<S>, Kind)>,
}

impl<S: WordCalls> Place<S> {
    fn new(inner: Option<(Arc<S>, Kind)>) -> Self {
        Self { inner }
    }

    /// Records that the call sent in this place came back with Redis's
    /// reply: the queue behind it is moving.
    pub(crate) fn answered(&self) {
        if let Some((inner, kind)) = &self.inner
            && let Some(batcher) = inner.batcher(*kind)
        {
            batcher.answered();
        }
    }
}

impl<S: WordCalls> Drop for Place<S> {
    fn drop(&mut self) {
        if let Some((inner, kind)) = &self.inner {
            release(inner, *kind);
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
    if queue.in_flight < IN_FLIGHT {
        // A returning call that finds a queue keeps its place for it; only
        // requests it left behind, too old to send (see `take`), can be
        // queued while a place is free, and this one goes before them.
        queue.in_flight += 1;
        return Turn::Now(Place::new(Some((inner.clone(), kind))));
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
/// (judged as [`patience::within`] judges it) in which no call of the
/// batcher was answered; while calls come back, the queue moves and it
/// waits on. When it gives up, its caller stops waiting, so it is left out
/// of the next call, never sent late. Once taken into a call it no longer
/// gives up: that call's outcome is its own (Redis may have decided it),
/// and the call ends within the store's ceiling. A call takes it only
/// within a deadline of the queue last moving (see [`take`]), so while
/// Redis answers nothing a request ends within its ceiling in the queue,
/// or a deadline and its call's ceiling if a call took it (and the
/// runtime's lateness in running the call).
pub(crate) async fn wait(
    batcher: &Batcher,
    mut reply: oneshot::Receiver<Result<Word, RedisStoreError>>,
    seq: u64,
) -> Result<Word, RedisStoreError> {
    let deadline = batcher.deadline;
    let queued = Instant::now();
    let dropped = || RedisStoreError::Protocol("the batch of this request was dropped".into());
    loop {
        let seen = batcher.answered.load(Ordering::Relaxed);
        match patience::within(deadline, &mut reply).await {
            Ok(Ok(word)) => return word,
            Ok(Err(_)) => return Err(dropped()),
            Err(Missed::Deadline | Missed::Ceiling) => {}
        }
        // Still queued (looked up under the queue's lock, so that no call
        // takes it meanwhile), or taken into a call.
        let taken = {
            let mut queue = batcher.queue();
            match queue.waiting.iter().position(|q| q.seq == seq) {
                None => true,
                Some(at) if batcher.answered.load(Ordering::Relaxed) == seen => {
                    queue.waiting.remove(at);
                    return Err(RedisStoreError::Deadline(queued.elapsed()));
                }
                Some(_) => false,
            }
        };
        if taken {
            return (&mut reply).await.unwrap_or_else(|_| Err(dropped()));
        }
    }
}

/// Gives a place back, or hands it to a task that sends the queue.
fn release<S: WordCalls>(inner: &Arc<S>, kind: Kind) {
    let Some(batcher) = inner.batcher(kind) else {
        return;
    };
    let batch = take(batcher);
    if batch.is_empty() {
        return;
    }
    match running::hand_on_runtime() {
        Some(runtime) => {
            // The place goes with the batch: the task hands it on when it
            // is dropped mid-call or unrun (a runtime shutting down).
            let place = Place::new(Some((inner.clone(), kind)));
            running::hand_on(&runtime, drive(place, batch));
        }
        // Outside a runtime (or inside a spawn that dropped the place
        // unrun) nothing can send: the batch's requests fail (their
        // senders are dropped) and the place is given back.
        None => {
            drop(batch);
            batcher.queue().in_flight -= 1;
        }
    }
}

/// The next batch from the queue, leaving out requests nobody waits for;
/// an empty batch gives the place back.
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
fn take(batcher: &Batcher) -> Vec<Queued> {
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
        queue.in_flight -= 1;
    }
    batch
}

/// Sends batches in `place` until no request young enough to send is
/// queued (see [`take`]), then gives the place back. Dropped before (mid-call, or unrun), the place hands the
/// queue on, or is given back.
async fn drive<S: WordCalls>(mut place: Place<S>, mut batch: Vec<Queued>) {
    let Some((inner, kind)) = place.inner.clone() else {
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
        batch = take(batcher);
        if batch.is_empty() {
            // `take` gave the place back.
            place.inner = None;
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use tollgate_core::Algorithm;

    use super::*;
    use crate::op::form::Form;

    /// The deadline of the test batchers' store.
    const DEADLINE: Duration = Duration::from_millis(50);

    /// A batcher whose calls never come back.
    struct Stuck(Batcher);

    impl WordCalls for Stuck {
        fn batcher(&self, _: &dyn WordForm) -> Option<&Batcher> {
            Some(&self.0)
        }
        async fn call_queued(
            &self,
            _: &dyn WordForm,
            _: &[Queued],
        ) -> Result<Vec<Word>, RedisStoreError> {
            std::future::pending().await
        }
    }

    /// A batcher whose calls take 45 ms and decide every request.
    struct Slow(Batcher);

    impl WordCalls for Slow {
        fn batcher(&self, _: &dyn WordForm) -> Option<&Batcher> {
            Some(&self.0)
        }
        async fn call_queued(
            &self,
            _: &dyn WordForm,
            batch: &[Queued],
        ) -> Result<Vec<Word>, RedisStoreError> {
            tokio::time::sleep(Duration::from_millis(45)).await;
            Ok(batch.iter().map(|_| (7, 0)).collect())
        }
    }

    /// Every place of `inner` taken by a request of `policy`.
    fn every_place<S: WordCalls>(inner: &Arc<S>, policy: &Policy) -> Vec<Place<S>> {
        let kind = Form::word_of(policy).unwrap();
        (0..IN_FLIGHT)
            .map(|_| match enter(inner, kind, request(policy)) {
                Turn::Now(place) => place,
                Turn::Queued(..) | Turn::Full => panic!("a place is free"),
            })
            .collect()
    }

    /// A request of `policy` queued in `inner`, whose places are taken.
    fn queue<S: WordCalls>(
        inner: &Arc<S>,
        policy: &Policy,
    ) -> (oneshot::Receiver<Result<Word, RedisStoreError>>, u64) {
        let kind = Form::word_of(policy).unwrap();
        match enter(inner, kind, request(policy)) {
            Turn::Queued(reply, seq) => (reply, seq),
            Turn::Now(_) | Turn::Full => panic!("every place is taken"),
        }
    }

    fn request(policy: &Policy) -> Request<'_> {
        Request {
            key: "k",
            period: 0,
            step: 1,
            slack: 0,
            policy,
        }
    }

    /// A queued request taken into a call waits for that call's outcome,
    /// past its own deadline: Redis may decide it. It gave up at its
    /// deadline, and its caller's failure policy decided it again.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_request_taken_into_a_call_waits_for_it_past_its_deadline() {
        let slow = Arc::new(Slow(Batcher::new(64, DEADLINE)));
        let policy = Policy::new("api", Algorithm::Gcra, "10/s").unwrap();
        let mut places = every_place(&slow, &policy);
        let (reply, seq) = queue(&slow, &policy);
        let start = Instant::now();
        let waiting = {
            let slow = slow.clone();
            tokio::spawn(async move { wait(&slow.0, reply, seq).await })
        };
        // At 10 ms the call ahead fails (its place is given up unanswered):
        // the queued request is sent, and its call answers at 55 ms.
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(places.pop());
        let word = waiting.await.unwrap();
        assert_eq!(word.unwrap(), (7, 0));
        assert_eq!(start.elapsed(), Duration::from_millis(55));
    }

    /// A queued request that no call took gives up at its deadline, and
    /// leaves the queue: it is never sent late.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_request_still_queued_at_its_deadline_gives_up_and_leaves_the_queue() {
        let stuck = Arc::new(Stuck(Batcher::new(64, DEADLINE)));
        let policy = Policy::new("api", Algorithm::Gcra, "10/s").unwrap();
        let _places = every_place(&stuck, &policy);
        let (reply, seq) = queue(&stuck, &policy);
        let waited = wait(&stuck.0, reply, seq).await;
        assert!(
            matches!(waited, Err(RedisStoreError::Deadline(_))),
            "{waited:?}"
        );
        assert!(stuck.0.queue().waiting.is_empty());
    }

    /// `reply`'s answer, failing (rather than hanging, on the paused
    /// clock) if none comes within a second.
    async fn answer(
        reply: &mut oneshot::Receiver<Result<Word, RedisStoreError>>,
    ) -> Result<Word, RedisStoreError> {
        tokio::time::timeout(Duration::from_secs(1), reply)
            .await
            .expect("answered")
            .expect("sent")
    }

    /// A queued request that waited a deadline since the queue last moved
    /// is not taken into the next call, which takes one that queued less
    /// than a deadline before. Taken, it waited up to a ceiling in the
    /// queue and another in the call. Once a call is answered, the queue
    /// moves, and it is taken.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_request_that_waited_a_deadline_since_the_queue_moved_is_left_behind() {
        let slow = Arc::new(Slow(Batcher::new(64, DEADLINE)));
        let policy = Policy::new("api", Algorithm::Gcra, "10/s").unwrap();
        let mut places = every_place(&slow, &policy);
        let (mut old, _) = queue(&slow, &policy);
        // A call is answered 30 ms later, and another request queues at 60.
        tokio::time::advance(Duration::from_millis(30)).await;
        places[0].answered();
        tokio::time::advance(Duration::from_millis(30)).await;
        let (mut young, _) = queue(&slow, &policy);
        // At 90 ms the other call returns unanswered. The requests' own
        // timers are not polled here: only the place's return judges them.
        tokio::time::advance(Duration::from_millis(30)).await;
        let start = Instant::now();
        drop(places.pop());
        assert_eq!(slow.0.queue().waiting.len(), 1);
        assert!(
            old.try_recv()
                .is_err_and(|e| e == oneshot::error::TryRecvError::Empty)
        );
        assert_eq!(answer(&mut young).await.unwrap(), (7, 0));
        assert_eq!(start.elapsed(), Duration::from_millis(45));
        // That answer moved the queue: the old request goes in the next call.
        assert_eq!(answer(&mut old).await.unwrap(), (7, 0));
        assert_eq!(start.elapsed(), Duration::from_millis(90));
    }

    /// A call answered less than a deadline before a place returns keeps
    /// the queue moving: a request queued before it is taken, however long
    /// ago it queued.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_request_of_a_moving_queue_is_taken_however_long_it_waited() {
        let slow = Arc::new(Slow(Batcher::new(64, DEADLINE)));
        let policy = Policy::new("api", Algorithm::Gcra, "10/s").unwrap();
        let mut places = every_place(&slow, &policy);
        let (mut waiting, _) = queue(&slow, &policy);
        tokio::time::advance(Duration::from_millis(60)).await;
        places[0].answered();
        tokio::time::advance(Duration::from_millis(30)).await;
        drop(places.pop());
        assert_eq!(answer(&mut waiting).await.unwrap(), (7, 0));
    }

    /// A place that returns to a queue of old requests alone is given
    /// back, free for the next request, and each old one is decided by its
    /// own wait: it gives up at its deadline when no call was answered.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_place_returning_to_old_requests_alone_is_free_and_they_give_up() {
        let stuck = Arc::new(Stuck(Batcher::new(64, DEADLINE)));
        let policy = Policy::new("api", Algorithm::Gcra, "10/s").unwrap();
        let kind = Form::word_of(&policy).unwrap();
        let mut places = every_place(&stuck, &policy);
        let (reply, seq) = queue(&stuck, &policy);
        tokio::time::advance(Duration::from_millis(60)).await;
        drop(places.pop());
        assert!(matches!(
            enter(&stuck, kind, request(&policy)),
            Turn::Now(_)
        ));
        let waited = wait(&stuck.0, reply, seq).await;
        assert!(
            matches!(waited, Err(RedisStoreError::Deadline(_))),
            "{waited:?}"
        );
        assert!(stuck.0.queue().waiting.is_empty());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_place_handed_to_a_task_that_never_runs_is_given_back() {
        // One request per call: each queued request is a batch of its own.
        // A deadline far longer than the test, on the real clock: every
        // queued request is young enough to be taken.
        let stuck = Arc::new(Stuck(Batcher::new(1, Duration::from_secs(3_600))));
        let policy = Policy::new("api", Algorithm::Gcra, "10/s").unwrap();
        let kind = Form::word_of(&policy).unwrap();
        let places = every_place(&stuck, &policy);
        let mut queued: Vec<_> = (0..5).map(|_| queue(&stuck, &policy).0).collect();

        // A place is given up in a runtime shutting down: it and the first
        // batch queued behind it go to a task that never runs. Dropped
        // inside the spawn, that task's place gives the next batch up and
        // itself back, rather than hand on again, once per batch queued.
        let handle = crate::running::shut_down_runtime();
        let mut places = places.into_iter();
        {
            let _inside = handle.enter();
            drop(places.next());
        }
        // Answered at once, so that a regression fails rather than hangs.
        for mut dropped in queued.drain(..2) {
            let answer = dropped.try_recv();
            assert!(
                answer.is_err_and(|e| e == oneshot::error::TryRecvError::Closed),
                "its batch was dropped"
            );
        }
        for waiting in &mut queued {
            assert!(
                waiting
                    .try_recv()
                    .is_err_and(|e| e == oneshot::error::TryRecvError::Empty)
            );
        }
        // The place is free again.
        assert!(matches!(
            enter(&stuck, kind, request(&policy)),
            Turn::Now(_)
        ));
        drop(places);
    }
}
