//! A slot held by a request, renewed while it runs and given back when dropped.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use tollgate_core::{InFlightLimit, Key, MemoryStore, SlotStore, StoreError};

use super::telemetry::Telemetry;
use crate::home::Home;
/// Where a request's slot was taken: in the layer's store, or, while it
/// fails, in the local fallback.
#[derive(Debug, Clone, Copy)]
pub(super) enum Holds {
    Store,
    Local,
}

/// A slot held: given back when dropped, and its lease renewed meanwhile
/// in a store of leases.
pub(super) struct Slot<St: SlotStore + Clone> {
    store: St,
    key: Key,
    limit: InFlightLimit,
    holder: u64,
    renewal: Option<tokio::task::AbortHandle>,
    telemetry: Telemetry,
    /// Where its renewals and give-back run (see [`Home::runtime`]).
    home: Home,
    /// A slot taken in the store, or the registration there of one the
    /// local fallback gave.
    taken: bool,
    /// Of a registration: whether the store may hold its slot (the
    /// acquire's reply was lost, or a renewal reached the store), so
    /// that it is given back (see `Registered`). One that never reached the
    /// store holds nothing there, and its give-back, which would fail and
    /// be tried again through an outage, is not sent.
    registered: Arc<AtomicU8>,
}

impl<St: SlotStore + Clone> Slot<St> {
    /// A slot taken in `store`, as the response body holds it.
    pub(super) fn boxed(
        store: St,
        key: Key,
        limit: &InFlightLimit,
        holder: u64,
        telemetry: &Telemetry,
        home: &Home,
    ) -> Box<dyn Any + Send + Sync> {
        Box::new(Self::take(
            store,
            key,
            limit.clone(),
            holder,
            telemetry,
            home,
            (true, false),
        ))
    }

    /// A request that runs while `store` failed, by the local fallback's
    /// slot ([`Slot::with_local`]) or let through
    /// ([`FailureMode::Open`](crate::FailureMode::Open)): registered in
    /// `store` by its renewals once the store answers again (a renewal
    /// takes a slot that is gone), so that a request that runs on past the
    /// failure counts there; given back when it ends. `lost`: the
    /// acquire's reply was lost, and the store may hold the slot already.
    pub(super) fn registered(
        store: St,
        key: Key,
        limit: &InFlightLimit,
        holder: u64,
        telemetry: &Telemetry,
        home: &Home,
        lost: bool,
    ) -> Self {
        let limit = limit.clone();
        Self::take(store, key, limit, holder, telemetry, home, (false, lost))
    }

    /// This registration with the slot the local fallback gave in `local`
    /// (under `local_limit`), as the response body holds them: given back
    /// to both.
    pub(super) fn with_local(
        self,
        local: MemoryStore,
        local_limit: &InFlightLimit,
    ) -> Box<dyn Any + Send + Sync> {
        let local = Slot::take(
            local,
            self.key.clone(),
            local_limit.clone(),
            self.holder,
            &self.telemetry,
            &self.home,
            (true, false),
        );
        Box::new((local, self))
    }

