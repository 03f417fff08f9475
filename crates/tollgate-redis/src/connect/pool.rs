//! A bb8 pool of multiplexed connections: [`Pool`], and
//! [`RedisStoreBuilder::connect_pool`].

use redis::IntoConnectionInfo;
use redis::{Cmd, FromRedisValue};

use crate::builder::RedisStoreBuilder;
use crate::connect::connection::RedisConnection;
use crate::error::RedisStoreError;
use crate::store::RedisStore;

/// A bb8 pool of multiplexed Redis connections (from `bb8-redis`).
pub type Pool = bb8::Pool<bb8_redis::RedisConnectionManager>;

impl RedisStoreBuilder {
    /// Connects through a bb8 pool of multiplexed connections.
    ///
    /// # Errors
    ///
    /// As [`RedisStoreBuilder::connect`].
    pub async fn connect_pool(
        self,
        url: impl IntoConnectionInfo,
    ) -> Result<RedisStore<Pool>, RedisStoreError> {
        self.check()?;
        let manager = bb8_redis::RedisConnectionManager::new(url)?;
        let pool = bb8::Pool::builder()
            .max_size(self.pool_size)
            .connection_timeout(self.checkout_timeout)
            .build(manager)
            .await?;
        self.build(pool).await
    }
}

impl RedisConnection for Pool {
    fn is_one_server(&self) -> bool {
        true
    }

    async fn query<T: FromRedisValue + Send>(&self, cmd: &Cmd) -> Result<T, RedisStoreError> {
        let mut con = self.get().await.map_err(|e| match e {
            bb8::RunError::User(e) => RedisStoreError::Redis(e),
            bb8::RunError::TimedOut => RedisStoreError::PoolTimeout,
        })?;
        Ok(cmd.query_async(&mut *con).await?)
    }
}
