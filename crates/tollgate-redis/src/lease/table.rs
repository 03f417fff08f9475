//! The leases one instance holds, and what it has seen of each key's rate.

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_core::{DecidedBy, Decision, Key, Policy, Timestamp};

use super::refunds::Refunds;

mod lease;
use lease::covering;
pub(crate) use lease::{LEASE_MIN_SPARE, Lease, drains};

/// What one instance knows of one key under one policy.
pub(crate) struct Entry {
    pub(crate) fingerprint: u64,
    pub(crate) last_seen: u64,
    /// Requests decided by the store since `span_start`: how the rate of
    /// a key without a lease is measured.
    span_start: u64,
    span_cost: u64,
    /// The size of the next lease; 0 while the key is cold.
    pub(crate) size: u64,
    /// A grant is on its way: the key's other requests meanwhile wait
    /// for it.
    pub(crate) refilling: Option<Arc<Refill>>,
    /// The lease being spent. Leases are boxed: with two inline, an
    /// entry spanned ten cache lines, and a table of many keys outgrew a
    /// core's cache.
    pub(crate) lease: Option<Box<Lease>>,
    /// The lease granted ahead, once seven eighths of the current one
    /// were spent or it grew late (see [`Entry::ahead`]): spent once the
    /// current one is used up or ended, so that the key does not wait for
    /// a grant.
    pub(crate) next: Option<Box<Lease>>,
    /// Local time (µs) until which the store's last answer says the key
    /// holds too little for a lease (0: not known to be low). Until then
    /// no grant is asked for: the key's requests go to the store, whose
    /// own cache answers its denials, so an exhausted key costs no more
    /// calls than without leases.
    low_until: u64,
    /// When (µs, by the store's clock) the store last answered the key
    /// blocked; 0 if never. A grant it decided before then was decided
    /// before the block: it is not kept.
    blocked_at: u64,
    /// The key's refunds sent through this instance, from its first grant
    /// or refund on (made then: a key that had neither allocates nothing).
    pub(crate) refunds: Option<Arc<Refunds>>,
}

/// A grant on its way for a key: what the key's other requests wait on.
#[derive(Default)]
pub(crate) struct Refill {
    /// Notified, every waiter at once, when the grant is settled.
    pub(crate) settled: tokio::sync::Notify,
    /// Notified when a request of the key starts waiting for the grant: a
    /// grant asked for ahead stops gathering and goes out at once.
    pub(crate) hurry: tokio::sync::Notify,
}

impl Entry {
    /// Marks a grant as on its way for the key: what its other requests
    /// wait on until the grant is settled (see `grant::Settled`).
    pub(crate) fn begin_grant(&mut self) -> Arc<Refill> {
        let waiting = Arc::new(Refill::default());
        self.refilling = Some(Arc::clone(&waiting));
        waiting
    }

    fn new(fingerprint: u64, now: u64) -> Self {
        Self {
            fingerprint,
            last_seen: now,
            span_start: now,
            span_cost: 0,
            size: 0,
            refilling: None,
            lease: None,
            next: None,
            low_until: 0,
            blocked_at: 0,
            refunds: None,
        }
    }

    /// Whether the key's refunds are counted beyond this entry and its
    /// leases: by a lease ended and on its way back, or a grant or a
    /// refund on its way. The entry is then kept: forgotten and made
    /// again, it would count the key's next refunds apart from them.
    pub(crate) fn refunds_elsewhere(&self) -> bool {
        self.refunds.as_ref().is_some_and(|refunds| {
            let leases = [&self.lease, &self.next].into_iter().flatten();
            let held = 1 + leases.filter(|lease| lease.refunds.is_some()).count();
            Arc::strong_count(refunds) > held
        })
    }

    /// Whether the store's last answer said the key holds too little for
    /// a lease, at `now`.
    pub(crate) fn is_low(&self, now: u64) -> bool {
        now < self.low_until
    }

    /// Remembers what the store answered at `now` for this key (a grant,
    /// refused or not, or a request it decided): a key left with less
    /// than a lease's worth is low until its denial's retry time, or
    /// until its limits reset. A key the store answered blocked (an
    /// operator blocked it, and this instance missed or never had the
    /// invalidation) drops its leases: no request is admitted from them
    /// any more. They are not given back: the block forgot the key's
    /// state, and their return would land behind its fence.
    pub(crate) fn store_answered(&mut self, decision: &Decision, now: u64) {
        if decision.is_blocked() {
            drop(self.lease.take());
            drop(self.next.take());
            self.blocked_at = self.blocked_at.max(decision.now().as_micros());
        }
        self.low_until = if decision.is_allowed() && !is_low(decision) {
            0
        } else {
            let wait = decision.retry_after().unwrap_or_else(|| decision.reset());
            now.saturating_add(micros(wait))
        };
    }

