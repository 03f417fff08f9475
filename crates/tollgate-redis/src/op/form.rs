//! How the store sends each policy's operations, by the policy's
//! [`Shape`]: the one place this crate matches shapes and forms.

use tollgate_core::{Policy, Shape};

use crate::op::tat::Tat;
use crate::op::window_word::WindowWord;
use crate::op::word::WordForm;

/// The script a policy's decisions run, and how they are batched.
#[derive(Clone, Copy, Debug)]
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
    /// The form of `policy`'s operations.
    #[inline]
    pub(crate) fn of(policy: &Policy) -> Form {
        match policy.shape() {
            Shape::Tat => Form::Tat,
            Shape::WindowWord => Form::WindowWord,
            Shape::Full => Form::General,
        }
    }

    /// The word script of the form, or `None` for the general form, whose
    /// script replies decisions: the one match over forms.
    #[inline]
    pub(crate) fn word(self) -> Option<&'static dyn WordForm> {
        match self {
            Form::Tat => Some(&Tat),
            Form::WindowWord => Some(&WindowWord),
            Form::General => None,
        }
    }

    /// The word script of `policy`'s form, if it has one.
    #[inline]
    pub(crate) fn word_of(policy: &Policy) -> Option<&'static dyn WordForm> {
        Form::of(policy).word()
    }
}
