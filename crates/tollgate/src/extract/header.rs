//! [`HeaderKey`]: the value of a request header.

use std::borrow::Cow;

use http::{HeaderName, Request};
use tollgate_core::Key;

use super::{KeyExtractor, MissingCause};

/// The value of a request header, such as an API key. A missing or empty
/// header yields no key, and so does a header sent more than once: which of
/// its values an auth layer checked is not known here, and keying by
/// another would let a client with one valid value pick any bucket with
/// the others. Either is the client's mistake (400).
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
/// let twice = Request::get("/")
///     .header("x-api-key", "junk-1")
///     .header("x-api-key", "k-123")
///     .body(())
///     .unwrap();
/// assert_eq!(by_api_key.extract(&twice), None);
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
        let mut values = request.headers().get_all(&self.name).iter();
        let value = values.next()?;
        (!value.is_empty() && values.next().is_none()).then(|| Key::header(value.as_bytes()))
    }

    /// The client must send the header, once: [`MissingCause::Client`].
    fn missing(&self, request: &Request<B>) -> MissingCause {
        let sent = request.headers().get_all(&self.name).iter().count();
        let once = if sent > 1 { " once" } else { "" };
        MissingCause::Client(Cow::Owned(format!("send the {} header{once}", self.name)))
    }
}
