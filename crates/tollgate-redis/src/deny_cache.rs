//! A bounded local cache of denials.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tollgate_core::{Algorithm, Decision, LimitStatus, Outcome, Policy, Timestamp};

use crate::error::RedisStoreError;

/// How long a cached denial answers for Redis after its call was sent, in
/// µs, the unit of the cache's times: a second (see [`DenyCache`]).
const ANSWERS_FOR_US: u64 = 1_000_000;

/// Remembers, per key, that Redis denied a request until a time.
///
/// A denial of a cost-1 request to a single-limit policy denies such
/// requests locally until then ([`DenyCache::lookup`]). Exact for what
/// this app server does: a denial only gets later when others consume,
/// never earlier, and the expiry counts from when the denied call was
/// *sent* (before Redis decided), so the cache never denies a request
/// Redis would admit, but for what another app server did to the key in
/// the last second (below). The rest of the decision
/// is exact too: while a cost-1 request is denied, `remaining` stays 0 and
/// the reset time stays put under every algorithm. That does not hold for
/// other costs (a bucket refills towards them) or for a policy's other
/// limits, so those always go to Redis while it answers. When it does not,
/// their denials still stand ([`DenyCache::lookup_on_failure`]): a key that
/// Redis cut off stays cut off through an outage, rather than getting a
/// fresh quota from the failure policy, until Redis admits the key a
/// request of that cost ([`DenyCache::admitted`]).
///
/// A denial answers for Redis for at most [`ANSWERS_FOR_US`] after its call
/// was sent; then the key's next request asks Redis again, and its answer
/// takes the denial's place. What only another app server did to the key
/// (a reset, a block or its end, a changed configuration) reaches this
/// cache that way: within a second, not at the end of a denial that may
/// last hours (a block's).
pub(crate) struct DenyCache {
    max_entries: usize,
    entries: Mutex<HashMap<String, Entry>>,
    /// While the cache is full, no denial in it ends before this (local
    /// µs): a new key's denial is turned away without a scan until then.
    /// Read and written under `entries`' lock.
    full_until: AtomicU64,
    /// Denials of an earlier epoch may no longer match Redis's state (the
    /// connection failed, or Redis restarted since): they no longer answer
    /// for Redis, but still stand while it cannot answer.
    epoch: AtomicU64,
    /// How many denials were removed (their keys reset or blocked, or
    /// admitted since), counted in the stripe of each key's name (see
    /// [`stripe`]): a denial decided while one of its stripe was removed
    /// may be of the state before, and is not taken in. Striped, so that
    /// the removals of other keys (a settlement removes one) rarely turn
    /// away a hammered key's denial.
    removals: [AtomicU64; STRIPES],
}

/// What becomes of a key's cached denial when a call that changes the
/// key's state in Redis (a refund, a reset, a block) may have run there
/// without its caller learning so: `then` (a [`DenyCache::demote`] or a
/// [`DenyCache::remove`]) when the call fails after Redis may have run it
/// ([`RedisStoreError::may_have_acted`]), or when it is dropped on its way
/// (its caller went away, or a timeout of the app's own). Disarmed, it
/// does nothing.
pub(crate) struct Uncertain<'a> {
    cache: &'a DenyCache,
    state_key: &'a str,
    then: fn(&DenyCache, &str),
    armed: bool,
}

impl<'a> Uncertain<'a> {
    pub(crate) fn new(
        cache: &'a DenyCache,
        state_key: &'a str,
        then: fn(&DenyCache, &str),
        armed: bool,
    ) -> Self {
        Self {
            cache,
            state_key,
            then,
            armed,
        }
    }

    /// The call came back with `result`: `then`, if armed and Redis may
    /// have run it though it failed.
    pub(crate) fn came_back<T>(mut self, result: &Result<T, RedisStoreError>) {
        let armed = std::mem::replace(&mut self.armed, false);
        if armed && result.as_ref().is_err_and(RedisStoreError::may_have_acted) {
            (self.then)(self.cache, self.state_key);
        }
    }
}

impl Drop for Uncertain<'_> {
    fn drop(&mut self) {
        if self.armed {
            (self.then)(self.cache, self.state_key);
        }
    }
}

/// How many stripes count removals (see [`DenyCache::sent`]).
const STRIPES: usize = 64;

