//! Asking the store for a lease, keeping it only if no invalidation
//! came in meanwhile, and asking ahead for the next one.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tollgate_core::{Decision, Key, Policy, Store, StoreError};

use super::refunds::Refunds;
use super::table::{self, Entry, Lease, Refill, identity, micros};
use super::{GATHER_PER_INTERVAL, LIFETIME_INTERVALS, LeasedStore, Shared};
use crate::algorithm::Leasing;

impl<S: Store> Shared<S> {
    /// A lease of `units`, granted by the store's answer `base` to a grant
    /// asked for at local time `sent`, when the key's refunds had done
    /// as many units as `refunds` says; `capped` when its size was held
    /// to the limit's share.
    #[allow(clippy::too_many_arguments)]
    fn lease(
        &self,
        key: &Key,
        policy: &Policy,
        base: Decision,
        units: u64,
        sent: u64,
        capped: bool,
        refunds: Option<(Arc<Refunds>, u64)>,
    ) -> Box<Lease> {
        let lifetime = Leasing::of(policy).lifetime(
            policy,
            &base,
            self.interval.saturating_mul(LIFETIME_INTERVALS),
        );
        Box::new(Lease {
            granted: units,
            left: units,
            sent,
            expires: sent.saturating_add(micros(lifetime)),
            began: sent,
            first: 0,
            capped,
            base,
            identity: identity(key, policy),
            key: key.clone(),
            policy: policy.clone(),
            refunds,
        })
    }

    /// Whether a grant asked for at invalidation `generation` may be
    /// kept: no invalidation arrived meanwhile, and the instance still
    /// hears of them.
    fn keeps(&self, generation: u64) -> bool {
        self.bus.generation.load(Ordering::Acquire) == generation && self.bus.listening()
    }

    /// Waits for the grant on its way for the key of `hash`, then spends
    /// `cost` from its lease, or asks the store when there is none.
    pub(super) async fn after_grant(
        &self,
        key: &Key,
        policy: &Policy,
        hash: u64,
        cost: u64,
        grant: Arc<Refill>,
    ) -> Result<Decision, StoreError> {
        let granted = grant.settled.notified();
        // The grant may have ended between the lock and here.
        let on_its_way = self
            .table
            .shard(hash)
            .get(&hash)
            .is_some_and(|e| e.refilling.as_ref().is_some_and(|w| Arc::ptr_eq(w, &grant)));
        if on_its_way {
            // A grant asked for ahead may still be gathering: this
            // request needs it now.
            grant.hurry.notify_one();
            granted.await;
        }
        let now = self.now();
        let spent = self
            .table
            .shard(hash)
            .get_mut(&hash)
            .filter(|e| e.fingerprint == policy.fingerprint())
            .and_then(|e| e.spend(cost, now));
        match spent {
            Some(decision) => Ok(decision),
            None => self.direct(key, policy, cost).await,
        }
    }

    /// Waits for the next tick of the grid on which grants asked for
    /// ahead go out together: a [`GATHER_PER_INTERVAL`]th of the lease
    /// interval, on Tokio's clock. A key's next lease is asked for while
    /// an eighth of its current one is left, about a fifth of an interval
    /// of its traffic, or while a quarter of its life is left (and
    /// gathered only while some is left, see [`LeasedStore::ahead`]), so
    /// the wait is a small part of that time.
    /// A request that needs the grant meanwhile
    /// ([`Refill::hurry`](super::table::Refill)) and
    /// [`LeasedStore::wait_for_grants`] end the wait.
    /// The asks of one tick reach the store at once, where they share
    /// calls: the Redis store batches the requests that queue behind its
    /// calls on their way, so a tick's asks take two or three calls
    /// rather than one each.
    /// A tick shorter than Tokio's timer's millisecond (an interval under
    /// 64 ms) is not waited for.
    async fn gathered(&self) {
        let tick = self.interval / GATHER_PER_INTERVAL;
        if tick < Duration::from_millis(1) {
            return;
        }
        let tick = tick.as_nanos();
        let into = self.gather_origin.elapsed().as_nanos() % tick;
        let left = u64::try_from(tick - into).unwrap_or(u64::MAX);
        tokio::time::sleep(Duration::from_nanos(left)).await;
    }

