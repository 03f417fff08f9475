//! How the store sends each policy's decisions, by the policy's
//! [`Shape`]: the one place this crate dispatches on shapes.

use tollgate_core::state::{decide_tat, decide_window_word};
use tollgate_core::{Decision, Policy, Shape, Timestamp};

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
            _ => Form::General,
        }
    }

    /// The decision of `cost` on `word`, a word script's reply for a key
    /// at Redis's `now`; `None` for the general form, whose script replies
    /// decisions.
    pub(crate) fn decide_word(
        self,
        policy: &Policy,
        now: u64,
        mut word: u64,
        cost: u64,
    ) -> Option<Decision> {
        let now = Timestamp::from_micros(now);
        match self {
            Form::Tat => Some(decide_tat(policy, &mut word, now, cost)),
            Form::WindowWord => Some(decide_window_word(policy, &mut word, now, cost)),
            Form::General => None,
        }
    }
}
