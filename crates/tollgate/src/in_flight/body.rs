//! [`InFlightBody`]: the response body that holds the slot.

use std::any::Any;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;

use crate::body::ResponseBody;
pin_project! {
    /// The response body of an [`InFlight`] service: the inner body, which
    /// holds the request's slot until it is finished or dropped, or the
    /// layer's own answer.
    pub struct InFlightBody<B> {
        #[pin]
        body: ResponseBody<B>,
        slot: Option<Box<dyn Any + Send + Sync>>,
    }
}

impl<B> InFlightBody<B> {
    pub(super) fn inner(body: B, slot: Option<Box<dyn Any + Send + Sync>>) -> Self {
        Self {
            body: ResponseBody::inner(body),
            slot,
        }
    }

    pub(super) fn own(body: Bytes) -> Self {
        Self {
            body: ResponseBody::own(Full::new(body)),
            slot: None,
        }
    }
}

impl<B> fmt::Debug for InFlightBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightBody")
            .field("holds_slot", &self.slot.is_some())
            .finish_non_exhaustive()
    }
}

impl<B> Body for InFlightBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.body.poll_frame(cx));
        if frame.is_none() {
            // The whole body is out: the request is done.
            this.slot.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
