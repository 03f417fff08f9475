//! The gate every request of an adaptive layer passes: its
//! [`Concurrency`] and the requests waiting for a slot, behind one lock.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;
use tollgate_core::{
    AdaptiveLimit, Clock, Completion, Concurrency, ConcurrencySnapshot, Permit, Priority, Timestamp,
};

use super::telemetry::Telemetry;

/// How long and how many requests may wait for a slot.
#[derive(Debug, Clone, Copy)]
pub(super) struct Queue {
    /// The most requests waiting at once, of every class.
    pub(super) max_waiting: usize,
    /// The longest a request waits before it is shed.
    pub(super) max_wait: Duration,
}

/// What a request is told at the gate.
pub(super) enum Entry {
    /// It may run.
    Admitted(Permit),
    /// It waits for a slot, which arrives on this channel.
    Wait(Waiting),
    /// It is shed.
    Shed,
}

struct Inner {
    concurrency: Concurrency,
    /// The requests waiting, per class in [`Priority::ALL`]'s order, oldest
    /// first.
    waiting: [VecDeque<oneshot::Sender<Permit>>; 3],
    /// When the timer that dispatches as a closed class reopens fires, if
    /// one is set.
    timer_at: Option<Timestamp>,
}

/// One layer's gate, shared by its services and its handles.
pub(super) struct Gate {
    inner: Mutex<Inner>,
    /// Requests that gave up while waiting since the queues were last
    /// swept: a full queue is swept only then (in constant time
    /// otherwise, as every entry asks).
    gone: AtomicUsize,
    clock: Arc<dyn Clock>,
    pub(super) queue: Option<Queue>,
    pub(super) telemetry: Telemetry,
}

impl Gate {
    pub(super) fn new(config: &AdaptiveLimit, clock: Arc<dyn Clock>, queue: Option<Queue>) -> Self {
        let telemetry = Telemetry::new(config.name());
        let concurrency = Concurrency::new(config, clock.now());
        telemetry.observe(concurrency.limit(clock.now()), 0, 0);
        Self {
            inner: Mutex::new(Inner {
                concurrency,
                waiting: Default::default(),
                timer_at: None,
            }),
            gone: AtomicUsize::new(0),
            clock,
            queue,
            telemetry,
        }
    }

    /// Admits a request of `class`, queues it, or sheds it.
    pub(super) fn enter(self: &Arc<Self>, class: Priority) -> Entry {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        // A request never passes one of its class or above that waits.
        purge(&mut inner);
        let ahead = inner.waiting[..=class.index()]
            .iter()
            .any(|queue| !queue.is_empty());
        if !ahead
            && inner.concurrency.would_admit(class, now)
            && let Some(permit) = inner.concurrency.try_acquire(class, now)
        {
            let in_flight = inner.concurrency.in_flight();
            drop(inner);
            self.telemetry.in_flight(in_flight);
            return Entry::Admitted(permit);
        }
        let Some(queue) = self.queue else {
            inner.concurrency.count_refused(class, now);
            drop(inner);
            self.telemetry.shed(class);
            return Entry::Shed;
        };
        if waiting(&inner) >= queue.max_waiting
            && !self.make_room(&mut inner, class, queue.max_waiting)
        {
            inner.concurrency.count_refused(class, now);
            drop(inner);
            self.telemetry.shed(class);
            return Entry::Shed;
        }
        let (sender, receiver) = oneshot::channel();
        inner.waiting[class.index()].push_back(sender);
        inner.concurrency.count_waiting(now);
        // Nothing may be in flight to release a slot to it: serve what
        // can be served now (a class above stopped being refused, say).
        let reopens = dispatch(&mut inner, now);
        self.wake_at(&mut inner, reopens, now);
        let queued = waiting(&inner);
        drop(inner);
        self.telemetry.queued(queued);
        Entry::Wait(Waiting {
            gate: self.clone(),
            class,
            receiver: Some(receiver),
            // From its entry, not its first poll: waits end in the order
            // they began, so one whose wait ended is at the front.
            deadline: tokio::time::Instant::now() + queue.max_wait,
        })
    }

    /// Hands back `permit`, done as `completion` says, and passes the free
    /// slots to the requests waiting, the most important first.
    pub(super) fn release(self: &Arc<Self>, permit: Permit, completion: Completion) {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        inner.concurrency.release(permit, now, completion);
        let reopens = dispatch(&mut inner, now);
        self.wake_at(&mut inner, reopens, now);
        let limit = inner.concurrency.limit(now);
        let in_flight = inner.concurrency.in_flight();
        let queued = waiting(&inner);
        drop(inner);
        self.telemetry.observe(limit, in_flight, queued);
    }

    /// What the gate holds now, and how many requests wait.
    pub(super) fn snapshot(&self) -> (ConcurrencySnapshot, usize) {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        purge(&mut inner);
        (inner.concurrency.snapshot(now), waiting(&inner))
    }

    /// Sets a timer to serve the requests waiting when the one `dispatch`
    /// stopped at could run though no request ends (at `reopens`: its
    /// class reopens, or a warm-up raises the limit): a release is not
    /// what lets it in, and none may come. No timer is set if one fires
    /// sooner; one sleeps at most the 100 ms of a closure (a clock stepped
    /// back would put the reopening far away), and one past its time
    /// without firing (its runtime gone) is replaced. None outside a Tokio
    /// runtime (a release from a drop there): the next release or entry
    /// dispatches.
    fn wake_at(self: &Arc<Self>, inner: &mut Inner, reopens: Option<Timestamp>, now: Timestamp) {
        let Some(reopens) = reopens else {
            return;
        };
        let wait = reopens
            .saturating_duration_since(now)
            .min(Concurrency::CLOSED_FOR);
        let fires = now + wait;
        if inner.timer_at.is_some_and(|at| at > now && at <= fires) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        inner.timer_at = Some(fires);
        let gate = self.clone();
        runtime.spawn(async move {
            tokio::time::sleep(wait).await;
            gate.redispatch(fires);
        });
    }

