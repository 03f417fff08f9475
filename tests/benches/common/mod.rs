//! The route, keys and limiters the HTTP benches share, so that the wrk
//! bench and the in-process bench measure the same things.

use axum::Router;
use axum::routing::get;
use http::{HeaderName, Request};
use tollgate::HeaderKey;
use tollgate_core::{Algorithm, Policy};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;

/// `tower_governor`'s key extractor for the `x-api-key` header (its key
/// type must be owned, so it builds a `String` per request).
#[derive(Clone)]
pub(crate) struct ApiKey;

impl KeyExtractor for ApiKey {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<Self::Key, tower_governor::GovernorError> {
        req.headers()
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or(tower_governor::GovernorError::UnableToExtractKey)
    }
}

/// The route every variant serves: `GET /` answers `ok`.
pub(crate) fn route() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

/// tollgate's key: the `x-api-key` header.
pub(crate) fn header_key() -> HeaderKey {
    HeaderKey::new(HeaderName::from_static("x-api-key"))
}

/// 9,999 per 50 ms per key (about 200,000 a second) with a burst of 9,999
/// (GCRA): far above what even one hot key sees, so every request is
/// admitted, with header values of at most four digits.
pub(crate) fn per_key() -> Policy {
    Policy::builder("bench")
        .algorithm(Algorithm::Gcra)
        .limit("9999/50ms")
        .burst(9_999)
        .build()
        .unwrap()
}

/// The route behind `tower_governor` with the same rate and burst, with
/// its `x-ratelimit-*` headers or without.
pub(crate) fn tower_governor_app(headers: bool) -> Router {
    let mut builder = GovernorConfigBuilder::default().key_extractor(ApiKey);
    builder.per_nanosecond(5_000).burst_size(9_999);
    if headers {
        // `use_headers` returns a builder of another type.
        let config = builder.use_headers().finish().unwrap();
        return route().layer(GovernorLayer::new(config));
    }
    route().layer(GovernorLayer::new(builder.finish().unwrap()))
}
