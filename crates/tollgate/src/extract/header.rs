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
/// A gRPC binary metadata header (a name ending in `-bin`) is keyed by the
/// bytes its base64 stands for, read as gRPC reads it (padded or not,
/// stray trailing bits allowed; of several comma-separated values, the
/// first): one credential is one key, not a bucket per spelling. A value
/// that is not base64 yields no key.
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
    /// gRPC binary metadata: keyed by what its base64 stands for.
    binary: bool,
}

impl HeaderKey {
    /// Keys requests by header `name`.
    pub fn new(name: HeaderName) -> Self {
        let binary = name.as_str().ends_with("-bin");
        Self { name, binary }
    }
}

impl<B> KeyExtractor<B> for HeaderKey {
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        let value = request.headers().get(&self.name)?;
        if value.is_empty() {
            return None;
        }
        if !self.binary {
            return Some(Key::header(value.as_bytes()));
        }
        use base64::Engine as _;
        use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
        // As gRPC reads it: padded or not, stray trailing bits allowed; of
        // several values sent as one, the first.
        const GRPC: GeneralPurpose = GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            GeneralPurposeConfig::new()
                .with_decode_padding_mode(DecodePaddingMode::Indifferent)
                .with_decode_allow_trailing_bits(true),
        );
        let text = value.as_bytes();
        let first = text.split(|&b| b == b',').next().unwrap_or(text);
        // An empty value (`,`, say) is no key, as an empty header is.
        let decoded = GRPC.decode(first.trim_ascii()).ok()?;
        (!decoded.is_empty()).then(|| Key::header(decoded))
    }

    /// The client must send the header: [`MissingCause::Client`].
    fn missing(&self, _: &Request<B>) -> MissingCause {
        let base64 = if self.binary { ", in base64" } else { "" };
        MissingCause::Client(Cow::Owned(format!("send the {} header{base64}", self.name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One binary metadata value, padded or not, is one key: tonic reads
    /// both as the same bytes, so a client alternating them had two
    /// buckets (found by an audit). Not base64: no key.
    #[test]
    fn a_binary_header_is_keyed_by_its_bytes() {
        let key = HeaderKey::new(HeaderName::from_static("x-token-bin"));
        let with = |value: &str| {
            let request = Request::get("/").header("x-token-bin", value).body(());
            key.extract(&request.unwrap())
        };
        assert_eq!(with("YWJjZA=="), Some(Key::header(b"abcd")));
        assert_eq!(with("YWJjZA"), Some(Key::header(b"abcd")));
        assert_eq!(with("not base64!"), None);
        // Trailing bits grpc-go accepts, and several values: the first.
        assert_eq!(with("YWJjZB"), Some(Key::header(b"abcd")));
        assert_eq!(with("YWJjZA==,eHl6"), Some(Key::header(b"abcd")));
        assert_eq!(with(","), None);
        // A text header is keyed by its text.
        let text = HeaderKey::new(HeaderName::from_static("x-token"));
        let request = Request::get("/").header("x-token", "YWJjZA==").body(());
        assert_eq!(
            text.extract(&request.unwrap()),
            Some(Key::header("YWJjZA=="))
        );
    }
}