    /// A slot `taken` in `store`, or registered there (`lost`: the
    /// acquire's reply was lost, and the store may hold it already).
    fn take(
        store: St,
        key: Key,
        limit: InFlightLimit,
        holder: u64,
        telemetry: &Telemetry,
        home: &Home,
        (taken, lost): (bool, bool),
    ) -> Self {
        let registered = Arc::new(AtomicU8::new(if lost {
            Registered::MAY_HOLD
        } else {
            Registered::NOT_YET
        }));
        if taken {
            telemetry.held(1.0);
        }
        // With no runtime to run on nothing renews: the slot is held until
        // its lease ends, or it is given back.
        let leases = store.leases();
        let runtime = leases.then(|| home.runtime()).flatten();
        let renewal = runtime.map(|runtime| {
            let (store, key, limit) = (store.clone(), key.clone(), limit.clone());
            let home = home.clone();
            let (telemetry, reached) = (telemetry.clone(), Arc::clone(&registered));
            let lease = limit.lease_duration();
            let every = lease / 3;
            runtime
                .spawn(async move {
                    let mut tick = tokio::time::interval(every);
                    // A renewal late for its tick (a stalled runtime) is
                    // not followed by the ticks it missed, all at once.
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    tick.tick().await;
                    // Renews until the slot is given back. A slot found gone
                    // is taken back, past the limit if new requests hold every
                    // slot (the request cannot be un-run), so that new
                    // requests count this one again within a renewal period of
                    // the store losing its slots.
                    // A registration's first renewal finds its slot gone,
                    // as it was never taken there: no news.
                    let mut expected_gone = !taken;
                    loop {
                        tick.tick().await;
                        // Counted as reaching the store while on its way,
                        // and after, unless it never did; none is sent once
                        // the slot was dropped. A slot dropped while its
                        // renewal is on its way is given back here, once the
                        // renewal's reply is in: on a store of several
                        // connections, a give-back sent meanwhile could reach
                        // the store first, and the renewal would then take
                        // the slot back for a whole lease.
                        let Ok(before) =
                            reached.fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                                (state & Registered::DROPPED == 0)
                                    .then_some(state | Registered::MAY_HOLD | Registered::RENEWING)
                            })
                        else {
                            return;
                        };
                        // Bounded, for a store without a deadline of its
                        // own: a slot dropped meanwhile waits for it.
                        let renewal = store.renew(&key, &limit, holder);
                        let renewed = tokio::time::timeout(lease, renewal)
                            .await
                            .unwrap_or(Err(StoreError::Timeout(lease)));
                        // A renewal that failed at once (the store's
                        // breaker open, its connection refused or dropped,
                        // or an error reply such as `LOADING`) is tried
                        // again after a quarter of the period, not a whole
                        // one: the store may have lost the slot (a Redis
                        // restarted empty drops its connections), and new
                        // requests take it until a renewal gets through. A
                        // renewal is taken again whole, so one that may
                        // have been applied is tried again as soon. Not one
                        // that timed out (the store is slow: more calls add
                        // to its load) or met this process's own load.
                        let cheap = |e: &StoreError| !e.is_timeout() && !e.is_own_load();
                        if renewed.as_ref().err().is_some_and(cheap) {
                            tick.reset_after(every / 4);
                        }
                        let unsent = renewed.as_ref().err().is_some_and(|e| !e.may_have_acted());
                        let held = match unsent {
                            true => before & Registered::MAY_HOLD,
                            false => Registered::MAY_HOLD,
                        };
                        let rest = !(Registered::MAY_HOLD | Registered::RENEWING);
                        let (Ok(state) | Err(state)) =
                            reached.fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                                Some(state & rest | held)
                            });
                        if state & Registered::DROPPED != 0 {
                            if taken || held != 0 {
                                give_back(&store, &key, &limit, holder, &home);
                            }
                            return;
                        }
                        if let Ok(renewal) = renewed {
                            if renewal.found_gone() && (!expected_gone || renewal.past_limit()) {
                                telemetry.slot_gone(renewal);
                            }
                            expected_gone = false;
                        }
                    }
                })
                .abort_handle()
        });
        Self {
            store,
            key,
            limit,
            holder,
            renewal,
            telemetry: telemetry.clone(),
            // A store without leases gives back at once, with no runtime.
            home: if leases { home.clone() } else { Home::NONE },
            taken,
            registered,
        }
    }
}

impl<St: SlotStore + Clone> Drop for Slot<St> {
    fn drop(&mut self) {
        if self.taken {
            self.telemetry.held(-1.0);
        }
        let state = self
            .registered
            .fetch_or(Registered::DROPPED, Ordering::AcqRel);
        // A renewal on its way gives the slot back once its reply is in.
        if state & Registered::RENEWING != 0 {
            return;
        }
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        if self.taken || state & Registered::MAY_HOLD != 0 {
            give_back(&self.store, &self.key, &self.limit, self.holder, &self.home);
        }
    }
}

/// A request's slot in the local fallback while it holds its slot in the
/// store: taken past this instance's share if need be, given back when
/// dropped. Should the store fail while the request runs, the fallback
/// counts it among this instance's requests, and gives the key no fresh
/// set of slots beside the ones it runs.
pub(super) struct LocalHold {
    local: MemoryStore,
    key: Key,
    limit: InFlightLimit,
    holder: u64,
}