    /// Passes the free slots to the requests waiting, as a release does,
    /// when a closed class reopens: the timer set to fire at `fired`.
    fn redispatch(self: &Arc<Self>, fired: Timestamp) {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        if inner.timer_at == Some(fired) {
            inner.timer_at = None;
        }
        let reopens = dispatch(&mut inner, now);
        self.wake_at(&mut inner, reopens, now);
        let in_flight = inner.concurrency.in_flight();
        let queued = waiting(&inner);
        drop(inner);
        self.telemetry.in_flight(in_flight);
        self.telemetry.queued(queued);
    }

    /// Makes room in a full queue of at most `max_waiting` for a request
    /// of `class`: requests that gave up leave, or else the newest request
    /// waiting in the lowest class below it is shed (its channel closes,
    /// and it is counted as refused when it sees that). False if none of
    /// either.
    fn make_room(&self, inner: &mut Inner, class: Priority, max_waiting: usize) -> bool {
        // Requests that gave up behind one still waiting count until they
        // reach the front: gone, they leave room without shedding anyone.
        // Swept only when some gave up since the last sweep.
        if self.gone.swap(0, Ordering::Acquire) > 0 {
            for queue in &mut inner.waiting {
                queue.retain(|waiter| !waiter.is_closed());
            }
            if waiting(inner) < max_waiting {
                return true;
            }
        }
        let below = &mut inner.waiting[class.index() + 1..];
        below
            .iter_mut()
            .rev()
            .find_map(VecDeque::pop_back)
            .is_some()
    }

    /// Counts a request of `class` that waited in vain.
    fn gave_up(&self, class: Priority) {
        // Not counted as gone: every wait has the same deadline, so one
        // whose wait ended is at the front, and leaves with `purge`.
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        inner.concurrency.count_refused(class, now);
        purge(&mut inner);
        let queued = waiting(&inner);
        drop(inner);
        self.telemetry.shed(class);
        self.telemetry.queued(queued);
    }
}

/// Passes the free slots to the requests waiting, the most important
/// first, the oldest first within a class; stops at the first that may
/// not run yet (the classes below may use no more than it). Returns when
/// that one could run though no request ends: when its class reopens, if
/// a refusal above closed it, or when a warm-up next raises the limit.
fn dispatch(inner: &mut Inner, now: Timestamp) -> Option<Timestamp> {
    let Inner {
        concurrency,
        waiting,
        timer_at: _,
    } = inner;
    for class in Priority::ALL {
        let queue = &mut waiting[class.index()];
        while let Some(waiter) = queue.front() {
            if waiter.is_closed() {
                queue.pop_front();
                continue;
            }
            if !concurrency.would_admit(class, now) {
                return concurrency.next_opening(class, now);
            }
            let waiter = queue.pop_front()?;
            let Some(permit) = concurrency.try_acquire(class, now) else {
                queue.push_front(waiter);
                return None;
            };
            if let Err(permit) = waiter.send(permit.after_waiting()) {
                // It gave up just now: the slot is free again.
                concurrency.release(permit, now, Completion::Ignored);
            }
        }
    }
    None
}

/// Lets the requests that gave up leave from the front of each queue: the
/// oldest give up first, as every wait has the same deadline.
fn purge(inner: &mut Inner) {
    for queue in &mut inner.waiting {
        while queue.front().is_some_and(oneshot::Sender::is_closed) {
            queue.pop_front();
        }
    }
}

/// The requests waiting, counting those that gave up behind one that
/// still waits (they leave when they reach the front): in constant time,
/// since it is asked on every entry and release.
fn waiting(inner: &Inner) -> usize {
    inner.waiting.iter().map(VecDeque::len).sum()
}

/// A request waiting for a slot. Dropped before its slot came (its
/// deadline passed, or its client went away), it leaves the queue; a slot
/// that came meanwhile goes back.
pub(super) struct Waiting {
    gate: Arc<Gate>,
    class: Priority,
    receiver: Option<oneshot::Receiver<Permit>>,
    deadline: tokio::time::Instant,
}

impl Waiting {
    /// Waits for a slot until the queue's `max_wait` after it entered:
    /// `None` if none came, or the gate shed it to make room for a more
    /// important request.
    pub(super) async fn slot(mut self) -> Option<Permit> {
        let receiver = self.receiver.as_mut()?;
        match tokio::time::timeout_at(self.deadline, receiver).await {
            Ok(Ok(permit)) => {
                self.receiver = None;
                Some(permit)
            }
            Ok(Err(_)) | Err(_) => {
                // Shed to make room, or its wait passed.
                let late = self.take_late();
                if late.is_none() {
                    self.gate.gave_up(self.class);
                }
                late
            }
        }
    }

    /// Closes the channel and takes a slot sent just before it closed.
    fn take_late(&mut self) -> Option<Permit> {
        let mut receiver = self.receiver.take()?;
        receiver.close();
        receiver.try_recv().ok()
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.receiver.is_none() {
            return;
        }
        match self.take_late() {
            Some(permit) => self.gate.release(permit, Completion::Ignored),
            None => {
                self.gate.gone.fetch_add(1, Ordering::Release);
            }
        }
    }
}
