//! The slots of in-flight limits in Redis ([`SlotStore`]): a sorted set
//! per limit and key, of holders scored by when their leases end; taking
//! renewing and giving one back, are script calls (`lua/inflight/`). A
//! holder given back while it held no slot is remembered for a lease, in
//! a second sorted set beside the slots, so that an acquire that arrives
//! after its give-back takes nothing (`release.lua`).

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
/// past the limit if new requests hold every slot. A give-back that
/// reaches Redis before its own acquire (on a pool, or a connection
/// replaced after an error, calls are not in order) makes that acquire
/// take nothing. Each call is one script call (`lua/inflight/`), under
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
        let (given_back, lease) = (given_back(&slots), limit.lease_duration());
        let call = inner
            .wire
            .acquire_slot(&slots, &given_back, holder, limit.max(), lease);
        let (acquired, held) = inner.gated(&slots, call).await?;
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
        Ok(inner.gated(&slots, call).await?)
    }

    async fn release(
        &self,
        key: &Key,
        limit: &InFlightLimit,
        holder: u64,
    ) -> Result<(), StoreError> {
        let inner = &*self.inner;
        let slots = inner.names.slots_key(limit.name(), key);
        let (given_back, lease) = (given_back(&slots), limit.lease_duration());
        let call = inner.wire.release_slot(&slots, &given_back, holder, lease);
        Ok(inner.gated(&slots, call).await?)
    }
}

/// The sorted set of holders given back while they held no slot of
/// `slots` (`lua/inflight/release.lua`): its name begins with `slots`,
/// whose hash tag keeps both in one cluster slot.
fn given_back(slots: &str) -> String {
    format!("{slots}:given-back")
}

/// A lease in ms, as the scripts take it.
fn lease_ms(lease: Duration) -> u64 {
    u64::try_from(lease.as_millis()).unwrap_or(u64::MAX)
}

impl<C: RedisConnection> Wire<C> {
    /// Takes a slot of `key` for `holder` if fewer than `max` are held
    /// and `holder` was not given back already (`given_back`): whether it
    /// did, and the slots held now.
    pub(crate) async fn acquire_slot(
        &self,
        key: &str,
        given_back: &str,
        holder: u64,
        max: u64,
        lease: Duration,
    ) -> Result<(bool, u64), RedisStoreError> {
        let script = &self.scripts.acquire;
        let (acquired, held): (u64, u64) = self
            .slot_call(script, [key, given_back], holder, max, lease)
            .await?;
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
        let renewed: u64 = self.slot_call(script, [key], holder, max, lease).await?;
        match renewed {
            1 => Ok(Renewal::Renewed),
            2 => Ok(Renewal::Retaken),
            3 => Ok(Renewal::RetakenPastLimit),
            other => Err(RedisStoreError::Protocol(format!(
                "a renewal replied {other}"
            ))),
        }
    }

    /// Runs a slot script (taking or renewing `holder`'s slot of
    /// `keys[0]`, at most `max` held, for `lease`) and reads its reply as
    /// `T`.
    async fn slot_call<T: redis::FromRedisValue, const N: usize>(
        &self,
        script: &DecisionScript,
        keys: [&str; N],
        holder: u64,
        max: u64,
        lease: Duration,
    ) -> Result<T, RedisStoreError> {
        let bytes: usize = keys.iter().map(|k| k.len()).sum();
        let reply = self
            .eval(keys[0], script, (6 + N, 96 + bytes), |cmd| {
                cmd.arg(N).arg(&keys[..]);
                cmd.arg(holder).arg(max).arg(lease_ms(lease));
            })
            .await?;
        T::from_redis_value(reply).map_err(|e| RedisStoreError::Protocol(e.to_string()))
    }

    /// Gives `holder`'s slot of `key` back; a holder that held none is
    /// remembered in `given_back` for `lease`, so that its acquire, if it
    /// is still on its way, takes nothing. A script call, whose errors
    /// are told apart as every script's are: a demoted master's
    /// `READONLY` makes the store refresh its connection (after a
    /// failover, a give-back on the old master failed until a script call
    /// refreshed it, and the slot stayed held to the end of its lease).
    pub(crate) async fn release_slot(
        &self,
        key: &str,
        given_back: &str,
        holder: u64,
        lease: Duration,
    ) -> Result<(), RedisStoreError> {
        let bytes = key.len() + given_back.len();
        self.eval(key, &self.scripts.release, (7, 64 + bytes), |cmd| {
            cmd.arg(2).arg(key).arg(given_back);
            cmd.arg(holder).arg(lease_ms(lease));
        })
        .await?;
        Ok(())
    }
}
