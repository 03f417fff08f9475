//! The floor of a task hand-off: the memory store, decided on another
//! task. Each `check` hands its request to one task, which takes every
//! request queued since it last ran (up to 64, as a batch call would),
//! decides each in memory and answers each on a oneshot, as redis-rs's
//! connection task answers a call. There is no I/O, and the answer comes
//! in the same turn of the scheduler, so no worker parks for it. Beside
//! the memory layer, this variant costs what the hand-off and its two
//! wake-ups cost; beside the Redis store, it leaves what Redis, its socket
//! and the script cost.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tollgate::{Decision, Key, MemoryStore, Policy, Settlement, Store, StoreError};

type Reply = oneshot::Sender<Result<Decision, StoreError>>;

/// A [`MemoryStore`] whose checks are decided on one other task.
#[derive(Clone)]
pub(crate) struct HandOffStore {
    memory: MemoryStore,
    queue: mpsc::UnboundedSender<(Key, Policy, u64, Reply)>,
}

impl HandOffStore {
    /// Spawns the deciding task on the current runtime.
    pub(crate) fn spawn() -> Self {
        let memory = MemoryStore::new();
        let (queue, mut requests) = mpsc::unbounded_channel::<(Key, Policy, u64, Reply)>();
        let decider = memory.clone();
        tokio::spawn(async move {
            let mut batch = Vec::with_capacity(64);
            while requests.recv_many(&mut batch, 64).await > 0 {
                for (key, policy, cost, reply) in batch.drain(..) {
                    // The memory store always decides at once; `check` is
                    // there for the type's sake.
                    let decision = match decider.try_check_now(&key, &policy, cost) {
                        Some(decision) => decision,
                        None => decider.check(&key, &policy, cost).await,
                    };
                    let _ = reply.send(decision);
                }
            }
        });
        Self { memory, queue }
    }
}

impl Store for HandOffStore {
    async fn check(&self, key: &Key, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        let (reply, decision) = oneshot::channel();
        let request = (key.clone(), policy.clone(), cost, reply);
        let stopped = || StoreError::backend(std::io::Error::other("the deciding task stopped"));
        if self.queue.send(request).is_err() {
            return Err(stopped());
        }
        decision.await.unwrap_or_else(|_| Err(stopped()))
    }

    async fn reset(&self, key: &Key, policy: &Policy) -> Result<(), StoreError> {
        self.memory.reset(key, policy).await
    }

    async fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: Settlement,
    ) -> Result<Decision, StoreError> {
        self.memory.settle(key, policy, settlement).await
    }

    async fn block(
        &self,
        key: &Key,
        policy: &Policy,
        duration: Duration,
    ) -> Result<(), StoreError> {
        self.memory.block(key, policy, duration).await
    }
}
