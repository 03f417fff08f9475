//! Quota leases: a global limit decided at local speed.

mod builder;
mod bus;
mod grant;
mod pubsub;
mod refunds;
mod spend;
mod table;
mod telemetry;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_core::{Clock, Decision, Key, Policy, Store, StoreError};

pub use builder::LeasedStoreBuilder;
use bus::{Bus, Listener};
use table::{Lease, Table};
use telemetry::{Call, LeaseMetrics};

/// A store that lends each instance slices of a hot key's allowance, so
/// that most of the key's requests are decided locally, without a round
/// trip, while the limit stays global and exact.
///
/// A lease is a grant, by the wrapped store, of several units of a key's
/// allowance at once: one `check` of their total cost, atomic, admitted
/// only if that much is available. The store counts the units as used
/// from then on, so every request admitted from a lease has consumed a
/// unit in the store; under a window, all instances together never admit
/// more than the limit (under GCRA and the token bucket, see
/// "Algorithms"). The instance spends the lease locally, and gives back what
/// it did not spend (a [`Settlement`](tollgate_core::Settlement) refund) when the lease ends, or
/// when the key goes quiet. Until then those units are unavailable to
/// other instances: under-admission is bounded by the units outstanding in
/// leases ([`LeasedStore::outstanding`]).
///
/// **Adaptive size.** A key is decided by the store as usual until its
/// rate is known (a whole [`interval`](LeasedStoreBuilder::interval) of
/// its traffic, or sooner once it has seen a lease's worth); then each
/// lease is sized to cover one and a half intervals of the key's traffic
/// (after a lease, by how fast it was spent, at most twice the last
/// size; after one of fewer than eight units, whose few requests measure
/// the rate only roughly, the mean of that and its own size), and never
/// more than a [`share`](LeasedStoreBuilder::share) of the limit's
/// capacity. When seven eighths of a lease are spent (half, for a lease
/// held to that share), or once it is one and a half intervals old (the
/// last quarter of its life of two intervals), the next one is asked for
/// in the background, so that the key does not wait for it; the rest of
/// the old one goes back when the next one takes its place. Such an ask
/// waits for the next tick of a grid of a 64th of the interval (for an
/// interval of 64 ms or more), so that the asks of many keys reach the
/// store together and share its calls (the Redis store batches them); a
/// request that finds the key's lease used up meanwhile sends it at once.
/// A lease held to its share, which can be spent far sooner, or one
/// already used up, asks at once.
/// A cold key, or one with fewer than three requests in one and a half
/// intervals, gets no lease; one that has leases keeps them down to about
/// two requests in that time (see the small leases' mean, above). A grant
/// the store refuses (the key is near its limit) sizes the next one to
/// what the store said remains, and the request is then decided by the
/// store: near its limit, a key is decided exactly as without leases.
///
/// **Algorithms.** GCRA and the token bucket: a lease lives twice the
/// interval, while its units drain from the key's backlog in the store at
/// the limit's rate from the grant on; units spent after they drained can
/// meet a burst the store admits elsewhere, so in a burst all instances
/// together admit up to the units outstanding in their leases beyond it.
/// Fixed and sliding windows: units count in the window of their grant,
/// so a lease also ends with its window. The sliding log and the leaky
/// bucket are always decided by the store: a log dates each request, and
/// a lease would date its units to the grant, so they would leave the log
/// before the requests that used them; a leaky bucket delays each request
/// by when it comes.
///
/// **Settlements.** A [`Settlement`](tollgate_core::Settlement) charge
/// (a request that cost more than it reserved) is paid first from the
/// units this instance's leases of the key still hold, which the store
/// counted at their grant, and only the rest goes to the store: a charge
/// past what the leases hold leaves them empty, so the key's next request
/// meets its debt in the store, as without leases. (Another instance's
/// leases of the key are spent to their end.)
///
/// **Refunds.** A [`Settlement`](tollgate_core::Settlement) refund goes
/// to the store as without leases. Of GCRA or a token bucket with one
/// limit, it also shortens the backlog the key's grants left there, so a
/// lease's unused units drain from it sooner, as does another lease's
/// return. A lease gives back only what can still be in that backlog,
/// less the key's refunds and returns sent through this instance and not
/// known done when its grant was asked for. A refund that timed out,
/// failed in the backend or was dropped may still land: it counts as not
/// done for 10 s (the leases asked for meanwhile give back that much
/// less, under-admission). Not counted: a refund sent by another
/// instance, or by this one while the lease's return is on its way, or
/// before this instance tracked the key (new, or its table was full). A
/// return
/// after the lease's units drained can hand such units out again, once:
/// at most the units other instances refunded or gave back for the key
/// between the grant's ask and the return, and the few refunds this
/// instance sent in a return's round trip.
///
/// **Headers.** A request spent from a lease reports the store's answer
/// to the grant, plus what the lease still holds: `remaining` is the
/// store's remaining at the grant plus the lease's unspent units (what
/// this client could still be admitted if no one else consumed), and
/// `reset` counts down from the store's answer. Denials always come from
/// the store, so `Retry-After` stays exact.
///
/// **Resets and blocks are fenced.** Once [`Store::reset`] or
/// [`Store::block`] through a `LeasedStore` returns, no instance admits
/// from a lease granted before it. One whose caller goes away before it
/// returns (a timeout, a client gone) runs to its end all the same, on
/// the runtime, so that a reset or block the store made ends the leases
/// too. The key is reset or blocked in the
/// store first; then an invalidation goes out on a Redis channel, and the
/// call waits until every subscribed instance has dropped its leases of
/// the key and said so. A grant sent before an instance heard the
/// invalidation is dropped when it arrives, whatever the store answered;
/// a grant sent after it reaches the store after the operation, so
/// a blocked key's grant is refused and a reset key's is counted in its
/// fresh state. An instance that is not subscribed (Redis is down, or the
/// subscription was lost) drops its leases and takes no new one until it
/// is subscribed again; one whose listening task ended with its runtime
/// (the store was built on another runtime) takes none again.
///
/// The one exception is an instance that does not acknowledge within
/// [`ack_timeout`](LeasedStoreBuilder::ack_timeout) (it is paused, or
/// its process stalls): the operation returns with a warning, and that
/// instance may go on spending what it held when the operation landed,
/// at most its two leases of the key (each at most the limit's capacity
/// divided by the [`share`](LeasedStoreBuilder::share)), and only until
/// they end, at most twice the [`interval`](LeasedStoreBuilder::interval)
/// after they were sent to the store. Its new grants meet the block in
/// the store, and the first refused so ends its leases of the key: so
/// does a block made through a plain store, which sends no invalidation.
/// After a reset, the leases that instances took from the fresh state
/// before they heard the invalidation are dropped, not given back: the
/// key under-admits by at most two leases per instance, until the units
/// age out of the limit. The other way round, the unused part of a lease
/// granted before the reset, still on its way back when the reset lands,
/// meets the reset's fence in the store (see
/// [`Settlement`](tollgate_core::Settlement); the Redis and memory
/// stores keep it) and gives the fresh state nothing, as does the refund
/// of a request spent from such a lease (it is reserved at the grant:
/// [`Decision::reserved_at`](tollgate_core::Decision::reserved_at)): within
/// `Settlement::fence` of the reset, and within the limits of the
/// store's clock that `Settlement` states, the fresh state admits one
/// allowance, and no more.
///
/// **Failures.** A lease already granted is spent while Redis fails (its
/// units were counted), unless the subscription is lost, which drops it.
/// A Redis that restarts or fails over drops every subscription, and with
/// them every lease; one that loses its data without dropping them (a
/// `FLUSHALL`, or state kept on another server than the channel's) leaves
/// each instance spending at most the two leases per key it holds, which
/// the fresh state no longer counts, until they end.
/// Every decision that needs the store returns the store's error, and the
/// layer's [`FailureMode`](https://docs.rs/tollgate/latest/tollgate/enum.FailureMode.html)
/// applies.
///
/// **Cancellation.** The requests of a key that find no lease while a
/// grant is on its way wait for that grant. A request dropped while its
/// own grant is on its way (its client went away, or a timeout above the
/// store gave up) ends that wait: the requests behind it wake, and go to
/// the store or ask again. The grant's units, if Redis counted them, are
/// never spent: under-admission by at most that grant, until they age
/// out of the limit.
///
/// ```
/// use tollgate::{Algorithm, Key, Policy, Store};
/// use tollgate_redis::{LeasedStore, RedisStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // This example runs against a local Redis (apt install redis-server).
/// let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
/// let redis = RedisStore::builder()
///     .prefix(format!("tollgate-doc-lease-{}", std::process::id()))
///     .connect(url.as_str())
///     .await?;
/// // Subscribes through the store's own Redis: the URL is not given again.
/// let store = LeasedStore::builder().wrap(redis).await;
/// let policy = Policy::new("api", Algorithm::Gcra, "1000/s")?;
/// let key = Key::user("ada");
/// // The first requests go to Redis, which measures the key's rate...
/// for _ in 0..200 {
///     assert!(store.check(&key, &policy, 1).await?.is_allowed());
/// }
/// // ...and every admission consumed a unit in Redis, leased or not.
/// store.return_leases().await;
/// assert_eq!(store.outstanding(), (0, 0));
/// # Ok(())
/// # }
/// ```
pub struct LeasedStore<S> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for LeasedStore<S> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// A lease's longest life, in lease intervals: a lease not spent by then
/// ends and gives back what is left.
const LIFETIME_INTERVALS: u32 = 2;

