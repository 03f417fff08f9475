//! A [`LeasedStore`] as a [`Store`]: a request spends from its key's
//! lease, or asks for one, or goes to the store; resets and blocks end
//! every instance's leases of the key once the store has them.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tollgate_core::{Decision, Key, Policy, Settlement, Store, StoreError};

use super::LeasedStore;
use super::bus::{self, Listener};
use super::table::{self, Refill, identity};
use crate::algorithm::Leasing;

/// What a request finds in the table.
enum Plan {
    /// Asks the store; `low` when the store last found the key low.
    Direct { low: bool },
    /// Asks for a lease of this size; the key's other requests wait on
    /// the refill until the grant is settled.
    Grant(u64, Arc<Refill>),
    /// Spent from the next lease, once the current one ended (boxed: the
    /// plan is part of every request's future).
    Spent(Box<Decision>),
    /// Waits for the grant on its way, then spends from it.
    Wait(Arc<Refill>),
}

impl<S: Store> LeasedStore<S> {
    /// Ends every instance's lease of `key` under `policy`'s name.
    async fn invalidate(&self, key: &Key, policy: &Policy) -> Result<(), StoreError> {
        let shared = &self.shared;
        let id = identity(key, policy);
        shared.bus.generation.fetch_add(1, Ordering::AcqRel);
        shared.drop_identity(&id);
        match shared.bus.invalidate(&id, shared.ack_timeout).await {
            Ok(()) => Ok(()),
            Err(bus::InvalidateError::Timeout) => {
                tracing::warn!(
                    policy = policy.name(),
                    "lease invalidation: not every instance acknowledged; their leases end with their lifetime"
                );
                Ok(())
            }
            Err(bus::InvalidateError::Channel(error)) => Err(StoreError::Backend(error)),
        }
    }

    /// Ends every instance's lease of `key` after the store's reset or
    /// block of it answered `done`: also when it failed in a way that may
    /// have reset or blocked the key all the same (a timeout), whose leases
    /// must then not be spent; its error is returned.
    async fn invalidate_after(
        &self,
        done: Result<(), StoreError>,
        key: &Key,
        policy: &Policy,
    ) -> Result<(), StoreError> {
        match done {
            Ok(()) => self.invalidate(key, policy).await,
            Err(error) if error.may_have_acted() => {
                if let Err(also) = self.invalidate(key, policy).await {
                    tracing::warn!(
                        policy = policy.name(),
                        error = %also,
                        "lease invalidation after a failed reset or block"
                    );
                }
                Err(error)
            }
            Err(error) => Err(error),
        }
    }
}

/// Runs `operation` to its end on a runtime that runs it (the current
/// one, or the store's home if the current one runs tasks only while its
/// thread blocks on a future: see [`crate::running::hand_on_runtime`]),
/// whether or not its caller waits for it: a reset or block the caller
/// gave up on (a timeout, a client gone) may have acted in the store
/// already, and every instance's leases of the key must end all the same.
/// With no runtime to run it on, it runs in the caller's future.
async fn to_the_end(
    home: &crate::patience::Home,
    operation: impl Future<Output = Result<(), StoreError>> + Send + 'static,
) -> Result<(), StoreError> {
    let Some(runtime) = crate::running::hand_on_runtime(home) else {
        return operation.await;
    };
    match runtime.spawn(operation).await {
        Ok(done) => done,
        // Its runtime shut down, or it panicked.
        Err(error) => Err(StoreError::backend(error)),
    }
}

