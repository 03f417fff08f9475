//! Key extractors: which bucket a request counts against.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use http::{HeaderName, Request};
use tollgate_core::{Key, KeyKind, TypeTag};

use crate::choose::{Choice, ChosenPolicy};

/// Picks the [`Key`] a request is limited by, or `None` when the request
/// carries no usable identity.
///
/// `None` is never turned into a shared bucket. The layer answers it as
/// configured with [`MissingKey`](crate::MissingKey); by default after
/// [`missing`](KeyExtractor::missing), which says whose mistake it is: a
/// client that left out what it must send gets a 400 (or a 401 without
/// authentication), a server wired without what the key needs a 500.
///
/// Implemented for closures `Fn(&Request<B>) -> Option<Key>` (whose missing
/// keys count as server-side) and for the extractors in this module.
///
/// ```
/// use http::Request;
/// use tollgate::{Key, KeyExtractor};
///
/// // Limit by API key, taken from the path `/tenants/{id}/...`.
/// let by_tenant = |req: &Request<()>| {
///     let mut parts = req.uri().path().split('/');
///     (parts.nth(1) == Some("tenants")).then(|| parts.next().map(Key::custom))?
/// };
/// let req = Request::get("/tenants/acme/items").body(()).unwrap();
/// assert_eq!(by_tenant.extract(&req), Some(Key::custom("acme")));
/// ```
pub trait KeyExtractor<B>: Send + Sync + 'static {
    /// The key for `request`, if it has one.
    fn extract(&self, request: &Request<B>) -> Option<Key>;

    /// Why `request`, for which [`extract`](KeyExtractor::extract) found no
    /// key, has none. Called only for such requests. The default blames the
    /// server ([`MissingCause::Server`]).
    fn missing(&self, request: &Request<B>) -> MissingCause {
        let _ = request;
        MissingCause::Server(Cow::Borrowed(
            "the key extractor found no key; check how the server is wired",
        ))
    }

    /// The policy (and perhaps the cost) `request` is limited by, when it
    /// is not the layer's own: see
    /// [`RateLimitLayer::choose_policy`](crate::RateLimitLayer::choose_policy).
    /// The default keeps the layer's.
    fn choose(&self, request: &Request<B>) -> Option<Choice> {
        let _ = request;
        None
    }
}

impl<B, F> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<Key> + Send + Sync + 'static,
{
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        self(request)
    }
}

/// Why a request has no key: whose mistake it is, and so how the layer
/// answers it by default ([`MissingKey::ByCause`](crate::MissingKey::ByCause)).
///
/// ```
/// use http::{HeaderName, Request};
/// use tollgate::{HeaderKey, KeyExtractor, MissingCause};
///
/// let by_api_key = HeaderKey::new(HeaderName::from_static("x-api-key"));
/// assert_eq!(
///     by_api_key.missing(&Request::new(())),
///     MissingCause::Client("send the x-api-key header".into())
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingCause {
    /// The client left out (or garbled) something it must send; the text
    /// tells it what, and goes into the response. Answered 400.
    Client(Cow<'static, str>),
    /// The request is not authenticated (no identity from the auth layer).
    /// Answered 401.
    Unauthenticated,
    /// The server is wired without what the key needs, such as a peer-IP
    /// key on a server started without connect info; the text is for the
    /// log only. Answered 500.
    Server(Cow<'static, str>),
}

/// One bucket for all requests: a global limit.
///
/// ```
/// use http::Request;
/// use tollgate::{GlobalKey, Key, KeyExtractor};
///
/// let req = Request::new(());
/// assert_eq!(GlobalKey.extract(&req), Some(Key::global()));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct GlobalKey;

impl<B> KeyExtractor<B> for GlobalKey {
    fn extract(&self, _: &Request<B>) -> Option<Key> {
        Some(Key::global())
    }
}

/// The value of a request header, such as an API key. A missing or empty
/// header yields no key.
///
/// Only use a header the client cannot choose freely (an API key that your
/// auth layer has validated, or a header set by your own proxy), or every
/// client can pick its own bucket.
///
/// ```
/// use http::Request;
/// use tollgate::{HeaderKey, Key, KeyExtractor};
///
/// let by_api_key = HeaderKey::new(http::HeaderName::from_static("x-api-key"));
/// let req = Request::get("/").header("x-api-key", "k-123").body(()).unwrap();
/// assert_eq!(by_api_key.extract(&req), Some(Key::header("k-123")));
/// assert_eq!(by_api_key.extract(&Request::new(())), None);
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys requests by header `name`.
    pub fn new(name: HeaderName) -> Self {
        Self { name }
    }
}

impl<B> KeyExtractor<B> for HeaderKey {
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        let value = request.headers().get(&self.name)?;
        (!value.is_empty()).then(|| Key::header(value.as_bytes()))
    }

    /// The client must send the header: [`MissingCause::Client`].
    fn missing(&self, _: &Request<B>) -> MissingCause {
        MissingCause::Client(Cow::Owned(format!("send the {} header", self.name)))
    }
}

