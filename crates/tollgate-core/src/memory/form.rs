//! The forms a key's state takes in a shard, one per [`Shape`], and the one
//! place the memory store dispatches on a policy's shape.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::algorithm::fixed_window::window_word_end;
use crate::decision::Decision;
use crate::policy::{Policy, Shape};
use crate::settle::Settlement;
use crate::state::{PolicyState, decide_tat, decide_window_word};
use crate::time::Timestamp;

pub(super) type KeyHash = u64;
pub(super) type HashedMap<V> = HashMap<KeyHash, V, BuildHasherDefault<PassThrough>>;

/// A shard's keys, one map per form.
#[derive(Default)]
pub(super) struct Maps {
    /// [`Shape::Tat`]: the one time that is the whole state, which is also
    /// when it expires.
    tat: HashedMap<u64>,
    /// [`Shape::WindowWord`]: the word and when it expires.
    windows: HashedMap<Window>,
    /// [`Shape::Full`]: every other key.
    full: HashedMap<Entry>,
    /// Keys an operator blocked, by their hash before the configuration
    /// is mixed in (a block holds under every configuration of the
    /// policy's name), with when the block ends. Usually empty.
    pub(super) blocks: HashedMap<u64>,
    /// Keys reset or blocked lately, by the same hash as `blocks`: when,
    /// and when the fence ends (see [`Settlement::fence`]). Usually empty.
    ///
    /// [`Settlement::fence`]: crate::Settlement::fence
    pub(super) fences: HashedMap<Fence>,
}

/// The fence of a reset or a block: refunds of requests reserved at or
/// before `at` change nothing until `until` (both µs).
#[derive(Clone, Copy)]
pub(super) struct Fence {
    pub(super) at: u64,
    pub(super) until: u64,
}

#[derive(Clone)]
pub(super) struct Window {
    word: u64,
    expires_at: u64,
}

#[derive(Clone)]
pub(super) struct Entry {
    state: PolicyState,
    expires_at: u64,
}

impl Maps {
    pub(super) fn len(&self) -> usize {
        self.tat.len() + self.windows.len() + self.full.len()
    }

    /// Forgets every key, block and fence expired by `now`; returns the
    /// earliest expiry of the keys kept, the earliest end of the blocks
    /// and fences kept, and when the keys kept expire.
    pub(super) fn retain_live(&mut self, now: u64) -> (u64, u64, Expiries) {
        let (mut next, mut end) = (u64::MAX, u64::MAX);
        let mut expiries = Expiries::default();
        let mut key = |at: u64| {
            let keep = live(at, now, &mut next);
            if keep {
                expiries.add(now, at);
            }
            keep
        };
        self.tat.retain(|_, &mut at| key(at));
        self.windows.retain(|_, window| key(window.expires_at));
        self.full.retain(|_, entry| key(entry.expires_at));
        self.blocks
            .retain(|_, &mut until| live(until, now, &mut end));
        self.fences
            .retain(|_, fence| live(fence.until, now, &mut end));
        (next, end, expiries)
    }
}

/// When a shard's keys expire, as far as sweeping a full shard needs to
/// know without scanning it: each key counted at its expiry rounded up to
/// a power of two of an eighth of its lifetime (so counted as expired at
/// most a quarter of its lifetime late), in buckets by that time. A key
/// decided again after it was counted is counted again, and once counted
/// expired stays so until the next sweep counts afresh: a count too high,
/// which makes a sweep come sooner, never later.
#[derive(Default)]
pub(super) struct Expiries {
    /// The keys whose bucket's time has passed.
    expired: usize,
    /// The other keys, by their bucket's time (µs).
    buckets: std::collections::BTreeMap<u64, u32>,
}

impl Expiries {
    /// Counts a key that expires at `expires_at`, at `now` (µs).
    pub(super) fn add(&mut self, now: u64, expires_at: u64) {
        self.fold(now);
        if expires_at <= now {
            self.expired = self.expired.saturating_add(1);
            return;
        }
        let step = ((expires_at - now) / 8).max(1).next_power_of_two();
        let due = expires_at.div_ceil(step).saturating_mul(step);
        let count = self.buckets.entry(due).or_default();
        *count = count.saturating_add(1);
    }