impl<S: Store> Store for LeasedStore<S> {
    fn try_check_now(
        &self,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        if !Leasing::of(policy).leases() || cost == 0 {
            return self.shared.store.try_check_now(key, policy, cost);
        }
        let shared = &self.shared;
        let now = shared.now();
        let hash = shared.table.hash(key, policy);
        let mut ended = Vec::new();
        let (decision, ahead, promoted) = {
            let mut shard = shared.table.shard(hash);
            let entry = shard
                .get_mut(&hash)
                .filter(|e| e.fingerprint == policy.fingerprint())?;
            let (decision, promoted) = match entry.spend(cost, now) {
                Some(decision) => (decision, None),
                // The next lease takes the place of one that ended with
                // units left, or holds too few for `cost`, as in `check`.
                // Those go back in the background: only within a runtime
                // context, to run it.
                None => {
                    let runtime = crate::running::hand_on_runtime(&shared.home)?;
                    (entry.promote(cost, now, &mut ended)?, Some(runtime))
                }
            };
            entry.last_seen = now;
            (decision, self.ahead(entry, policy, hash, now), promoted)
        };
        self.ask_ahead(ahead, key, policy);
        if let Some(runtime) = promoted {
            shared.give_back_later(&runtime, ended);
        }
        Some(Ok(decision))
    }

    async fn check(&self, key: &Key, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        let shared = &self.shared;
        if !Leasing::of(policy).leases() || cost == 0 {
            return shared.direct(key, policy, cost).await;
        }
        let now = shared.now();
        let hash = shared.table.hash(key, policy);
        let mut ended = Vec::new();
        let mut ahead = None;
        let plan = {
            let mut shard = shared.table.shard(hash);
            let idle_before = shared.idle_before(now);
            let entry = shared.table.entry(
                &mut shard,
                hash,
                policy.fingerprint(),
                now,
                idle_before,
                &mut ended,
            );
            match entry {
                None => Plan::Direct { low: false },
                Some(entry) => {
                    if let Some(decision) = entry.spend(cost, now) {
                        let ahead = self.ahead(entry, policy, hash, now);
                        drop(shard);
                        self.ask_ahead(ahead, key, policy);
                        return Ok(decision);
                    }
                    if let Some(decision) = entry.promote(cost, now, &mut ended) {
                        ahead = self.ahead(entry, policy, hash, now);
                        Plan::Spent(Box::new(decision))
                    } else {
                        let cap = shared.cap(policy);
                        // Neither lease can serve the request: they end,
                        // the older first (its return is counted against
                        // the later one's, see `Shared::return_unused`).
                        match entry.lease.take() {
                            Some(lease) => {
                                entry.resize(&lease, cost, now, shared.interval, cap);
                                ended.push(*lease);
                            }
                            None => entry.observe(cost, now, shared.interval, cap),
                        }
                        // A size learnt under another configuration
                        // (within an interval of a change) may exceed this
                        // one's largest lease.
                        entry.size = entry.size.min(cap);
                        if entry.next.as_ref().is_some_and(|next| next.expires <= now) {
                            ended.extend(entry.next.take().map(|next| *next));
                        }
                        if let Some(waiting) = &entry.refilling {
                            Plan::Wait(Arc::clone(waiting))
                        } else if !shared.bus.listening() || !entry.worth_a_lease(cost, now) {
                            Plan::Direct {
                                low: entry.is_low(now),
                            }
                        } else {
                            let waiting = entry.begin_grant();
                            Plan::Grant(entry.size, waiting)
                        }
                    }
                }
            }
        };
        self.ask_ahead(ahead, key, policy);
        if let Plan::Spent(_) = &plan
            && !ended.is_empty()
            && let Some(runtime) = crate::running::hand_on_runtime(&shared.home)
        {
            // Decided here: the ended lease goes back in the background,
            // not on this request's time.
            shared.give_back_later(&runtime, std::mem::take(&mut ended));
        }
        // The rare paths are boxed, so that the common one, a request the
        // store decides, carries a future no larger than the store's.
        let deciding = async {
            match plan {
                Plan::Direct { low } => {
                    let decided = shared.direct(key, policy, cost).await;
                    if let Ok(decision) = &decided {
                        // Only a key that is or becomes low pays for the
                        // lock: the store's answer says when to lease again.
                        if low || table::is_low(decision) || !decision.is_allowed() {
                            shared.store_answered(policy, hash, decision);
                        }
                    }
                    decided
                }
                Plan::Grant(size, waiting) => {
                    Box::pin(async {
                        let settled = super::grant::Settled::new(shared, hash, waiting);
                        match shared
                            .grant(key, policy, hash, size, cost, now, settled)
                            .await?
                        {
                            Some(decision) => Ok(decision),
                            None => shared.direct(key, policy, cost).await,
                        }
                    })
                    .await
                }
                Plan::Spent(decision) => Ok(*decision),
                Plan::Wait(grant) => {
                    Box::pin(shared.after_grant(key, policy, hash, cost, grant)).await
                }
            }
        };
        if ended.is_empty() {
            return deciding.await;
        }
        // The decision first: a grant's guard (`Settled`) is made on its
        // first poll, before anything else of this request can fail.
        let (decision, ()) = tokio::join!(biased; deciding, Box::pin(shared.give_back(ended)));
        decision
    }

