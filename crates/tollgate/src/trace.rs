//! The fields tollgate records on the request's `tracing` span.
//!
//! Each decision of a [`RateLimitLayer`](crate::RateLimitLayer) (and of a
//! [`RateLimiter`](crate::RateLimiter)) is recorded on the current span,
//! [`tracing::Span::current`], under the field names below. A span records
//! only the fields it declared when it was made, so declare them, empty,
//! on the span of each request (tower-http's `TraceLayer::make_span_with`,
//! or your own `info_span!`); a span without them records nothing, at the
//! cost of one look at its field names (none at all while no subscriber
//! was ever set).
//!
//! | field | recorded | value |
//! |---|---|---|
//! | [`POLICY`] | every decision, and every answer of the failure policy | the policy's name (a plan's policy, `items-read-pro`, when a plan chose it) |
//! | [`OUTCOME`] | every decision of a store (the local fallback's included) | `allowed`, `limited`, `shadow_limited`, as in [`telemetry::DECISIONS`](crate::telemetry::DECISIONS) |
//! | [`LIMIT`] | a refusal (`limited`) | the limit that fired, in its text form (`10/s`), as the `tollgate-exceeded` header names it; `blocked` for a key an operator blocked |
//! | [`STORE`] | with [`POLICY`] | the name of the store the layer asked ([`Store::name`](crate::Store::name): `memory`, `redis`, ...) |
//! | [`FALLBACK`] | when the store failed and the failure policy answered | `open`, `closed`, `local_allowed`, `local_limited`, as in [`telemetry::FALLBACKS`](crate::telemetry::FALLBACKS) |
//!
//! A request that passes several layers is recorded by each in turn, an
//! inner layer's record replacing an outer one's: the span ends with the
//! layer that refused it, or else with the innermost layer, which
//! admitted it (tracing-subscriber's `fmt` prints every record in turn,
//! `tollgate.policy="api-ip" ... tollgate.policy="items-read"`: the last
//! is the span's). [`LIMIT`] and [`FALLBACK`] are recorded only when they
//! apply (a span cannot unset a field), so they are left empty unless a
//! layer refused, or a layer's store failed.
//!
//! Under [`FailureMode::Open`](crate::FailureMode::Open) or
//! [`Closed`](crate::FailureMode::Closed) no store decided, and no
//! [`OUTCOME`] is recorded: [`FALLBACK`] says what became of the request,
//! and [`STORE`] which store failed. Under
//! [`Local`](crate::FailureMode::Local), the in-memory fallback
//! decided: [`OUTCOME`] is its decision, [`FALLBACK`] `local_allowed` or
//! `local_limited`, and [`STORE`] still the store that failed.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//!
//! use axum::{Router, body::Body, routing::get};
//! use http::Request;
//! use tollgate::{Algorithm, GlobalKey, Policy, RateLimitLayer, trace};
//! use tower::ServiceExt;
//! use tracing::{Instrument, field::Empty};
//!
//! # #[derive(Clone, Default)]
//! # struct Buffer(Arc<Mutex<Vec<u8>>>);
//! # impl std::io::Write for Buffer {
//! #     fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
//! #         self.0.lock().unwrap().extend_from_slice(bytes);
//! #         Ok(bytes.len())
//! #     }
//! #     fn flush(&mut self) -> std::io::Result<()> { Ok(()) }
//! # }
//! # let log = Buffer::default();
//! # let writer = log.clone();
//! # let subscriber = tracing_subscriber::fmt()
//! #     .with_writer(move || writer.clone())
//! #     .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
//! #     .with_ansi(false)
//! #     .finish();
//! # let _guard = tracing::subscriber::set_default(subscriber);
//! # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
//! let policy = Policy::new("api", Algorithm::Gcra, "1/min")?;
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(policy, GlobalKey));
//! for _ in 0..2 {
//!     // The request's span declares tollgate's fields, empty.
//!     let span = tracing::info_span!(
//!         "request",
//!         { trace::POLICY } = Empty,
//!         { trace::OUTCOME } = Empty,
//!         { trace::LIMIT } = Empty,
//!         { trace::STORE } = Empty,
//!         { trace::FALLBACK } = Empty,
//!     );
//!     let request = Request::get("/").body(Body::empty())?;
//!     app.clone().oneshot(request).instrument(span).await?;
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # let log = String::from_utf8(log.0.lock().unwrap().clone())?;
//! # let closed: Vec<&str> = log.lines().collect();
//! // The spans, as tracing-subscriber's `fmt` prints them when they close:
//! // the second request was refused by the limit `1/min`.
//! # assert!(closed[0].contains(
//! r#"request{tollgate.policy="api" tollgate.outcome="allowed" tollgate.store="memory"}"#
//! # ), "{log}");
//! # assert!(closed[1].contains(
//! r#"request{tollgate.policy="api" tollgate.outcome="limited" tollgate.limit=1/min tollgate.store="memory"}"#
//! # ), "{log}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

/// The span field of the policy that decided: its name.
pub const POLICY: &str = "tollgate.policy";

/// The span field of the decision's outcome: `allowed`, `limited` or
/// `shadow_limited`.
pub const OUTCOME: &str = "tollgate.outcome";

/// The span field of the limit that fired on a refusal, in its text form
/// (`10/s`).
pub const LIMIT: &str = "tollgate.limit";

/// The span field of the store the layer asked, by its
/// [`Store::name`](crate::Store::name): `memory`, `redis`, ...
pub const STORE: &str = "tollgate.store";

/// The span field of the failure policy's answer, when the store failed:
/// `open`, `closed`, `local_allowed` or `local_limited`.
pub const FALLBACK: &str = "tollgate.fallback";

/// What the name of every field of [`ALL`] starts with.
pub(crate) const PREFIX: &str = "tollgate.";

/// Every field tollgate records, to declare on a span at once.
///
/// ```
/// assert_eq!(tollgate::trace::ALL.len(), 5);
/// assert!(tollgate::trace::ALL.iter().all(|f| f.starts_with("tollgate.")));
/// ```
pub const ALL: [&str; 5] = [POLICY, OUTCOME, LIMIT, STORE, FALLBACK];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_starts_with_the_prefix_looked_for() {
        assert!(ALL.iter().all(|field| field.starts_with(PREFIX)));
        assert_eq!(PREFIX, "tollgate.");
    }
}
