//! How the store sends each policy's decisions, by the policy's
//! [`Shape`]: the one place this crate dispatches on shapes.

use tollgate_core::state::{PolicyState, blocked, decide_tat, decide_window_word};
use tollgate_core::{Decision, Policy, Settlement, Shape, Timestamp};

/// The flag of a word script's word that is the end of an operator's
/// block rather than a key's state (see `lua/lib/block.lua`).
pub(crate) const BLOCKED: u64 = 1 << 63;

/// The script a policy's decisions run, and how they are batched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    /// [`Shape::Tat`]: `tat.lua`, decisions of every key batched together.
    Tat,
    /// [`Shape::WindowWord`]: `window_word.lua`, batched the same way.
    WindowWord,
    /// [`Shape::Full`]: the algorithm's own script, decisions of one key
    /// batched in its lane.
    General,
}

impl Form {
    /// The form of `policy`'s decisions.
    #[inline]
    pub(crate) fn of(policy: &Policy) -> Form {
        match policy.shape() {
            Shape::Tat => Form::Tat,
            Shape::WindowWord => Form::WindowWord,
            Shape::Full => Form::General,
        }
    }

    /// The decision of `op` on `word`, a word script's reply for a key at
    /// Redis's `now` (the script did the same to the key's word); `None`
    /// for the general form, whose script replies decisions.
    pub(crate) fn decide_word(
        self,
        policy: &Policy,
        now: u64,
        mut word: u64,
        op: WordOp<'_>,
    ) -> Option<Decision> {
        let now = Timestamp::from_micros(now);
        if word & BLOCKED != 0 {
            let until = Timestamp::from_micros(word & !BLOCKED);
            return (self != Form::General).then(|| blocked(policy, now, until));
        }
        match (self, op) {
            (Form::Tat, WordOp::Check(cost)) => Some(decide_tat(policy, &mut word, now, cost)),
            (Form::WindowWord, WordOp::Check(cost)) => {
                Some(decide_window_word(policy, &mut word, now, cost))
            }
            (Form::Tat, WordOp::Settle(settlement)) => {
                Some(PolicyState::from_tat(policy, word, now)?.settle(policy, now, settlement))
            }
            (Form::WindowWord, WordOp::Settle(settlement)) => {
                Some(PolicyState::from_window_word(policy, word)?.settle(policy, now, settlement))
            }
            (Form::General, _) => None,
        }
    }
}

/// What a word script did to a key's word.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WordOp<'a> {
    /// Decided a request of this cost.
    Check(u64),
    /// Settled a request's cost.
    Settle(&'a Settlement),
}
