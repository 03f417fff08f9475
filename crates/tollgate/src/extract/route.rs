//! [`RouteKey`]: the method and matched route template (feature `axum`).

use std::borrow::Cow;

use http::Request;
use tollgate_core::Key;

use super::{KeyExtractor, MissingCause};

/// The request's method and matched route template (axum's
/// [`MatchedPath`](axum::extract::MatchedPath), such as `/users/{id}`), for
/// keys per route. Only the template is used, never the raw path, so
/// clients cannot mint new keys; for the same reason `HEAD` counts as
/// `GET` (axum answers it with the `GET` handler where the route has no
/// `HEAD` handler of its own; either way the two share a key), and every
/// method outside HTTP's standard ones shares one key per route. Requests outside
/// a matched route have no key; apply it with `Router::route_layer`.
///
/// ```
/// use axum::{Router, routing::get};
/// use tollgate::{Algorithm, ExtensionKey, Policy, RateLimitLayer, RouteKey};
///
/// let policy = Policy::new("per-user-per-route", Algorithm::Gcra, "10/s")?;
/// let app: Router = Router::new()
///     .route("/items/{id}", get(|| async { "item" }))
///     .route_layer(RateLimitLayer::new(policy, (RouteKey, ExtensionKey::<String>::new())));
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteKey;

impl<B> KeyExtractor<B> for RouteKey {
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        let path = request.extensions().get::<axum::extract::MatchedPath>()?;
        let method = Key::custom(method_name(request.method()));
        Some(Key::composite([&method, &Key::custom(path.as_str())]))
    }

    fn missing(&self, _: &Request<B>) -> MissingCause {
        MissingCause::Server(Cow::Borrowed(
            "no matched route: apply RouteKey with Router::route_layer",
        ))
    }
}

/// The method as a key's part: `HEAD` as `GET` (axum runs the `GET`
/// handler for it), and any method outside the standard ones as `other`,
/// so that a client inventing methods cannot mint keys.
fn method_name(method: &http::Method) -> &'static str {
    match method.as_str() {
        "GET" | "HEAD" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "PATCH" => "PATCH",
        "OPTIONS" => "OPTIONS",
        "CONNECT" => "CONNECT",
        "TRACE" => "TRACE",
        _ => "other",
    }
}
