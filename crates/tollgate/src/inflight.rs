//! [`InFlightLayer`]: at most N requests of one key in progress at once.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::num::NonZeroU64;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;
use tollgate_core::{InFlightLimit, Key, MemoryStore, Renewal, SlotStore, Slots};
use tower_layer::Layer;
use tower_service::Service;

use crate::answer::{self, Protocol};
use crate::body::ResponseBody;
use crate::extract::KeyExtractor;
use crate::fallback::{Answer, FailureMode, FailureReport, shared_fallback};
use crate::report::Throttle;
use crate::response::Responder;

/// A layer that admits at most [`InFlightLimit::max`] requests of one key
/// in progress at once, across every app server that shares its store:
/// a keyed, distributed concurrency limit, beside the rate limit of
/// [`RateLimitLayer`](crate::RateLimitLayer).
///
/// A request takes a slot before the inner service sees it, and gives it
/// back when its response body is finished or dropped: when the client
/// has read the whole response, disconnects, or the handler fails or
/// panics. A request that finds every slot of its key taken is answered
/// at once with 429, `application/problem+json`, `Retry-After: 1` and
/// [`x-concurrency-limit`](crate::CONCURRENCY_LIMIT) carrying the limit.
///
/// On Redis a slot is a lease ([`InFlightLimit::lease`]) renewed every
/// third of it while the request runs, so the slot of an app server that
/// dies frees itself when the lease ends; in memory a slot lives exactly
/// as long as its request. A renewal that finds its slot gone (Redis
/// restarted without persistence, was flushed, or failed over to a replica
/// that missed writes) takes it back, so the limit holds again for new
/// requests within a third of the lease; a running request that finds
/// every slot taken meanwhile runs on uncounted and is counted again as
/// soon as a slot is free (see [`Renewal`]).
///
/// When the store fails, the layer follows its [`FailureMode`] as
/// [`RateLimitLayer`](crate::RateLimitLayer) does: under
/// [`FailureMode::Local`] (the default) the slots are taken in memory,
/// with this instance's share of the limit ([`InFlightLayer::local_divisor`]);
/// [`FailureMode::Open`] lets the request through unlimited;
/// [`FailureMode::Closed`] answers 503.
///
/// ```
/// use axum::{Router, routing::get};
/// use tollgate::{ExtensionKey, InFlightLayer, InFlightLimit};
///
/// # #[derive(Clone)] struct UserId(String);
/// # impl tollgate::ToKey for UserId { fn to_key(&self) -> tollgate::Key { self.0.to_key() } }
/// let exports = InFlightLimit::new("exports", 2)?;
/// let app: Router = Router::new()
///     .route("/export", get(|| async { "a large file" }))
///     .route_layer(InFlightLayer::new(exports, ExtensionKey::<UserId>::new()));
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub struct InFlightLayer<K, St = MemoryStore> {
    limit: InFlightLimit,
    extractor: Arc<K>,
    store: St,
    failure: FailureMode,
    divisor: NonZeroU64,
    local: MemoryStore,
    responder: Responder,
}

struct Shared<K, St> {
    limit: InFlightLimit,
    extractor: Arc<K>,
    store: St,
    failure: FailureMode,
    /// The local fallback's slots, and this instance's share of the limit.
    local: MemoryStore,
    local_limit: InFlightLimit,
    responder: Responder,
    telemetry: Telemetry,
}

impl<K> InFlightLayer<K> {
    /// A layer of `limit` keyed by `extractor`, holding its slots in a
    /// store of its own in memory (use [`store`](Self::store) to share
    /// them through Redis).
    pub fn new(limit: InFlightLimit, extractor: K) -> Self {
        Self {
            responder: Responder::new(limit.name()),
            limit,
            extractor: Arc::new(extractor),
            store: MemoryStore::new(),
            failure: FailureMode::default(),
            divisor: NonZeroU64::MIN,
            local: shared_fallback().clone(),
        }
    }
}

impl<K, St> InFlightLayer<K, St> {
    /// Holds the slots in `store`: a `RedisStore` shared by every app
    /// server makes the limit global.
    pub fn store<S2>(self, store: S2) -> InFlightLayer<K, S2> {
        InFlightLayer {
            limit: self.limit,
            extractor: self.extractor,
            store,
            failure: self.failure,
            divisor: self.divisor,
            local: self.local,
            responder: self.responder,
        }
    }

    /// What to do when the store fails: [`FailureMode::Local`] (the
    /// default) takes the slot in memory, with this instance's share of
    /// the limit; [`FailureMode::Open`] lets the request through
    /// unlimited; [`FailureMode::Closed`] answers 503.
    pub fn on_store_error(mut self, mode: FailureMode) -> Self {
        self.failure = mode;
        self
    }

