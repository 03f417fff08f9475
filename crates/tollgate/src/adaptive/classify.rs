//! [`Classify`]: the [`Priority`] of a request.

use http::Request;
use tollgate_core::Priority;

/// Tells the class of a request, for an
/// [`AdaptiveConcurrencyLayer`](super::AdaptiveConcurrencyLayer) to shed
/// the lowest first. Any `Fn(&Request<B>) -> Priority` is one.
///
/// A class taken from what the client sends (a header) is the client's
/// claim: take it from what your own authentication established, or cap
/// what an unauthenticated client may claim.
pub trait Classify<B>: Send + Sync + 'static {
    /// The class of `request`.
    fn classify(&self, request: &Request<B>) -> Priority;
}

impl<B, F> Classify<B> for F
where
    F: Fn(&Request<B>) -> Priority + Send + Sync + 'static,
{
    fn classify(&self, request: &Request<B>) -> Priority {
        self(request)
    }
}

/// Every request in one class (the layer's default puts them all in
/// [`Priority::Default`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SameClass(pub Priority);

impl<B> Classify<B> for SameClass {
    fn classify(&self, _request: &Request<B>) -> Priority {
        self.0
    }
}
