//! Resetting a key: one `DEL` of its state.

use tollgate_core::{Key, Policy};

use crate::connect::RedisConnection;
use crate::error::RedisStoreError;
use crate::keys::log_keys;
use crate::store::RedisStore;

impl<C: RedisConnection> RedisStore<C> {
    /// Resets `key` under `policy`'s name, as [`Store::reset`](tollgate_core::Store::reset) does,
    /// keeping the Redis-specific error: deletes its state (the value or
    /// hash, and a sliding log's sets of this configuration's periods) in
    /// one `DEL`, under the store's deadline and breaker, then drops what
    /// this store remembers of it locally (a cached denial, the last
    /// decision). Other app servers' deny caches may still deny the key
    /// until their cached denial runs out: at most that denial's
    /// `Retry-After`.
    ///
    /// # Errors
    ///
    /// A [`RedisStoreError`] when Redis fails, the deadline passes or the
    /// circuit breaker is open.
    pub async fn reset_key(&self, key: &Key, policy: &Policy) -> Result<(), RedisStoreError> {
        let inner = &*self.inner;
        let state_key = inner.names.state_key(policy, key);
        let mut del = redis::cmd("DEL");
        del.arg(&state_key)
            .arg(log_keys(&state_key, policy).collect::<Vec<_>>());
        let connection = &inner.wire.connection;
        inner
            .guarded(&state_key, async {
                connection.query_for_key::<i64>(&state_key, &del).await
            })
            .await?;
        inner.deny_cache.remove(&state_key);
        inner.last_known.remove(&state_key);
        Ok(())
    }
}
