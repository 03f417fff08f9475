//! [`InFlightLayer`]: the layer and its settings.

use std::fmt;
use std::sync::Arc;

use tollgate_core::{InFlightLimit, MemoryStore};
use tower_layer::Layer;

use crate::answer::headers::Values;
use crate::fallback::{FailureMode, FailureSettings, InstanceCount};
use crate::home::Home;
use crate::macros::{failure_setters, grpc_setter};
use crate::response::Responder;

use super::future::Shared;
use super::service::InFlight;
use super::telemetry::Telemetry;

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
/// that missed writes) takes it back, past the limit if new requests took
/// every slot meanwhile, so the limit holds again for new requests within
/// a third of the lease: no new request takes a slot until fewer than the
/// limit run (see [`Renewal`](tollgate_core::Renewal)). A renewal that
/// fails at once (the store's breaker open, its connection refused, or
/// dropped as a restarting Redis drops it) is tried again after a twelfth
/// of the lease, so a store that was away when its renewals came counts
/// the running requests again within a twelfth of the lease of answering;
/// one that timed out waits
/// the whole third, not to add to a slow store's load. (A store that
/// stops answering times out until its breaker opens.)
///
/// A slot's renewals and give-back run in the background: on the
/// request's runtime, or on the one the layer made its service on (where
/// [`Layer::layer`] was called) when that one has worker threads and the
/// request's is a runtime of its own thread only (a job worker's, which
/// runs tasks only while its thread blocks on a future), or the response
/// is dropped outside any runtime; not once that runtime has shut down
/// (one idle task on it, for each runtime, tells when). Build the layer
/// on the app's runtime for workers to share it.
///
/// When the store fails, the layer follows its [`FailureMode`] as
/// [`RateLimitLayer`](crate::RateLimitLayer) does: under
/// [`FailureMode::Local`] (the default) the slots are taken in memory,
/// with this instance's share of the limit ([`InFlightLayer::local_divisor`]),
/// counting the requests this instance runs on slots of the store (each
/// holds one in memory too, past the share if need be, when the store is
/// one of leases such as Redis's: a failure gives the key no fresh set of
/// slots beside them), and a refusal says that share;
/// [`FailureMode::Open`] lets the request through unlimited;
/// [`FailureMode::Closed`] answers 503. A request that runs under either of
/// the first two is registered in the store by its renewals once the store
/// answers again, so that one that runs on past the failure counts there
/// (past the limit, if new requests took every slot meanwhile).
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
    fallback: FailureSettings,
    responder: Responder,
    /// Shared by every service the layer makes (axum makes one per
    /// connection), so that its warnings are throttled across them.
    telemetry: Telemetry,
}

impl<K> InFlightLayer<K> {
    /// A layer of `limit` keyed by `extractor`, holding its slots in a
    /// store of its own in memory (use [`store`](Self::store) to share
    /// them through Redis).
    pub fn new(limit: InFlightLimit, extractor: K) -> Self {
        Self {
            responder: Responder::new(limit.name(), Values::named(limit.name())),
            telemetry: Telemetry::new(limit.name()),
            limit,
            extractor: Arc::new(extractor),
            store: MemoryStore::new(),
            fallback: FailureSettings::default(),
        }
    }
}

impl<K, St> InFlightLayer<K, St> {
    /// The layer's answer settings, for a setter to change.
    fn responder_mut(&mut self) -> &mut Responder {
        &mut self.responder
    }

    /// Holds the slots in `store`: a `RedisStore` shared by every app
    /// server makes the limit global.
    pub fn store<S2>(self, store: S2) -> InFlightLayer<K, S2> {
        InFlightLayer {
            limit: self.limit,
            extractor: self.extractor,
            store,
            fallback: self.fallback,
            responder: self.responder,
            telemetry: self.telemetry,
        }
    }

    failure_setters! {
        fallback;
        /// What to do when the store fails: [`FailureMode::Local`] (the
        /// default) takes the slot in memory, with this instance's share of
        /// the limit; [`FailureMode::Open`] lets the request through
        /// unlimited; [`FailureMode::Closed`] answers 503.
        on_store_error;
        /// How many instances share the limit, for [`FailureMode::Local`]:
        /// while the store fails, each lets `max / instances` requests of a
        /// key run at once (at least 1; see [`InFlightLimit::divided`]).
        /// Default 1.
        local_divisor;
        /// The instance count as a handle that may change at runtime, for
        /// fleets that autoscale (see [`InstanceCount`](crate::InstanceCount)),
        /// in place of a fixed `local_divisor`.
        local_instances;
        /// The in-memory store whose slots [`FailureMode::Local`] takes
        /// (default: [`shared_fallback`](crate::shared_fallback)).
        local_fallback;
    }

    grpc_setter! {
        /// Answers as a gRPC server: a refused request gets a trailers-only
        /// `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms: 1000`, a
        /// `RetryInfo` of 1 s and `x-concurrency-limit` as metadata; a store
        /// failure under [`FailureMode::Closed`] gets `UNAVAILABLE`.
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
            fallback: self.fallback.clone(),
            responder: self.responder.clone(),
            telemetry: self.telemetry.clone(),
        }
    }
}

impl<K, St> fmt::Debug for InFlightLayer<K, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLayer")
            .field("limit", &self.limit)
            .field("failure", &self.fallback.mode)
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
                failure: self.fallback.mode,
                local: self.fallback.local.clone(),
                instances: self.fallback.instances.clone(),
                responder: self.responder.clone(),
                telemetry: self.telemetry.clone(),
                home: Home::here(),
            }),
        }
    }
}
