//! How the rate-limit service types its response bodies: [`BodyKind`],
//! [`WrapBody`] (the default) and [`KeepBody`].

use bytes::Bytes;
use http_body_util::Full;

use crate::body::ResponseBody;

/// How [`RateLimit`](crate::RateLimit) types the bodies of its responses:
/// [`WrapBody`] (the default) or [`KeepBody`], chosen with
/// [`RateLimitLayer::keep_body_type`](crate::RateLimitLayer::keep_body_type).
/// Sealed: the two are all there is.
pub trait BodyKind<B>: sealed::Sealed {
    /// The body type of the service's responses.
    type Body;

    /// The body of a response from the inner service.
    fn inner(body: B) -> Self::Body;

    /// The body of a response the layer made itself (a rejection).
    fn own(body: Bytes) -> Self::Body;
}

/// Responses carry a [`ResponseBody<B>`]: the inner service's body `B`, or
/// the layer's own rejection body. Works with any body type. The default.
#[derive(Debug, Clone, Copy, Default)]
pub struct WrapBody;

/// Responses keep the inner service's body type `B`, and the layer builds
/// its own rejections with `B::from(Bytes)`, as axum's `Body` allows.
///
/// Axum converts every response of a layered route to its `Body`, and
/// boxes any other body type to do so: one allocation per response, which
/// this saves.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeepBody;

impl<B> BodyKind<B> for WrapBody {
    type Body = ResponseBody<B>;

    fn inner(body: B) -> ResponseBody<B> {
        ResponseBody::inner(body)
    }

    fn own(body: Bytes) -> ResponseBody<B> {
        ResponseBody::own(Full::new(body))
    }
}

impl<B: From<Bytes>> BodyKind<B> for KeepBody {
    type Body = B;

    fn inner(body: B) -> B {
        body
    }

    fn own(body: Bytes) -> B {
        B::from(body)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::WrapBody {}
    impl Sealed for super::KeepBody {}
}
