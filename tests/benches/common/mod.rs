//! The route, keys and limiters the HTTP benches share, so that the wrk
//! bench and the in-process bench measure the same things: the
//! conditions of issue 31. The key is in the `Authorization` header, the
//! route answers a short JSON body, and every limiter admits 1,000,000 a
//! second with a burst of 1,000,000, so that nothing is refused and the
//! header numbers have six or seven digits.

use axum::Router;
use axum::routing::get;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Request};
use tollgate::HeaderKey;
use tollgate_core::{Algorithm, Policy};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;

/// Requests per second each key is allowed, and the burst.
pub(crate) const QUOTA: u64 = 1_000_000;

/// `tower_governor`'s key extractor for the `Authorization` header (its
/// key type must be owned, so it builds a `String` per request).
#[derive(Clone)]
pub(crate) struct Authorization;

impl KeyExtractor for Authorization {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<Self::Key, tower_governor::GovernorError> {
        req.headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or(tower_governor::GovernorError::UnableToExtractKey)
    }
}

/// The body every variant answers with.
pub(crate) const BODY: &str = r#"{"ok":true}"#;

/// The route every variant serves: `GET /` answers a short JSON body,
/// with its `content-type` (a static value, as axum's `Json` sets it).
pub(crate) fn route() -> Router {
    Router::new().route(
        "/",
        get(|| async {
            (
                [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
                BODY,
            )
        }),
    )
}

/// tollgate's key: the `Authorization` header.
pub(crate) fn header_key() -> HeaderKey {
    HeaderKey::new(AUTHORIZATION)
}

/// [`QUOTA`] per second per key with a burst of [`QUOTA`] (GCRA): far
/// above what even one hot key sees, so every request is admitted.
pub(crate) fn per_key() -> Policy {
    Policy::builder("bench")
        .algorithm(Algorithm::Gcra)
        .limit(format!("{QUOTA}/s").as_str())
        .burst(QUOTA)
        .build()
        .unwrap()
}

/// The route behind `tower_governor` with the same rate and burst, with
/// its `x-ratelimit-*` headers or without.
pub(crate) fn tower_governor_app(headers: bool) -> Router {
    let mut builder = GovernorConfigBuilder::default().key_extractor(Authorization);
    builder
        .per_nanosecond(1_000_000_000 / QUOTA)
        .burst_size(u32::try_from(QUOTA).unwrap());
    if headers {
        // `use_headers` returns a builder of another type.
        let config = builder.use_headers().finish().unwrap();
        return route().layer(GovernorLayer::new(config));
    }
    route().layer(GovernorLayer::new(builder.finish().unwrap()))
}
