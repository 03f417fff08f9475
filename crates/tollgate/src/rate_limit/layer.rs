//! The rate-limit layer.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{MemoryStore, OverrideSource, Policy, Store};
use tower_layer::Layer;

use crate::fallback::FallbackStore;
use crate::response::Responder;

use crate::plans::PlanMap;

use super::body::{KeepBody, WrapBody};
use super::choose::ChosenPolicy;
use super::responders::Responders;
use super::service::{Config, RateLimit, Shared};
use super::settle::Settle;

/// Applies a rate-limit [`Policy`] to every request of the wrapped service.
///
/// Each request's [`Key`](crate::Key) comes from the key extractor `K` (a
/// closure or one of the [extractors](crate::KeyExtractor)); its state lives
/// in the store `St`, the embedded [`MemoryStore`] unless another is set
/// with [`store`](RateLimitLayer::store). All services made by one layer,
/// and all their clones, share that state.
///
/// Admitted requests get GitHub-style `x-ratelimit-*` headers; denied ones
/// a 429 with `Retry-After` and an `application/problem+json` body.
///
/// ```
/// use axum::{Router, routing::get};
/// use tollgate::{Algorithm, GlobalKey, Policy, RateLimitLayer};
///
/// let policy = Policy::new("api", Algorithm::Gcra, "100/min")?;
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(RateLimitLayer::new(policy, GlobalKey));
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug)]
#[must_use]
pub struct RateLimitLayer<K, St = MemoryStore, M = WrapBody> {
    pub(super) store: FallbackStore<St>,
    pub(super) config: Config<K>,
    body: PhantomData<fn() -> M>,
}

impl<K, St, M> Clone for RateLimitLayer<K, St, M> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            config: self.config.clone(),
            body: PhantomData,
        }
    }
}

impl<K> RateLimitLayer<K, MemoryStore> {
    /// Limits requests by `policy`, keyed by `extractor`, on a new
    /// [`MemoryStore`] with the system clock.
    pub fn new(policy: Policy, extractor: K) -> Self {
        Self {
            store: FallbackStore::new(MemoryStore::new()),
            config: Config {
                settle: None,
                responder: Arc::new(Responder::of(&policy)),
                policy,
                extractor: Arc::new(extractor),
                cost: 1,
                wait: None,
                overrides: None,
            },
            body: PhantomData,
        }
    }
}

impl<K, St, M> RateLimitLayer<K, St, M> {
    /// Keeps state in `store` instead. Pass a clone of one store to several
    /// layers to let them share state (state is per policy name and key).
    pub fn store<St2>(self, store: St2) -> RateLimitLayer<K, St2, M> {
        RateLimitLayer {
            store: self.store.rewrapped(store),
            config: self.config,
            body: PhantomData,
        }
    }

