//! The response body of the rate-limit service.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;

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

pin_project! {
    /// The inner service's body, or the body of a response the layer made
    /// itself (a rejection). The response body of
    /// [`RateLimit`](crate::RateLimit) unless the layer
    /// [keeps the inner body type](crate::RateLimitLayer::keep_body_type).
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Own { #[pin] body: Full<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn own(body: Full<Bytes>) -> Self {
        Self {
            kind: Kind::Own { body },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Own { body } => match body.poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
                Poll::Ready(Some(Err(never))) => match never {},
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Own { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Own { body } => body.size_hint(),
        }
    }
}
