//! [`UsageStatus`]: a caller's `GET /usage`, as an axum handler.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, Request};
use axum::handler::Handler;
use axum::response::{IntoResponse, Response};
use tollgate_core::ledger::{Ledger, UsageQuery};
use tollgate_core::{Clock, ConfigError, Key, SystemClock};

use crate::answer::{UsageReport, bad_usage_query, status_unavailable};
use crate::extract::KeyExtractor;

use super::map::PlanMap;
use super::source::PlanSource;

/// What one route tells of a request: its key there, and the names of
/// the policies of every plan of the route.
type Route = Arc<dyn Fn(&Request) -> Option<(Key, Arc<[String]>)> + Send + Sync>;

/// A ready-made axum handler for a caller's `GET /usage`: the caller's
/// settled usage, from a usage ledger, under the policy of every plan of
/// every route given (a caller who changed plan sees both), as a
/// [`UsageReport`]. A route whose key the request does not have is left
/// out, and a policy is shown once.
///
/// The range comes from the query string (see
/// [`UsageQuery::from_params`]): `granularity` (`hour`, `day`, `month`;
/// `day` by default), `from` (the start of the current month in the
/// ledger's time zone by default) and `to` (now by default), each instant
/// in Unix seconds, RFC 3339 or a date. A parameter that does not parse,
/// or a range of more than 2,000 buckets, is answered 400 with
/// problem+json naming it; a ledger that fails, 503 with `Retry-After: 1`.
///
/// Give each route the key extractor and [`PlanMap`] of its layer, and the
/// ledger its layers' store records in (a
/// [`MeteredStore`](tollgate_core::ledger::MeteredStore)). Put the handler
/// behind the same auth layer as the routes.
///
/// ```
/// use axum::body::Body;
/// use axum::{Router, middleware, routing::get};
/// use http::Request;
/// use tollgate::{
///     Algorithm, ExtensionKey, MemoryStore, PlanMap, Policy, RateLimitLayer, UsageStatus,
/// };
/// use tollgate_core::ledger::{MemoryLedger, MeteredStore};
/// use tower::ServiceExt;
///
/// #[derive(Clone)]
/// struct Plan(&'static str);
/// impl AsRef<str> for Plan {
///     fn as_ref(&self) -> &str { self.0 }
/// }
///
/// async fn auth(mut req: Request<Body>, next: middleware::Next) -> axum::response::Response {
///     req.extensions_mut().insert("ada".to_string());
///     req.extensions_mut().insert(Plan("free"));
///     next.run(req).await
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ledger = MemoryLedger::new();
/// let store = MeteredStore::new(MemoryStore::new(), ledger.clone());
/// let plans = PlanMap::builder(Policy::new("items", Algorithm::Gcra, "10/min")?)
///     .plan("pro", Policy::new("items-pro", Algorithm::Gcra, "100/min")?)
///     .from_extension::<Plan>()?;
/// let user = ExtensionKey::<String>::new();
/// let items = RateLimitLayer::new(plans.default_choice().policy().clone(), user.clone())
///     .store(store)
///     .plans(plans.clone());
/// let app = Router::new()
///     .route("/items", get(|| async { "items" }).route_layer(items))
///     .route("/usage", get(UsageStatus::new(ledger).route(user, plans)))
///     .layer(middleware::from_fn(auth));
///
/// for _ in 0..3 {
///     app.clone().oneshot(Request::get("/items").body(Body::empty())?).await?;
/// }
/// let shown = app.clone().oneshot(Request::get("/usage").body(Body::empty())?).await?;
/// assert_eq!(shown.status(), 200);
/// let body = axum::body::to_bytes(shown.into_body(), 1 << 16).await?;
/// let json: serde_json::Value = serde_json::from_slice(&body)?;
/// assert_eq!(json["usage"]["items"]["total"], 3);
/// assert_eq!(json["usage"]["items-pro"]["total"], 0);
///
/// let bad = app.oneshot(Request::get("/usage?granularity=week").body(Body::empty())?).await?;
/// assert_eq!(bad.status(), 400);
/// # Ok(())
/// # }
/// ```
pub struct UsageStatus<L> {
    ledger: L,
    routes: Arc<[Route]>,
    clock: Arc<dyn Clock>,
}

