//! Invalidations: how an operator's reset or block on one instance ends
//! every instance's lease of that key before it takes effect.
//!
//! Every instance subscribes to one channel. Once the reset or block is
//! in the store, an invalidation publishes `d <nonce> <identity>`;
//! `PUBLISH` answers how many subscribers got it. Each drops its leases of
//! the identity, then publishes `a <nonce> <instance>`, and the
//! invalidating instance waits for that many instances' acknowledgements
//! before the reset or block returns. So no lease granted before it is spent after it returns (a
//! grant on its way when an instance hears the invalidation is dropped
//! when it lands); one spent while the operation is under way is
//! concurrent with it. An instance that is not subscribed (Redis is down,
//! or the subscription was lost) holds no lease and takes none: it might
//! miss an invalidation.
//!
//! `PUBLISH` counts the subscribers of the node it is sent to. On a
//! cluster, which forwards the message to every node, an instance
//! subscribed through another node is not counted, and the operation could
//! return before that instance dropped its leases: so every instance
//! subscribes through the same node (see `LeasedStoreBuilder::connect`).
//!
//! The channel itself is a [`Channel`]: Redis pub/sub (`redis.rs`), or
//! anything that delivers every message to every subscriber.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError, Weak};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use tokio::sync::watch;

/// Why a channel could not subscribe or publish.
pub(crate) type ChannelError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A publish/subscribe channel that every instance of one limit shares.
pub(crate) trait Channel: Send + Sync + 'static {
    /// The channel's name, for logs.
    fn name(&self) -> &str;
    /// Subscribes: the payloads of the messages published from then on,
    /// until the subscription is lost.
    fn subscribe(&self) -> BoxFuture<'_, Result<BoxStream<'static, Vec<u8>>, ChannelError>>;
    /// Publishes `message`: how many subscribers received it.
    fn publish<'a>(&'a self, message: &'a str) -> BoxFuture<'a, Result<u64, ChannelError>>;
}

/// The invalidation channel of one instance.
pub(crate) struct Bus {
    channel: Box<dyn Channel>,
    /// Invalidations this instance waits on: acknowledgements so far.
    pending: Mutex<HashMap<String, Acks>>,
    /// Subscribed: leases may be taken.
    listening: AtomicBool,
    /// Counts the invalidations received, so that a grant on its way
    /// while one arrived is not kept.
    pub(crate) generation: AtomicU64,
    instance: u64,
    next_nonce: AtomicU64,
}

/// The acknowledgements of one invalidation: how many instances, each
/// counted once by the name it gives (an instance of an earlier version,
/// which gives none, counted at each).
struct Acks {
    count: watch::Sender<u64>,
    by: HashSet<String>,
}

impl Acks {
    fn heard(&mut self, by: Option<&str>) {
        let new = match by {
            Some(instance) => self.by.insert(instance.to_owned()),
            None => true,
        };
        if new {
            self.count.send_modify(|n| *n += 1);
        }
    }
}

/// What a [`Bus`] asks of the store it serves.
pub(crate) trait Listener: Send + Sync + 'static {
    /// Drops the leases of `identity`, without giving anything back.
    fn drop_identity(&self, identity: &[u8; 16]);
    /// Drops every lease: the subscription is lost.
    fn drop_all(&self);
    /// The bus this listener serves.
    fn bus(&self) -> &Bus;
}

impl Bus {
    pub(crate) fn new(channel: impl Channel) -> Self {
        Self {
            channel: Box::new(channel),
            pending: Mutex::new(HashMap::new()),
            listening: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            instance: std::hash::BuildHasher::hash_one(
                &foldhash::quality::RandomState::default(),
                std::process::id(),
            ),
            next_nonce: AtomicU64::new(0),
        }
    }

