//! The store's operations, one file each, with their arguments, the
//! script they run and the reading of its reply: `decide.rs`,
//! `settle.rs`, `block.rs`, `reset.rs`, `status.rs` and `slots.rs` (the
//! in-flight [`SlotStore`](tollgate_core::SlotStore)). Each policy's
//! form (`form.rs`, the one match over forms) says which script: a word
//! script (`word.rs`: `tat.rs`, `window_word.rs`, replies read in
//! `word_reply.rs`) or its algorithm's general script (`general.rs`).
//! Here, the one dispatch: [`Store`] to each operation.

use std::time::Duration;

use tollgate_core::{Decision, Key, Policy, Settlement, Store, StoreError};

use crate::connect::RedisConnection;
use crate::store::RedisStore;

mod block;
pub(crate) mod decide;
pub(crate) mod form;
mod general;
mod reset;
mod settle;
mod slots;
mod status;
mod tat;
mod window_word;
pub(crate) mod word;
mod word_reply;

impl<C: RedisConnection> Store for RedisStore<C> {
    async fn check(&self, key: &Key, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        Ok(self.decide(key, policy, cost).await?)
    }

    async fn status(&self, key: &Key, policy: &Policy) -> Result<Decision, StoreError> {
        Ok(self.status_of(key, policy).await?)
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
        self.last_known_of(key, policy)
    }
    /// `redis`, whatever the connection (one server, a pool, a cluster,
    /// Sentinel).
    fn name(&self) -> &'static str {
        "redis"
    }
}