    /// Whether to keep a lease that the store granted at `granted_at` (by
    /// its clock): not one granted before the store last answered the key
    /// blocked (that answer, on another connection, came back first, and
    /// dropped the key's leases). One granted since was granted once the
    /// block ended or was lifted.
    pub(crate) fn keeps_grant(&self, granted_at: Timestamp) -> bool {
        granted_at.as_micros() >= self.blocked_at
    }

    /// Counts a request of `cost` decided by the store at `now`, and
    /// sizes the next lease: once a whole `interval` has passed, to the
    /// key's rate over it ([`covering`]); before that, to the cost seen so
    /// far once it is a lease's worth ([`LEASE_MIN_SPARE`] beyond one
    /// request), so that a key busy from its start does not wait a whole
    /// interval.
    /// Two close requests of a cold key are no rate.
    pub(crate) fn observe(&mut self, cost: u64, now: u64, interval: Duration, cap: u64) {
        self.span_cost = self.span_cost.saturating_add(cost);
        let elapsed = now.saturating_sub(self.span_start);
        if u128::from(elapsed) >= interval.as_micros() {
            self.size = covering(self.span_cost, elapsed, interval).min(cap);
            self.span_start = now;
            self.span_cost = 0;
        } else if self.span_cost > cost.saturating_add(LEASE_MIN_SPARE) {
            self.size = self.size.max(self.span_cost.min(cap));
        }
    }

    /// Spends `cost` at `now` from the current lease, or from the next
    /// once the current one is used up.
    pub(crate) fn spend(&mut self, cost: u64, now: u64) -> Option<Decision> {
        let live = |lease: &Lease| lease.expires > now && lease.left >= cost;
        if let Some(lease) = self.lease.as_mut().filter(|l| live(l)) {
            return Some(lease.spend(cost, now));
        }
        // A used-up lease has nothing to give back: the next one takes
        // its place here. One with units left goes back first, through
        // `promote`.
        if self.lease.as_ref().is_none_or(|l| l.left == 0) && self.next.as_deref().is_some_and(live)
        {
            let next = self.next.take()?;
            return Some(self.lease.insert(next).spend(cost, now));
        }
        None
    }

    /// Takes up to `units` at `now` from the current lease, then from the
    /// next, for a settlement's charge of a request `by` decided: units the
    /// same store counted at their grant pay for it (not a local
    /// fallback's for a request the shared store decided, or the reverse),
    /// so that no later request spends them, and the store is charged only
    /// the rest. How many it took, and what the lease it took from last
    /// tells of the key.
    pub(crate) fn charge(
        &mut self,
        units: u64,
        now: u64,
        by: DecidedBy,
    ) -> (u64, Option<Decision>) {
        let mut taken = 0;
        let mut told = None;
        for lease in [&mut self.lease, &mut self.next].into_iter().flatten() {
            if taken == units {
                break;
            }
            if lease.base.decided_by() != by {
                continue;
            }
            if let Some((took, decision)) = lease.charge(units - taken, now) {
                taken += took;
                told = Some(decision);
            }
        }
        (taken, told)
    }

    /// When neither lease could serve `cost` at `now` (see [`Self::spend`])
    /// and the current one ended or holds too little while the next one
    /// can: hands the current one to `ended`, to give back what it holds,
    /// and spends from the next. Asking the store for another lease
    /// instead would leave the next one waiting, unspent, to its end.
    pub(crate) fn promote(
        &mut self,
        cost: u64,
        now: u64,
        ended: &mut Vec<Lease>,
    ) -> Option<Decision> {
        if !self
            .next
            .as_ref()
            .is_some_and(|l| l.expires > now && l.left >= cost)
        {
            return None;
        }
        let next = self.next.take()?;
        ended.extend(self.lease.replace(next).map(|lease| *lease));
        self.lease.as_mut().map(|lease| lease.spend(cost, now))
    }

