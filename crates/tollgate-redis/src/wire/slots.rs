//! The slots of in-flight limits on the wire (`lua/inflight/`).

use tollgate_core::Renewal;

use crate::connect::RedisConnection;
use crate::error::RedisStoreError;
use crate::wire::Wire;

impl<C: RedisConnection> Wire<C> {
    /// Takes a slot of `key` for `holder` if fewer than `max` are held:
    /// whether it did, and the slots held now.
    pub(crate) async fn acquire_slot(
        &self,
        key: &str,
        holder: u64,
        max: u64,
        lease_ms: u64,
    ) -> Result<(bool, u64), RedisStoreError> {
        let reply = self
            .eval(key, &self.scripts.acquire, (7, 96 + key.len()), |cmd| {
                cmd.arg(1).arg(key).arg(holder).arg(max).arg(lease_ms);
            })
            .await?;
        let (acquired, held): (u64, u64) = redis::FromRedisValue::from_redis_value(reply)
            .map_err(|e| RedisStoreError::Protocol(e.to_string()))?;
        Ok((acquired == 1, held))
    }

    /// Extends `holder`'s lease, taking its slot back if it is gone and
    /// fewer than `max` are held.
    pub(crate) async fn renew_slot(
        &self,
        key: &str,
        holder: u64,
        max: u64,
        lease_ms: u64,
    ) -> Result<Renewal, RedisStoreError> {
        let reply = self
            .eval(key, &self.scripts.renew, (7, 96 + key.len()), |cmd| {
                cmd.arg(1).arg(key).arg(holder).arg(max).arg(lease_ms);
            })
            .await?;
        let renewed: u64 = redis::FromRedisValue::from_redis_value(reply)
            .map_err(|e| RedisStoreError::Protocol(e.to_string()))?;
        match renewed {
            1 => Ok(Renewal::Renewed),
            2 => Ok(Renewal::Retaken),
            0 => Ok(Renewal::Lost),
            other => Err(RedisStoreError::Protocol(format!(
                "a renewal replied {other}"
            ))),
        }
    }

    /// Gives `holder`'s slot back.
    pub(crate) async fn release_slot(&self, key: &str, holder: u64) -> Result<(), RedisStoreError> {
        let mut zrem = redis::cmd("ZREM");
        zrem.arg(key).arg(holder);
        self.connection.query_for_key::<i64>(key, &zrem).await?;
        Ok(())
    }
}
