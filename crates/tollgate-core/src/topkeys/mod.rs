//! Top keys: for each policy, the keys most often limited and the most
//! active, in bounded memory.
//!
//! A [`WatchedStore`] wraps any store and counts in [`TopKeys`] each
//! decision of a request (a cost of 0, a peek, is not counted) under two
//! [`Ranking`]s: every decision in [`Active`](Ranking::Active), a denial
//! in [`Limited`](Ranking::Limited) too. Each policy and ranking keeps a
//! **space-saving** sketch (Metwally, Agrawal and El Abbadi, "Efficient
//! computation of frequent and top-k elements in data streams", 2005) in
//! each of its shards: `m` counters ([`TopKeysBuilder::counters`]) a
//! shard, and a key always counted in the same shard. Its error is
//! deterministic:
//!
//! - each reported count is at most its [`error`](TopKey::error) above the
//!   true count, and never below it;
//! - every error, and the count of any key not reported, is at most the
//!   summary's [`floor`](Summary::floor), which is at most `N / m` after
//!   `N` counted decisions of that policy and ranking: every key counted
//!   more than `N / m` times is reported.
//!
//! Instances merge their summaries ([`Summary::merge`]; the Redis store's
//! `RedisTopKeys` publishes and merges them): the merged bounds are the
//! sums of the instances' bounds, at most `N / m` for the `N` decisions
//! of all instances together.
//!
//! Keys are shown by their [`KeyLabel`]: by default a hash
//! ([`HashedLabel`]), never the key's bytes unless the application says so
//! ([`RawLabel`], or a closure of its own). A key's bytes are not kept.
//!
//! Counting is a local update under one shard's lock. The counts run from
//! the start (or the last [`clear`](TopKeys::clear)): they rank keys over
//! the instance's life, not over a recent window.
//!
//! ```
//! use tollgate_core::topkeys::{Ranking, TopKeys, WatchedStore};
//! use tollgate_core::{Algorithm, Key, MemoryStore, Policy, Store};
//!
//! # futures_lite_block_on(async {
//! let top = TopKeys::builder().label(|key: &Key| String::from_utf8_lossy(key.as_bytes()).into_owned()).build()?;
//! let store = WatchedStore::new(MemoryStore::new(), top.clone());
//! let policy = Policy::new("api", Algorithm::FixedWindow, "2/min")?;
//! for user in ["ada", "ada", "ada", "bob", "ada"] {
//!     store.check(&Key::user(user), &policy, 1).await?;
//! }
//! let limited = top.summary("api", Ranking::Limited);
//! assert_eq!(limited.keys()[0].label(), "ada");
//! assert_eq!(limited.keys()[0].count(), 2);
//! let active = top.summary("api", Ranking::Active);
//! assert_eq!(active.total(), 5);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! # fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     let mut f = std::pin::pin!(f);
//! #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
//! #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
//! # }
//! ```

mod label;
mod sketch;
mod summary;
mod watched;

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::error::ConfigError;
use crate::key::Key;

pub use label::{HashedLabel, KeyLabel, RawLabel};
pub use summary::{Summary, TopKey};
pub use watched::WatchedStore;

use sketch::SpaceSaving;

/// What a policy's keys are ranked by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Ranking {
    /// Decisions denied: the keys most often limited.
    Limited,
    /// Every decision of a request: the most active keys.
    Active,
}

impl Ranking {
    /// Every ranking.
    pub const ALL: [Ranking; 2] = [Ranking::Limited, Ranking::Active];

    /// A short stable name: `limited`, `active`.
    ///
    /// ```
    /// use tollgate_core::topkeys::Ranking;
    ///
    /// assert_eq!(Ranking::Limited.as_str(), "limited");
    /// assert_eq!(Ranking::from_name("active"), Some(Ranking::Active));
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            Ranking::Limited => "limited",
            Ranking::Active => "active",
        }
    }

    /// The ranking of that [`as_str`](Self::as_str) name, if there is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

/// The two sketches of one policy in one shard.
#[derive(Debug)]
struct Pair {
    limited: SpaceSaving,
    active: SpaceSaving,
}

impl Pair {
    fn get(&self, ranking: Ranking) -> &SpaceSaving {
        match ranking {
            Ranking::Limited => &self.limited,
            Ranking::Active => &self.active,
        }
    }
}

/// One shard: the sketches of each policy, for the keys it holds.
type Shard = HashMap<Box<str>, Pair>;

struct Shared {
    shards: Box<[Mutex<Shard>]>,
    counters: usize,
    max_policies: usize,
    /// Policies counted, across shards: bounded by `max_policies`.
    policies: Mutex<Vec<Box<str>>>,
    label: Box<dyn KeyLabel>,
    /// Each key's id, on a seed of this instance's own: with a seed known
    /// to all, a client could craft a key whose id is another client's,
    /// and be counted, and shown, as that client.
    ids: foldhash::quality::RandomState,
    dropped: AtomicU64,
}

/// Each policy's top keys in this instance (see the [module](self)).
/// Clones share the counts.
#[derive(Clone)]
pub struct TopKeys {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for TopKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopKeys")
            .field("shards", &self.shared.shards.len())
            .field("counters", &self.shared.counters)
            .field("max_policies", &self.shared.max_policies)
            .finish_non_exhaustive()
    }
}

impl Default for TopKeys {
    fn default() -> Self {
        Self::new()
    }
}

impl TopKeys {
    /// 8 shards of 128 counters per policy and ranking, keys labelled by
    /// [`HashedLabel`].
    pub fn new() -> Self {
        TopKeysBuilder::default().finish()
    }

