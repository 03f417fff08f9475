//! The slots of in-flight limits in Redis ([`SlotStore`]): a sorted set
//! per limit and key, of holders scored by when their leases end.

use tollgate_core::{InFlightLimit, Key, Renewal, SlotStore, Slots, StoreError};

use crate::connect::RedisConnection;
use crate::store::RedisStore;

/// Slots are leases on Redis's clock, renewed by their holders: a slot of
/// an app server that died frees itself when its lease ends, and a
/// renewal that finds its slot gone (Redis lost its data) takes it back
/// if there is room. Each call is one script call (`lua/inflight/`), under
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
        let lease = lease_ms(limit);
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
            .renew_slot(&slots, holder, limit.max(), lease_ms(limit));
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

fn lease_ms(limit: &InFlightLimit) -> u64 {
    u64::try_from(limit.lease_duration().as_millis()).unwrap_or(u64::MAX)
}
