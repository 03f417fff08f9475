//! Extractors made of others: tuples, whose key is the composite of their
//! parts' keys, and [`ChosenPolicy`], which also picks the policy: by a
//! closure, or by a [`PlanMap`].

use http::Request;
use tollgate_core::Key;

use crate::plans::{PlanMap, PlanSource};
use crate::rate_limit::{Choice, ChosenPolicy};

use super::{KeyExtractor, MissingCause};

/// Several extractors combined: the request's key is the
/// [composite](Key::composite) of all their keys, and it has none if any
/// of them has none. Use it to limit, for example, each user on each route.
///
/// ```
/// use http::Request;
/// use tollgate::{ExtensionKey, GlobalKey, HeaderKey, Key, KeyExtractor, ToKey};
///
/// let by_tenant_and_user = (
///     HeaderKey::new(http::HeaderName::from_static("x-tenant")),
///     ExtensionKey::<String>::new(),
/// );
/// let mut req = Request::get("/").header("x-tenant", "acme").body(()).unwrap();
/// assert_eq!(by_tenant_and_user.extract(&req), None, "no user yet");
/// req.extensions_mut().insert("ada".to_string());
/// assert_eq!(
///     by_tenant_and_user.extract(&req),
///     Some(Key::composite([&Key::header("acme"), &"ada".to_key()]))
/// );
/// ```
impl<B, X, Y> KeyExtractor<B> for (X, Y)
where
    X: KeyExtractor<B>,
    Y: KeyExtractor<B>,
{
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        let x = self.0.extract(request)?;
        let y = self.1.extract(request)?;
        Some(Key::composite([&x, &y]))
    }

    /// The cause of the first part that has no key.
    fn missing(&self, request: &Request<B>) -> MissingCause {
        match self.0.extract(request) {
            None => self.0.missing(request),
            Some(_) => self.1.missing(request),
        }
    }
}

impl<B, X, Y, Z> KeyExtractor<B> for (X, Y, Z)
where
    X: KeyExtractor<B>,
    Y: KeyExtractor<B>,
    Z: KeyExtractor<B>,
{
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        let x = self.0.extract(request)?;
        let y = self.1.extract(request)?;
        let z = self.2.extract(request)?;
        Some(Key::composite([&x, &y, &z]))
    }

    /// The cause of the first part that has no key.
    fn missing(&self, request: &Request<B>) -> MissingCause {
        if self.0.extract(request).is_none() {
            self.0.missing(request)
        } else if self.1.extract(request).is_none() {
            self.1.missing(request)
        } else {
            self.2.missing(request)
        }
    }
}

impl<B, K, C, P> KeyExtractor<B> for ChosenPolicy<K, C>
where
    K: KeyExtractor<B>,
    C: Fn(&Request<B>) -> Option<P> + Send + Sync + 'static,
    P: Into<Choice>,
{
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        self.key.extract(request)
    }

    fn missing(&self, request: &Request<B>) -> MissingCause {
        self.key.missing(request)
    }

    fn choose(&self, request: &Request<B>) -> Option<Choice> {
        (self.choose)(request).map(Into::into)
    }
}

/// The policy of the request's plan, by the map: the default's for a
/// request without a known plan, so never the layer's own unless it is the
/// default (as [`RateLimitLayer::plans`](crate::RateLimitLayer::plans)
/// makes it).
impl<B, K, P> KeyExtractor<B> for ChosenPolicy<K, PlanMap<P>>
where
    K: KeyExtractor<B>,
    P: PlanSource<B>,
{
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        self.key.extract(request)
    }

    fn missing(&self, request: &Request<B>) -> MissingCause {
        self.key.missing(request)
    }

    fn choose(&self, request: &Request<B>) -> Option<Choice> {
        Some(self.choose.choose(request).clone())
    }
}