/// The grid on which grants asked for ahead go out together, in
/// fractions of a lease interval (see [`Shared::gathered`]).
const GATHER_PER_INTERVAL: u32 = 64;

/// How long a key may go unseen, in lease intervals, before its entry is
/// forgotten when room is needed.
const IDLE_INTERVALS: u32 = 4;

struct Shared<S> {
    store: S,
    clock: Arc<dyn Clock>,
    /// One lease interval.
    interval: Duration,
    /// The divisor of a limit's capacity that bounds a lease.
    share: u64,
    ack_timeout: Duration,
    table: Table,
    bus: Bus,
    calls: Calls,
    /// The calls by policy and the leases held, through the `metrics`
    /// facade.
    metrics: LeaseMetrics,
    /// Work in the background not yet done: grants asked for ahead of
    /// time, and leases being given back.
    ahead: AtomicU64,
    ahead_done: tokio::sync::Notify,
    /// The origin of the grid on which grants asked for ahead go out
    /// together (see [`Shared::gathered`]).
    gather_origin: tokio::time::Instant,
    /// Sends the grants asked for ahead that wait for their tick now.
    flush: tokio::sync::Notify,
    /// The runtime the store was built on.
    home: crate::patience::Home,
}

#[derive(Default)]
struct Calls {
    grants: AtomicU64,
    direct: AtomicU64,
    returns: AtomicU64,
}

