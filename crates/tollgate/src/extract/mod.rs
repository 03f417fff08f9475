//! Key extractors: which bucket a request counts against. The trait and
//! why a key is missing are here; each extractor has a file of its own.

mod combine;
mod extension;
mod forwarded;
mod header;
mod hops;
mod ip;
#[cfg(feature = "axum")]
mod route;

pub use extension::{ExtensionKey, ToKey};
pub use forwarded::{ClientIp, ForwardedHeader};
pub use header::HeaderKey;
pub use ip::{PeerIp, peer_addr};
#[cfg(feature = "axum")]
pub use route::RouteKey;

use std::borrow::Cow;

use http::Request;
use tollgate_core::Key;

use crate::rate_limit::Choice;

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