    /// Gives responses the inner service's own body type instead of
    /// [`ResponseBody`](crate::ResponseBody); the layer then builds its
    /// rejections with `From<Bytes>`, which axum's `Body` implements.
    ///
    /// Axum converts the responses of a layered route to its `Body`, and
    /// must box any other body type to do so: keeping axum's type saves
    /// that allocation on every response.
    ///
    /// ```
    /// use axum::{Router, routing::get};
    /// use tollgate::{Algorithm, GlobalKey, Policy, RateLimitLayer};
    ///
    /// let policy = Policy::new("api", Algorithm::Gcra, "100/min")?;
    /// let app: Router = Router::new()
    ///     .route("/", get(|| async { "hello" }))
    ///     .layer(RateLimitLayer::new(policy, GlobalKey).keep_body_type());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn keep_body_type(self) -> RateLimitLayer<K, St, KeepBody> {
        RateLimitLayer {
            store: self.store,
            config: self.config,
            body: PhantomData,
        }
    }

    /// The cost of each request (default 1). A cost of 0 only reads the
    /// state: requests are never denied (but for a key an operator
    /// blocked), and carry the headers.
    pub fn cost(mut self, cost: u64) -> Self {
        self.config.cost = cost;
        self
    }

    /// Settles each request's cost after its response, by `rule`: the
    /// layer reserves the request's cost before calling the inner service
    /// (denying as usual when it does not fit), then refunds the unused
    /// part or charges the rest, in one more store call (one round trip on
    /// Redis) made only when the actual cost differs. The response's
    /// headers show the state after settling. A charge past the allowance
    /// is debt that delays the key's next admission (see
    /// [`Settlement`](tollgate_core::Settlement) for each algorithm). If
    /// the settlement fails, the failure is reported like any store
    /// failure and the headers show the reservation's state; the
    /// reservation stands, unless the call timed out after the store took
    /// it (a remote store's reply can be lost or late: the settlement
    /// then holds, and this instance cannot know it). A settlement goes where its reservation was
    /// made: a request the local fallback decided (under
    /// [`FailureMode::Local`](crate::FailureMode::Local)) is settled there,
    /// never in the shared store, which did not charge it.
    ///
    /// A settlement under way runs to its end even if the response is
    /// dropped (its client went away, or a timeout), so that a usage
    /// ledger records what the store settled. A request whose response
    /// never came (dropped before it, or the inner service failed) is not
    /// settled: its reservation stands.
    ///
    /// Tokens of an LLM call, known when the handler is done: reserve an
    /// estimate, and let the handler report the real count with
    /// [`ActualCost`](crate::ActualCost).
    ///
    /// ```
    /// use axum::{Extension, Router, routing::post};
    /// use http::HeaderName;
    /// use tollgate::{ActualCost, Algorithm, HeaderKey, Policy, RateLimitLayer, Settle};
    ///
    /// let tokens = Policy::new("tokens", Algorithm::TokenBucket, "10000/min")?;
    /// let app: Router = Router::new()
    ///     .route("/complete", post(|| async { (Extension(ActualCost(412)), "...") }))
    ///     .route_layer(
    ///         RateLimitLayer::new(tokens, HeaderKey::new(HeaderName::from_static("x-api-key")))
    ///             .cost(500) // the estimate reserved up front
    ///             .settle(Settle::actual_cost()),
    ///     );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Brute-force protection that counts only failed logins:
    ///
    /// ```
    /// use axum::{Router, routing::post};
    /// use tollgate::{Algorithm, PeerIp, Policy, RateLimitLayer, Settle};
    ///
    /// let failures = Policy::new("login-failures", Algorithm::FixedWindow, "5/15min")?;
    /// let app: Router = Router::new()
    ///     .route("/login", post(|| async { "welcome" }))
    ///     .route_layer(
    ///         RateLimitLayer::new(failures, PeerIp::new())
    ///             .settle(Settle::count_only(|status| status.as_u16() >= 400)),
    ///     );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn settle(mut self, rule: Settle) -> Self {
        self.config.settle = Some(rule);
        self
    }

    /// Waits instead of rejecting: a denied request is held until the exact
    /// time it would be admitted and then checked again, as long as that
    /// is within `max_wait` of its arrival, or within its own gRPC
    /// deadline (`grpc-timeout`) if that is shorter; otherwise it is
    /// rejected as usual (at once, without waiting in vain). A request
    /// whose cost can never be admitted is rejected at once.
    ///
    /// Meant for clients: wrap a Tower client service (an HTTP client for a
    /// third-party API with a quota) so that every caller, on every machine
    /// sharing the store, paces its calls instead of failing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Algorithm, GlobalKey, Policy, RateLimitLayer};
    ///
    /// let quota = Policy::new("partner-api", Algorithm::SlidingLog, "25/5s")?;
    /// let layer = RateLimitLayer::new(quota, GlobalKey).wait(Duration::from_secs(30));
    /// # let _ = layer;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn wait(mut self, max_wait: Duration) -> Self {
        self.config.wait = Some(max_wait);
        self
    }

    /// Limits each request by the policy `choose` picks for it, or by the
    /// layer's own where it returns `None`: plan tiers (the plan the auth
    /// layer put into the request's extensions), per-tenant overrides, and
    /// the like. The key is the layer's extractor's, as before. `choose`
    /// returns a [`Policy`], or a [`Choice`](crate::Choice) with the
    /// request's cost under it.
    ///
    /// Each chosen policy keeps its own state (state belongs to a policy's
    /// name: give each plan its own), and the headers, the problem body
    /// and the metrics name it. Returning one of a fixed set of policies
    /// (a clone is a reference count) costs no allocation per request.
    ///
    /// ```
    /// use axum::body::Body;
    /// use axum::{Router, routing::get};
    /// use http::Request;
    /// use tollgate::{Algorithm, ExtensionKey, Policy, RateLimitLayer};
    ///
    /// #[derive(Clone, PartialEq)]
    /// enum Plan { Free, Pro }
    ///
    /// let free = Policy::new("api-free", Algorithm::Gcra, "60/h")?;
    /// let pro = Policy::new("api-pro", Algorithm::Gcra, "5000/h")?;
    /// let app: Router = Router::new()
    ///     .route("/api", get(|| async { "ok" }))
    ///     .layer(
    ///         RateLimitLayer::new(free, ExtensionKey::<String>::new()).choose_policy(
    ///             move |req: &Request<Body>| {
    ///                 (req.extensions().get::<Plan>() == Some(&Plan::Pro)).then(|| pro.clone())
    ///             },
    ///         ),
    ///     );
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn choose_policy<C>(self, choose: C) -> RateLimitLayer<ChosenPolicy<K, C>, St, M> {
        let Config {
            policy,
            extractor,
            cost,
            wait,
            settle,
            responder,
            overrides,
        } = self.config;
        RateLimitLayer {
            store: self.store,
            config: Config {
                policy,
                extractor: Arc::new(ChosenPolicy::new(extractor, choose)),
                cost,
                wait,
                settle,
                responder,
                overrides,
            },
            body: PhantomData,
        }
    }

    /// Limits each request by the policy of its plan in `plans` (see
    /// [`PlanMap`]): the plan's policy and cost, or the map's default for
    /// a request without a plan or of a plan the map does not name. The
    /// layer's own policy becomes the map's default (what a request
    /// without a key is answered under); its cost stays the cost of a
    /// choice without one. The same as
    /// [`choose_policy`](Self::choose_policy)`(plans)` but for that.
    ///
    /// ```
    /// use axum::body::Body;
    /// use axum::{Router, routing::get};
    /// use http::Request;
    /// use tollgate::{Algorithm, Choice, ExtensionKey, FakeClock, MemoryStore, PlanMap, Policy, RateLimitLayer};
    /// use tower::ServiceExt;
    ///
    /// #[derive(Clone)]
    /// struct Plan(&'static str);
    /// impl AsRef<str> for Plan {
    ///     fn as_ref(&self) -> &str { self.0 }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let free = Policy::new("export", Algorithm::TokenBucket, "50/h")?;
    /// let pro = Policy::new("export-pro", Algorithm::TokenBucket, "200/h")?;
    /// let plans = PlanMap::builder(free.clone())
    ///     .plan("pro", Choice::new(pro).cost(5))
    ///     .from_extension::<Plan>()?;
    /// let app = Router::new().route("/export", get(|| async { "..." })).route_layer(
    ///     RateLimitLayer::new(free, ExtensionKey::<String>::new())
    ///         .store(MemoryStore::builder().clock(FakeClock::default()).build()?)
    ///         .cost(10)
    ///         .plans(plans),
    /// );
    /// let export = |plan: Option<&'static str>| {
    ///     let mut req = Request::get("/export").body(Body::empty()).unwrap();
    ///     req.extensions_mut().insert("ada".to_string());
    ///     if let Some(plan) = plan {
    ///         req.extensions_mut().insert(Plan(plan));
    ///     }
    ///     req
    /// };
    /// let pro = app.clone().oneshot(export(Some("pro"))).await?;
    /// assert_eq!(pro.headers()["x-ratelimit-resource"], "export-pro");
    /// assert_eq!(pro.headers()["x-ratelimit-remaining"], "195");
    /// // A plan the map does not know is limited by the default.
    /// let team = app.oneshot(export(Some("team"))).await?;
    /// assert_eq!(team.headers()["x-ratelimit-resource"], "export");
    /// assert_eq!(team.headers()["x-ratelimit-remaining"], "40");
    /// # Ok(())
    /// # }
    /// ```
    pub fn plans<P>(
        mut self,
        plans: PlanMap<P>,
    ) -> RateLimitLayer<ChosenPolicy<K, PlanMap<P>>, St, M> {
        let default = plans.default_choice().policy();
        if default.name() != self.config.policy.name() {
            self.config.responder = Arc::new(self.config.responder.for_policy(default));
        }
        self.config.policy = default.clone();
        self.choose_policy(plans)
    }

    /// Applies each key's override from `source` ([`MemoryOverrides`],
    /// `tollgate_redis::RedisOverrides`, a [`CachedLookup`] of your
    /// database): under a policy (the layer's or a plan's), a key with
    /// an override in force is limited by its own limits, exempt (called
    /// through without asking the store, and without rate-limit
    /// headers), or denied (403; see [`Override`] for why). Its own
    /// limits keep the policy's name, so the key keeps what it used, and
    /// the headers tell its own limits. A request whose key has no
    /// override costs a local lookup (none while the source knows no
    /// override at all), never a round trip. Only a key the source has yet
    /// to hear of waits, for a bounded time, for the source's first answer
    /// ([`Applied::Pending`](crate::Applied::Pending)): a key's first
    /// requests on an instance under a [`CachedLookup`], and the requests
    /// of an instance whose `RedisOverrides` has not loaded yet.
    ///
    /// ```
    /// use http::Request;
    /// use tollgate::{
    ///     Algorithm, HeaderKey, MemoryOverrides, Override, OverrideStore, Policy, RateLimitLayer,
    ///     Key,
    /// };
    /// use tower::{ServiceBuilder, ServiceExt, service_fn};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let api = Policy::new("api", Algorithm::FixedWindow, "10/min")?;
    /// let overrides = MemoryOverrides::new();
    /// let layer = RateLimitLayer::new(api.clone(), HeaderKey::new(http::HeaderName::from_static("x-api-key")))
    ///     .overrides(overrides.clone());
    /// let svc = ServiceBuilder::new()
    ///     .layer(layer)
    ///     .service(service_fn(|_req: Request<()>| async {
    ///         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    ///     }));
    /// let request = |key: &str| Request::get("/").header("x-api-key", key).body(()).unwrap();
    ///
    /// overrides.set(&Key::header("acme"), &api, Override::limit("1000/min")?, None).await?;
    /// let raised = svc.clone().oneshot(request("acme")).await?;
    /// assert_eq!(raised.headers()["x-ratelimit-limit"], "1000");
    /// let plan = svc.clone().oneshot(request("bob")).await?;
    /// assert_eq!(plan.headers()["x-ratelimit-limit"], "10");
    ///
    /// overrides.set(&Key::header("mallory"), &api, Override::Deny, None).await?;
    /// let denied = svc.oneshot(request("mallory")).await?;
    /// assert_eq!(denied.status(), 403);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`MemoryOverrides`]: crate::MemoryOverrides
    /// [`CachedLookup`]: crate::CachedLookup
    /// [`Override`]: crate::Override
    pub fn overrides(mut self, source: impl OverrideSource) -> Self {
        self.config.overrides = Some(Arc::new(source));
        self
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.config.policy
    }

    /// The store.
    pub fn get_store(&self) -> &St {
        self.store.get_ref()
    }
}

impl<S, K, St: Store, M> Layer<S> for RateLimitLayer<K, St, M> {
    type Service = RateLimit<S, K, St, M>;

    fn layer(&self, inner: S) -> Self::Service {
        let mut config = self.config.clone();
        // Traces name the store: the one this layer has now.
        let store = self.store.get_ref().name();
        if config.responder.store != store {
            Arc::make_mut(&mut config.responder).store = store;
        }
        let responders = Responders::new(config.responder.clone());
        RateLimit::new(
            inner,
            Arc::new(Shared {
                store: self.store.clone(),
                config,
                responders,
            }),
        )
    }
}