    /// Whether at least `n` keys have expired by `now` (µs), as counted.
    pub(super) fn expired_by(&mut self, now: u64, n: usize) -> bool {
        self.fold(now);
        self.expired >= n
    }

    /// Moves the buckets whose time has passed into `expired`: the
    /// buckets held are those still to come, so they stay few (a few per
    /// power of two of the keys' lifetimes).
    fn fold(&mut self, now: u64) {
        while let Some(bucket) = self.buckets.first_entry() {
            if *bucket.key() > now {
                break;
            }
            self.expired = self.expired.saturating_add(bucket.remove() as usize);
        }
    }
}

/// Whether what expires at `at` is still live at `now` (µs); if it is,
/// lowers `earliest` to `at`.
fn live(at: u64, now: u64, earliest: &mut u64) -> bool {
    let keep = at > now;
    if keep {
        *earliest = (*earliest).min(at);
    }
    keep
}

/// How the shard keeps, decides and converts the state of one shape.
pub(super) trait Form {
    /// What the shard holds per key.
    type Held: Clone;

    fn map(maps: &mut Maps) -> &mut HashedMap<Self::Held>;

    /// Decides on a held state.
    fn decide(held: &mut Self::Held, policy: &Policy, now: Timestamp, cost: u64) -> Decision;

    /// Decides on `state`, carried over from another configuration, or on
    /// a fresh state; returns the decision and what to hold, with when it
    /// expires.
    fn decide_new(
        state: Option<PolicyState>,
        policy: &Policy,
        now: Timestamp,
        cost: u64,
    ) -> (Decision, Self::Held, u64);

    /// Settles a request's cost on a held state.
    fn settle(
        held: &mut Self::Held,
        policy: &Policy,
        now: Timestamp,
        settlement: &Settlement,
    ) -> Decision;

    /// `state` (of `policy`) as held, with when it expires.
    fn hold(state: PolicyState, policy: &Policy) -> (Self::Held, u64);

    /// When a held state expires.
    fn expires_at(held: &Self::Held) -> u64;

    /// The held state of a key under `policy`, to carry it to another
    /// configuration.
    fn state(held: Self::Held, policy: &Policy, now: Timestamp) -> Option<PolicyState>;
}

pub(super) struct Tat;
pub(super) struct WindowWord;
pub(super) struct Full;

impl Form for Tat {
    type Held = u64;

    fn map(maps: &mut Maps) -> &mut HashedMap<u64> {
        &mut maps.tat
    }

    #[inline(always)]
    fn decide(word: &mut u64, policy: &Policy, now: Timestamp, cost: u64) -> Decision {
        decide_tat(policy, word, now, cost)
    }

    fn decide_new(
        state: Option<PolicyState>,
        policy: &Policy,
        now: Timestamp,
        cost: u64,
    ) -> (Decision, u64, u64) {
        let mut word = state.and_then(|state| state.tat()).unwrap_or(0);
        let decision = decide_tat(policy, &mut word, now, cost);
        (decision, word, word)
    }

    fn settle(
        word: &mut u64,
        policy: &Policy,
        now: Timestamp,
        settlement: &Settlement,
    ) -> Decision {
        let mut state = PolicyState::from_tat(policy, *word, now)
            .unwrap_or_else(|| PolicyState::new(policy, now));
        let decision = state.settle(policy, now, settlement);
        *word = state.tat().unwrap_or(*word);
        decision
    }

    fn expires_at(word: &u64) -> u64 {
        *word
    }

    fn hold(state: PolicyState, policy: &Policy) -> (u64, u64) {
        let word = state
            .tat()
            .unwrap_or_else(|| state.expires_at(policy).as_micros());
        (word, word)
    }

    fn state(word: u64, policy: &Policy, now: Timestamp) -> Option<PolicyState> {
        PolicyState::from_tat(policy, word, now)
    }
}

fn window_period(policy: &Policy) -> u64 {
    policy.params().first().map_or(1, |p| p.period_us.max(1))
}

impl Form for WindowWord {
    type Held = Window;

    fn map(maps: &mut Maps) -> &mut HashedMap<Window> {
        &mut maps.windows
    }

