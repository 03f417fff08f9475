//! Exact rate limiting for Axum, Tonic and any Tower service, on an
//! embedded in-memory store or, with `tollgate-redis`, shared across many
//! servers through Redis.
//!
//! Add a [`RateLimitLayer`] with a [`Policy`] and a [key
//! extractor](KeyExtractor). Every response of the route carries
//! GitHub-style `x-ratelimit-*` headers; a denied request gets a 429 with
//! `Retry-After` (whole seconds, rounded up) and an `application/problem+json`
//! body.
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, body::Body, routing::get};
//! use http::{Request, StatusCode};
//! use tollgate::{Algorithm, FakeClock, GlobalKey, MemoryStore, Policy, RateLimitLayer, Timestamp};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = FakeClock::new(Timestamp::from_secs(1_700_000_040));
//! let store = MemoryStore::builder().clock(clock.clone()).build()?;
//! let policy = Policy::new("hello", Algorithm::FixedWindow, "2/min")?;
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(policy, GlobalKey).store(store));
//!
//! let request = || Request::get("/").body(Body::empty()).unwrap();
//! let first = app.clone().oneshot(request()).await?;
//! assert_eq!(first.status(), StatusCode::OK);
//! assert_eq!(first.headers()["x-ratelimit-remaining"], "1");
//! assert_eq!(first.headers()["x-ratelimit-reset"], "1700000100");
//!
//! app.clone().oneshot(request()).await?;
//! let third = app.clone().oneshot(request()).await?;
//! assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(third.headers()["retry-after"], "60");
//!
//! clock.advance(Duration::from_secs(60));
//! assert_eq!(app.oneshot(request()).await?.status(), StatusCode::OK);
//! # Ok(())
//! # }
//! ```
//!
//! # Keys
//!
//! A key extractor is a closure `Fn(&Request<B>) -> Option<Key>` or one of
//! [`GlobalKey`], [`HeaderKey`], [`ExtensionKey`] (an authenticated user id
//! put into request extensions by your auth layer) and `PeerIp` (the socket
//! peer, with IPv6 grouped by /56). A request without a key is never
//! counted against a shared bucket. By default it is answered by whose
//! mistake it is ([`MissingKey`], [`MissingCause`]): 400 when the client left
//! out what it must send (a header), 401 when it is not authenticated, 500
//! when the server is wired without what the key needs; the log says so at
//! most once a second.
//!
//! Behind a reverse proxy the socket peer is the proxy. Do not key by the
//! leftmost `X-Forwarded-For` entry: clients write it themselves.
//!
//! # Guides
//!
//! - [Choosing an algorithm](guides::choosing_an_algorithm): burst and
//!   smoothness trade-offs with numbers; shaping against policing.
//! - [Keys behind proxies and IPv6](guides::keys_and_proxies).
//! - [Running on Redis and Redis Cluster](guides::redis).
//! - [Failure modes](guides::failure_modes): store outages, full stores,
//!   missing keys, bad configuration.
//! - [Outbound calls and job throttling](guides::outbound_and_jobs).
//! - [Observing and rolling out policies](guides::observability): metrics,
//!   shadow mode, enforcement ramps and the `tollgate-sim` replay tool.
//! - [Plans, costs and operators](guides::plans_costs_and_operators): a
//!   policy per plan ([`PlanMap`]), a caller's `GET /rate_limit`, cost
//!   settled after the response
//!   ([`RateLimitLayer::settle`], [`ActualCost`]), inspecting, resetting
//!   and blocking keys, and requests in flight ([`InFlightLayer`]).
//! - [Protecting the service itself](guides::protecting_the_service): an
//!   adaptive concurrency limit that sheds the least important requests
//!   first ([`AdaptiveConcurrencyLayer`]).
//!
//! # Outside HTTP
//!
//! [`RateLimiter`] offers `check`, `check_n` and a bounded
//! `until_ready` wait for jobs and outbound calls, and `settle`, `status`,
//! `reset` and `block` for work whose cost is known afterwards and for
//! operators.
//!
//! # Feature flags
//!
//! | feature | default | enables |
//! |---|---|---|
//! | `axum` | yes | peer addresses from axum's `ConnectInfo`, `RouteKey`, the `GET /rate_limit` handler `RateLimitStatus` and the `GET /usage` handler `UsageStatus` |
//! | `tonic` | no | peer addresses from Tonic's `TcpConnectInfo` |
//! | `metrics` | no | [counters and gauges](telemetry) through the `metrics` facade |

