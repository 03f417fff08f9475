//! The operations beside decisions: settling a request's actual cost,
//! resetting a key and blocking it. Each is one call, under the store's
//! deadline and breaker, and drops what this store remembers of the key
//! locally.

use std::time::Duration;

use tollgate_core::{Decision, Key, Policy, Settlement, Timestamp};

use crate::connect::RedisConnection;
use crate::error::RedisStoreError;
use crate::script::settle_args;
use crate::shape::{Form, WordOp};
use crate::store::RedisStore;

/// The longest block, 2^50 µs, as the memory store's.
const MAX_BLOCK_US: u64 = 1 << 50;

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
            .arg(crate::keys::log_keys(&state_key, policy).collect::<Vec<_>>());
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

    /// Settles a request's actual cost, as [`Store::settle`](tollgate_core::Store::settle) does, keeping
    /// the Redis-specific error: one script call, alone (neither batched
    /// nor queued behind the key's decisions, which it need not wait for:
    /// every call is atomic), under the store's deadline and breaker. A
    /// denial of the key in the local deny cache is dropped, since a
    /// refund may have made room.
    ///
    /// # Errors
    ///
    /// As [`RedisStore::decide`].
    pub async fn settle_key(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: &Settlement,
    ) -> Result<Decision, RedisStoreError> {
        let inner = &*self.inner;
        let state_key = inner.names.state_key(policy, key);
        let sent_at = inner.local_now();
        let form = Form::of(policy);
        let args = settle_args(form, policy, settlement);
        let wire = &inner.wire;
        let decision = match form {
            Form::General => {
                let call = wire.settle_general(&state_key, policy, &args.step);
                inner.guarded(&state_key, call).await?
            }
            form => {
                let call = wire.settle_word(form, &state_key, policy, &args);
                let (now, word) = inner.guarded(&state_key, call).await?;
                form.decide_word(policy, now, word, WordOp::Settle(settlement))
                    .ok_or_else(|| RedisStoreError::Protocol("no decision".into()))?
            }
        };
        inner.deny_cache.remove(&state_key);
        inner
            .last_known
            .record(state_key, policy, &decision, sent_at);
        Ok(decision)
    }

    /// Blocks `key` under `policy`'s name for `duration`, as
    /// [`Store::block`](tollgate_core::Store::block) does, keeping the Redis-specific error: one script
    /// call (`lua/block.lua`) deletes its state and writes the block,
    /// expiring when it ends; every app server's next decision of the key
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
        let inner = &*self.inner;
        let state_key = inner.names.state_key(policy, key);
        let micros =
            u64::try_from(duration.as_micros()).map_or(MAX_BLOCK_US, |d| d.min(MAX_BLOCK_US));
        let mut keys = vec![state_key.clone()];
        keys.extend(crate::keys::log_keys(&state_key, policy));
        let ends = inner
            .guarded(&state_key, inner.wire.block(&keys, micros))
            .await?;
        inner.deny_cache.remove(&state_key);
        inner.last_known.remove(&state_key);
        Ok(Timestamp::from_micros(ends))
    }
}
