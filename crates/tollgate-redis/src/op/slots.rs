//! The slots of in-flight limits in Redis ([`SlotStore`]): a sorted set
//! per limit and key, of holders scored by when their leases end; taking
//! and renewing one are script calls (`lua/inflight/`), giving one back a
//! `ZREM`.

use std::time::Duration;

use tollgate_core::{InFlightLimit, Key, Renewal, SlotStore, Slots, StoreError};

use crate::connect::RedisConnection;
use crate::error::RedisStoreError;
use crate::script::DecisionScript;
use crate::store::RedisStore;
use crate::wire::Wire;

/// Slots are leases on Redis's clock, renewed by their holders: a slot of
/// an app server that died frees itself when its lease ends, and a
/// renewal that finds its slot gone (Redis lost its data) takes it back,
/// past the limit if new requests hold every slot. Each call is one script call (`lua/inflight/`), under
/// the store's deadline and circuit breaker.
impl<C: RedisConnection> SlotStore for RedisStore<C> {
    async fn acquire(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> Result<Slots, StoreError> {
        let inner = &*self.inner;
        let slots = inner.names.slots_key(limit.name(), key);
        let lease = limit.lease_duration();
        let call = inner.wire.acquire_slot(&slots, holder, limit.max(), lease);
        let (acquired, held) = inner.guarded(&slots, call).await?;
        Ok(Slots { acquired, held })
    }

    async fn renew(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> Result<Renewal, StoreError> {
        let inner = &*self.inner;
        let slots = inner.names.slots_key(limit.name(), key);
        let call = inner
            .wire
            .renew_slot(&slots, holder, limit.max(), limit.lease_duration());
        Ok(inner.guarded(&slots, call).await?)
    }

    async fn release(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> Result<(), StoreError> {
        let inner = &*self.inner;
        let slots = inner.names.slots_key(limit.name(), key);
        let call = inner.wire.release_slot(&slots, holder);
        Ok(inner.guarded(&slots, call).await?)
    }
}

/// A lease in ms, as the scripts take it.
fn lease_ms(lease: Duration) -> u64 {
    u64::try_from(lease.as_millis()).unwrap_or(u64::MAX)
}

impl<C: RedisConnection> Wire<C> {
    /// Takes a slot of `key` for `holder` if fewer than `max` are held:
    /// whether it did, and the slots held now.
    pub(crate) async fn acquire_slot(
        &self,
        key: &str,
        holder: u64,
        max: u64,
        lease: Duration,
    ) -> Result<(bool, u64), RedisStoreError> {
        let script = &self.scripts.acquire;
        let (acquired, held): (u64, u64) = self.slot_call(script, key, holder, max, lease).await?;
        Ok((acquired == 1, held))
    }

    /// Extends `holder`'s lease, taking its slot back if it is gone (past
    /// the limit if `max` are held).
    pub(crate) async fn renew_slot(
        &self,
        key: &str,
        holder: u64,
        max: u64,
        lease: Duration,
    ) -> Result<Renewal, RedisStoreError> {
        let script = &self.scripts.renew;
        let renewed: u64 = self.slot_call(script, key, holder, max, lease).await?;
        match renewed {
            1 => Ok(Renewal::Renewed),
            2 => Ok(Renewal::Retaken),
            3 => Ok(Renewal::RetakenPastLimit),
            other => Err(RedisStoreError::Protocol(format!(
                "a renewal replied {other}"
            ))),
        }
    }

    /// Runs a slot script (taking or renewing `holder`'s slot of `key`,
    /// at most `max` held, for `lease`) and reads its reply as `T`.
    async fn slot_call<T: redis::FromRedisValue>(
        &self,
        script: &DecisionScript,
        key: &str,
        holder: u64,
        max: u64,
        lease: Duration,
    ) -> Result<T, RedisStoreError> {
        let reply = self
            .eval(key, script, (7, 96 + key.len()), |cmd| {
                cmd.arg(1)
                    .arg(key)
                    .arg(holder)
                    .arg(max)
                    .arg(lease_ms(lease));
            })
            .await?;
        T::from_redis_value(reply).map_err(|e| RedisStoreError::Protocol(e.to_string()))
    }

    /// Gives `holder`'s slot back. Its errors are told apart as the
    /// scripts' are: a demoted master's `READONLY` is
    /// [`RedisStoreError::Unavailable`], which makes the store refresh its
    /// connection (after a failover, a give-back on the old master failed
    /// until a script call refreshed it, and the slot stayed held to the
    /// end of its lease).
    pub(crate) async fn release_slot(&self, key: &str, holder: u64) -> Result<(), RedisStoreError> {
        let mut zrem = redis::cmd("ZREM");
        zrem.arg(key).arg(holder);
        let released = self.connection.query_for_key::<i64>(key, &zrem).await;
        released.map_err(crate::wire::reclassify)?;
        Ok(())
    }
}