impl<L> UsageStatus<L> {
    /// A handler that shows no route yet, reading `ledger`, with the
    /// system clock's now as the default end of the range.
    pub fn new(ledger: L) -> Self {
        Self {
            ledger,
            routes: Arc::new([]),
            clock: Arc::new(SystemClock),
        }
    }

    /// Shows, after the routes given before, the policies of every plan of
    /// the route whose layer keys requests by `key` and limits them by
    /// `plans`.
    #[must_use]
    pub fn route<K, P>(self, key: K, plans: PlanMap<P>) -> Self
    where
        K: KeyExtractor<Body>,
        P: PlanSource<Body>,
    {
        let names: Arc<[String]> = plans
            .family()
            .members()
            .iter()
            .map(|p| p.name().to_owned())
            .collect();
        let route: Route =
            Arc::new(move |request: &Request| Some((key.extract(request)?, names.clone())));
        let routes = self.routes.iter().cloned().chain([route]).collect();
        Self { routes, ..self }
    }

    /// The ledger it reads.
    pub fn ledger(&self) -> &L {
        &self.ledger
    }

    /// The clock whose now ends the default range (the system clock's by
    /// default): a fake clock in tests.
    #[must_use]
    pub fn clock(self, clock: impl Clock) -> Self {
        Self {
            clock: Arc::new(clock),
            ..self
        }
    }

    /// The range `request`'s query string asks for.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the parameter that does not parse.
    pub fn query(&self, request: &Request) -> Result<UsageQuery, ConfigError>
    where
        L: Ledger,
    {
        let params: HashMap<String, String> = Query::try_from_uri(request.uri())
            .map(|Query(params)| params)
            .map_err(|_| ConfigError::InvalidSetting {
                setting: "query",
                reason: "the query string does not parse",
            })?;
        let param = |name: &str| params.get(name).map(String::as_str);
        UsageQuery::from_params(
            self.ledger.settings(),
            self.clock.now(),
            param("granularity"),
            param("from"),
            param("to"),
        )
    }
}

impl<L: Clone> Clone for UsageStatus<L> {
    fn clone(&self) -> Self {
        Self {
            ledger: self.ledger.clone(),
            routes: self.routes.clone(),
            clock: self.clock.clone(),
        }
    }
}

impl<L: fmt::Debug> fmt::Debug for UsageStatus<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UsageStatus")
            .field("ledger", &self.ledger)
            .field("routes", &self.routes.len())
            .finish_non_exhaustive()
    }
}

/// Answers with the caller's [`UsageReport`], 400 or 503.
impl<L, S> Handler<UsageStatus<()>, S> for UsageStatus<L>
where
    L: Ledger + Clone,
{
    type Future = Pin<Box<dyn Future<Output = Response> + Send>>;

    fn call(self, request: Request, _state: S) -> Self::Future {
        let query = self.query(&request);
        let asked: Vec<(Key, Arc<[String]>)> =
            self.routes.iter().filter_map(|r| r(&request)).collect();
        Box::pin(async move {
            let query = match query {
                Ok(query) => query,
                Err(error) => return bad_usage_query(&error).map(Body::from),
            };
            let mut pairs: Vec<(&Key, &str)> = Vec::new();
            for (key, names) in &asked {
                for name in names.iter() {
                    pairs.push((key, name));
                }
            }
            match UsageReport::read_pairs(&self.ledger, pairs, query).await {
                Ok(report) => report.into_response(),
                Err(_) => status_unavailable().map(Body::from),
            }
        })
    }
}
