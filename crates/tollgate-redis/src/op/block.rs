//! Blocking a key: one call of `lua/block.lua`, which deletes its state,
//! writes the block, expiring when it ends, and fences its refunds.

use std::time::Duration;

use tollgate_core::{Key, Policy, Settlement, Timestamp};

use crate::connect::RedisConnection;
use crate::deny_cache::{DenyCache, Uncertain};
use crate::error::RedisStoreError;
use crate::keys::{fence_key, log_keys};
use crate::op::word_reply::decimal;
use crate::store::RedisStore;
use crate::wire::Wire;

/// The longest block, 2^50 µs, as the memory store's.
const MAX_BLOCK: Duration = Duration::from_micros(1 << 50);

impl<C: RedisConnection> RedisStore<C> {
    /// Blocks `key` under `policy`'s name for `duration`, as
    /// [`Store::block`](tollgate_core::Store::block) does, keeping the Redis-specific error: one script
    /// call (`lua/block.lua`) deletes its state and writes the block,
    /// expiring when it ends, and fences its refunds (see
    /// [`Settlement`]); every app server's next decision of the key
    /// finds it. Returns when the block ends, on Redis's clock.
    ///
    /// # Errors
    ///
    /// A [`RedisStoreError`] when Redis fails, the deadline passes or the
    /// circuit breaker is open.
    pub async fn block_key(
        &self,
        key: &Key,
        policy: &Policy,
        duration: Duration,
    ) -> Result<Timestamp, RedisStoreError> {
        self.forget_key(key, policy, duration).await
    }

    /// Forgets `key`'s state under `policy`'s name and fences its refunds,
    /// blocking it for `duration` if that is not zero: when the block ends
    /// (now, for none).
    pub(super) async fn forget_key(
        &self,
        key: &Key,
        policy: &Policy,
        duration: Duration,
    ) -> Result<Timestamp, RedisStoreError> {
        let inner = &*self.inner;
        let state_key = inner.names.state_key(policy, key);
        let mut keys = vec![state_key.clone()];
        keys.extend(log_keys(&state_key, policy));
        keys.push(fence_key(&state_key));
        let fence = Settlement::fence(policy);
        // A reset or block that failed or was dropped on its way may have
        // run: the key's denial goes as if it had (a reset key denied
        // here until its old denial's end, through an outage too, is worse
        // than a blocked one asked about again).
        let cache = &inner.deny_cache;
        let uncertain = Uncertain::new(cache, &state_key, DenyCache::remove, true);
        let ends = inner
            .gated(&state_key, inner.wire.forget(&keys, duration, fence))
            .await;
        uncertain.came_back(&ends);
        let ends = ends?;
        inner.deny_cache.remove(&state_key);
        inner.last_known.remove(&state_key);
        Ok(Timestamp::from_micros(ends))
    }
}

impl<C: RedisConnection> Wire<C> {
    /// Forgets the key of `keys` (its state key, then a sliding log's
    /// sets, then its fence key), blocks it for `duration` (none if zero,
    /// at most [`MAX_BLOCK`]), and fences its refunds for `fence` after
    /// the block ends: when the block ends, in µs on Redis's clock.
    async fn forget(
        &self,
        keys: &[String],
        duration: Duration,
        fence: Duration,
    ) -> Result<u64, RedisStoreError> {
        let Some(first) = keys.first() else {
            return Ok(0);
        };
        let micros = |d: Duration| u64::try_from(d.min(MAX_BLOCK).as_micros()).unwrap_or(u64::MAX);
        let (now, min_ttl_ms) = self.test_time();
        let reply = self
            .eval(first, &self.scripts.block, (9, 64 * keys.len()), |cmd| {
                cmd.arg(keys.len())
                    .arg(keys)
                    .arg(micros(duration))
                    .arg(micros(fence));
                if now > 0 {
                    cmd.arg(now).arg(min_ttl_ms);
                }
            })
            .await?;
        let ends = match &reply {
            redis::Value::BulkString(text) => decimal(text),
            _ => None,
        }
        .ok_or_else(|| RedisStoreError::Protocol(format!("{reply:?}")))?;
        // The block ends its duration after Redis's time then.
        self.saw_time(ends.checked_sub(micros(duration)));
        Ok(ends)
    }
}
