//! The compact forms a store may keep a single limit's state in: a
//! bucket's or GCRA's one word, a fixed window's word. Shared with
//! tollgate-redis, whose word scripts keep these words; not part of the
//! API.

use super::PolicyState;
use super::limit::LimitState;
use crate::algorithm::Algorithm;
use crate::algorithm::fixed_window::FixedWindow;
use crate::algorithm::gcra::Gcra;
use crate::algorithm::leaky_bucket::LeakyBucket;
use crate::algorithm::token_bucket::TokenBucket;
use crate::policy::Policy;
use crate::time::Timestamp;

impl PolicyState {
    /// The state of a policy of [`Shape::Tat`](crate::Shape::Tat) whose
    /// compact form is `word` (see [`decide_tat`](super::decide_tat)); `None` for a policy of
    /// another shape. With [`PolicyState::tat`], this lets a store that
    /// keeps compact forms carry a key over to a policy of another shape.
    ///
    /// ```
    /// use tollgate_core::{Algorithm, Policy, Timestamp};
    /// use tollgate_core::state::PolicyState;
    ///
    /// let gcra = Policy::new("api", Algorithm::Gcra, "2/s")?;
    /// let now = Timestamp::from_secs(1_700_000_000);
    /// let state = PolicyState::from_tat(&gcra, now.as_micros() + 500_000, now).unwrap();
    /// assert_eq!(state.tat(), Some(now.as_micros() + 500_000));
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    #[doc(hidden)] // a storage encoding, shared with tollgate-redis: not part of the API
    pub fn from_tat(policy: &Policy, word: u64, now: Timestamp) -> Option<Self> {
        let [p] = policy.params() else {
            return None;
        };
        let limit = match policy.algorithm() {
            Algorithm::Gcra => LimitState::Gcra(Gcra { tat: word }),
            Algorithm::LeakyBucket => LimitState::LeakyBucket(LeakyBucket { free_at: word }),
            Algorithm::TokenBucket => {
                LimitState::TokenBucket(TokenBucket::full_at(word, p, now.as_micros()))
            }
            Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow => {
                return None;
            }
        };
        Some(Self::single(policy, limit))
    }

    /// The state of a single fixed-window policy whose window word is
    /// `word` (see [`decide_window_word`](super::decide_window_word)); `None` for another policy.
    #[doc(hidden)] // a storage encoding, shared with tollgate-redis: not part of the API
    pub fn from_window_word(policy: &Policy, word: u64) -> Option<Self> {
        let [p] = policy.params() else {
            return None;
        };
        match policy.algorithm() {
            Algorithm::FixedWindow => Some(Self::single(
                policy,
                LimitState::FixedWindow(FixedWindow::from_word(word, p)),
            )),
            Algorithm::SlidingLog
            | Algorithm::SlidingWindow
            | Algorithm::TokenBucket
            | Algorithm::LeakyBucket
            | Algorithm::Gcra => None,
        }
    }

    fn single(policy: &Policy, limit: LimitState) -> Self {
        Self {
            policy: policy.clone(),
            limits: std::iter::once(limit).collect(),
        }
    }

    /// The one-time compact form of this state (see
    /// [`PolicyState::from_tat`]): when a single GCRA, token-bucket or
    /// leaky-bucket limit's backlog clears; `None` for other policies.
    #[doc(hidden)] // a storage encoding, shared with tollgate-redis: not part of the API
    pub fn tat(&self) -> Option<u64> {
        let ([state], [p]) = (&self.limits[..], self.policy.params()) else {
            return None;
        };
        match state {
            LimitState::Gcra(_) | LimitState::LeakyBucket(_) | LimitState::TokenBucket(_) => {
                Some(state.expires_at(p))
            }
            LimitState::FixedWindow(_)
            | LimitState::SlidingLog(_)
            | LimitState::SlidingWindow(_) => None,
        }
    }

    /// The window word of this state (see
    /// [`PolicyState::from_window_word`]): a single fixed window's start
    /// plus its count, at most the period less 1 µs (which denies as any
    /// count above the limit does); `None` for other policies.
    #[doc(hidden)] // a storage encoding, shared with tollgate-redis: not part of the API
    pub fn window_word(&self) -> Option<u64> {
        let ([state], [p]) = (&self.limits[..], self.policy.params()) else {
            return None;
        };
        match state {
            LimitState::FixedWindow(window) => Some(window.word(p)),
            LimitState::SlidingLog(_)
            | LimitState::SlidingWindow(_)
            | LimitState::TokenBucket(_)
            | LimitState::LeakyBucket(_)
            | LimitState::Gcra(_) => None,
        }
    }
}
