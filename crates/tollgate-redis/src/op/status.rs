//! What the store can tell of a key without changing it: its status (a
//! decision of cost 0, which the scripts commit nothing for), the last
//! decision Redis made of it, and whether the store is ready.

use std::time::{Duration, Instant};

use tollgate_core::{Algorithm, Decision, Key, Policy};

use crate::connect::RedisConnection;
use crate::error::RedisStoreError;
use crate::op::decide::{decided, word_request};
use crate::op::form::Form;
use crate::store::RedisStore;

impl<C: RedisConnection> RedisStore<C> {
    /// The status of `key` under `policy`, as [`Store::status`](tollgate_core::Store::status)
    /// gives it: a decision of cost 0, through the decision path.
    pub(crate) async fn status_of(
        &self,
        key: &Key,
        policy: &Policy,
    ) -> Result<Decision, RedisStoreError> {
        self.decide(key, policy, 0).await
    }

    /// The last decision Redis made for `key` under `policy`, while a
    /// limit of it has not reset (see [`Store::last_known`](tollgate_core::Store::last_known)).
    pub(crate) fn last_known_of(&self, key: &Key, policy: &Policy) -> Option<Decision> {
        let inner = &*self.inner;
        let state_key = inner.names.state_key(policy, key);
        inner.last_known.get(&state_key, policy, inner.local_now())
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
        let Some(form) = Form::word_of(policy) else {
            return self
                .inner
                .wire
                .general(state_key, policy, &[cost])
                .await?
                .pop()
                .ok_or_else(|| RedisStoreError::Protocol("no decision in the reply".into()));
        };
        let request = word_request(form, state_key, policy, cost);
        let words = self.inner.wire.send(form, &[request]).await?;
        let &(now, word) = words
            .first()
            .ok_or_else(|| RedisStoreError::Protocol("no word in the reply".into()))?;
        decided(form, policy, now, word, cost)
    }
}
