//! [`RateLimitStatus`]: a caller's `GET /rate_limit`, as an axum handler.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::handler::Handler;
use axum::response::{IntoResponse, Response};
use tollgate_core::{Key, OverrideSource, Policy, Store, StoreError};

use crate::answer::{RateLimitReport, status_unavailable};
use crate::extract::KeyExtractor;
use crate::overrides::own_limits;

use super::map::PlanMap;
use super::source::PlanSource;

/// What one route tells of a request: its key there, and the policy of
/// its plan.
type Route = Arc<dyn Fn(&Request) -> Option<(Key, Policy)> + Send + Sync>;

/// A ready-made axum handler for a caller's `GET /rate_limit`: the
/// caller's state under the policy of their plan on every route given,
/// in the JSON of GitHub's endpoint of that name (see
/// [`RateLimitReport`]), consuming nothing. A route whose key the request
/// does not have (a route keyed by user, for an anonymous caller) is left
/// out, and a route of a policy shown already is not shown twice. When
/// the store fails, the answer is 503 with `Retry-After: 1`, as a
/// request refused under a closed failure mode.
///
/// Give each route the key extractor and [`PlanMap`] of its layer, and the
/// store the layers share. Put the handler behind the same auth layer as
/// the routes, so that the caller's key and plan are in the request.
///
/// ```
/// use axum::body::Body;
/// use axum::{Router, middleware, routing::get};
/// use http::Request;
/// use tollgate::{
///     Algorithm, ExtensionKey, MemoryStore, PlanMap, Policy, RateLimitLayer, RateLimitStatus,
/// };
/// use tower::ServiceExt;
///
/// #[derive(Clone)]
/// struct Plan(&'static str);
/// impl AsRef<str> for Plan {
///     fn as_ref(&self) -> &str { self.0 }
/// }
///
/// /// Stands in for your auth: ada is on the pro plan.
/// async fn auth(mut req: Request<Body>, next: middleware::Next) -> axum::response::Response {
///     req.extensions_mut().insert("ada".to_string());
///     req.extensions_mut().insert(Plan("pro"));
///     next.run(req).await
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let plans = PlanMap::builder(Policy::new("items", Algorithm::Gcra, "10/min")?)
///     .plan("pro", Policy::new("items-pro", Algorithm::Gcra, "100/min")?)
///     .from_extension::<Plan>()?;
/// let user = ExtensionKey::<String>::new();
/// let items = RateLimitLayer::new(plans.default_choice().policy().clone(), user.clone())
///     .store(store.clone())
///     .plans(plans.clone());
/// let app = Router::new()
///     .route("/items", get(|| async { "items" }).route_layer(items))
///     .route("/rate_limit", get(RateLimitStatus::new(store).route(user, plans)))
///     .layer(middleware::from_fn(auth));
///
/// app.clone().oneshot(Request::get("/items").body(Body::empty())?).await?;
/// let shown = app.oneshot(Request::get("/rate_limit").body(Body::empty())?).await?;
/// assert_eq!(shown.status(), 200);
/// let body = axum::body::to_bytes(shown.into_body(), 1 << 16).await?;
/// let json: serde_json::Value = serde_json::from_slice(&body)?;
/// let pro = &json["resources"]["items-pro"];
/// assert_eq!((&pro["limit"], &pro["used"], &pro["remaining"]), (&100.into(), &1.into(), &99.into()));
/// assert_eq!(pro["resource"], "items-pro");
/// assert_eq!(json["rate"], *pro);
/// # Ok(())
/// # }
/// ```
pub struct RateLimitStatus<St> {
    store: St,
    routes: Arc<[Route]>,
    overrides: Option<Arc<dyn OverrideSource>>,
}

impl<St> RateLimitStatus<St> {
    /// A handler that shows no route yet, reading `store`.
    pub fn new(store: St) -> Self {
        Self {
            store,
            routes: Arc::new([]),
            overrides: None,
        }
    }

    /// Shows each caller's own limits where an override from `source`
    /// gives them (the source the routes' layers apply): the limit,
    /// remaining and reset of the key's own limits under the policy's
    /// name. An exempt or denied caller is shown the policy's state.
    #[must_use]
    pub fn overrides(mut self, source: impl OverrideSource) -> Self {
        self.overrides = Some(Arc::new(source));
        self
    }

    /// Shows, after the routes given before, the route whose layer keys
    /// requests by `key` and limits them by `plans`.
    #[must_use]
    pub fn route<K, P>(self, key: K, plans: PlanMap<P>) -> Self
    where
        K: KeyExtractor<Body>,
        P: PlanSource<Body>,
    {
        let route: Route = Arc::new(move |request: &Request| {
            let key = key.extract(request)?;
            Some((key, plans.choose(request).policy().clone()))
        });
        let routes = self.routes.iter().cloned().chain([route]).collect();
        Self {
            store: self.store,
            routes,
            overrides: self.overrides,
        }
    }

    /// The report of `request`'s caller: what the handler answers with.
    /// The request is read at once (its keys and plans); the future asks
    /// the store, after the first answer of a key's overrides where an
    /// override source is still looking it up.
    ///
    /// # Errors
    ///
    /// The first [`StoreError`] met; the routes after it are not asked.
    pub fn report(
        &self,
        request: &Request,
    ) -> impl Future<Output = Result<RateLimitReport, StoreError>> + Send + '_
    where
        St: Store + Sync,
    {
        let asked: Vec<(Key, Policy)> = self.routes.iter().filter_map(|r| r(request)).collect();
        async move {
            let mut states = Vec::with_capacity(asked.len());
            for (key, policy) in asked {
                let own = own_limits(self.overrides.as_deref(), &key, &policy).await;
                let policy = own.unwrap_or(policy);
                let state = self.store.status(&key, &policy).await?;
                states.push((policy, state));
            }
            Ok(RateLimitReport::new(states))
        }
    }
}

impl<St: Clone> Clone for RateLimitStatus<St> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            routes: self.routes.clone(),
            overrides: self.overrides.clone(),
        }
    }
}

impl<St: fmt::Debug> fmt::Debug for RateLimitStatus<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitStatus")
            .field("store", &self.store)
            .field("routes", &self.routes.len())
            .finish()
    }
}

/// Answers with the caller's [`report`](RateLimitStatus::report), or 503.
impl<St, S> Handler<RateLimitStatus<()>, S> for RateLimitStatus<St>
where
    St: Store + Clone + Send + Sync + 'static,
{
    type Future = Pin<Box<dyn Future<Output = Response> + Send>>;

    fn call(self, request: Request, _state: S) -> Self::Future {
        Box::pin(async move {
            match self.report(&request).await {
                Ok(report) => IntoResponse::into_response(report),
                Err(_) => status_unavailable().map(Body::from),
            }
        })
    }
}