    /// The size of a lease to ask for ahead of time at `now`, if the
    /// current one has spent seven eighths of its units (half, if it was
    /// held to its share of the limit), or is in the last quarter of a
    /// whole life (one and a half intervals old), and none is on its way:
    /// what the current one saw spent, scaled to a lease's span
    /// ([`Lease::next_size`]).
    pub(crate) fn ahead(
        &self,
        now: u64,
        interval: Duration,
        cap: impl FnOnce() -> u64,
    ) -> Option<u64> {
        let lease = self.lease.as_ref()?;
        // A lease held to its share lasts less than a lease's span at the
        // key's rate: the next one is asked for at half, not seven eighths.
        let ask_at = if lease.capped { 2 } else { 8 };
        // One spent slower than its size foretold, in the last quarter of
        // its life: the next one is asked for now, not by the request that
        // finds this one ended (and then waits for the grant). The rest of
        // this one goes back when the next one takes its place. Not one
        // whose life its window cut short: the next one would be granted
        // in the same window and end with it, unspent.
        let life = micros(interval).saturating_mul(u64::from(super::LIFETIME_INTERVALS));
        let late = lease.expires.saturating_sub(lease.sent) >= life
            && now.saturating_sub(lease.sent) >= life / 4 * 3;
        if self.next.is_some()
            || self.refilling.is_some()
            || (lease.left.saturating_mul(ask_at) > lease.granted && !late)
            || self.is_low(now)
        {
            return None;
        }
        let size = lease.next_size(now, 0, interval, cap());
        (size > LEASE_MIN_SPARE).then_some(size)
    }

    /// Whether a request of `cost` at `now` should ask for a lease of the
    /// entry's size: one that holds at least [`LEASE_MIN_SPARE`] more
    /// units, of a key the store did not last find low.
    pub(crate) fn worth_a_lease(&self, cost: u64, now: u64) -> bool {
        self.size >= cost.saturating_add(LEASE_MIN_SPARE) && !self.is_low(now)
    }

    /// Sizes the next lease after `lease` ends at `now`, where a request
    /// of `cost` finds it ended (see [`Lease::next_size`]), and starts
    /// measuring the rate afresh.
    pub(crate) fn resize(
        &mut self,
        lease: &Lease,
        cost: u64,
        now: u64,
        interval: Duration,
        cap: u64,
    ) {
        self.size = lease.next_size(now, cost, interval, cap);
        self.span_start = now;
        self.span_cost = 0;
    }
}

/// `span` in whole µs, the unit of the table's times; an absurdly long
/// span is forever.
pub(crate) fn micros(span: Duration) -> u64 {
    u64::try_from(span.as_micros()).unwrap_or(u64::MAX)
}

type Map = HashMap<u64, Entry, foldhash::fast::FixedState>;

/// A shard on cache lines of its own: a hot key's shard is locked from
/// every thread, and should not slow its neighbours.
#[repr(align(128))]
struct Padded {
    map: Mutex<Map>,
    /// While the shard is full, none of its keys goes idle before this
    /// (local µs): a new key is turned away without a scan until then.
    /// Read and written under `map`'s lock.
    full_until: AtomicU64,
}

/// Sharded by key hash, each shard bounded.
pub(crate) struct Table {
    hasher: foldhash::quality::RandomState,
    shards: Box<[Padded]>,
    per_shard: usize,
}

const SHARDS: usize = 64;

