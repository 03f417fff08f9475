//! Automatic batching: one-word decisions (and, apart from them,
//! window-word decisions) that arrive while earlier ones are on their way
//! to Redis share one script call.
//!
//! At most [`IN_FLIGHT`] calls are on their way at a time. A request that
//! finds a free place is sent at once, alone, exactly as without batching,
//! so an idle store adds no delay. A request that finds every place taken
//! queues; when a call returns and requests are queued, the place is not
//! given back but passed to a task that sends the queue (up to the batch
//! size) in one `EVALSHA` and goes on until the queue is empty. Redis then
//! reads one command, runs one script and writes one reply for many
//! decisions, and the client encodes, sends and parses one.
//!
//! Every request is still decided by exactly one script call, atomically,
//! in the order it queued; requests whose callers stopped waiting (their
//! deadline passed) are left out before a call is sent.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;
use tollgate_core::Policy;

use crate::connection::RedisConnection;
use crate::error::RedisStoreError;
use crate::store::Inner;

/// Calls of the batch script on their way at once.
pub(crate) const IN_FLIGHT: usize = 2;

/// What the script says of one request: Redis's `now` and the key's time
/// before the request (0 for an expired key), both in µs.
pub(crate) type Word = (u64, u64);

/// Which script a request runs; each has its own queue and places.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A single GCRA, token-bucket or leaky-bucket limit (`one_word.lua`).
    OneWord,
    /// A single fixed-window limit (`window_word.lua`).
    WindowWord,
}

/// One request to a word script: its state key and numbers (see
/// `script::one_word_args` and `script::window_word_args`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request<'a> {
    pub(crate) key: &'a str,
    /// The window's period in µs (window words; 0 for one-word requests).
    pub(crate) period: u64,
    pub(crate) step: u64,
    pub(crate) slack: u64,
    /// The request's policy, whose descriptor the script writes the state
    /// under.
    pub(crate) policy: &'a Policy,
}

/// A request waiting for a place in a call.
pub(crate) struct Queued {
    key: String,
    period: u64,
    step: u64,
    slack: u64,
    policy: Policy,
    reply: oneshot::Sender<Result<Word, RedisStoreError>>,
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
}

/// The queue of one store.
pub(crate) struct Batcher {
    max_keys: usize,
    queue: Mutex<Queue>,
}

/// Where a request goes: sent alone at once (holding a place, if the store
/// batches, until the [`Place`] is dropped), or queued for a batch.
pub(crate) enum Turn<C: RedisConnection> {
    Now(Place<C>),
    Queued(oneshot::Receiver<Result<Word, RedisStoreError>>),
}

/// A place among the calls on their way; dropping it (when the call has
/// returned, or its caller stopped waiting) hands it to the queue.
pub(crate) struct Place<C: RedisConnection> {
    inner: Option<(Arc<Inner<C>>, Kind)>,
}

impl<C: RedisConnection> Drop for Place<C> {
    fn drop(&mut self) {
        if let Some((inner, kind)) = &self.inner {
            release(inner, *kind);
        }
    }
}

impl Batcher {
    /// A batcher of at most `max_keys` requests per call.
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            max_keys,
            queue: Mutex::default(),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Takes a place for `request`, or queues it.
pub(crate) fn enter<C: RedisConnection>(
    inner: &Arc<Inner<C>>,
    kind: Kind,
    request: Request<'_>,
) -> Turn<C> {
    let Some(batcher) = inner.batcher(kind) else {
        return Turn::Now(Place { inner: None });
    };
    let mut queue = batcher.queue();
    if queue.in_flight < IN_FLIGHT {
        // Nothing is queued while a place is free: a returning call that
        // finds a queue keeps its place for it.
        queue.in_flight += 1;
        return Turn::Now(Place {
            inner: Some((inner.clone(), kind)),
        });
    }
    let (reply, receiver) = oneshot::channel();
    queue.waiting.push(Queued {
        key: request.key.to_owned(),
        period: request.period,
        step: request.step,
        slack: request.slack,
        policy: request.policy.clone(),
        reply,
    });
    Turn::Queued(receiver)
}

/// Gives a place back, or hands it to a task that sends the queue.
fn release<C: RedisConnection>(inner: &Arc<Inner<C>>, kind: Kind) {
    let Some(batcher) = inner.batcher(kind) else {
        return;
    };
    let batch = take(batcher);
    if batch.is_empty() {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(drive(inner.clone(), kind, batch));
        }
        // Outside a runtime nothing can send: the queued requests fail
        // (their senders are dropped) and the place is given back.
        Err(_) => {
            drop(batch);
            batcher.queue().in_flight -= 1;
        }
    }
}

/// The next batch from the queue, leaving out requests nobody waits for;
/// an empty batch gives the place back.
fn take(batcher: &Batcher) -> Vec<Queued> {
    let mut queue = batcher.queue();
    queue.waiting.retain(|q| !q.reply.is_closed());
    let n = queue.waiting.len().min(batcher.max_keys);
    let batch: Vec<Queued> = queue.waiting.drain(..n).collect();
    if batch.is_empty() {
        queue.in_flight -= 1;
    }
    batch
}