    fn status(
        &self,
        key: &Key,
        policy: &Policy,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.shared.store.status(key, policy)
    }

    /// A charge is paid first from this instance's leases of the key (see
    /// [`LeasedStore`], "Settlements"), and the rest goes to the store. A
    /// refund of a key whose leases drain ("Refunds") is counted against
    /// the key's leases before it goes to the store: there it shortens the
    /// backlog their grants left, and they give back that much less.
    async fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: Settlement,
    ) -> Result<Decision, StoreError> {
        let shared = &self.shared;
        let charge = settlement.charge();
        if charge > 0 && Leasing::of(policy).leases() {
            let hash = shared.table.hash(key, policy);
            let now = shared.now();
            let (taken, told) = {
                let mut shard = shared.table.shard(hash);
                let entry = shard.get_mut(&hash);
                let entry = entry.filter(|e| e.fingerprint == policy.fingerprint());
                let by = settlement.decided_by();
                entry.map_or((0, None), |entry| entry.charge(charge, now, by))
            };
            if let (true, Some(told)) = (taken == charge, told) {
                return Ok(told);
            }
            let rest = Settlement::new(
                settlement.reserved(),
                settlement.actual() - taken,
                settlement.reserved_at(),
            );
            let rest = rest.with_decided_by(settlement.decided_by());
            return shared.store.settle(key, policy, rest).await;
        }
        let refund = settlement.refund();
        if refund == 0 || !Leasing::of(policy).leases() || !table::drains(policy) {
            return shared.store.settle(key, policy, settlement).await;
        }
        let hash = shared.table.hash(key, policy);
        // Whatever the entry's configuration: the store keeps the key's
        // state under the policy's name, so a refund settled under an old
        // one may shorten the new one's backlog too (where the new one's
        // state carries over to it whole: see `lua/lib/carry.lua`).
        let refunds = shared
            .table
            .shard(hash)
            .get_mut(&hash)
            .map(|e| Arc::clone(e.refunds.get_or_insert_with(Arc::default)));
        shared
            .refunding(refunds.as_ref(), refund, || {
                shared.store.settle(key, policy, settlement)
            })
            .await
    }

    /// Resets the key in the store, then ends every instance's lease of
    /// it (see [`LeasedStore`]'s fence), to the end even if the caller
    /// goes away.
    async fn reset(&self, key: &Key, policy: &Policy) -> Result<(), StoreError> {
        let (this, key, policy) = (self.clone(), key.clone(), policy.clone());
        to_the_end(&self.shared.home, async move {
            let done = this.shared.store.reset(&key, &policy).await;
            this.invalidate_after(done, &key, &policy).await
        })
        .await
    }

    /// Blocks the key in the store, then ends every instance's lease of
    /// it (see [`LeasedStore`]'s fence), to the end even if the caller
    /// goes away.
    async fn block(
        &self,
        key: &Key,
        policy: &Policy,
        duration: Duration,
    ) -> Result<(), StoreError> {
        let (this, key, policy) = (self.clone(), key.clone(), policy.clone());
        to_the_end(&self.shared.home, async move {
            let done = this.shared.store.block(&key, &policy, duration).await;
            this.invalidate_after(done, &key, &policy).await
        })
        .await
    }

    fn last_known(&self, key: &Key, policy: &Policy) -> Option<Decision> {
        self.shared.store.last_known(key, policy)
    }
    fn name(&self) -> &'static str {
        self.shared.store.name()
    }
}