impl Table {
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            hasher: foldhash::quality::RandomState::default(),
            shards: (0..SHARDS)
                .map(|_| Padded {
                    map: Mutex::new(HashMap::default()),
                    full_until: AtomicU64::new(0),
                })
                .collect(),
            per_shard: max_keys.div_ceil(SHARDS),
        }
    }

    pub(crate) fn hash(&self, key: &Key, policy: &Policy) -> u64 {
        self.hasher.hash_one((policy.name(), key))
    }

    pub(crate) fn shard(&self, hash: u64) -> MutexGuard<'_, Map> {
        self.padded(hash).map.lock()
    }

    fn padded(&self, hash: u64) -> &Padded {
        // The top bits: the map itself uses the low ones.
        &self.shards[(hash >> 58) as usize % SHARDS]
    }

    /// The entry of `hash` for `fingerprint`, made if there is room: a
    /// full shard first forgets keys idle since `idle_before` (handing
    /// their leases to `ended`), and tracks no new key if still full. It
    /// scans for idle keys no sooner than the first of them can be idle
    /// (or a quarter of the idle span after its last scan, if sooner), so
    /// that new keys sprayed at a full shard do not each scan it.
    pub(crate) fn entry<'a>(
        &self,
        shard: &'a mut Map,
        hash: u64,
        fingerprint: u64,
        now: u64,
        idle_before: u64,
        ended: &mut Vec<Lease>,
    ) -> Option<&'a mut Entry> {
        if !shard.contains_key(&hash) && shard.len() >= self.per_shard {
            let full_until = &self.padded(hash).full_until;
            if now < full_until.load(Ordering::Relaxed) {
                return None;
            }
            shard.retain(|_, e| {
                let keep =
                    e.last_seen >= idle_before || e.refilling.is_some() || e.refunds_elsewhere();
                if !keep {
                    ended.extend(e.lease.take().map(|lease| *lease));
                    ended.extend(e.next.take().map(|next| *next));
                }
                keep
            });
            if shard.len() >= self.per_shard {
                // A key seen at `t` is idle from `t` plus the idle span on.
                // One kept only for a grant or a refund on its way may go
                // sooner: the shard is scanned again within a quarter of
                // the span (an interval) all the same.
                let span = now.saturating_sub(idle_before);
                let first_seen = shard.values().map(|e| e.last_seen);
                let first_seen = first_seen.filter(|&seen| seen >= idle_before).min();
                let first_idle =
                    first_seen.map_or(u64::MAX, |seen| seen.saturating_add(span).saturating_add(1));
                let soon = now.saturating_add(span / 4).max(now.saturating_add(1));
                full_until.store(first_idle.min(soon), Ordering::Relaxed);
                return None;
            }
        }
        let entry = shard
            .entry(hash)
            .or_insert_with(|| Entry::new(fingerprint, now));
        if entry.fingerprint != fingerprint {
            // The policy's configuration changed: the rate carries over,
            // and the old one's leases are dropped, not given back. A
            // return settles under the configuration it was granted
            // under: it would carry the key back to the old one where the
            // new one's state carries over whole (or holds nothing any
            // more), and change nothing elsewhere (see
            // `lua/lib/carry.lua`). The units left stay
            // counted until they age out, which can only under-admit, by
            // at most a lease.
            drop(entry.lease.take());
            drop(entry.next.take());
            entry.fingerprint = fingerprint;
        }
        entry.last_seen = now;
        Some(entry)
    }

    /// Takes out every lease for which `end` holds, forgetting keys idle
    /// since `idle_before`.
    pub(crate) fn sweep(
        &self,
        idle_before: u64,
        mut end: impl FnMut(&Lease) -> bool,
    ) -> Vec<Lease> {
        let mut ended = Vec::new();
        for shard in &self.shards {
            let mut shard = shard.map.lock();
            shard.retain(|_, e| {
                for slot in [&mut e.lease, &mut e.next] {
                    if slot.as_deref().is_some_and(&mut end) {
                        ended.extend(slot.take().map(|lease| *lease));
                    }
                }
                e.last_seen >= idle_before
                    || e.refilling.is_some()
                    || e.lease.is_some()
                    || e.next.is_some()
                    || e.refunds_elsewhere()
            });
        }
        ended
    }

    /// How many leases are held, and how many units they hold.
    pub(crate) fn outstanding(&self) -> (usize, u64) {
        let mut held = (0, 0);
        for shard in &self.shards {
            let shard = shard.map.lock();
            let leases = shard.values().flat_map(|e| [&e.lease, &e.next]);
            for lease in leases.filter_map(Option::as_ref) {
                held.0 += 1;
                held.1 += lease.left;
            }
        }
        held
    }
}

/// Whether the store's answer leaves the key less than a lease's worth.
pub(crate) fn is_low(decision: &Decision) -> bool {
    decision.remaining() <= LEASE_MIN_SPARE
}

/// The identity of a key under a policy's name, the same on every
/// instance: how an invalidation names the leases it ends.
pub(crate) fn identity(key: &Key, policy: &Policy) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let mut digest = Sha256::new();
    for part in [
        policy.name().as_bytes(),
        key.kind().as_str().as_bytes(),
        key.as_bytes(),
    ] {
        digest.update((part.len() as u64).to_be_bytes());
        digest.update(part);
    }
    let mut id = [0; 16];
    id.copy_from_slice(&digest.finalize()[..16]);
    id
}

#[cfg(test)]
mod tests;