    /// How many instances share the limit, for [`FailureMode::Local`]:
    /// while the store fails, each lets `max / instances` requests of a
    /// key run at once (at least 1; see [`InFlightLimit::divided`]).
    /// Default 1.
    pub fn local_divisor(mut self, instances: NonZeroU64) -> Self {
        self.divisor = instances;
        self
    }

    /// The in-memory store whose slots [`FailureMode::Local`] takes
    /// (default: [`shared_fallback`](crate::shared_fallback)).
    pub fn local_fallback(mut self, store: MemoryStore) -> Self {
        self.local = store;
        self
    }

    /// Answers as a gRPC server: a refused request gets a trailers-only
    /// `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms: 1000`, a
    /// `RetryInfo` of 1 s and `x-concurrency-limit` as metadata; a store
    /// failure under [`FailureMode::Closed`] gets `UNAVAILABLE`.
    pub fn grpc(mut self) -> Self {
        self.responder.protocol = Protocol::Grpc;
        self
    }

    /// The limit.
    pub fn limit(&self) -> &InFlightLimit {
        &self.limit
    }
}

impl<K, St: Clone> Clone for InFlightLayer<K, St> {
    fn clone(&self) -> Self {
        Self {
            limit: self.limit.clone(),
            extractor: self.extractor.clone(),
            store: self.store.clone(),
            failure: self.failure,
            divisor: self.divisor,
            local: self.local.clone(),
            responder: self.responder.clone(),
        }
    }
}

impl<K, St> fmt::Debug for InFlightLayer<K, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLayer")
            .field("limit", &self.limit)
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

impl<S, K, St: Clone> Layer<S> for InFlightLayer<K, St> {
    type Service = InFlight<S, K, St>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlight {
            inner,
            shared: Arc::new(Shared {
                limit: self.limit.clone(),
                extractor: self.extractor.clone(),
                store: self.store.clone(),
                failure: self.failure,
                local: self.local.clone(),
                local_limit: self.limit.divided(self.divisor),
                responder: self.responder.clone(),
                telemetry: Telemetry::new(self.limit.name()),
            }),
        }
    }
}

/// The service of an [`InFlightLayer`].
pub struct InFlight<S, K, St> {
    inner: S,
    shared: Arc<Shared<K, St>>,
}

impl<S: Clone, K, St> Clone for InFlight<S, K, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, K, St> fmt::Debug for InFlight<S, K, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight")
            .field("inner", &self.inner)
            .field("limit", &self.shared.limit)
            .finish_non_exhaustive()
    }
}

type BoxedResponse<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<InFlightBody<B>>, E>> + Send>>;

impl<S, K, St, ReqBody, ResBody> Service<Request<ReqBody>> for InFlight<S, K, St>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    K: KeyExtractor<ReqBody>,
    St: SlotStore + Clone,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<InFlightBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxedResponse<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service `poll_ready` made ready goes with the request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        let Some(key) = shared.extractor.extract(&request) else {
            let cause = shared.extractor.missing(&request);
            let response = shared.responder.missing_key(&cause);
            return Box::pin(async move { Ok(response.map(InFlightBody::own)) });
        };
        Box::pin(async move {
            let holder = shared.store.new_holder();
            let acquired = shared.store.acquire(&key, &shared.limit, holder).await;
            let taken = acquired.map(|slots| (slots, Holds::Store));
            let local = || {
                let slots = shared
                    .local
                    .acquire_slot_sync(&key, &shared.local_limit, holder);
                Ok((slots, Holds::Local))
            };
            let slot: Option<Box<dyn Any + Send + Sync>> =
                match shared.failure.apply(taken, local, &shared.telemetry) {
                    Answer::Decided((Slots { acquired: true, .. }, Holds::Store)) => {
                        let store = shared.store.clone();
                        Some(Slot::boxed(
                            store,
                            key,
                            &shared.limit,
                            holder,
                            &shared.telemetry,
                        ))
                    }
                    Answer::Decided((Slots { acquired: true, .. }, Holds::Local)) => {
                        let store = shared.local.clone();
                        let limit = &shared.local_limit;
                        Some(Slot::boxed(store, key, limit, holder, &shared.telemetry))
                    }
                    Answer::Decided((
                        Slots {
                            acquired: false, ..
                        },
                        Holds::Store | Holds::Local,
                    )) => {
                        shared.telemetry.rejected();
                        let protocol = shared.responder.protocol;
                        let response = answer::in_flight_full(&shared.limit, protocol);
                        return Ok(response.map(InFlightBody::own));
                    }
                    Answer::LetThrough(_) => None,
                    Answer::Refused(_) => {
                        return Ok(shared.responder.unavailable().map(InFlightBody::own));
                    }
                };
            // Held across the call: dropped (and given back) if the call
            // fails, panics or is dropped, else handed to the body.
            let response = inner.call(request).await?;
            Ok(response.map(|body| InFlightBody::inner(body, slot)))
        })
    }
}

/// Where a request's slot was taken: in the layer's store, or, while it
/// fails, in the local fallback.
#[derive(Debug, Clone, Copy)]
enum Holds {
    Store,
    Local,
}