    /// Asks for `size` units for the key of `hash`: `cost` of them for
    /// the request that asks (0 for a lease asked for ahead), the rest for
    /// a lease. The request's decision, or `None` when the store refused
    /// the grant (the key is near its limit). `settled` ends the key's
    /// wait for the grant (its `refilling`, set by the caller under the
    /// shard's lock) when the grant is settled, or when it is dropped on
    /// its way: the request that asked for it was dropped (its client went
    /// away, or a timeout gave up on it), or the task that asked ahead
    /// panicked or was never run.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn grant(
        &self,
        key: &Key,
        policy: &Policy,
        hash: u64,
        size: u64,
        cost: u64,
        sent: u64,
        settled: Settled<S>,
    ) -> Result<Option<Decision>, StoreError> {
        let generation = self.bus.generation.load(Ordering::Acquire);
        // The key's refunds known done before the grant is asked for: the
        // store took them before it. Any other, it may take after, where
        // it shortens the lease's backlog (see `Lease::unused`).
        let refunds = if table::drains(policy) {
            self.table
                .shard(hash)
                .get_mut(&hash)
                .filter(|e| e.fingerprint == policy.fingerprint())
                .map(|e| {
                    let refunds = Arc::clone(e.refunds.get_or_insert_with(Arc::default));
                    let done = refunds.done();
                    (refunds, done)
                })
        } else {
            None
        };
        self.calls.grants.fetch_add(1, Ordering::Relaxed);
        self.metrics.count(super::Call::Grant, policy.name());
        let answer = self.store.check(key, policy, size).await;
        let base = {
            let mut shard = self.table.shard(hash);
            let entry = shard
                .get_mut(&hash)
                .filter(|e| e.fingerprint == policy.fingerprint());
            let answer = answer?;
            if let Some(entry) = entry {
                entry.store_answered(&answer, self.now());
                if !answer.is_allowed() {
                    entry.size = entry.size.min(answer.remaining());
                }
            }
            if !answer.is_allowed() {
                return Ok(None);
            }
            answer
        };
        let capped = size >= self.cap(policy);
        let granted_at = base.now();
        let mut lease = self.lease(key, policy, base, size - cost, sent, capped, refunds);
        // The request's own units were taken from the grant already.
        let decision = lease.spend(0, sent).with_cost(cost);
        let unkept = {
            let mut shard = self.table.shard(hash);
            // Under the shard's lock: an invalidation bumps the generation
            // before it sweeps the shards, so a lease is either installed
            // before the sweep, which drops it, or sees the new generation.
            match shard.get_mut(&hash) {
                // The configuration changed while the grant was on its way:
                // dropped, as the table drops the old one's leases.
                Some(entry) if entry.fingerprint != policy.fingerprint() => None,
                // The store answered the key blocked after it granted this,
                // and that answer dropped the key's leases: not kept, and
                // its units go back (behind the block's fence, the return
                // changes nothing; it counts only if Redis's clock stepped
                // back meanwhile).
                Some(entry) if !entry.keeps_grant(granted_at) => Some(lease),
                // An invalidation came while the grant was on its way (of
                // this key or another), or the instance stopped hearing of
                // them: the lease is not kept, and its units go back. Of a
                // key reset or blocked after the grant, the return lands
                // behind the fence and changes nothing; any other key's
                // units come back (they were lost: under-admission, for
                // every grant in flight at every reset of any key).
                Some(_) | None if !self.keeps(generation) => Some(lease),
                Some(entry) if lease.expires > sent => install(entry, lease),
                Some(_) | None => Some(lease),
            }
        };
        if let Some(lease) = unkept {
            // Granted last, its units follow those of the key's leases held
            // here: its return shifts none of theirs, and is not counted
            // against them (counted, each would give back that much less).
            // The key's next grant waits for it (`settled` is kept until
            // then): asked for before the return lands, its units would
            // follow this one's, and the return would shift them.
            self.return_unused(*lease, false).await;
        }
        drop(settled);
        Ok(Some(decision))
    }
}

/// The grant on its way for the key of `hash`: the key's `refilling`,
/// which requests that find no lease wait on. Dropped when the grant is
/// settled, or with the grant's future, it ends the key's wait for it and
/// wakes its waiters, so that no request of the key waits for a grant
/// that will never come. (Its drop takes the key's shard lock: never
/// made or dropped while that lock is held.)
pub(super) struct Settled<S> {
    shared: Arc<Shared<S>>,
    hash: u64,
    waiting: Arc<Refill>,
}