    /// Starts configuring top keys.
    pub fn builder() -> TopKeysBuilder {
        TopKeysBuilder::default()
    }

    /// Counts one decision of `key` under the policy named `policy`:
    /// in [`Ranking::Active`], and in [`Ranking::Limited`] too if it was
    /// `limited`. [`WatchedStore`] calls it for every decision it sees.
    pub fn record(&self, key: &Key, policy: &str, limited: bool) {
        let shared = &*self.shared;
        let id = shared.ids.hash_one(key);
        // The shard count is at most 256: the index fits.
        let shard = &shared.shards[(id % shared.shards.len() as u64) as usize];
        let mut sketches = shard.lock();
        let pair = match sketches.get_mut(policy) {
            Some(pair) => pair,
            None => {
                if !self.admit_policy(policy) {
                    shared.dropped.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                sketches.entry(policy.into()).or_insert_with(|| Pair {
                    limited: SpaceSaving::new(shared.counters),
                    active: SpaceSaving::new(shared.counters),
                })
            }
        };
        let label = || shared.label.label(key).into_boxed_str();
        if limited {
            pair.limited.add(id, label);
        }
        pair.active.add(id, label);
    }

    /// Whether `policy` may have sketches: it has them in another shard,
    /// or there is room for one more policy.
    fn admit_policy(&self, policy: &str) -> bool {
        let mut policies = self.shared.policies.lock();
        if policies.iter().any(|p| &**p == policy) {
            return true;
        }
        if policies.len() >= self.shared.max_policies {
            return false;
        }
        policies.push(policy.into());
        true
    }

    /// This instance's summary of `policy` under `ranking`: every key its
    /// sketches hold, highest count first (see [`Summary`] for its
    /// bounds). Empty for a policy never counted.
    pub fn summary(&self, policy: &str, ranking: Ranking) -> Summary {
        let mut keys = Vec::new();
        let (mut total, mut floor) = (0, 0);
        for shard in &self.shared.shards {
            let sketches = shard.lock();
            if let Some(pair) = sketches.get(policy) {
                let sketch = pair.get(ranking);
                total += sketch.total();
                // A key lives in one shard: one not held was counted at
                // most its own shard's floor.
                floor = floor.max(sketch.floor());
                keys.extend(sketch.entries());
            }
        }
        Summary::new(total, floor, keys)
    }

    /// The policies counted, in the order first seen.
    pub fn policies(&self) -> Vec<String> {
        self.shared
            .policies
            .lock()
            .iter()
            .map(|p| p.to_string())
            .collect()
    }

    /// Decisions not counted because [`max_policies`](TopKeysBuilder::max_policies)
    /// policies were counted already.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Forgets every count.
    pub fn clear(&self) {
        for shard in &self.shared.shards {
            shard.lock().clear();
        }
        self.shared.policies.lock().clear();
    }
}

/// Configures [`TopKeys`]; made by [`TopKeys::builder`].
pub struct TopKeysBuilder {
    shards: usize,
    counters: usize,
    max_policies: usize,
    label: Box<dyn KeyLabel>,
}

impl std::fmt::Debug for TopKeysBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopKeysBuilder")
            .field("shards", &self.shards)
            .field("counters", &self.counters)
            .field("max_policies", &self.max_policies)
            .finish_non_exhaustive()
    }
}

impl Default for TopKeysBuilder {
    fn default() -> Self {
        Self {
            shards: 8,
            counters: 128,
            max_policies: 256,
            label: Box::new(HashedLabel::new()),
        }
    }
}

impl TopKeysBuilder {
    /// Counters per shard, policy and ranking (128 by default, from 1 to
    /// 65,536): the `m` of the error bound `N / m`. Each counter holds a
    /// label and three numbers.
    #[must_use]
    pub fn counters(mut self, counters: usize) -> Self {
        self.counters = counters;
        self
    }

    /// Shards, each under its own lock (8 by default, from 1 to 256).
    #[must_use]
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards;
        self
    }

    /// The most policies counted (256 by default, at least 1); decisions
    /// of further policies are not counted, but counted in
    /// [`TopKeys::dropped`].
    #[must_use]
    pub fn max_policies(mut self, max: usize) -> Self {
        self.max_policies = max;
        self
    }

    /// How keys are shown ([`HashedLabel`] by default).
    #[must_use]
    pub fn label(mut self, label: impl KeyLabel) -> Self {
        self.label = Box::new(label);
        self
    }

    /// The top keys.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] for counters, shards or policies
    /// out of their range.
    pub fn build(self) -> Result<TopKeys, ConfigError> {
        if !(1..=65_536).contains(&self.counters) {
            return Err(ConfigError::InvalidSetting {
                setting: "counters",
                reason: "keep from 1 to 65536 counters a shard",
            });
        }
        if !(1..=256).contains(&self.shards) {
            return Err(ConfigError::InvalidSetting {
                setting: "shards",
                reason: "use from 1 to 256 shards",
            });
        }
        if self.max_policies == 0 {
            return Err(ConfigError::InvalidSetting {
                setting: "max_policies",
                reason: "count at least 1 policy",
            });
        }
        Ok(self.finish())
    }

    fn finish(self) -> TopKeys {
        TopKeys {
            shared: Arc::new(Shared {
                shards: (0..self.shards)
                    .map(|_| Mutex::new(HashMap::new()))
                    .collect(),
                counters: self.counters,
                max_policies: self.max_policies,
                policies: Mutex::new(Vec::new()),
                label: self.label,
                ids: foldhash::quality::RandomState::default(),
                dropped: AtomicU64::new(0),
            }),
        }
    }
}

#[cfg(test)]
mod tests;
