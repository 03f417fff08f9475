//! The store's shards: each holds its keys in the forms of `form.rs`, and
//! decides, carries over, admits and sweeps them under its lock.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard, RwLock};

use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::memory::form::{Expiries, Fence, Form, KeyHash, Maps, dispatch};
use crate::policy::MAX_SPAN_US;
use crate::policy::Policy;
use crate::settle::Settlement;
use crate::state::{PolicyState, blocked};
use crate::time::{Clock, SystemClock, Timestamp};

mod visit;
use visit::{Check, Decided, Seed, Settle, Take};

/// What every handle of one store shares.
pub(super) struct Shared {
    pub(super) shards: Box<[Padded]>,
    pub(super) shard_capacity: usize,
    pub(super) max_keys: usize,
    /// `None` for the [`SystemClock`], read without a virtual call.
    pub(super) clock: Option<std::sync::Arc<dyn Clock>>,
    pub(super) seed: foldhash::quality::RandomState,
    pub(super) keys_gauge: KeysGauge,
    /// The configurations each policy name was decided under, so that a
    /// key whose state was kept under one is found, and carried over, from
    /// another. Written only when a new configuration keeps its first key.
    pub(super) configs: RwLock<HashMap<u64, Configs>>,
}

/// The configurations of one policy name the store has kept keys under.
#[derive(Default)]
pub(super) struct Configs {
    /// The latest [`MAX_CONFIGS`]: a key's state is carried over between
    /// them.
    kept: Vec<Policy>,
    /// The [`MAX_RETIRED`] before them, oldest first: no longer carried
    /// over, but a reset or a block of a key still forgets its state under
    /// them, as it would in Redis, which keeps one state per name.
    retired: Vec<Policy>,
}

/// The most configurations of one policy name the store carries keys
/// between: beyond it, the oldest is retired, and its keys' state is
/// kept but no longer carried over to the others (a reset or a block
/// still forgets it: see [`MAX_RETIRED`]).
const MAX_CONFIGS: usize = 8;

/// The most configurations of one policy name, beyond the kept ones, under
/// which a reset or a block still forgets a key's state. Beyond it, a
/// key's state under the oldest outlives a reset (until it expires).
const MAX_RETIRED: usize = 64;

/// The smallest shard size worth a sweep.
const MIN_SWEEP: usize = 1_024;

/// The share of a full shard's keys (one in this many) whose expiry makes
/// a sweep of it due.
const FULL_SWEEP_SHARE: usize = 16;

/// The [`MEMORY_STORE_KEYS`](crate::telemetry::MEMORY_STORE_KEYS) gauge,
/// with the `metrics` feature; nothing without it.
pub(super) struct KeysGauge {
    #[cfg(feature = "metrics")]
    gauge: metrics::Gauge,
}

impl KeysGauge {
    pub(super) fn new() -> Self {
        #[cfg(feature = "metrics")]
        crate::telemetry::describe();
        Self {
            #[cfg(feature = "metrics")]
            gauge: metrics::gauge!(crate::telemetry::MEMORY_STORE_KEYS),
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    fn add(&self, _keys: usize) {
        #[cfg(feature = "metrics")]
        self.gauge.increment(_keys as f64);
    }

    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    fn sub(&self, _keys: usize) {
        #[cfg(feature = "metrics")]
        self.gauge.decrement(_keys as f64);
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let held = self.shards.iter().map(|s| lock(&s.0).len()).sum();
        self.keys_gauge.sub(held);
    }
}

/// A shard's lock on a cache line pair of its own, so that threads working
/// on neighbouring shards do not slow each other down.
#[repr(align(128))]
pub(super) struct Padded(pub(super) Mutex<Shard>);

pub(super) struct Shard {
    maps: Maps,
    /// Sweep when the shard holds this many keys, blocks and fences.
    sweep_at: usize,
    /// No key held expires before this (µs): a sweep earlier frees no
    /// room for a key.
    next_expiry: u64,
    /// No block or fence held ends before this (µs).
    next_end: u64,
    /// When the keys expire: those the last sweep kept, each key made
    /// since, and each expiry a refund brought forward (a key counted
    /// twice only makes a sweep come sooner). A full shard sweeps once a
    /// [`FULL_SWEEP_SHARE`] of its keys have expired by this count, so
    /// that each scan frees room for many new keys.
    expiries: Expiries,
    /// New keys refused since the last sweep: as many as a
    /// [`FULL_SWEEP_SHARE`] of the keys make a sweep due too, whatever the
    /// count of expiries says (it counts a key expired up to a quarter of
    /// its lifetime late: hours, for day-long keys).
    refused: usize,
}

pub(super) fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A short spin, then parking: critical sections here are a few dozen
    // nanoseconds, far shorter than a trip through the kernel.
    shard.lock()
}

impl Shared {
    /// Decides `cost` for `key` under `policy`.
    #[inline(always)]
    pub(super) fn check(&self, key: &Key, policy: &Policy, cost: u64) -> Decided {
        let (shard, base) = self.locate(key, policy);
        let mut guard = lock(&self.shards[shard].0);
        let now = self.now();
        dispatch(
            policy,
            Check {
                shared: self,
                shard: &mut guard,
                base,
                now,
                cost,
            },
        )
    }