impl LocalHold {
    /// `holder`'s slot of `key` in `local`, under `limit` (this instance's
    /// share).
    pub(super) fn new(local: MemoryStore, key: Key, limit: InFlightLimit, holder: u64) -> Self {
        local.renew_slot_sync(&key, &limit, holder);
        Self {
            local,
            key,
            limit,
            holder,
        }
    }
}

impl Drop for LocalHold {
    fn drop(&mut self) {
        self.local.release_now(&self.key, &self.limit, self.holder);
    }
}

/// The state of a slot's registration and renewals (a `Slot`'s
/// `registered`), in bits.
struct Registered;

impl Registered {
    /// No call of it reached the store: the store holds nothing of it.
    const NOT_YET: u8 = 0;
    /// The acquire's reply was lost, or a renewal is on its way or
    /// reached the store: it may hold the slot.
    const MAY_HOLD: u8 = 1;
    /// The slot was dropped: no renewal is sent after.
    const DROPPED: u8 = 2;
    /// A renewal is on its way: the renewing task, not the drop, gives the
    /// slot back.
    const RENEWING: u8 = 4;
}

/// Gives `holder`'s slot back, for good (the request ended, or will never
/// hold it): at once if the store needs no I/O, else in the background.
/// Giving back a slot the store never took frees nothing (slots are held
/// by holder); a store whose calls can arrive out of order remembers the
/// holder, so that its acquire, if still on its way, takes nothing. A
/// give-back the store fails (its breaker is open, it missed its
/// deadline) is tried again, each wait twice the last, until
/// the slot's lease would have ended anyway; lost, it would hold the slot
/// until then, refusing the key's requests for up to a lease. At most
/// [`MAX_RETRYING`] give-backs are tried again at once; past that, and
/// with no runtime to run on, the lease frees the slot. It runs on the
/// layer's `home` when the current runtime would leave it unrun (see
/// [`Home::runtime`]).
pub(super) fn give_back<St: SlotStore + Clone>(
    store: &St,
    key: &Key,
    limit: &InFlightLimit,
    holder: u64,
    home: &Home,
) {
    if store.release_now(key, limit, holder) {
        return;
    }
    if let Some(runtime) = home.runtime() {
        let (store, key, limit) = (store.clone(), key.clone(), limit.clone());
        runtime.spawn(async move {
            let lease = limit.lease_duration();
            let until = tokio::time::Instant::now() + lease;
            // Each try ends with the lease too, on a store with no deadline
            // of its own.
            let released = || tokio::time::timeout_at(until, store.release(&key, &limit, holder));
            if matches!(released().await, Ok(Ok(()))) {
                return;
            }
            let Some(_retrying) = Retrying::new() else {
                return;
            };
            let mut wait = FIRST_RETRY;
            loop {
                let next = tokio::time::Instant::now() + wait;
                if next >= until {
                    return;
                }
                tokio::time::sleep_until(next).await;
                if matches!(released().await, Ok(Ok(()))) {
                    return;
                }
                wait = wait.saturating_mul(2).min(lease / 3).max(FIRST_RETRY);
            }
        });
    }
}

/// The wait before a failed give-back is tried again the first time.
const FIRST_RETRY: Duration = Duration::from_millis(100);

/// The most give-backs tried again at once, in the process: in a long
/// outage, every request that ends fails its give-back.
pub(super) const MAX_RETRYING: usize = 4096;

static RETRYING: AtomicUsize = AtomicUsize::new(0);

/// A give-back being tried again, counted in [`RETRYING`] until dropped.
struct Retrying;

impl Retrying {
    /// Counts one more, if fewer than [`MAX_RETRYING`] are.
    fn new() -> Option<Self> {
        RETRYING
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_RETRYING).then_some(n + 1)
            })
            .ok()
            .map(|_| Self)
    }
}

impl Drop for Retrying {
    fn drop(&mut self) {
        RETRYING.fetch_sub(1, Ordering::AcqRel);
    }
}