mod adaptive;
mod answer;
mod body;
mod clock;
mod extract;
mod fallback;
mod home;
mod in_flight;
mod limiter;
mod macros;
mod overrides;
mod plans;
mod rate_limit;
mod ready;
mod report;
mod response;
pub mod trace;

pub use adaptive::{
    AdaptiveConcurrency, AdaptiveConcurrencyLayer, AdaptiveHandle, Classify, SameClass,
};
pub use answer::headers;
pub use answer::{CONCURRENCY_LIMIT, MissingKey, RateLimitReport, UsageReport, rejection};
pub use body::ResponseBody;
pub use clock::TokioClock;
#[cfg(feature = "axum")]
pub use extract::RouteKey;
pub use extract::{ClientIp, ForwardedHeader, PeerIp, peer_addr};
pub use extract::{ExtensionKey, GlobalKey, HeaderKey, KeyExtractor, MissingCause, ToKey};
pub use fallback::{
    FailureMode, FallbackStore, InstanceCount, UnknownFailureMode, shared_fallback,
};
pub use headers::HeaderStyle;
pub use in_flight::{InFlight, InFlightBody, InFlightLayer};
pub use limiter::{Jitter, RateLimiter, WaitError};
pub use overrides::{CachedLookup, CachedLookupBuilder, OverrideLookup};
pub use plans::{PlanExtension, PlanMap, PlanMapBuilder, PlanSource};
#[cfg(feature = "axum")]
pub use plans::{RateLimitStatus, UsageStatus};
pub use rate_limit::{
    ActualCost, BodyKind, Choice, ChosenPolicy, KeepBody, RateLimit, RateLimitLayer,
    ResponseFuture, Settle, WrapBody,
};
pub use report::LogThrottle;
pub use tollgate_core::ledger;
pub use tollgate_core::telemetry;
pub use tollgate_core::topkeys;

pub use tollgate_core::{
    AdaptiveLimit, AdaptiveLimitBuilder, Completion, ConcurrencySnapshot, LimitAlgorithm, Priority,
};
pub use tollgate_core::{
    Algorithm, Applied, BoxStore, Calendar, Clock, ConfigError, DecidedBy, Decision, FakeClock,
    FirstAnswer, InFlightLimit, Key, KeyKind, Limit, LimitStatus, MemoryOverrides, MemoryStore,
    Outcome, Override, OverrideError, OverrideSource, OverrideStore, OverrideTable, Policy,
    PolicyBuilder, PolicyFamily, Renewal, Settlement, SlotStore, Slots, Store, StoreError,
    SystemClock, Timestamp, TypeTag,
};

/// Guides: how to choose, key, run, observe and roll out limits.
///
/// The same pages are in the crate's `guides/` folder; every code block
/// in them is compiled as a doctest, and run unless it needs a Redis
/// server (marked `no_run`).
pub mod guides {
    #[doc = include_str!("../guides/choosing-an-algorithm.md")]
    pub mod choosing_an_algorithm {}

    #[doc = include_str!("../guides/keys-and-proxies.md")]
    pub mod keys_and_proxies {}

    #[doc = include_str!("../guides/redis.md")]
    pub mod redis {}

    #[doc = include_str!("../guides/failure-modes.md")]
    pub mod failure_modes {}

    #[doc = include_str!("../guides/outbound-and-jobs.md")]
    pub mod outbound_and_jobs {}

    #[doc = include_str!("../guides/observability.md")]
    pub mod observability {}

    #[doc = include_str!("../guides/plans-costs-and-operators.md")]
    pub mod plans_costs_and_operators {}

    #[doc = include_str!("../guides/tonic.md")]
    pub mod tonic {}

    #[doc = include_str!("../guides/protecting-the-service.md")]
    pub mod protecting_the_service {}
}
