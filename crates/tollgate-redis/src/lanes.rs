//! One lane per key for the general scripts: a request finds its key's
//! call on its way, or sends one.
//!
//! Without lanes, a client that sends 2,000 requests at once costs 2,000
//! script calls of one key, each with its own deadline, and the tail of
//! them misses the deadline in our own queue: a burst from one client then
//! looks like a Redis outage to the breaker and to every other key. With
//! lanes, a request whose key has a call on its way waits behind it, and
//! when the call returns, everything that queued meanwhile (up to
//! [`MAX_BATCH`]) goes in one call, which decides each request in turn,
//! exactly as if they had come one by one. Waiting in the lane has no
//! deadline of its own: each call has the store's deadline (and its
//! ceiling), and a lane holds at most [`MAX_QUEUED`] requests. A batch
//! holds the requests of one configuration of the policy, so a request
//! waits for at most five calls (the one on its way, then four batches of
//! [`MAX_BATCH`]; test `redis_batching::the_lane_of_one_key_*`), and one
//! more for each other configuration queued ahead of it, which happens
//! only while a change of the key's limits takes effect. A request the
//! lane has no room for fails at once with [`RedisStoreError::QueueFull`],
//! which the breaker does not count.
//!
//! Across keys, at most [`GENERAL_IN_FLIGHT`] calls are on their way at a
//! time ([`Gate`]): a burst of many keys (a spray of new clients) queues
//! here, where its wait is our own, rather than all at once on the
//! connection, where the tail met its deadline behind the head and
//! opened the breaker with Redis healthy. Every other call for a key
//! takes its place here too (`Inner::gated`): the word scripts' calls that
//! are not batched (batching off, or a cluster), settlements, resets and
//! blocks, and in-flight slots.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tollgate_core::{Decision, Policy};

use std::future::Future;

use crate::error::RedisStoreError;
use crate::patience::Missed;
use crate::running;

/// What the lanes need of whoever owns them (the store): the lanes, and a
/// general-script call under the store's deadline and breaker.
pub(crate) trait GeneralCalls: Send + Sync + 'static {
    fn lanes(&self) -> &Lanes;

    /// The runtime the store was built on.
    fn home(&self) -> &crate::patience::Home;

    /// Decides requests of `costs` for `key` under `policy` in turn, in one
    /// call.
    fn call_general(
        &self,
        key: &str,
        policy: &Policy,
        costs: &[u64],
    ) -> impl Future<Output = Result<Vec<Decision>, RedisStoreError>> + Send;
}

/// The most requests of one key decided by one call.
pub(crate) const MAX_BATCH: usize = 1_024;

/// The most requests of one key waiting behind its call.
pub(crate) const MAX_QUEUED: usize = 4 * MAX_BATCH;

type Reply = oneshot::Sender<Result<Decision, RedisStoreError>>;

/// The most general-script calls on their way at a time, across keys.
pub(crate) const GENERAL_IN_FLIGHT: usize = 64;

/// The most calls waiting for a place among them; one more fails at once
/// with [`RedisStoreError::QueueFull`].
pub(crate) const GATE_QUEUED: usize = 65_536;

/// The places of the general-script calls on their way
/// ([`GENERAL_IN_FLIGHT`]). A call that finds none free waits for one, in
/// our own queue, with no deadline of its own: as long as calls keep
/// coming back, answered or failed (each frees a place; a failed one was
/// Redis's lateness, counted by the breaker, which then turns the calls
/// behind it away at once). Each call's deadline starts once it has its
/// place. Only two whole ceilings with none back fail the wait, and only
/// as the app's own lateness ([`RedisStoreError::Late`]) if our runtime
/// was too late to tell (see [`crate::patience::at_most`]).
pub(crate) struct Gate {
    places: tokio::sync::Semaphore,
    waiting: AtomicUsize,
    /// Calls come back so far: the queue's progress.
    back: AtomicU64,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            places: tokio::sync::Semaphore::new(GENERAL_IN_FLIGHT),
            waiting: AtomicUsize::new(0),
            back: AtomicU64::new(0),
        }
    }
}

/// A call's place: given back, and counted as come back, when dropped.
pub(crate) struct Place<'a> {
    gate: &'a Gate,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.gate.back.fetch_add(1, Ordering::Relaxed);
    }
}