    /// Takes `state` as the state of `key` under `policy`; where the shard
    /// holds some already, each limit keeps the more used of the two.
    pub(super) fn seed(
        &self,
        key: &Key,
        policy: &Policy,
        state: PolicyState,
    ) -> Result<(), StoreError> {
        let (shard, base) = self.locate(key, policy);
        let mut guard = lock(&self.shards[shard].0);
        let now = self.now();
        dispatch(
            policy,
            Seed {
                shared: self,
                shard: &mut guard,
                base,
                now,
                state,
            },
        )
    }

    /// Settles a request's actual cost for `key` under `policy`.
    pub(super) fn settle(&self, key: &Key, policy: &Policy, settlement: &Settlement) -> Decided {
        let (shard, base) = self.locate(key, policy);
        let mut guard = lock(&self.shards[shard].0);
        let now = self.now();
        dispatch(
            policy,
            Settle {
                shared: self,
                shard: &mut guard,
                base,
                now,
                settlement,
            },
        )
    }

    /// Forgets `key` under every configuration of `policy`'s name, and
    /// lifts a block of it.
    pub(super) fn reset(&self, key: &Key, policy: &Policy) {
        let (shard, base) = self.locate(key, policy);
        let mut guard = lock(&self.shards[shard].0);
        let now = self.now();
        guard.sweep_if_due(self, now.as_micros());
        self.forget(&mut guard, base, policy, now);
        guard.maps.blocks.remove(&base);
        guard.fence(base, policy, now, now);
    }

    /// Forgets `key` under `policy`'s name and denies it until `now` plus
    /// `duration`; returns when the block ends.
    pub(super) fn block(&self, key: &Key, policy: &Policy, duration: Duration) -> Timestamp {
        let (shard, base) = self.locate(key, policy);
        let mut guard = lock(&self.shards[shard].0);
        let now = self.now();
        guard.sweep_if_due(self, now.as_micros());
        self.forget(&mut guard, base, policy, now);
        let micros = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
        let until = now.as_micros().saturating_add(micros.min(MAX_SPAN_US));
        guard.maps.blocks.insert(base, until);
        guard.next_end = guard.next_end.min(until);
        guard.fence(base, policy, now, Timestamp::from_micros(until));
        Timestamp::from_micros(until)
    }

    /// Lifts a block of `key` under `policy`'s name made before `at` (the
    /// time of its fence, which a block writes and which outlasts it).
    pub(super) fn lift_block_before(&self, key: &Key, policy: &Policy, at: Timestamp) -> bool {
        let (shard, base) = self.locate(key, policy);
        let mut guard = lock(&self.shards[shard].0);
        let made = guard.maps.fences.get(&base).map(|fence| fence.at);
        let before = made.is_some_and(|made| made < at.as_micros());
        before && guard.maps.blocks.remove(&base).is_some()
    }

    /// Forgets the key of `base` under every configuration of `policy`'s
    /// name, the retired ones too.
    fn forget(&self, shard: &mut Shard, base: KeyHash, policy: &Policy, now: Timestamp) {
        let mut configs = self.other_configs(policy);
        configs.push(policy.clone());
        if let Some(known) = self.configs.read().get(&policy.identity()) {
            configs.extend(known.retired.iter().cloned());
        }
        for config in configs {
            let take = Take {
                shard,
                hash: base ^ config.config_mix(),
                now,
                keep: false,
            };
            if dispatch(&config, take).is_some() {
                self.keys_gauge.sub(1);
            }
        }
    }

    fn now(&self) -> Timestamp {
        match &self.clock {
            None => SystemClock.now(),
            Some(clock) => clock.now(),
        }
    }

