//! The scripts, assembled from `src/lua`: one general script per
//! algorithm, smaller ones for one-time and window-word policies, the
//! block and the in-flight slots; each hashed once.

use tollgate_core::{Algorithm, Policy};

use crate::algorithm::unit;

/// `carried_word`, the carry-over library of the word scripts, as one
/// function (see `lua/lib/word_carry_begin.lua`).
macro_rules! word_carry {
    () => {
        concat!(
            include_str!("lua/lib/word_carry_begin.lua"),
            include_str!("lua/lib/arith.lua"),
            include_str!("lua/lib/carry.lua"),
            include_str!("lua/lib/word_carry_end.lua"),
            include_str!("lua/lib/block.lua"),
            include_str!("lua/lib/fence.lua"),
        )
    };
}

/// The script of a single GCRA, token-bucket or leaky-bucket limit, in its
/// two orders: writing first and reading first. They differ only in their
/// first line, and have two SHA-1s, so that the store picks one without
/// sending another argument (each argument costs Redis a rehash of the
/// script's `ARGV` table as it grows; `BENCHMARKS.md` has the cost).
pub(crate) const TAT_WRITE_FIRST: &str = concat!(
    "local write_first = true\n",
    word_carry!(),
    include_str!("lua/shape/tat.lua")
);
const TAT_READ_FIRST: &str = concat!(
    "local write_first = false\n",
    word_carry!(),
    include_str!("lua/shape/tat.lua")
);

/// The script of a single fixed-window limit whose state is a window word
/// (see [`Shape::WindowWord`](tollgate_core::Shape::WindowWord)).
pub(crate) const WINDOW_WORD: &str =
    concat!(word_carry!(), include_str!("lua/shape/window_word.lua"));

/// The script that resets or blocks a key (see `lua/block.lua`).
const BLOCK: &str = concat!(
    include_str!("lua/lib/fence.lua"),
    include_str!("lua/block.lua")
);

/// A decision script: its source and SHA-1.
#[derive(Debug)]
pub(crate) struct DecisionScript {
    pub(crate) source: &'static str,
    pub(crate) sha: String,
}

impl DecisionScript {
    pub(crate) fn new(source: &'static str) -> Self {
        let sha = redis::Script::new(source).get_hash().to_owned();
        Self { source, sha }
    }
}

/// Each algorithm's general script, hashed once.
#[derive(Debug)]
struct General {
    fixed_window: DecisionScript,
    sliding_log: DecisionScript,
    sliding_window: DecisionScript,
    token_bucket: DecisionScript,
    leaky_bucket: DecisionScript,
    gcra: DecisionScript,
}

impl General {
    fn new() -> Self {
        let script = |algorithm| DecisionScript::new(unit(algorithm).script);
        Self {
            fixed_window: script(Algorithm::FixedWindow),
            sliding_log: script(Algorithm::SlidingLog),
            sliding_window: script(Algorithm::SlidingWindow),
            token_bucket: script(Algorithm::TokenBucket),
            leaky_bucket: script(Algorithm::LeakyBucket),
            gcra: script(Algorithm::Gcra),
        }
    }

    fn of(&self, algorithm: Algorithm) -> &DecisionScript {
        match algorithm {
            Algorithm::FixedWindow => &self.fixed_window,
            Algorithm::SlidingLog => &self.sliding_log,
            Algorithm::SlidingWindow => &self.sliding_window,
            Algorithm::TokenBucket => &self.token_bucket,
            Algorithm::LeakyBucket => &self.leaky_bucket,
            Algorithm::Gcra => &self.gcra,
        }
    }

    /// Every algorithm's script, complete by construction: a new
    /// algorithm's script is loaded with the others as soon as `of` finds
    /// it.
    fn all(&self) -> [&DecisionScript; Algorithm::ALL.len()] {
        Algorithm::ALL.map(|algorithm| self.of(algorithm))
    }
}

/// The scripts, hashed once.
#[derive(Debug)]
pub(crate) struct Scripts {
    general: General,
    /// Writing first, then reading first.
    tat: [DecisionScript; 2],
    pub(crate) window_word: DecisionScript,
    pub(crate) block: DecisionScript,
    /// The in-flight limit's scripts: taking a slot, renewing its lease,
    /// giving it back.
    pub(crate) acquire: DecisionScript,
    pub(crate) renew: DecisionScript,
    pub(crate) release: DecisionScript,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            general: General::new(),
            tat: [
                DecisionScript::new(TAT_WRITE_FIRST),
                DecisionScript::new(TAT_READ_FIRST),
            ],
            window_word: DecisionScript::new(WINDOW_WORD),
            block: DecisionScript::new(BLOCK),
            acquire: DecisionScript::new(include_str!("lua/inflight/acquire.lua")),
            renew: DecisionScript::new(include_str!("lua/inflight/renew.lua")),
            release: DecisionScript::new(include_str!("lua/inflight/release.lua")),
        }
    }

    /// The general script of `policy`'s algorithm.
    pub(crate) fn get(&self, policy: &Policy) -> &DecisionScript {
        self.general.of(policy.algorithm())
    }

    /// The script of one-time policies, which takes one or more keys,
    /// writing first or reading first.
    pub(crate) fn tat(&self, write_first: bool) -> &DecisionScript {
        &self.tat[usize::from(!write_first)]
    }

    pub(crate) fn all(&self) -> impl Iterator<Item = &DecisionScript> {
        self.general.all().into_iter().chain(&self.tat).chain([
            &self.window_word,
            &self.block,
            &self.acquire,
            &self.renew,
            &self.release,
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_algorithm_finds_its_own_general_script() {
        let scripts = Scripts::new();
        for algorithm in Algorithm::ALL {
            let policy = Policy::new("p", algorithm, "10/s").unwrap();
            assert_eq!(
                scripts.get(&policy).source,
                unit(algorithm).script,
                "{algorithm}"
            );
        }
    }
}