impl Gate {
    /// A place for a call, waiting for one (see [`Gate`]) under `deadline`,
    /// on `home`'s runtimes.
    pub(crate) async fn enter(
        &self,
        deadline: Duration,
        home: &impl crate::patience::Runtimes,
    ) -> Result<Place<'_>, RedisStoreError> {
        let place = |permit| Place {
            gate: self,
            _permit: permit,
        };
        if let Ok(permit) = self.places.try_acquire() {
            return Ok(place(permit));
        }
        if self.waiting.fetch_add(1, Ordering::Relaxed) >= GATE_QUEUED {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(RedisStoreError::QueueFull);
        }
        // Counted out however the wait ends, dropped on its way too.
        let _queued = Queued(&self.waiting);
        // Every call on its way comes back within its ceiling, answered or
        // failed (and counted by the breaker): twice that with none back
        // is not Redis's lateness but a call that never ends. (On a
        // cluster, the calls to a failed master come back failed within
        // their ceiling, and free their places for the healthy ones'.) A
        // window whose timer our runtime ran late, still late at its last
        // look, is our own lateness: the calls on their way were late with
        // it, and answer to the breaker themselves.
        let window = crate::patience::ceiling(deadline).saturating_mul(2);
        let slack = crate::patience::slack(deadline);
        let queued = tokio::time::Instant::now();
        // One ask for a place, kept across windows: its turn in the queue
        // with it.
        let mut acquire = std::pin::pin!(self.places.acquire());
        loop {
            let seen = self.back.load(Ordering::Relaxed);
            match crate::patience::at_most(window, slack, home, acquire.as_mut()).await {
                Ok(Ok(permit)) => return Ok(place(permit)),
                // Never closed.
                Ok(Err(_)) => return Err(RedisStoreError::QueueFull),
                Err(_) if self.back.load(Ordering::Relaxed) != seen => {}
                Err(Missed::Busy) => {
                    return Err(RedisStoreError::Late(queued.elapsed()));
                }
                Err(Missed::Deadline | Missed::Ceiling) => {
                    return Err(RedisStoreError::Deadline(queued.elapsed()));
                }
            }
        }
    }
}

/// A call waiting for a place, counted in [`Gate::waiting`] while it lives.
struct Queued<'a>(&'a AtomicUsize);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request waiting behind its key's call.
struct Waiting {
    policy: Policy,
    cost: u64,
    reply: Reply,
}

/// The lanes of one store: each key with a call on its way, and the
/// requests waiting behind it.
#[derive(Default)]
pub(crate) struct Lanes {
    map: Mutex<HashMap<String, Vec<Waiting>>>,
    /// The places of the calls on their way, across keys.
    pub(crate) gate: Gate,
}

impl Lanes {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Waiting>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next batch of `key`: up to [`MAX_BATCH`] requests whose callers
    /// still wait, of the configuration of the first, in the order they
    /// queued. Requests of another configuration (queued while a change of
    /// the key's limits takes effect) keep their places for a batch of
    /// their own, rather than cutting this one short: interleaved, they
    /// would make a call per request. Closes the lane when none is left.
    fn take(&self, key: &str) -> Vec<Waiting> {
        let mut map = self.map();
        let Some(waiting) = map.get_mut(key) else {
            return Vec::new();
        };
        waiting.retain(|w| !w.reply.is_closed());
        let Some(first) = waiting.first() else {
            map.remove(key);
            return Vec::new();
        };
        let fingerprint = first.policy.fingerprint();
        let leading = waiting
            .iter()
            .take(MAX_BATCH)
            .take_while(|w| w.policy.fingerprint() == fingerprint)
            .count();
        if leading == waiting.len().min(MAX_BATCH) {
            return waiting.drain(..leading).collect();
        }
        let (mut batch, mut rest) = (Vec::new(), Vec::with_capacity(waiting.len()));
        for w in waiting.drain(..) {
            if batch.len() < MAX_BATCH && w.policy.fingerprint() == fingerprint {
                batch.push(w);
            } else {
                rest.push(w);
            }
        }
        *waiting = rest;
        batch
    }
}