/// How many calls a [`LeasedStore`] made to the store it wraps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseCalls {
    /// Grants asked for: one `check` of a lease's cost.
    pub grants: u64,
    /// Requests decided by the store, without a lease.
    pub direct: u64,
    /// Unused parts given back: one `settle` each.
    pub returns: u64,
}

impl LeaseCalls {
    /// Every call.
    pub fn total(&self) -> u64 {
        self.grants + self.direct + self.returns
    }
}

impl<S: Store> LeasedStore<S> {
    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.shared.store
    }

    /// The leases this instance holds, and the units they hold unspent.
    pub fn outstanding(&self) -> (usize, u64) {
        self.shared.table.outstanding()
    }

    /// The calls made to the wrapped store so far.
    pub fn calls(&self) -> LeaseCalls {
        let calls = &self.shared.calls;
        LeaseCalls {
            grants: calls.grants.load(Ordering::Relaxed),
            direct: calls.direct.load(Ordering::Relaxed),
            returns: calls.returns.load(Ordering::Relaxed),
        }
    }

    /// Whether the instance is subscribed to invalidations, and so may
    /// take leases.
    pub fn is_listening(&self) -> bool {
        self.shared.bus.listening()
    }

    /// Waits until no lease this instance asked for ahead of time (while
    /// a hot key's current one was being spent) is still on its way, and
    /// every lease it is giving back in the background is back. Asks
    /// waiting for their tick to go out with others are sent at once.
    pub async fn wait_for_grants(&self) {
        let shared = &self.shared;
        loop {
            let done = shared.ahead_done.notified();
            if shared.ahead.load(Ordering::Acquire) == 0 {
                return;
            }
            // Asks waiting for their tick go now (one made after this
            // waits at most a tick).
            shared.flush.notify_waiters();
            done.await;
        }
    }

    /// Ends every lease now, giving back the unused part, once the grants
    /// on their way are in: for a graceful shutdown, so that other
    /// instances get the units at once.
    pub async fn return_leases(&self) {
        self.wait_for_grants().await;
        let ended = self.shared.table.sweep(0, |_| true);
        self.shared.give_back(ended).await;
        self.shared.report_held();
    }
}

impl<S: Store> Shared<S> {
    fn now(&self) -> u64 {
        self.clock.now().as_micros()
    }

    /// Keys unseen since this are forgotten when room is needed
    /// ([`IDLE_INTERVALS`] ago).
    fn idle_before(&self, now: u64) -> u64 {
        now.saturating_sub(table::micros(self.interval.saturating_mul(IDLE_INTERVALS)))
    }

