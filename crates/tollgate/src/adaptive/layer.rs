//! [`AdaptiveConcurrencyLayer`]: the layer, its settings, and the
//! [`AdaptiveHandle`] that reads its state.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{AdaptiveLimit, Clock, ConcurrencySnapshot, ConfigError};
use tower_layer::Layer;

use crate::TokioClock;
use crate::answer::headers::Values;
use crate::macros::grpc_setter;
use crate::response::Responder;

use super::classify::SameClass;
use super::gate::{Gate, Queue};
use super::service::AdaptiveConcurrency;

/// A layer that protects the service itself: it lets at most as many
/// requests run at once as the service can serve without its latency
/// climbing, a limit it finds from the latency it observes
/// ([`AdaptiveLimit`]), and sheds the rest, the least important first.
///
/// It counts every request of this instance, whatever its key: put it
/// beside the per-key [`RateLimitLayer`](crate::RateLimitLayer), which
/// keeps one client from taking more than its share, while this keeps all
/// of them together from taking more than the service can give.
///
/// Each request's [`Priority`](tollgate_core::Priority) comes from
/// [`classify`](Self::classify); when the limit is reached, sheddable
/// requests are refused first, then default ones, and critical ones last
/// (see [`AdaptiveLimitBuilder::reserve`](tollgate_core::AdaptiveLimitBuilder::reserve)).
/// A request refused is answered at once with 503, `Retry-After: 1` and an
/// `application/problem+json` body naming the limit and its class (gRPC:
/// `UNAVAILABLE` with a pushback of 1 s), unless the layer has a
/// [`queue`](Self::queue), where it may wait a bounded time for a slot.
///
/// A request holds its slot until the inner service returns its response
/// (not until its body is sent), and its latency is measured over the
/// same span. A response of 503 or 504 from the inner service (or, in a
/// trailers-only gRPC response, `UNAVAILABLE` or `DEADLINE_EXCEEDED`)
/// counts as a drop (the limit shrinks), unless a Tollgate layer inside
/// made that answer itself. A 429 (or `RESOURCE_EXHAUSTED`), a rate
/// limit's refusal, teaches the limit nothing: its latency is not the
/// service's at work. Nor does any other answer a Tollgate layer inside
/// makes itself (a rejection status of 403, an operator's deny, a
/// missing key's 400). A limit inside that makes requests wait (a shaping
/// delay, a queue) holds their slots here meanwhile, and its wait counts
/// as their latency: put such limits outside. An error from it, or a request whose client
/// went away, is [`Completion::Abandoned`](tollgate_core::Completion::Abandoned):
/// a latency sample of the time it ran once that is longer than the
/// latency the limit's algorithm knows, and a drop when a quarter of a
/// window's requests (two at least) end so after half their typical
/// latency, near the limit (clients giving up in numbers).
///
/// Every service the layer makes shares one limit: apply the same layer
/// to every route the limit protects.
///
/// ```
/// use axum::{Router, routing::get};
/// use http::Request;
/// use tollgate::{AdaptiveConcurrencyLayer, AdaptiveLimit, Priority};
///
/// let limit = AdaptiveLimit::builder("api")
///     .bounds(8, 500)
///     .reserve(Priority::Critical, 0.2)
///     .build()?;
/// let layer = AdaptiveConcurrencyLayer::new(limit).classify(|request: &Request<_>| {
///     if request.uri().path().starts_with("/checkout") {
///         Priority::Critical
///     } else {
///         Priority::Default
///     }
/// });
/// let state = layer.handle(); // for metrics or a dashboard
/// let app: Router = Router::new()
///     .route("/checkout", get(|| async { "paid" }))
///     .route("/search", get(|| async { "results" }))
///     .layer(layer);
/// assert_eq!(state.snapshot().in_flight, 0);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub struct AdaptiveConcurrencyLayer<C = SameClass> {
    limit: AdaptiveLimit,
    classify: Arc<C>,
    clock: Arc<dyn Clock>,
    queue: Option<Queue>,
    responder: Responder,
    gate: Arc<Gate>,
}

impl AdaptiveConcurrencyLayer {
    /// A layer of `limit`, every request of [`Priority::Default`](tollgate_core::Priority::Default)
    /// until [`classify`](Self::classify) says otherwise, shedding at
    /// once (no queue), on Tokio's clock.
    pub fn new(limit: AdaptiveLimit) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
        Self {
            gate: Arc::new(Gate::new(&limit, clock.clone(), None)),
            responder: Responder::new(limit.name(), Values::named(limit.name())),
            limit,
            classify: Arc::new(SameClass::default()),
            clock,
            queue: None,
        }
    }
}