impl<S> Settled<S> {
    /// The grant `waiting` for the key of `hash`, once the shard's lock
    /// that marked it is released.
    pub(super) fn new(shared: &Arc<Shared<S>>, hash: u64, waiting: Arc<Refill>) -> Self {
        Self {
            shared: Arc::clone(shared),
            hash,
            waiting,
        }
    }
}

impl<S> Drop for Settled<S> {
    fn drop(&mut self) {
        {
            let mut shard = self.shared.table.shard(self.hash);
            if let Some(entry) = shard.get_mut(&self.hash)
                && entry
                    .refilling
                    .as_ref()
                    .is_some_and(|w| Arc::ptr_eq(w, &self.waiting))
            {
                entry.refilling = None;
            }
        }
        self.waiting.settled.notify_waiters();
    }
}

/// Puts `lease` in the first free place of `entry`, or hands it back.
fn install(entry: &mut Entry, lease: Box<Lease>) -> Option<Box<Lease>> {
    match (&entry.lease, &entry.next) {
        (None, _) => entry.lease = Some(lease),
        (Some(_), None) => entry.next = Some(lease),
        (Some(_), Some(_)) => return Some(lease),
    }
    None
}

/// The next lease of a key, marked as on its way under the key's shard
/// lock ([`LeasedStore::ahead`]): asked for by
/// [`LeasedStore::ask_ahead`] once that lock is released, which must
/// follow, or the key's requests wait for a grant never asked for.
#[must_use]
pub(super) struct Ahead {
    runtime: tokio::runtime::Handle,
    size: u64,
    hash: u64,
    now: u64,
    /// Whether the ask waits for the next tick of the gathering grid.
    gather: bool,
    waiting: Arc<Refill>,
}

impl<S: Store> LeasedStore<S> {
    /// Marks the next lease of the key of `hash` as on its way when
    /// `entry`'s current one has spent enough of its units
    /// ([`Entry::ahead`]); [`ask_ahead`](Self::ask_ahead) asks for it.
    pub(super) fn ahead(
        &self,
        entry: &mut Entry,
        policy: &Policy,
        hash: u64,
        now: u64,
    ) -> Option<Ahead> {
        let shared = &self.shared;
        let size = entry.ahead(now, shared.interval, || shared.cap(policy))?;
        let runtime = crate::running::hand_on_runtime(&shared.home)?;
        if !shared.bus.listening() {
            return None;
        }
        // Gathered only while the lease has units left for the key's
        // requests meanwhile: not one held to its share, which can be
        // spent in far less than its span, nor one used up already (a
        // lease of fewer than eight units asks then, unless it grew late
        // first), whose next request needs the grant.
        let gather = (entry.lease.as_ref()).is_some_and(|lease| !lease.capped && lease.left > 0);
        Some(Ahead {
            runtime,
            size,
            hash,
            now,
            gather,
            waiting: entry.begin_grant(),
        })
    }

    /// Asks, in the background, for the lease `ahead` marked, once the
    /// shard's lock is released: a task that panics, or that a runtime
    /// shutting down never runs, still ends the key's wait for it.
    pub(super) fn ask_ahead(&self, ahead: Option<Ahead>, key: &Key, policy: &Policy) {
        let Some(ahead) = ahead else {
            return;
        };
        let shared = &self.shared;
        let refill = Arc::clone(&ahead.waiting);
        let settled = Settled::new(shared, ahead.hash, ahead.waiting);
        let (asking, key, policy) = (Arc::clone(shared), key.clone(), policy.clone());
        let (size, hash, now) = (ahead.size, ahead.hash, ahead.now);
        let gather = ahead.gather;
        shared.in_background(&ahead.runtime, async move {
            let now = if gather {
                tokio::select! {
                    () = asking.gathered() => {}
                    () = refill.hurry.notified() => {}
                    () = asking.flush.notified() => {}
                }
                // No lease is taken while invalidations go unheard: the
                // key's waiters wake when `settled` drops.
                if !asking.bus.listening() {
                    return;
                }
                // Sent now: the lease's life and the key's rate count
                // from here.
                asking.now()
            } else if !asking.bus.listening() {
                return;
            } else {
                now
            };
            // A failure leaves the current lease going; the request that
            // finds it used up meets the store's error itself.
            let _ = asking
                .grant(&key, &policy, hash, size, 0, now, settled)
                .await;
        });
    }
}
