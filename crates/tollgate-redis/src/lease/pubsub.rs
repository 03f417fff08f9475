//! What ties leases to Redis: invalidations on a Redis pub/sub channel
//! ([`RedisChannel`]), and [`LeasedStoreBuilder::connect`], which makes
//! one from a URL.

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use redis::AsyncCommands;
use tollgate_core::Store;

use super::LeasedStore;
use super::builder::LeasedStoreBuilder;
use super::bus::{Channel, ChannelError};
use crate::error::RedisStoreError;

impl LeasedStoreBuilder {
    /// Wraps `store`, subscribing to invalidations through the Redis at
    /// `url` (the store's; any node of a cluster), and starts the task
    /// that gives back the unused part of ended leases.
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::Redis`] for a malformed URL. A Redis that cannot
    /// be reached yet is not an error: no lease is taken until the
    /// subscription is made.
    pub async fn connect<S: Store>(
        self,
        store: S,
        url: &str,
    ) -> Result<LeasedStore<S>, RedisStoreError> {
        let client = redis::Client::open(url)?;
        let channel = RedisChannel {
            name: self.channel_name().to_owned(),
            client,
            publisher: tokio::sync::Mutex::new(None),
        };
        Ok(self.start(store, channel).await)
    }
}

/// A Redis pub/sub channel: a subscription of its own per subscribe, and
/// one connection to publish on, made when first needed and again after
/// a failure.
struct RedisChannel {
    name: String,
    client: redis::Client,
    publisher: tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
}

impl Channel for RedisChannel {
    fn name(&self) -> &str {
        &self.name
    }

    fn subscribe(&self) -> BoxFuture<'_, Result<BoxStream<'static, Vec<u8>>, ChannelError>> {
        Box::pin(async move {
            let subscribed = async {
                let mut pubsub = self.client.get_async_pubsub().await?;
                pubsub.subscribe(&self.name).await?;
                redis::RedisResult::Ok(pubsub)
            };
            let pubsub = subscribed.await.map_err(boxed)?;
            let messages = pubsub
                .into_on_message()
                .map(|message| message.get_payload().unwrap_or_default());
            Ok(messages.boxed())
        })
    }

    fn publish<'a>(&'a self, message: &'a str) -> BoxFuture<'a, Result<u64, ChannelError>> {
        Box::pin(async move {
            let mut publisher = self.publisher.lock().await;
            let connection = match &mut *publisher {
                Some(connection) => connection,
                empty @ None => empty.insert(
                    self.client
                        .get_multiplexed_async_connection()
                        .await
                        .map_err(boxed)?,
                ),
            };
            let sent: redis::RedisResult<u64> = connection.publish(&self.name, message).await;
            if sent.is_err() {
                *publisher = None;
            }
            sent.map_err(boxed)
        })
    }
}

/// A Redis error as a channel's, kept whole (the store's error wraps it
/// as its source).
fn boxed(error: redis::RedisError) -> ChannelError {
    Box::new(error)
}
