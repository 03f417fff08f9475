//! [`LeasedStoreBuilder`]: the settings of a [`LeasedStore`], its start
//! on any invalidation channel, and the task that gives back ended
//! leases.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tollgate_core::{Clock, Store, SystemClock};

use super::bus::{Bus, Channel};
use super::table::Table;
use super::{Calls, LeaseMetrics, LeasedStore, Shared};

/// Settings of a [`LeasedStore`]; see [`LeasedStore::builder`].
#[derive(Debug, Clone)]
pub struct LeasedStoreBuilder {
    interval: Duration,
    share: u64,
    max_keys: usize,
    channel: String,
    ack_timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
}

impl Default for LeasedStoreBuilder {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            share: 16,
            max_keys: 100_000,
            channel: "tollgate:leases".to_owned(),
            ack_timeout: Duration::from_secs(1),
            clock: None,
        }
    }
}

impl LeasedStoreBuilder {
    /// The lease interval (default 1 s, at least 8 µs: a shorter one is
    /// taken as 8 µs): a lease covers one and a half intervals of its
    /// key's traffic, and lives two before its unused part goes back.
    /// Longer intervals mean fewer calls to the store and more units held
    /// by each instance.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_micros(8));
        self
    }

    /// A lease holds at most `1 / share` of a limit's capacity (default
    /// 16, at least 1: 0 is taken as 1). An instance holds two leases of a key at most (the
    /// one being spent and the next): with `n` instances, at most
    /// `2n / share` of the capacity is outstanding at once.
    pub fn share(mut self, share: u64) -> Self {
        self.share = share.max(1);
        self
    }

    /// How many keys the instance tracks (default 100,000). A key beyond
    /// them, once idle keys are forgotten, is decided by the store.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The Redis channel invalidations go through (default
    /// `tollgate:leases`). Every instance of one limit must use the same.
    /// Give apps that share a Redis under different prefixes a channel
    /// each: a reset or block waits for every subscriber of its channel to
    /// acknowledge, the other app's instances too, and a subscriber that
    /// never acknowledges (a `PSUBSCRIBE *` of a monitoring tool) makes
    /// each one wait the [`ack_timeout`](Self::ack_timeout).
    pub fn channel(mut self, channel: impl Into<String>) -> Self {
        self.channel = channel.into();
        self
    }

    /// How long a reset or block waits for every instance to drop its
    /// lease (default 1 s). An instance that has not answered by then is
    /// too slow to spend much: its lease ends with its lifetime.
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self
    }

    /// The clock leases are timed with, for tests: the wrapped store's
    /// [`test_clock`](crate::RedisStoreBuilder::test_clock).
    pub fn test_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The name of the channel invalidations go through.
    pub(super) fn channel_name(&self) -> &str {
        &self.channel
    }

    /// Wraps `store`, subscribing to invalidations on `channel`, and
    /// starts the task that gives back the unused part of ended leases.
    pub(super) async fn start<S: Store>(self, store: S, channel: impl Channel) -> LeasedStore<S> {
        let shared = Arc::new(Shared {
            store,
            clock: self.clock.unwrap_or_else(|| Arc::new(SystemClock)),
            interval: self.interval,
            share: self.share,
            ack_timeout: self.ack_timeout,
            table: Table::new(self.max_keys),
            bus: Bus::new(channel),
            calls: Calls::default(),
            metrics: LeaseMetrics::new(),
            ahead: AtomicU64::new(0),
            ahead_done: tokio::sync::Notify::new(),
            gather_origin: tokio::time::Instant::now(),
            flush: tokio::sync::Notify::new(),
            home: crate::patience::Home::here(),
        });
        Bus::listen(Arc::downgrade(&shared)).await;
        sweep_every(Arc::downgrade(&shared), self.interval);
        LeasedStore { shared }
    }
}

/// Gives back ended leases every `interval`, while the store lives.
fn sweep_every<S: Store>(shared: Weak<Shared<S>>, interval: Duration) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let now = shared.now();
            let ended = shared
                .table
                .sweep(shared.idle_before(now), |lease| lease.expires <= now);
            shared.give_back(ended).await;
            shared.report_held();
        }
    });
}

impl LeasedStore<()> {
    /// Settings, to [`wrap`](LeasedStoreBuilder::wrap) around a store (or
    /// [`connect`](LeasedStoreBuilder::connect) around one, subscribing
    /// through a URL of its own).
    pub fn builder() -> LeasedStoreBuilder {
        LeasedStoreBuilder::default()
    }
}