    pub(crate) fn listening(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    /// Subscribes, and keeps subscribed while `listener` lives: a lost
    /// subscription drops every lease, and is made again after a pause.
    /// Returns once the first subscription is made (or failed). The task
    /// that listens runs on the current runtime: if it ends otherwise (the
    /// runtime shuts down, or it panics), every lease is dropped and none
    /// is taken again, and a warning says so.
    pub(crate) async fn listen<L: Listener>(listener: Weak<L>) {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut pause = Duration::from_millis(50);
            loop {
                let Some(strong) = listener.upgrade() else {
                    return;
                };
                let subscribed = strong.bus().channel.subscribe();
                let subscribed = tokio::time::timeout(Duration::from_secs(2), subscribed).await;
                let Ok(Ok(mut messages)) = subscribed else {
                    drop(strong);
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(());
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                    continue;
                };
                pause = Duration::from_millis(50);
                // A grant asked for while no invalidation could be heard
                // (an operator's reset may have come and gone unheard) is
                // not kept, even if its answer lands once heard again.
                strong.bus().generation.fetch_add(1, Ordering::AcqRel);
                strong.bus().listening.store(true, Ordering::Release);
                // However hearing ends (the subscription lost, or this task
                // panicking, or dropped with its runtime), the instance stops
                // taking leases and drops those it holds.
                let mut hearing = Hearing {
                    listener: listener.clone(),
                    for_good: true,
                };
                drop(strong);
                if let Some(ready) = ready.take() {
                    let _ = ready.send(());
                }
                while let Some(payload) = messages.next().await {
                    let Some(strong) = listener.upgrade() else {
                        return;
                    };
                    strong.bus().receive(&*strong, &payload).await;
                }
                hearing.for_good = false;
                drop(hearing);
                let Some(strong) = listener.upgrade() else {
                    return;
                };
                tracing::warn!(
                    channel = %strong.bus().channel.name(),
                    "lease invalidations: subscription lost; leases dropped until it is back"
                );
            }
        });
        let _ = ready_rx.await;
    }

    async fn receive<L: Listener>(&self, listener: &L, payload: &[u8]) {
        let text = String::from_utf8_lossy(payload);
        let mut parts = text.split(' ');
        match (parts.next(), parts.next(), parts.next()) {
            (Some("d"), Some(nonce), Some(id)) => {
                if let Some(identity) = parse_identity(id) {
                    self.generation.fetch_add(1, Ordering::AcqRel);
                    listener.drop_identity(&identity);
                }
                // Acknowledged even when unreadable: the sender waits. Named
                // by this instance, so that an invalidation heard twice (its
                // publish sent again) is acknowledged once.
                let ack = format!("a {nonce} {:x}", self.instance);
                let _ = self.publish(&ack).await;
            }
            (Some("a"), Some(nonce), by) => {
                let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(acks) = pending.get_mut(nonce) {
                    acks.heard(by);
                }
            }
            _ => {}
        }
    }

    async fn publish(&self, message: &str) -> Result<u64, ChannelError> {
        self.channel.publish(message).await
    }

    /// Ends every instance's leases of `identity`, waiting up to `timeout`
    /// for each subscriber to acknowledge.
    pub(crate) async fn invalidate(
        &self,
        identity: &[u8; 16],
        timeout: Duration,
    ) -> Result<(), InvalidateError> {
        let nonce = format!(
            "{:x}.{}",
            self.instance,
            self.next_nonce.fetch_add(1, Ordering::Relaxed)
        );
        let (count, mut seen) = watch::channel(0);
        let acks = Acks {
            count,
            by: HashSet::new(),
        };
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(nonce.clone(), acks);
        // Waited on until this returns or is dropped on its way (its
        // caller went away).
        let awaiting = Awaiting { bus: self, nonce };
        let message = format!("d {} {}", awaiting.nonce, hex(identity));
        let waited = tokio::time::timeout(timeout, async {
            let receivers = self
                .publish(&message)
                .await
                .map_err(InvalidateError::Channel)?;
            seen.wait_for(|n| *n >= receivers)
                .await
                .map(|_| ())
                .map_err(|_| InvalidateError::Timeout)
        })
        .await;
        waited.unwrap_or(Err(InvalidateError::Timeout))
    }
}

/// A subscription heard from: dropped, it ends the instance's leases
/// (see [`Bus::listen`]); `for_good` unless the subscription ended and
/// will be made again.
struct Hearing<L: Listener> {
    listener: Weak<L>,
    for_good: bool,
}