/// The stripe that counts removals of `state_key`: FNV-1a over its last 16
/// bytes (a state key ends in hex digits of a SHA-256, see `keys.rs`, which
/// spread keys as well as the whole name would, at a third of the cost),
/// then a xorshift and a multiply (FNV alone leaves the top bits of names
/// that differ in their last bytes alike), and the top bits of that.
fn stripe(state_key: &str) -> usize {
    let bytes = state_key.as_bytes();
    let tail = &bytes[bytes.len().saturating_sub(16)..];
    let mut hash = tail.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    // `STRIPES` is a power of two: that many from the top bits.
    (hash >> (64 - STRIPES.trailing_zeros())) as usize
}

/// What the deny cache's counts were when a decision was sent
/// ([`DenyCache::sent`]): a denial is cached as of then
/// ([`DenyCache::insert`]).
#[derive(Clone, Copy)]
pub(crate) struct Sent {
    /// The key's stripe's removals.
    removals: u64,
    /// The epoch: a denial sent in an earlier one is cached as of it, and
    /// does not answer for Redis.
    epoch: u64,
}

/// What the deny cache holds of a key, for a request.
pub(crate) enum Cached {
    /// A denial that answers for Redis.
    Denial(Decision),
    /// A denial that no longer answers for Redis, but stands while it
    /// cannot answer ([`DenyCache::lookup_on_failure`]): an admission by
    /// Redis ends it ([`DenyCache::admitted`]).
    Standing,
    /// No denial.
    Nothing,
}

struct Entry {
    fingerprint: u64,
    /// The denied cost: a denial holds for this cost and more.
    cost: u64,
    /// Whether the denial is exact for later requests of the same cost
    /// (see [`cacheable`]), or stands only when Redis cannot answer.
    exact: bool,
    epoch: u64,
    sent_at: u64,
    /// When the denial came back: the wait it tells counts from then.
    received_at: u64,
    until: u64,
    decision: Decision,
}

impl Entry {
    /// The denial as it stands at local time `now` (µs), before `until`.
    /// Its wait counts from when it came back: Redis measured it at some
    /// instant between the call's sending and then, so a wait counted from
    /// the sending would be early by the queue and the round trip, and a
    /// client would come back to a second refusal.
    fn at(&self, policy: &Policy, now: u64) -> Decision {
        let elapsed = now.saturating_sub(self.received_at);
        let wait = self.until - self.sent_at;
        let told_until = self.received_at.max(self.sent_at).saturating_add(wait);
        shift(
            policy,
            &self.decision,
            elapsed,
            told_until.saturating_sub(now),
        )
    }
}