    #[inline(always)]
    fn decide(window: &mut Window, policy: &Policy, now: Timestamp, cost: u64) -> Decision {
        let decision = decide_window_word(policy, &mut window.word, now, cost);
        let end = window_word_end(window.word, window_period(policy));
        window.expires_at = window.expires_at.max(end);
        decision
    }

    fn decide_new(
        state: Option<PolicyState>,
        policy: &Policy,
        now: Timestamp,
        cost: u64,
    ) -> (Decision, Window, u64) {
        let mut word = state.and_then(|state| state.window_word()).unwrap_or(0);
        let decision = decide_window_word(policy, &mut word, now, cost);
        let expires_at = window_word_end(word, window_period(policy));
        (decision, Window { word, expires_at }, expires_at)
    }

    fn settle(
        window: &mut Window,
        policy: &Policy,
        now: Timestamp,
        settlement: &Settlement,
    ) -> Decision {
        let mut state = PolicyState::from_window_word(policy, window.word)
            .unwrap_or_else(|| PolicyState::new(policy, now));
        let decision = state.settle(policy, now, settlement);
        window.word = state.window_word().unwrap_or(window.word);
        let end = window_word_end(window.word, window_period(policy));
        window.expires_at = window.expires_at.max(end);
        decision
    }

    fn expires_at(window: &Window) -> u64 {
        window.expires_at
    }

    fn hold(state: PolicyState, policy: &Policy) -> (Window, u64) {
        let expires_at = state.expires_at(policy).as_micros();
        let word = state.window_word().unwrap_or(0);
        (Window { word, expires_at }, expires_at)
    }

    fn state(window: Window, policy: &Policy, _now: Timestamp) -> Option<PolicyState> {
        PolicyState::from_window_word(policy, window.word)
    }
}

impl Form for Full {
    type Held = Entry;

    fn map(maps: &mut Maps) -> &mut HashedMap<Entry> {
        &mut maps.full
    }

    #[inline(always)]
    fn decide(entry: &mut Entry, policy: &Policy, now: Timestamp, cost: u64) -> Decision {
        let decision = entry.state.decide(policy, now, cost);
        entry.expires_at = entry
            .expires_at
            .max(entry.state.expires_at(policy).as_micros());
        decision
    }

    fn decide_new(
        state: Option<PolicyState>,
        policy: &Policy,
        now: Timestamp,
        cost: u64,
    ) -> (Decision, Entry, u64) {
        let mut state = state.unwrap_or_else(|| PolicyState::new(policy, now));
        let decision = state.decide(policy, now, cost);
        let (entry, expires_at) = Self::hold(state, policy);
        (decision, entry, expires_at)
    }

    fn settle(
        entry: &mut Entry,
        policy: &Policy,
        now: Timestamp,
        settlement: &Settlement,
    ) -> Decision {
        let decision = entry.state.settle(policy, now, settlement);
        entry.expires_at = entry
            .expires_at
            .max(entry.state.expires_at(policy).as_micros());
        decision
    }

    fn expires_at(entry: &Entry) -> u64 {
        entry.expires_at
    }

    fn hold(state: PolicyState, policy: &Policy) -> (Entry, u64) {
        let expires_at = state.expires_at(policy).as_micros();
        (Entry { state, expires_at }, expires_at)
    }

    fn state(entry: Entry, _policy: &Policy, _now: Timestamp) -> Option<PolicyState> {
        Some(entry.state)
    }
}

/// Work to do on a key in the form of its policy's shape.
pub(super) trait Visit {
    type Out;
    fn visit<F: Form>(self, policy: &Policy) -> Self::Out;
}

/// Runs `visit` in the form of `policy`'s shape: the memory store's one
/// dispatch on shapes.
#[inline(always)]
pub(super) fn dispatch<V: Visit>(policy: &Policy, visit: V) -> V::Out {
    match policy.shape() {
        Shape::Tat => visit.visit::<Tat>(policy),
        Shape::WindowWord => visit.visit::<WindowWord>(policy),
        Shape::Full => visit.visit::<Full>(policy),
    }
}

/// The map's keys are already uniformly random hashes.
#[derive(Default)]
pub(super) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}