/// A value that identifies a user or client, put into request extensions by
/// an authentication layer and read by [`ExtensionKey`].
///
/// The implementations for strings and integers make
/// [`KeyKind::User`](tollgate_core::KeyKind::User) keys tagged with the
/// value's type ([`Key::typed`]), so that a string and a number with the
/// same bytes, or `-1i64` and `u64::MAX`, are different users.
///
/// ```
/// use tollgate::{Key, KeyKind, ToKey, TypeTag};
///
/// #[derive(Clone)]
/// struct UserId(u64);
///
/// impl ToKey for UserId {
///     fn to_key(&self) -> Key {
///         self.0.to_key()
///     }
/// }
/// assert_eq!(UserId(7).to_key(), Key::typed(KeyKind::User, TypeTag::Unsigned, 7u64.to_be_bytes()));
/// assert_ne!(0x61646d696e5f5f5f_u64.to_key(), "admin___".to_key());
/// assert_ne!((-1_i64).to_key(), u64::MAX.to_key());
/// ```
pub trait ToKey {
    /// The [`Key`] (normally of [`KeyKind::User`](tollgate_core::KeyKind::User)).
    fn to_key(&self) -> Key;
}

impl ToKey for String {
    fn to_key(&self) -> Key {
        self.as_str().to_key()
    }
}

impl ToKey for str {
    fn to_key(&self) -> Key {
        Key::typed(KeyKind::User, TypeTag::Str, self)
    }
}

impl ToKey for u64 {
    fn to_key(&self) -> Key {
        Key::typed(KeyKind::User, TypeTag::Unsigned, self.to_be_bytes())
    }
}

impl ToKey for u32 {
    fn to_key(&self) -> Key {
        u64::from(*self).to_key()
    }
}

impl ToKey for i64 {
    fn to_key(&self) -> Key {
        Key::typed(KeyKind::User, TypeTag::Signed, self.to_be_bytes())
    }
}

impl ToKey for i32 {
    fn to_key(&self) -> Key {
        i64::from(*self).to_key()
    }
}

impl ToKey for Key {
    fn to_key(&self) -> Key {
        self.clone()
    }
}

/// The authenticated identity of type `T` that an auth layer put into the
/// request's extensions. Requests without it (unauthenticated) yield no
/// key; this extractor never reads anything the client sent.
///
/// ```
/// use http::Request;
/// use tollgate::{ExtensionKey, Key, KeyExtractor, ToKey};
///
/// let by_user = ExtensionKey::<String>::new();
/// let mut req = Request::new(());
/// assert_eq!(by_user.extract(&req), None);
/// req.extensions_mut().insert("ada".to_string());
/// assert_eq!(by_user.extract(&req), Some("ada".to_key()));
/// ```
pub struct ExtensionKey<T> {
    _marker: PhantomData<fn() -> T>,
}

impl<T> ExtensionKey<T> {
    /// Keys requests by their `T` extension.
    pub fn new() -> Self {
        Self {
            _marker: PhantomData,
        }
    }
}

impl<T> Default for ExtensionKey<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for ExtensionKey<T> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for ExtensionKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExtensionKey<{}>", std::any::type_name::<T>())
    }
}

impl<B, T> KeyExtractor<B> for ExtensionKey<T>
where
    T: ToKey + Send + Sync + 'static,
{
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        request.extensions().get::<T>().map(ToKey::to_key)
    }

    /// No identity from the auth layer: [`MissingCause::Unauthenticated`].
    fn missing(&self, _: &Request<B>) -> MissingCause {
        MissingCause::Unauthenticated
    }
}

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

/// The request's method and matched route template (axum's
/// [`MatchedPath`](axum::extract::MatchedPath), such as `/users/{id}`), for
/// keys per route. Only the template is used, never the raw path, so
/// clients cannot mint new keys. Requests outside a matched route have no
/// key; apply it with `Router::route_layer`.
///
/// ```
/// use axum::{Router, routing::get};
/// use tollgate::{Algorithm, ExtensionKey, Policy, RateLimitLayer, RouteKey};
///
/// let policy = Policy::new("per-user-per-route", Algorithm::Gcra, "10/s")?;
/// let app: Router = Router::new()
///     .route("/items/{id}", get(|| async { "item" }))
///     .route_layer(RateLimitLayer::new(policy, (RouteKey, ExtensionKey::<String>::new())));
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[cfg(feature = "axum")]
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteKey;

#[cfg(feature = "axum")]
impl<B> KeyExtractor<B> for RouteKey {
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        let path = request.extensions().get::<axum::extract::MatchedPath>()?;
        let method = Key::custom(request.method().as_str());
        Some(Key::composite([&method, &Key::custom(path.as_str())]))
    }

    fn missing(&self, _: &Request<B>) -> MissingCause {
        MissingCause::Server(Cow::Borrowed(
            "no matched route: apply RouteKey with Router::route_layer",
        ))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_key_of_different_types_never_collides() {
        // The same eight bytes as a number and as text.
        assert_ne!(0x6164_6d69_6e5f_5f5f_u64.to_key(), "admin___".to_key());
        assert_ne!((-1_i64).to_key(), u64::MAX.to_key());
        assert_ne!(5_i64.to_key(), 5_u64.to_key());
        // One type, one key, whatever the width or ownership.
        assert_eq!(7_u32.to_key(), 7_u64.to_key());
        assert_eq!((-7_i32).to_key(), (-7_i64).to_key());
        assert_eq!(String::from("ada").to_key(), "ada".to_key());
    }
}