impl<L: Listener> Drop for Hearing<L> {
    fn drop(&mut self) {
        if let Some(listener) = self.listener.upgrade() {
            let bus = listener.bus();
            bus.listening.store(false, Ordering::Release);
            bus.generation.fetch_add(1, Ordering::AcqRel);
            listener.drop_all();
            if self.for_good {
                tracing::warn!(
                    channel = %bus.channel.name(),
                    "lease invalidations: the task that listens ended (its runtime shut down, or it panicked); this instance takes no more leases"
                );
            }
        }
    }
}

/// An invalidation's acknowledgements, counted until it is dropped.
struct Awaiting<'a> {
    bus: &'a Bus,
    nonce: String,
}

impl Drop for Awaiting<'_> {
    fn drop(&mut self) {
        self.bus
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.nonce);
    }
}

/// Why an invalidation did not reach every instance.
#[derive(Debug)]
pub(crate) enum InvalidateError {
    Channel(ChannelError),
    Timeout,
}

impl std::fmt::Display for InvalidateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InvalidateError::Channel(e) => write!(f, "publishing failed: {e}"),
            InvalidateError::Timeout => f.write_str("not every instance acknowledged in time"),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(32), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn parse_identity(text: &str) -> Option<[u8; 16]> {
    if text.len() != 32 {
        return None;
    }
    let mut id = [0; 16];
    for (i, byte) in id.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(id)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::sync::Arc;

    /// A channel whose publishing never ends.
    struct Stuck;

    impl Channel for Stuck {
        fn name(&self) -> &str {
            "stuck"
        }
        fn subscribe(&self) -> BoxFuture<'_, Result<BoxStream<'static, Vec<u8>>, ChannelError>> {
            Box::pin(std::future::pending())
        }
        fn publish<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<u64, ChannelError>> {
            Box::pin(std::future::pending())
        }
    }

    /// A channel that subscribes at once and never delivers a message.
    pub(in crate::lease) struct Quiet;

    impl Channel for Quiet {
        fn name(&self) -> &str {
            "quiet"
        }
        fn subscribe(&self) -> BoxFuture<'_, Result<BoxStream<'static, Vec<u8>>, ChannelError>> {
            let messages: BoxStream<'static, Vec<u8>> = Box::pin(futures::stream::pending());
            Box::pin(std::future::ready(Ok(messages)))
        }
        fn publish<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<u64, ChannelError>> {
            Box::pin(std::future::ready(Ok(1)))
        }
    }

    /// The leases of one instance: how often all of them were dropped.
    struct Leases {
        bus: Bus,
        dropped: AtomicU64,
    }

    impl Listener for Leases {
        fn drop_identity(&self, _: &[u8; 16]) {}
        fn drop_all(&self) {
            self.dropped.fetch_add(1, Ordering::SeqCst);
        }
        fn bus(&self) -> &Bus {
            &self.bus
        }
    }

    #[test]
    fn an_instance_whose_listening_task_is_gone_takes_no_more_leases() {
        let leases = Arc::new(Leases {
            bus: Bus::new(Quiet),
            dropped: AtomicU64::new(0),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(Bus::listen(Arc::downgrade(&leases)));
        assert!(leases.bus.listening());
        let generation = leases.bus.generation.load(Ordering::SeqCst);
        // The runtime goes, and the listening task with it.
        drop(runtime);
        assert!(!leases.bus.listening(), "no invalidation can be heard");
        assert_eq!(leases.dropped.load(Ordering::SeqCst), 1, "leases held end");
        assert_eq!(
            leases.bus.generation.load(Ordering::SeqCst),
            generation + 1,
            "a grant on its way is not kept"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_invalidation_dropped_on_its_way_stops_counting_acknowledgements() {
        let bus = Bus::new(Stuck);
        let mut invalidating = Box::pin(bus.invalidate(&[7; 16], Duration::from_secs(60)));
        assert!(futures::poll!(invalidating.as_mut()).is_pending());
        assert_eq!(bus.pending.lock().unwrap().len(), 1);
        drop(invalidating);
        assert!(bus.pending.lock().unwrap().is_empty());
    }

    #[test]
    fn identities_round_trip_through_hex() {
        let id = [0xab; 16];
        assert_eq!(parse_identity(&hex(&id)), Some(id));
        assert_eq!(parse_identity("zz"), None);
        assert_eq!(parse_identity(&"g".repeat(32)), None);
    }
}

#[cfg(test)]
mod resent {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use futures::future::BoxFuture;
    use futures::stream::BoxStream;
    use tokio::sync::mpsc;

    use super::{Bus, Channel, ChannelError, InvalidateError, Listener};

    /// Every subscriber's inbox.
    #[derive(Default)]
    struct Hub {
        inboxes: Mutex<Vec<mpsc::UnboundedSender<Vec<u8>>>>,
    }

    impl Hub {
        fn deliver(&self, message: &str) -> u64 {
            let inboxes = self.inboxes.lock().unwrap();
            for inbox in inboxes.iter() {
                let _ = inbox.send(message.as_bytes().to_vec());
            }
            inboxes.len() as u64
        }
    }

    /// One instance's channel. `reads` is false for an instance that is
    /// subscribed (counted by PUBLISH) but slow to read its messages.
    /// An invalidation is delivered twice, as `RedisChannel::publish`
    /// does when the first PUBLISH ran but its reply was lost to a
    /// dropped connection (`is_connection_dropped`), and it sends again.
    struct Hubbed {
        hub: Arc<Hub>,
        reads: bool,
        held: Mutex<Option<mpsc::UnboundedReceiver<Vec<u8>>>>,
    }

    impl Channel for Hubbed {
        fn name(&self) -> &str {
            "hub"
        }
        fn subscribe(&self) -> BoxFuture<'_, Result<BoxStream<'static, Vec<u8>>, ChannelError>> {
            let (tx, rx) = mpsc::unbounded_channel();
            self.hub.inboxes.lock().unwrap().push(tx);
            let stream: BoxStream<'static, Vec<u8>> = if self.reads {
                Box::pin(futures::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|m| (m, rx))
                }))
            } else {
                *self.held.lock().unwrap() = Some(rx);
                Box::pin(futures::stream::pending())
            };
            Box::pin(std::future::ready(Ok(stream)))
        }
        fn publish<'a>(&'a self, message: &'a str) -> BoxFuture<'a, Result<u64, ChannelError>> {
            let mut receivers = self.hub.deliver(message);
            if message.starts_with("d ") {
                // The first PUBLISH ran; its reply was lost; sent again.
                receivers = self.hub.deliver(message);
            }
            Box::pin(std::future::ready(Ok(receivers)))
        }
    }

    struct Instance {
        bus: Bus,
        dropped: AtomicU64,
    }

    impl Listener for Instance {
        fn drop_identity(&self, _: &[u8; 16]) {
            self.dropped.fetch_add(1, Ordering::SeqCst);
        }
        fn drop_all(&self) {}
        fn bus(&self) -> &Bus {
            &self.bus
        }
    }

    /// An invalidation delivered twice (sent again after its reply was
    /// lost) to a fast instance and a slow one: the fast one's two
    /// acknowledgements count once, and the invalidation waits for the
    /// slow one (here, until its timeout).
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn an_invalidation_heard_twice_is_acknowledged_once_by_each_instance() {
        let hub = Arc::new(Hub::default());
        let instance = |reads| {
            Arc::new(Instance {
                bus: Bus::new(Hubbed {
                    hub: Arc::clone(&hub),
                    reads,
                    held: Mutex::new(None),
                }),
                dropped: AtomicU64::new(0),
            })
        };
        let fast = instance(true);
        let slow = instance(false);
        Bus::listen(Arc::downgrade(&fast)).await;
        Bus::listen(Arc::downgrade(&slow)).await;
        assert!(fast.bus.listening() && slow.bus.listening());
        let invalidated = fast.bus.invalidate(&[7; 16], Duration::from_secs(1)).await;
        assert_eq!(
            slow.dropped.load(Ordering::SeqCst),
            0,
            "slow has not heard it"
        );
        assert!(
            matches!(invalidated, Err(InvalidateError::Timeout)),
            "returned {:?} with the slow instance's leases held",
            invalidated.map_err(|e| e.to_string())
        );
    }
}