    /// The largest lease of `policy`.
    fn cap(&self, policy: &Policy) -> u64 {
        policy
            .params()
            .iter()
            .map(|p| p.capacity / self.share)
            .min()
            .unwrap_or(0)
    }

    /// Runs `work` on `runtime`, counted until it ends (see
    /// [`LeasedStore::wait_for_grants`]).
    fn in_background(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        work: impl Future<Output = ()> + Send + 'static,
    ) {
        self.ahead.fetch_add(1, Ordering::AcqRel);
        // Counted off when the task's future is dropped: when the work
        // ends, when it panics, and when a runtime shutting down drops
        // the task unrun (made outside the future, so it is part of it
        // from the start).
        let counted = Background(Arc::clone(self));
        runtime.spawn(async move {
            let _counted = counted;
            work.await;
        });
    }

    /// Gives back what `ended` did not spend in the background, not on a
    /// request's time.
    fn give_back_later(self: &Arc<Self>, runtime: &tokio::runtime::Handle, ended: Vec<Lease>) {
        let giving = Arc::clone(self);
        self.in_background(runtime, async move { giving.give_back(ended).await });
    }

    async fn give_back(&self, ended: Vec<Lease>) {
        for lease in ended {
            self.return_unused(lease, true).await;
        }
    }

    /// Gives back what `lease` did not spend. A return shortens the key's
    /// backlog like any refund: `counted` against the key's other leases,
    /// granted after it, since a key's older lease ends first. (Rarely, a
    /// grant takes the place of a current lease that ended while an older
    /// next one, too small for the request that ended it, holds on: a
    /// return of the newer one is then counted against the older one too,
    /// which can only under-admit.) One that fails leaves the units used
    /// until the store forgets them: under-admission, never over.
    async fn return_unused(&self, lease: Lease, counted: bool) {
        let Some(settlement) = lease.unused(self.now()) else {
            return;
        };
        self.calls.returns.fetch_add(1, Ordering::Relaxed);
        self.metrics.count(Call::Return, lease.policy.name());
        let refunds = lease.refunds.as_ref().filter(|_| counted);
        let _ = self
            .refunding(
                refunds.map(|(refunds, _)| refunds),
                settlement.refund(),
                || self.store.settle(&lease.key, &lease.policy, settlement),
            )
            .await;
    }

    /// Sends a refund of `units` of a key whose refunds are counted in
    /// `refunds` (see [`Refunds`](refunds::Refunds)).
    async fn refunding<F>(
        &self,
        refunds: Option<&Arc<refunds::Refunds>>,
        units: u64,
        send: impl FnOnce() -> F,
    ) -> Result<Decision, StoreError>
    where
        F: Future<Output = Result<Decision, StoreError>>,
    {
        let refunding = refunds.map(|refunds| refunds::Refunding::start(refunds, units));
        let answer = send().await;
        // Answered, or never reached the store: done. Otherwise it may
        // still land, and the guard counts it done later.
        let known = answer
            .as_ref()
            .map_or_else(|error| !error.may_have_acted(), |_| true);
        if known && let Some(refunding) = refunding {
            refunding.done();
        }
        answer
    }

    /// Reports to the gauges of leases held what the table holds now.
    fn report_held(&self) {
        self.metrics.held(self.table.outstanding());
    }

    /// Remembers the store's answer to a request of the key of `hash`.
    fn store_answered(&self, policy: &Policy, hash: u64, decision: &Decision) {
        let now = self.now();
        let mut shard = self.table.shard(hash);
        let entry = shard
            .get_mut(&hash)
            .filter(|e| e.fingerprint == policy.fingerprint());
        if let Some(entry) = entry {
            entry.store_answered(decision, now);
        }
    }

    async fn direct(&self, key: &Key, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        self.calls.direct.fetch_add(1, Ordering::Relaxed);
        self.metrics.count(Call::Direct, policy.name());
        self.store.check(key, policy, cost).await
    }
}

/// A task of [`Shared::in_background`], counted in `ahead` until dropped.
struct Background<S>(Arc<Shared<S>>);

impl<S> Drop for Background<S> {
    fn drop(&mut self) {
        self.0.ahead.fetch_sub(1, Ordering::AcqRel);
        self.0.ahead_done.notify_waiters();
    }
}

impl<S: Store> Listener for Shared<S> {
    fn drop_identity(&self, identity: &[u8; 16]) {
        drop(self.table.sweep(0, |lease| lease.identity == *identity));
    }

    fn drop_all(&self) {
        drop(self.table.sweep(0, |_| true));
    }

    fn bus(&self) -> &Bus {
        &self.bus
    }
}