    /// The shard of `key` under `policy`'s name, and the key's hash before
    /// the configuration is mixed in.
    #[inline(always)]
    fn locate(&self, key: &Key, policy: &Policy) -> (usize, KeyHash) {
        let mut h = self.seed.build_hasher();
        // Fixed-width parts, then the key's bytes, whose length is among
        // them: no two different inputs feed the same bytes. The policy
        // enters as one number (its name, hashed when it was built), so a
        // check costs three mixing steps, not six. Its limits are not part
        // of it: a changed configuration finds the state built under the
        // old one and carries it over.
        h.write_u64(policy.identity());
        h.write_u64(((key.as_bytes().len() as u64) << 8) | key.kind() as u64);
        h.write(key.as_bytes());
        let base = h.finish();
        // The map uses the hash's low bits for buckets and its top 7 for
        // tags; pick the shard from the middle 32 bits, scaled to the shard
        // count by a multiplication rather than a (slow) division. Every
        // configuration of a policy finds a key in the same shard, under
        // its own name in the maps.
        let shard = ((((base >> 25) & 0xffff_ffff) * self.shards.len() as u64) >> 32) as usize;
        (shard, base)
    }

    /// The other configurations of `policy`'s name the store has kept keys
    /// under; registers `policy` among them.
    fn other_configs(&self, policy: &Policy) -> Vec<Policy> {
        let name = policy.identity();
        let same = |p: &Policy| p.fingerprint() == policy.fingerprint();
        let known = self.configs.read();
        let others: Vec<Policy> = known
            .get(&name)
            .map(|configs| configs.kept.iter().filter(|p| !same(p)).cloned().collect())
            .unwrap_or_default();
        let registered = known
            .get(&name)
            .is_some_and(|configs| configs.kept.iter().any(same));
        drop(known);
        if !registered {
            let mut known = self.configs.write();
            let configs = known.entry(name).or_default();
            if !configs.kept.iter().any(same) {
                configs.retired.retain(|p| !same(p));
                if configs.kept.len() >= MAX_CONFIGS {
                    let oldest = configs.kept.remove(0);
                    if configs.retired.len() >= MAX_RETIRED {
                        configs.retired.remove(0);
                    }
                    configs.retired.push(oldest);
                }
                configs.kept.push(policy.clone());
            }
        }
        others
    }
}

impl Shard {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            maps: Maps::default(),
            sweep_at: MIN_SWEEP.min(capacity),
            next_expiry: u64::MAX,
            next_end: u64::MAX,
            expiries: Expiries::default(),
            refused: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.maps.len()
    }

    /// The decision on a request of the key of `base` if an operator
    /// blocked it. A blocked key holds no state (blocking forgot it, and
    /// nothing makes it anew while the block lasts), so only the paths of
    /// a key the shard does not hold ask: a check of a held key pays
    /// nothing for blocks.
    fn blocked(&mut self, base: KeyHash, policy: &Policy, now: Timestamp) -> Option<Decision> {
        let until = *self.maps.blocks.get(&base)?;
        if until > now.as_micros() {
            return Some(blocked(policy, now, Timestamp::from_micros(until)));
        }
        self.maps.blocks.remove(&base);
        None
    }

    /// Fences the key of `base`, reset or blocked at `now`, for
    /// [`Settlement::fence`] after `ends` (now, or when the block ends),
    /// or until an earlier fence of it ends, if later.
    fn fence(&mut self, base: KeyHash, policy: &Policy, now: Timestamp, ends: Timestamp) {
        let span = u64::try_from(Settlement::fence(policy).as_micros()).unwrap_or(u64::MAX);
        let fence = Fence {
            at: now.as_micros(),
            until: ends.as_micros().saturating_add(span),
        };
        let held = self.maps.fences.entry(base).or_insert(fence);
        *held = Fence {
            at: fence.at,
            until: fence.until.max(held.until),
        };
        self.next_end = self.next_end.min(held.until);
    }

    /// Whether `settlement` is a refund that the fence of a reset or a
    /// block of the key of `base` drops at `now`. Like blocks, a fence is
    /// forgotten once it has ended.
    fn fenced(&mut self, base: KeyHash, now: Timestamp, settlement: &Settlement) -> bool {
        // Only a refund can be fenced: a charge, or a request that cost
        // what it reserved, does not look.
        if settlement.actual() >= settlement.reserved() {
            return false;
        }
        let Some(&fence) = self.maps.fences.get(&base) else {
            return false;
        };
        if fence.until <= now.as_micros() {
            self.maps.fences.remove(&base);
            return false;
        }
        settlement.fenced_by(Timestamp::from_micros(fence.at))
    }

