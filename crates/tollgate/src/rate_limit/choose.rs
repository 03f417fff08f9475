//! Choosing each request's policy: plans and per-tenant overrides.

use std::fmt;
use std::sync::Arc;

use tollgate_core::Policy;

/// What a policy chooser picks for a request: a policy, and the cost of the
/// request under it when that differs from the layer's
/// [`cost`](crate::RateLimitLayer::cost). A [`Policy`] converts into a
/// choice at the layer's cost.
///
/// ```
/// use tollgate::{Algorithm, Choice, Policy};
///
/// let pro = Policy::new("export-pro", Algorithm::TokenBucket, "500/h")?;
/// // Exports cost pro users 5 of their 500, not the route's 10.
/// let choice = Choice::new(pro).cost(5);
/// # let _ = choice;
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Choice {
    pub(crate) policy: Policy,
    pub(crate) cost: Option<u64>,
}

impl Choice {
    /// `policy` at the layer's cost.
    pub fn new(policy: Policy) -> Self {
        Self { policy, cost: None }
    }

    /// The chosen policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The cost of the request under this choice.
    #[must_use]
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = Some(cost);
        self
    }
}

impl From<Policy> for Choice {
    fn from(policy: Policy) -> Self {
        Self::new(policy)
    }
}

/// A key extractor that also picks each request's policy (its
/// [`KeyExtractor`](crate::KeyExtractor) implementation is in
/// `extract/combine.rs`, with the other extractors made of others): what
/// [`RateLimitLayer::choose_policy`](crate::RateLimitLayer::choose_policy)
/// makes of the layer's extractor and a chooser. The key is the inner
/// extractor's; the policy is the chooser's, or the layer's own where the
/// chooser returns `None`.
pub struct ChosenPolicy<K, C> {
    pub(crate) key: Arc<K>,
    pub(crate) choose: C,
}

impl<K, C> ChosenPolicy<K, C> {
    pub(crate) fn new(key: Arc<K>, choose: C) -> Self {
        Self { key, choose }
    }
}

impl<K: fmt::Debug, C> fmt::Debug for ChosenPolicy<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChosenPolicy")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}
