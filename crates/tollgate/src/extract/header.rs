//! [`HeaderKey`]: the value of a request header.

use std::borrow::Cow;

use http::{HeaderName, Request};
use tollgate_core::Key;

use super::{KeyExtractor, MissingCause};

/// The value of a request header, such as an API key. A missing or empty
/// header yields no key. A header sent more than once is keyed by its
/// first value, the one `HeaderMap::get` (and so most auth layers) reads:
/// an auth layer that checks another of them must refuse such requests
/// itself, or a client with one valid key picks its bucket with the
/// others. (Refusing them here would let them through unlimited under
/// [`MissingKey::Allow`](crate::MissingKey::Allow).)
///
/// Only use a header the client cannot choose freely (an API key that your
/// auth layer has validated, or a header set by your own proxy), or every
/// client can pick its own bucket. A value longer than
/// [`Key::MAX_HEADER_BYTES`] is keyed by its digest ([`Key::header`]), so
/// that a long header costs no table more than 32 bytes.
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
