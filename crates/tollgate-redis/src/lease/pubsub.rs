//! What ties leases to Redis: invalidations on a Redis pub/sub channel
//! ([`RedisChannel`]), made by [`LeasedStoreBuilder::wrap`] from the
//! store's own connection settings or by [`LeasedStoreBuilder::connect`]
//! from a URL.

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use redis::AsyncCommands;
use tollgate_core::Store;

use super::LeasedStore;
use super::builder::LeasedStoreBuilder;
use super::bus::{Channel, ChannelError};
use crate::connect::ManagedConnection;
use crate::error::RedisStoreError;
use crate::store::RedisStore;

impl LeasedStoreBuilder {
    /// Wraps `store`, subscribing to invalidations through the Redis it
    /// connects to (the same URL and settings: it is not given twice), and
    /// starts the task that gives back the unused part of ended leases.
    /// For a store on another connection (a pool, a cluster, Sentinel),
    /// [`connect`](LeasedStoreBuilder::connect) takes the URL to
    /// subscribe through.
    ///
    /// ```
    /// use tollgate::{Algorithm, Key, Policy, Store};
    /// use tollgate_redis::{LeasedStore, RedisStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    /// let redis = RedisStore::builder()
    ///     .prefix(format!("tollgate-doc-wrap-{}", std::process::id()))
    ///     .connect(url.as_str())
    ///     .await?;
    /// let store = LeasedStore::builder().wrap(redis).await;
    /// let policy = Policy::new("api", Algorithm::Gcra, "1000/s")?;
    /// assert!(store.check(&Key::user("ada"), &policy, 1).await?.is_allowed());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn wrap(
        self,
        store: RedisStore<ManagedConnection>,
    ) -> LeasedStore<RedisStore<ManagedConnection>> {
        let client = store.connection().client().clone();
        let channel = RedisChannel::new(self.channel_name(), client);
        self.start(store, channel).await
    }

    /// Wraps `store`, subscribing to invalidations through the Redis at
    /// `url`, and starts the task that gives back the unused part of ended
    /// leases.
    ///
    /// `url` is the store's Redis, or on a cluster one node, **the same
    /// node for every instance**: a reset or block waits for as many
    /// acknowledgements as `PUBLISH` reports receivers, and on a cluster
    /// it counts only the node's own subscribers, so an instance
    /// subscribed through another node would not be waited for. (While
    /// that node is down, instances are not subscribed, and so hold no
    /// lease and take none: the store decides every request.)
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
        let channel = RedisChannel::new(self.channel_name(), client);
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

impl RedisChannel {
    /// The channel `name` on the Redis of `client`.
    fn new(name: &str, client: redis::Client) -> Self {
        Self {
            name: name.to_owned(),
            client,
            publisher: tokio::sync::Mutex::new(None),
        }
    }
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

    /// Publishes on the connection kept for it, made anew when it is
    /// missing. A connection found dead (Redis restarted since it was
    /// used: the message never left) is made anew and the message sent
    /// once more on it, so that the first invalidation or acknowledgement
    /// after a restart is not lost.
    fn publish<'a>(&'a self, message: &'a str) -> BoxFuture<'a, Result<u64, ChannelError>> {
        Box::pin(async move {
            let mut publisher = self.publisher.lock().await;
            let mut sent = Ok(0);
            for _ in 0..2 {
                let connection = match &mut *publisher {
                    Some(connection) => connection,
                    empty @ None => empty.insert(
                        self.client
                            .get_multiplexed_async_connection()
                            .await
                            .map_err(boxed)?,
                    ),
                };
                sent = connection.publish(&self.name, message).await;
                match &sent {
                    Ok(_) => break,
                    Err(error) => {
                        *publisher = None;
                        if !(error.is_connection_dropped() || error.is_connection_refusal()) {
                            break;
                        }
                    }
                }
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
