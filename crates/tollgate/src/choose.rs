//! Choosing each request's policy: plans and per-tenant overrides.

use std::fmt;
use std::sync::Arc;

use http::Request;
use tollgate_core::{Key, Policy};

use crate::extract::{KeyExtractor, MissingCause};

/// A key extractor that also picks each request's policy: what
/// [`RateLimitLayer::choose_policy`](crate::RateLimitLayer::choose_policy)
/// makes of the layer's extractor and a chooser. The key is the inner
/// extractor's; the policy is the chooser's, or the layer's own where the
/// chooser returns `None`.
pub struct ChosenPolicy<K, C> {
    key: Arc<K>,
    choose: C,
}

impl<K, C> ChosenPolicy<K, C> {
    pub(crate) fn new(key: Arc<K>, choose: C) -> Self {
        Self { key, choose }
    }
}

impl<B, K, C> KeyExtractor<B> for ChosenPolicy<K, C>
where
    K: KeyExtractor<B>,
    C: Fn(&Request<B>) -> Option<Policy> + Send + Sync + 'static,
{
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        self.key.extract(request)
    }

    fn missing(&self, request: &Request<B>) -> MissingCause {
        self.key.missing(request)
    }

    fn policy(&self, request: &Request<B>) -> Option<Policy> {
        (self.choose)(request)
    }
}

impl<K: fmt::Debug, C> fmt::Debug for ChosenPolicy<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChosenPolicy")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}