/// A slot held: given back when dropped, and its lease renewed meanwhile
/// in a store of leases.
struct Slot<St: SlotStore + Clone> {
    store: St,
    key: Key,
    limit: InFlightLimit,
    holder: u64,
    renewal: Option<tokio::task::AbortHandle>,
    telemetry: Telemetry,
}

impl<St: SlotStore + Clone> Slot<St> {
    /// A slot taken in `store`, as the response body holds it.
    fn boxed(
        store: St,
        key: Key,
        limit: &InFlightLimit,
        holder: u64,
        telemetry: &Telemetry,
    ) -> Box<dyn Any + Send + Sync> {
        Box::new(Self::take(store, key, limit.clone(), holder, telemetry))
    }

    fn take(store: St, key: Key, limit: InFlightLimit, holder: u64, telemetry: &Telemetry) -> Self {
        telemetry.held(1.0);
        let renewal = store.leases().then(|| {
            let (store, key, limit) = (store.clone(), key.clone(), limit.clone());
            let telemetry = telemetry.clone();
            let every = limit.lease_duration() / 3;
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.tick().await;
                // Renews until the slot is given back, even once its slot
                // is found gone: the store takes it back if a slot is free,
                // so that new requests count this one again within a
                // renewal period of the store losing its slots; while
                // every slot is held by others, the request runs on
                // uncounted (it cannot be un-run), and takes one back as
                // soon as one is free.
                loop {
                    tick.tick().await;
                    if let Ok(renewal) = store.renew(&key, &limit, holder).await
                        && renewal.found_gone()
                    {
                        telemetry.slot_gone(renewal);
                    }
                }
            })
            .abort_handle()
        });
        Self {
            store,
            key,
            limit,
            holder,
            renewal,
            telemetry: telemetry.clone(),
        }
    }
}

impl<St: SlotStore + Clone> Drop for Slot<St> {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        self.telemetry.held(-1.0);
        if self.store.release_now(&self.key, &self.limit, self.holder) {
            return;
        }
        // Outside a runtime the lease frees the slot.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (store, key, limit) = (self.store.clone(), self.key.clone(), self.limit.clone());
            let holder = self.holder;
            runtime.spawn(async move {
                let _ = store.release(&key, &limit, holder).await;
            });
        }
    }
}

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
    fn inner(body: B, slot: Option<Box<dyn Any + Send + Sync>>) -> Self {
        Self {
            body: ResponseBody::inner(body),
            slot,
        }
    }

    fn own(body: Bytes) -> Self {
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

/// The layer's metrics (with the `metrics` feature) and throttled logs.
#[derive(Clone)]
struct Telemetry {
    #[cfg(feature = "metrics")]
    held: metrics::Gauge,
    #[cfg(feature = "metrics")]
    rejected: metrics::Counter,
    throttle: Arc<Throttle>,
    gone: Arc<Throttle>,
}

impl Telemetry {
    fn new(_name: &str) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            held: metrics::gauge!(
                tollgate_core::telemetry::INFLIGHT_SLOTS,
                "policy" => _name.to_owned()
            ),
            #[cfg(feature = "metrics")]
            rejected: metrics::counter!(
                tollgate_core::telemetry::INFLIGHT_REJECTED,
                "policy" => _name.to_owned()
            ),
            throttle: Arc::new(Throttle::new(std::time::Duration::from_secs(1))),
            gone: Arc::new(Throttle::new(std::time::Duration::from_secs(1))),
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    fn held(&self, _change: f64) {
        #[cfg(feature = "metrics")]
        self.held.increment(_change);
    }

    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    fn rejected(&self) {
        #[cfg(feature = "metrics")]
        self.rejected.increment(1);
    }

    /// A renewal found its slot gone: the store lost it, or its lease ran
    /// out before the renewal came.
    fn slot_gone(&self, renewal: Renewal) {
        if let Some(suppressed) = self.gone.may_log(tokio::time::Instant::now()) {
            if renewal.holds() {
                tracing::warn!(
                    suppressed,
                    "in-flight limit: a running request's slot was gone; taken back"
                );
            } else {
                tracing::warn!(
                    suppressed,
                    "in-flight limit: a running request's slot was gone and every slot is held; it runs uncounted until one is free"
                );
            }
        }
    }
}

impl FailureReport for Telemetry {
    fn store_failed(&self, mode: FailureMode, error: &tollgate_core::StoreError) {
        if let Some(suppressed) = self.throttle.may_log(tokio::time::Instant::now()) {
            tracing::warn!(
                error = error as &dyn std::error::Error,
                failure_mode = ?mode,
                suppressed,
                "in-flight limit: the store failed; applying the failure policy"
            );
        }
    }

    fn decided_locally(&self, _allowed: bool) {}

    fn let_through(&self) {}

    fn refused(&self) {}
}