/// Decides a request of `cost` under `policy` (a general-script policy)
/// for `key`: sends the key's call, or waits behind the one on its way.
pub(crate) async fn decide<S: GeneralCalls>(
    inner: &Arc<S>,
    key: &str,
    policy: &Policy,
    cost: u64,
) -> Result<Decision, RedisStoreError> {
    let waiting = {
        let mut map = inner.lanes().map();
        match map.get_mut(key) {
            Some(waiting) if waiting.len() >= MAX_QUEUED => return Err(RedisStoreError::QueueFull),
            Some(waiting) => {
                let (reply, receiver) = oneshot::channel();
                waiting.push(Waiting {
                    policy: policy.clone(),
                    cost,
                    reply,
                });
                Some(receiver)
            }
            None => {
                map.insert(key.to_owned(), Vec::new());
                None
            }
        }
    };
    if let Some(receiver) = waiting {
        return receiver.await.unwrap_or_else(|_| {
            Err(RedisStoreError::Protocol(
                "the call of this request was dropped".into(),
            ))
        });
    }
    // This request opened the lane: its call goes now, alone. Whoever
    // queues meanwhile is sent by a task when it returns, or when this
    // request stops waiting.
    let lane = Lane {
        inner: inner.clone(),
        key: key.to_owned(),
        open: true,
    };
    let decisions = inner.call_general(key, policy, &[cost]).await;
    drop(lane);
    decisions?
        .pop()
        .ok_or_else(|| RedisStoreError::Protocol("no decision in the reply".into()))
}

/// A lane held by its driver: when dropped while open, hands what queued
/// behind to a task, or closes the lane.
struct Lane<S: GeneralCalls> {
    inner: Arc<S>,
    key: String,
    /// Whether the lane is still this driver's (not closed by the last
    /// [`Lanes::take`], after which another request may open it anew).
    open: bool,
}

impl<S: GeneralCalls> Drop for Lane<S> {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        let batch = self.inner.lanes().take(&self.key);
        if batch.is_empty() {
            return;
        }
        let key = std::mem::take(&mut self.key);
        match running::hand_on_runtime(self.inner.home()) {
            Some(runtime) => {
                // The lane goes with the batch: the task hands it on or
                // closes it when dropped mid-call or unrun (a runtime
                // shutting down).
                let lane = Lane {
                    inner: self.inner.clone(),
                    key,
                    open: true,
                };
                running::hand_on(&runtime, drive(lane, batch));
            }
            // With no runtime to send on (outside any, of a store whose
            // home is not known, or inside a spawn that dropped the lane
            // unrun): the queued requests fail (their
            // senders are dropped) and the lane closes.
            None => {
                drop(batch);
                self.inner.lanes().map().remove(&key);
            }
        }
    }
}