impl DenyCache {
    pub(crate) fn new(max_entries: usize) -> Self {
        Self {
            max_entries,
            entries: Mutex::new(HashMap::new()),
            full_until: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            removals: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// A local denial of `cost` for `state_key` at local time `now` (µs),
    /// or whether the key holds a denial that does not answer for Redis.
    pub(crate) fn lookup(&self, state_key: &str, policy: &Policy, cost: u64, now: u64) -> Cached {
        if self.max_entries == 0 {
            return Cached::Nothing;
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(entry) = entries.get(state_key) else {
            return Cached::Nothing;
        };
        // A request under another configuration of the policy (which may
        // drop the denying limit) makes the denial stale, whatever it costs.
        if now >= entry.until || entry.fingerprint != policy.fingerprint() {
            entries.remove(state_key);
            return Cached::Nothing;
        }
        if !entry.exact
            || !cacheable(policy, cost)
            || entry.epoch != self.epoch()
            || now.saturating_sub(entry.sent_at) >= ANSWERS_FOR_US
        {
            return Cached::Standing;
        }
        Cached::Denial(entry.at(policy, now))
    }

    /// A denial of `cost` for `state_key` at local time `now` (µs) that
    /// Redis made and that is still in force, for when Redis cannot decide:
    /// any denial of this cost or less, of this configuration of the
    /// policy. Its limits' other numbers are as Redis last reported them.
    /// A larger cost than the one denied waits until every limit has room
    /// for it ([`fits_after`]; never less than the smaller cost's wait,
    /// which would bring its client back too early), or is denied for good
    /// past a limit's capacity.
    pub(crate) fn lookup_on_failure(
        &self,
        state_key: &str,
        policy: &Policy,
        cost: u64,
        now: u64,
    ) -> Option<Decision> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = entries.get(state_key)?;
        let stands =
            now < entry.until && entry.fingerprint == policy.fingerprint() && cost >= entry.cost;
        let denied = stands.then(|| entry.at(policy, now))?;
        if cost == entry.cost || denied.is_blocked() {
            return Some(denied);
        }
        let limits = denied.limits().iter().copied();
        let outcome = match denied.limits().iter().find(|s| cost > s.capacity()) {
            Some(s) => Outcome::CostExceedsCapacity {
                cost,
                capacity: s.capacity(),
            },
            None => Outcome::Limited {
                retry_after: (denied.limits().iter())
                    .filter_map(|s| fits_after(policy.algorithm(), s, cost))
                    .chain(denied.retry_after())
                    .max()
                    .unwrap_or_default(),
            },
        };
        Some(Decision::new(
            policy,
            outcome,
            denied.now(),
            Duration::ZERO,
            limits,
        ))
    }

    /// Remembers `decision`, a denial of `cost` for a call sent at local
    /// time `sent_at` (µs) and answered at `received_at`. The denial stops
    /// answering at `sent_at` plus its wait, so that it never denies what
    /// Redis would admit; the wait it tells counts from `received_at`, so
    /// that a client told it never comes back before Redis would admit it.
    ///
    /// `sent` is what [`DenyCache::sent`] said of the key when the decision
    /// was sent: if the key was reset or blocked since, the decision may
    /// predate it, and caching it would deny the reset key here until the
    /// old denial ended; if the epoch moved since (Redis restarted, or the
    /// connection failed), it is cached as of its own, and stands only
    /// while Redis cannot answer.
    pub(crate) fn insert(
        &self,
        state_key: &str,
        policy: &Policy,
        cost: u64,
        (sent_at, received_at, sent): (u64, u64, Sent),
        decision: &Decision,
    ) {
        let Some(retry) = decision.retry_after() else {
            return;
        };
        let removed = &self.removals[stripe(state_key)];
        if removed.load(Ordering::Acquire) != sent.removals {
            return;
        }
        if self.max_entries == 0 || cost == 0 {
            return;
        }
        let retry = u64::try_from(retry.as_micros()).unwrap_or(u64::MAX);
        let until = sent_at.saturating_add(retry.min(u64::MAX / 2));
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        // Again under the lock: a removal counts before it takes the lock,
        // so one between the look above and this lock is seen here, and
        // one after it removes what is inserted below.
        if removed.load(Ordering::Acquire) != sent.removals {
            return;
        }
        // A key's denial of a smaller cost, still in force, stays: it
        // stands for every cost from its own up while Redis cannot answer,
        // where this one would stand for fewer (and a client choosing its
        // cost could end its own denial just before an outage).
        let fingerprint = policy.fingerprint();
        if entries.get(state_key).is_some_and(|e| {
            // Only while this decision still leaves it no room: one
            // that shows room for it (a reset or refund elsewhere)
            // ends it.
            e.cost < cost
                && sent_at < e.until
                && e.fingerprint == fingerprint
                && (decision.is_blocked()
                    || decision.limits().iter().any(|s| s.remaining() < e.cost))
        }) {
            return;
        }
        if entries.len() >= self.max_entries && !entries.contains_key(state_key) {
            // Full of denials still in force: a scan before the first of
            // them ends would free nothing, so hostile keys denied one
            // after another do not each scan the whole cache.
            if sent_at < self.full_until.load(Ordering::Relaxed) {
                return;
            }
            entries.retain(|_, e| e.until > sent_at);
            if entries.len() >= self.max_entries {
                let first_end = entries.values().map(|e| e.until).min();
                let first_end = first_end.unwrap_or(sent_at);
                self.full_until.store(first_end, Ordering::Relaxed);
                return;
            }
        }
        // No denial held may end before the time the shortcut waits for:
        // one that fills the room a reset made, or replaces a key's
        // denial, can end earlier than those the last scan saw.
        self.full_until.fetch_min(until, Ordering::Relaxed);
        entries.insert(
            state_key.to_owned(),
            Entry {
                fingerprint,
                cost,
                exact: cacheable(policy, cost),
                epoch: sent.epoch,
                sent_at,
                received_at,
                until,
                decision: decision.clone(),
            },
        );
    }

    /// Redis admitted a request of `cost` for `state_key`, sent at local
    /// time `sent_at` (µs), whose lookup found a denial [standing](Cached::Standing):
    /// the key's denial of that cost or less, sent before, no longer
    /// stands, not even while Redis cannot answer (a key reset, unblocked
    /// or refunded since, by this app server or another, would be denied
    /// through an outage until the old denial's end). A denial decided
    /// while it is removed may be the old one, and is not taken in (see
    /// [`DenyCache::insert`]).
    pub(crate) fn admitted(&self, state_key: &str, cost: u64, sent_at: u64) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries
            .get(state_key)
            .is_some_and(|e| e.cost <= cost && e.sent_at <= sent_at)
        {
            // Under the lock, which `insert` checks the count under.
            self.removed(state_key);
            entries.remove(state_key);
        }
    }

    /// Stops every denial held now from answering for Redis: Redis's state
    /// may have changed under it. They still stand while Redis cannot
    /// answer ([`DenyCache::lookup_on_failure`]).
    pub(crate) fn forget(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// Stops the denial of `state_key` from answering for Redis, which may
    /// have room for the key now (a refund whose call may have run there);
    /// it still stands while Redis cannot answer. A denial decided before
    /// is not cached over it (see [`DenyCache::insert`]).
    pub(crate) fn demote(&self, state_key: &str) {
        self.removed(state_key);
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = entries.get_mut(state_key) {
            entry.exact = false;
        }
    }

    /// Drops the denial of `state_key`, whose state was reset: it no
    /// longer stands, not even while Redis cannot answer.
    pub(crate) fn remove(&self, state_key: &str) {
        self.removed(state_key);
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(state_key);
    }

    /// The counts a denial of `state_key` is cached as of: read when a
    /// decision is sent, and passed to [`DenyCache::insert`] with it.
    pub(crate) fn sent(&self, state_key: &str) -> Sent {
        Sent {
            removals: self.removals[stripe(state_key)].load(Ordering::Acquire),
            epoch: self.epoch(),
        }
    }

    /// Counts a removal of `state_key`'s denial, before it is made.
    fn removed(&self, state_key: &str) {
        self.removals[stripe(state_key)].fetch_add(1, Ordering::AcqRel);
    }

    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub(crate) fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

fn cacheable(policy: &Policy, cost: u64) -> bool {
    cost == 1 && policy.limits().len() == 1
}

/// When the limit whose state is `status` has room for `cost` (at most its
/// capacity), if it has none now and nothing else uses it meanwhile: a
/// rate-based limit when its backlog has drained to the capacity less the
/// cost, exactly; a window when it is fully back (the sliding window and
/// log tell nothing sooner: late, never early).
fn fits_after(algorithm: Algorithm, status: &LimitStatus, cost: u64) -> Option<Duration> {
    if status.remaining() >= cost {
        return None;
    }
    match algorithm {
        Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            let room = status.capacity().saturating_sub(cost);
            let room = room.saturating_mul(status.limit().interval_micros());
            Some(status.reset().saturating_sub(Duration::from_micros(room)))
        }
        Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog => {
            Some(status.reset())
        }
    }
}

/// `decision` as it stands `elapsed` µs later, with `retry` µs to go.
fn shift(policy: &Policy, decision: &Decision, elapsed: u64, retry: u64) -> Decision {
    let now = Timestamp::from_micros(decision.now().as_micros() + elapsed);
    if decision.is_blocked() {
        // A block's denial stays one (a shadow mode enforces it).
        let until = Timestamp::from_micros(now.as_micros().saturating_add(retry));
        return tollgate_core::state::blocked(policy, now, until);
    }
    let elapsed_d = Duration::from_micros(elapsed);
    let statuses = decision.limits().iter().map(|s| {
        LimitStatus::new(
            s.index(),
            s.limit(),
            s.capacity(),
            s.remaining(),
            s.reset().saturating_sub(elapsed_d),
            s.retry_after().map(|r| r.saturating_sub(elapsed_d)),
        )
    });
    Decision::new(
        policy,
        Outcome::Limited {
            retry_after: Duration::from_micros(retry),
        },
        now,
        Duration::ZERO,
        statuses,
    )
}

#[cfg(test)]
mod tests;