/// Sends batches until the queue is empty, then gives the place back.
async fn drive<C: RedisConnection>(inner: Arc<Inner<C>>, kind: Kind, mut batch: Vec<Queued>) {
    // Gives the place back if the task is dropped mid-call (the runtime
    // shutting down); disarmed when the loop gives it back itself.
    struct Slot<'a>(Option<&'a Batcher>);
    impl Drop for Slot<'_> {
        fn drop(&mut self) {
            if let Some(batcher) = self.0 {
                batcher.queue().in_flight -= 1;
            }
        }
    }
    let Some(batcher) = inner.batcher(kind) else {
        return;
    };
    let mut slot = Slot(Some(batcher));
    loop {
        // The call, not the wait in the queue, answers to the deadline and
        // the breaker: one failed call is one failure, however many
        // requests it carried.
        let key = batch.first().map_or("", |q| q.key.as_str());
        let result = inner.guarded(key, inner.send_batch(kind, &batch)).await;
        match result {
            Ok(words) => {
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
            slot.0 = None;
            return;
        }
    }
}

/// A reply of the one-word script, read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Each request's word, at Redis's `now`, which the reply carried.
    Words(Vec<Word>),
    /// One request, whose key's time was this many µs ahead of Redis's
    /// `now`, which the reply did not carry.
    Ahead(u64),
}

/// Reads a reply of the one-word script for `n` requests: `now` alone, as
/// a positive integer (no key's time was ahead of now); for one request
/// whose key's time was ahead, now minus that time, a negative integer; or
/// else the string `"<seconds> <microseconds> <old_1> ... <old_n>"`, now as
/// Redis `TIME` gave it.
pub(crate) fn words(reply: &redis::Value, n: usize) -> Result<Reply, RedisStoreError> {
    use redis::Value;
    let bad = || RedisStoreError::Protocol(format!("{reply:?}"));
    match reply {
        Value::Int(now) if *now >= 0 => Ok(Reply::Words(vec![(now.unsigned_abs(), 0); n])),
        Value::Int(gap) if n == 1 => Ok(Reply::Ahead(gap.unsigned_abs())),
        Value::BulkString(text) => {
            let mut fields = text.split(|&b| b == b' ').map(decimal);
            let now = match (fields.next().flatten(), fields.next().flatten()) {
                (Some(sec), Some(usec)) if usec < 1_000_000 => sec
                    .checked_mul(1_000_000)
                    .and_then(|s| s.checked_add(usec))
                    .ok_or_else(bad)?,
                _ => return Err(bad()),
            };
            let words = fields
                .map(|old| old.map(|old| (now, old)))
                .collect::<Option<Vec<Word>>>()
                .ok_or_else(bad)?;
            if words.len() == n {
                Ok(Reply::Words(words))
            } else {
                Err(bad())
            }
        }
        _ => Err(bad()),
    }
}

/// A non-empty run of ASCII digits as a `u64`, or `None`.
fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        if d.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    #[test]
    fn replies_are_read_per_request() {
        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let read = |reply: Value, n| match words(&reply, n) {
            Ok(Reply::Words(words)) => words,
            other => panic!("{other:?}"),
        };
        assert_eq!(read(Value::Int(7), 3), vec![(7, 0); 3]);
        assert_eq!(
            read(text("2 5 0 3000009"), 2),
            vec![(2_000_005, 0), (2_000_005, 3_000_009)]
        );
        assert_eq!(
            read(text("1795000000 999999 1795000001000000"), 1),
            vec![(1_795_000_000_999_999, 1_795_000_001_000_000)]
        );
        assert_eq!(words(&Value::Int(-9), 1).unwrap(), Reply::Ahead(9));
        assert_eq!(
            words(&Value::Int(i64::MIN), 1).unwrap(),
            Reply::Ahead(1 << 63)
        );
        for bad in [
            words(&text("2 5 0 9"), 3),
            words(&text("2 5 0 9"), 1),
            words(&text("2 5"), 1),
            words(&text("2"), 0),
            words(&text("2 1000000 9"), 1),
            words(&text("2 5 -9"), 1),
            words(&text("2 5 9 "), 1),
            words(&text("2  5 9"), 1),
            words(&text("2 5 1e9"), 1),
            words(&text("2 5 18446744073709551616"), 1),
            words(&text("18446744073710 5 9"), 1),
            // A gap is for one request alone.
            words(&Value::Int(-1), 2),
            words(&Value::Array(vec![Value::Int(7), Value::Int(9)]), 1),
            words(&Value::Nil, 1),
        ] {
            assert!(matches!(bad, Err(RedisStoreError::Protocol(_))), "{bad:?}");
        }
    }
}