/// Sends the batches of `lane`'s key until the lane is empty. Dropped
/// before (mid-call, or unrun), the lane is handed on or closed.
async fn drive<S: GeneralCalls>(mut lane: Lane<S>, mut batch: Vec<Waiting>) {
    let (inner, key) = (lane.inner.clone(), lane.key.clone());
    while let Some(first) = batch.first() {
        let policy = first.policy.clone();
        let costs: Vec<u64> = batch.iter().map(|w| w.cost).collect();
        match inner.call_general(&key, &policy, &costs).await {
            Ok(decisions) if decisions.len() == batch.len() => {
                for (waiting, decision) in batch.drain(..).zip(decisions) {
                    let _ = waiting.reply.send(Ok(decision));
                }
            }
            Ok(_) => {
                for waiting in batch.drain(..) {
                    let error = RedisStoreError::Protocol("a decision is missing".into());
                    let _ = waiting.reply.send(Err(error));
                }
            }
            Err(error) => {
                for waiting in batch.drain(..) {
                    let _ = waiting.reply.send(Err(error.duplicate()));
                }
            }
        }
        batch = inner.lanes().take(&key);
    }
    // The last take closed the lane: nothing for the guard to hand on.
    lane.open = false;
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tollgate_core::Algorithm;

    use super::*;

    /// Lanes whose calls never come back, counted.
    #[derive(Default)]
    struct Stuck {
        lanes: Lanes,
        calls: AtomicUsize,
    }

    impl GeneralCalls for Stuck {
        fn lanes(&self) -> &Lanes {
            &self.lanes
        }
        fn home(&self) -> &crate::patience::Home {
            &crate::patience::Home::NONE
        }
        async fn call_general(
            &self,
            _: &str,
            _: &Policy,
            _: &[u64],
        ) -> Result<Vec<Decision>, RedisStoreError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            std::future::pending().await
        }
    }

    /// Lanes whose calls wait for a gate, then admit every request; each
    /// call's size recorded.
    struct Gated {
        lanes: Lanes,
        gate: tokio::sync::Semaphore,
        sizes: Mutex<Vec<usize>>,
    }

    impl GeneralCalls for Gated {
        fn lanes(&self) -> &Lanes {
            &self.lanes
        }
        fn home(&self) -> &crate::patience::Home {
            &crate::patience::Home::NONE
        }
        async fn call_general(
            &self,
            _: &str,
            policy: &Policy,
            costs: &[u64],
        ) -> Result<Vec<Decision>, RedisStoreError> {
            self.sizes.lock().unwrap().push(costs.len());
            let _pass = self.gate.acquire().await.unwrap();
            let now = tollgate_core::Timestamp::from_secs(1);
            let mut state = tollgate_core::state::PolicyState::new(policy, now);
            Ok(costs
                .iter()
                .map(|&c| state.decide(policy, now, c))
                .collect())
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn requests_of_two_configurations_interleaved_go_in_a_batch_each() {
        let gated = Arc::new(Gated {
            lanes: Lanes::default(),
            gate: tokio::sync::Semaphore::new(0),
            sizes: Mutex::new(Vec::new()),
        });
        let old = Policy::new("api", Algorithm::SlidingLog, "10/s").unwrap();
        let new = Policy::new("api", Algorithm::SlidingLog, "20/s").unwrap();
        let mut tasks = Vec::new();
        for i in 0..7 {
            // The first opens the lane; then the two configurations in
            // turn, as while a change of the limits takes effect.
            let policy = if i % 2 == 0 { old.clone() } else { new.clone() };
            let gated = gated.clone();
            tasks.push(tokio::spawn(async move {
                decide(&gated, "k", &policy, 1).await.map(|d| d.limit())
            }));
            tokio::task::yield_now().await;
        }
        assert_eq!(*gated.sizes.lock().unwrap(), [1], "one on its way");
        gated.gate.add_permits(1);
        let mut limits = Vec::new();
        for task in tasks {
            limits.push(task.await.unwrap().unwrap());
        }
        // Each decided under its own configuration.
        assert_eq!(limits, [10, 20, 10, 20, 10, 20, 10]);
        // After the first call, the three of the configuration queued
        // first (the new one), then the three of the other.
        assert_eq!(*gated.sizes.lock().unwrap(), [1, 3, 3]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_lane_handed_to_a_task_that_never_runs_is_closed() {
        let stuck = Arc::new(Stuck::default());
        let policy = Policy::new("api", Algorithm::SlidingLog, "10/s").unwrap();
        let mut driving = Box::pin(decide(&stuck, "k", &policy, 1));
        assert!(futures::poll!(driving.as_mut()).is_pending());
        // Queued behind it: requests of two policies in turn, each a batch
        // of its own.
        let other = Policy::new("other", Algorithm::SlidingLog, "20/s").unwrap();
        let mut queued: Vec<_> = (0..6)
            .map(|i| {
                let policy = if i % 2 == 0 { &policy } else { &other };
                Box::pin(decide(&stuck, "k", policy, 1))
            })
            .collect();
        for request in &mut queued {
            assert!(futures::poll!(request.as_mut()).is_pending());
        }
        assert_eq!(
            stuck.calls.load(Ordering::SeqCst),
            1,
            "one behind the other"
        );

        // The driver goes away in a runtime shutting down: the lane and
        // the first batch queued in it go to a task that never runs.
        // Dropped inside the spawn, that task's lane closes rather than
        // hand on again, once per batch queued.
        let handle = crate::running::shut_down_runtime();
        {
            let _inside = handle.enter();
            drop(driving);
        }
        // Answered at once, so that a regression fails rather than hangs.
        for mut request in queued {
            let answer = futures::poll!(request.as_mut());
            assert!(
                matches!(answer, std::task::Poll::Ready(Err(_))),
                "its call was dropped"
            );
        }
        // The lane is closed: the key's next request is sent.
        let mut next = Box::pin(decide(&stuck, "k", &policy, 1));
        assert!(futures::poll!(next.as_mut()).is_pending());
        assert_eq!(stuck.calls.load(Ordering::SeqCst), 2, "sent, not queued");
    }
}

#[cfg(test)]
mod gate_tests;