    /// The state the key of `base` holds under another configuration of
    /// `policy`'s name, carried over to `policy`, taken out of the shard;
    /// for a settlement that `changes` the key, a copy if the other
    /// configuration does not carry over whole (see
    /// [`PolicyState::carries_whole`]) and the state still holds use (see
    /// [`PolicyState::holds_use`]), the shard keeping it as it was. Also
    /// says whether it is such a copy.
    fn other(
        &mut self,
        shared: &Shared,
        base: KeyHash,
        policy: &Policy,
        now: Timestamp,
        changes: bool,
    ) -> Option<(PolicyState, bool)> {
        for other in shared.other_configs(policy) {
            let partial = changes && !PolicyState::carries_whole(&other, policy);
            let hash = base ^ other.config_mix();
            let take = Take {
                shard: self,
                hash,
                now,
                keep: partial,
            };
            if let Some(mut state) = dispatch(&other, take) {
                // A state that holds no use any more drops nothing: it
                // carries over as any other.
                let keep = partial && state.holds_use(&other, now);
                if partial && !keep {
                    let take = Take {
                        shard: self,
                        hash,
                        now,
                        keep: false,
                    };
                    dispatch(&other, take);
                }
                if !keep {
                    shared.keys_gauge.sub(1);
                }
                state.carry_and_advance(policy, now);
                return Some((state, keep));
            }
        }
        None
    }

    /// Makes room for a new key expiring at `expires_at` and inserts it, or
    /// reports the shard full.
    fn admit<F: Form>(
        &mut self,
        shared: &Shared,
        now: Timestamp,
        hash: KeyHash,
        held: F::Held,
        expires_at: u64,
    ) -> Result<(), StoreError> {
        let now = now.as_micros();
        self.sweep_if_due(shared, now);
        if self.len() >= shared.shard_capacity {
            self.refused = self.refused.saturating_add(1);
            return Err(StoreError::Full {
                max_keys: shared.max_keys,
            });
        }
        F::map(&mut self.maps).insert(hash, held);
        self.expires(now, expires_at);
        shared.keys_gauge.add(1);
        Ok(())
    }

    /// Counts a key that expires at `expires_at`, at `now` (µs): made, or
    /// brought forward.
    pub(super) fn expires(&mut self, now: u64, expires_at: u64) {
        self.next_expiry = self.next_expiry.min(expires_at);
        self.expiries.add(now, expires_at);
    }

    /// Everything the shard holds: its keys, and the blocks and fences of
    /// keys reset or blocked lately.
    fn held(&self) -> usize {
        self.maps.len() + self.maps.blocks.len() + self.maps.fences.len()
    }

    /// Sweeps when the shard has doubled since its last sweep (keys,
    /// blocks and fences together) and something it holds has expired by
    /// `now` (µs), or when its keys fill it and one of them has expired:
    /// in a shard of [`MIN_SWEEP`] keys or more, a [`FULL_SWEEP_SHARE`]
    /// of them. (Otherwise a full shard whose keys expire one by one, as a
    /// flood of new keys keeps it, would scan itself whole for every new
    /// key.)
    /// Blocks and fences count towards the doubling, so that those of keys
    /// never seen again are forgotten even in a shard whose keys stay few.
    /// They do not count against `max_keys`, and the end of one makes a
    /// full shard sweep (which frees no room for a key) only as any shard
    /// sweeps, once per doubling.
    fn sweep_if_due(&mut self, shared: &Shared, now: u64) {
        let grown = self.held() >= self.sweep_at && now >= self.next_expiry.min(self.next_end);
        let full = self.len() >= shared.shard_capacity
            && now >= self.next_expiry
            && self.enough_expired(now);
        if grown || full {
            let swept = self.sweep(now);
            shared.keys_gauge.sub(swept);
            self.sweep_at = (self.held() * 2).max(MIN_SWEEP);
        }
    }

    /// Forgets every key, block and fence that has expired by `now` (µs);
    /// returns how many keys it forgot.
    fn sweep(&mut self, now: u64) -> usize {
        let before = self.len();
        (self.next_expiry, self.next_end, self.expiries) = self.maps.retain_live(now);
        self.refused = 0;
        before - self.len()
    }

    /// Whether a [`FULL_SWEEP_SHARE`] of the shard's keys have expired by
    /// `now` (µs), as far as its count of their expiries tells, or as many
    /// new keys were refused since the last sweep (any one key, in a shard
    /// of fewer than [`MIN_SWEEP`]): either way, a scan is paid for.
    fn enough_expired(&mut self, now: u64) -> bool {
        let share = self.len() / FULL_SWEEP_SHARE;
        self.len() < MIN_SWEEP || self.refused >= share || self.expiries.expired_by(now, share)
    }
}
