//! Resetting a key: one call of `lua/block.lua` with no block, which
//! deletes its state and fences its refunds.

use std::time::Duration;

use tollgate_core::{Key, Policy};

use crate::connect::RedisConnection;
use crate::error::RedisStoreError;
use crate::store::RedisStore;

impl<C: RedisConnection> RedisStore<C> {
    /// Resets `key` under `policy`'s name, as [`Store::reset`](tollgate_core::Store::reset) does,
    /// keeping the Redis-specific error: one script call (`lua/block.lua`)
    /// deletes its state (the value or hash, and a sliding log's sets of
    /// this configuration's periods) and fences its refunds (see
    /// [`Settlement`](tollgate_core::Settlement)), under the store's
    /// deadline and breaker; then this store drops what it remembers of the
    /// key locally (a cached denial, the last decision). Other app servers'
    /// deny caches may still deny the key for up to a second: a cached
    /// denial answers for Redis for at most that long before the key's
    /// next request asks Redis again.
    ///
    /// # Errors
    ///
    /// A [`RedisStoreError`] when Redis fails, the deadline passes or the
    /// circuit breaker is open.
    pub async fn reset_key(&self, key: &Key, policy: &Policy) -> Result<(), RedisStoreError> {
        self.forget_key(key, policy, Duration::ZERO).await?;
        Ok(())
    }
}