impl<C> AdaptiveConcurrencyLayer<C> {
    /// The layer's answer settings, for a setter to change.
    fn responder_mut(&mut self) -> &mut Responder {
        &mut self.responder
    }

    /// A fresh gate for the settings as they are now: a setter is called
    /// before any request passes.
    fn regate(mut self) -> Self {
        self.gate = Arc::new(Gate::new(&self.limit, self.clock.clone(), self.queue));
        self
    }

    /// Takes each request's class from `classify`, any
    /// `Fn(&Request<B>) -> Priority` or a [`Classify`](super::Classify).
    pub fn classify<C2>(self, classify: C2) -> AdaptiveConcurrencyLayer<C2> {
        AdaptiveConcurrencyLayer {
            limit: self.limit,
            classify: Arc::new(classify),
            clock: self.clock,
            queue: self.queue,
            responder: self.responder,
            gate: self.gate,
        }
    }

    /// Lets a request that finds no slot wait for one, at most `max_wait`,
    /// with at most `max_waiting` requests waiting at once; a slot that
    /// frees goes to the most important class waiting, the oldest first.
    /// A request still waiting at its deadline is shed. One that finds the
    /// queue full takes the place of a request that gave up while waiting,
    /// or else of the newest request waiting in the lowest class below its
    /// own, which is shed at once; with neither, it is shed itself. A class closed by a refusal above it is
    /// served when it reopens, whether or not a slot was released since.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] for a `max_waiting` of 0 or above
    /// 100,000, or a `max_wait` of 0 or above a minute.
    pub fn queue(mut self, max_waiting: usize, max_wait: Duration) -> Result<Self, ConfigError> {
        if max_waiting == 0 || max_waiting > 100_000 {
            return Err(ConfigError::InvalidSetting {
                setting: "queue max_waiting",
                reason: "must be from 1 to 100,000",
            });
        }
        if max_wait.is_zero() || max_wait > Duration::from_secs(60) {
            return Err(ConfigError::InvalidSetting {
                setting: "queue max_wait",
                reason: "must be more than zero and at most a minute",
            });
        }
        self.queue = Some(Queue {
            max_waiting,
            max_wait,
        });
        Ok(self.regate())
    }

    /// Measures latency and warm-up on `clock` (default: Tokio's, which
    /// tests can pause).
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self.regate()
    }

    grpc_setter! {
        /// Answers as a gRPC server: a shed request gets a trailers-only
        /// `UNAVAILABLE` with `grpc-retry-pushback-ms: 1000` and
        /// `retry-after: 1`.
    }

    /// The limit's settings.
    pub fn limit(&self) -> &AdaptiveLimit {
        &self.limit
    }

    /// A handle on the layer's state, for metrics, dashboards and tests.
    ///
    /// Take it once the layer is set up: [`queue`](Self::queue) and
    /// [`clock`](Self::clock) start the layer's state afresh, and a handle
    /// taken before them keeps watching the state they replaced.
    pub fn handle(&self) -> AdaptiveHandle {
        AdaptiveHandle {
            gate: self.gate.clone(),
        }
    }
}

impl<C> Clone for AdaptiveConcurrencyLayer<C> {
    fn clone(&self) -> Self {
        Self {
            limit: self.limit.clone(),
            classify: self.classify.clone(),
            clock: self.clock.clone(),
            queue: self.queue,
            responder: self.responder.clone(),
            gate: self.gate.clone(),
        }
    }
}

impl<C> fmt::Debug for AdaptiveConcurrencyLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveConcurrencyLayer")
            .field("limit", &self.limit)
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl<S, C> Layer<S> for AdaptiveConcurrencyLayer<C> {
    type Service = AdaptiveConcurrency<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        AdaptiveConcurrency {
            inner,
            classify: self.classify.clone(),
            gate: self.gate.clone(),
            responder: Arc::new(self.responder.clone()),
        }
    }
}

/// A read-only handle on an [`AdaptiveConcurrencyLayer`]'s state.
#[derive(Clone)]
pub struct AdaptiveHandle {
    gate: Arc<Gate>,
}

impl AdaptiveHandle {
    /// The limit in force, the requests in flight and those refused so
    /// far.
    pub fn snapshot(&self) -> ConcurrencySnapshot {
        self.gate.snapshot().0
    }

    /// The requests waiting for a slot.
    pub fn queued(&self) -> usize {
        self.gate.snapshot().1
    }
}

impl fmt::Debug for AdaptiveHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveHandle")
            .field("snapshot", &self.snapshot())
            .finish()
    }
}
