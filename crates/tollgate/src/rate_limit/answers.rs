//! [`RateLimitLayer`]'s settings of how it answers: its headers, its
//! rejections, shadow mode and the enforcement ramp, missing keys, store
//! failures, and gRPC.

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use tollgate_core::{ConfigError, Decision, MemoryStore};

use crate::answer::MissingKey;
use crate::answer::headers::HeaderStyle;
use crate::fallback::{FailureMode, InstanceCount};
use crate::macros::{failure_setters, grpc_setter};
use crate::response::Responder;

use super::layer::RateLimitLayer;

impl<K, St, M> RateLimitLayer<K, St, M> {
    /// The layer's answer settings, for a setter to change: the layer's
    /// own copy, shared by the services it made before.
    fn responder_mut(&mut self) -> &mut Responder {
        Arc::make_mut(&mut self.config.responder)
    }

    /// Which rate-limit headers to send (default [`HeaderStyle::GitHub`]).
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.responder_mut().headers = style;
        self
    }

    /// The status of a rejection (default 429). GitHub-compatible clients
    /// may expect 403.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidValue`] when `status` is not a client or
    /// server error (4xx or 5xx): a client would take a rejection with
    /// any other status for its answer.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate::{Algorithm, GlobalKey, Policy, RateLimitLayer};
    ///
    /// let policy = Policy::new("api", Algorithm::Gcra, "100/min")?;
    /// let layer = RateLimitLayer::new(policy.clone(), GlobalKey).rejection_status(StatusCode::FORBIDDEN)?;
    /// # let _ = layer;
    /// assert!(RateLimitLayer::new(policy, GlobalKey).rejection_status(StatusCode::OK).is_err());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn rejection_status(mut self, status: StatusCode) -> Result<Self, ConfigError> {
        self.responder_mut().status = an_error_status("rejection_status", status)?;
        Ok(self)
    }

    /// Builds rejections with `f` instead of the problem+json response.
    /// The layer still adds the rate-limit headers, and `Retry-After` unless
    /// `f` set one.
    pub fn rejection<F>(mut self, f: F) -> Self
    where
        F: Fn(&Decision) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.responder_mut().custom = Some(Arc::new(f));
        self
    }

    grpc_setter! {
        /// Answers as a gRPC server: rejections become trailers-only responses
        /// with `grpc-status` 8 (`RESOURCE_EXHAUSTED`) and a `grpc-message`,
        /// carrying the rate-limit headers and `retry-after` (seconds) as
        /// metadata, and the wait until the request would be admitted in the
        /// two forms gRPC clients read: `grpc-retry-pushback-ms` (gRFC A6's
        /// retry policy; whole milliseconds, rounded up, or -1 for a request
        /// that can never be admitted, which tells the client not to retry)
        /// and a `google.rpc.RetryInfo` in `grpc-status-details-bin` (exact,
        /// read by `tonic-types`' `StatusExt::get_details_retry_info`). A
        /// missing key becomes the code nearest its status:
        /// `INVALID_ARGUMENT` for the client's mistake (a 400), `INTERNAL`
        /// for the server's (a 500), `UNAUTHENTICATED` / `PERMISSION_DENIED`
        /// for a 401 / 403 [`MissingKey::Reject`]; a store failure in closed
        /// mode `UNAVAILABLE` with a pushback of a second.
    }

    /// Shadow mode, a dry run: the policy decides, records and adds its
    /// headers, but never rejects over the limit. Requests it would have
    /// rejected are served and counted as `shadow_limited` in
    /// [`telemetry::DECISIONS`](crate::telemetry::DECISIONS), with a debug
    /// event each, so a new policy can be tried on real traffic before it
    /// is enforced. The same as `enforce_percent(0)`.
    ///
    /// What an operator decided is enforced all the same: a key blocked
    /// with [`Store::block`](tollgate_core::Store::block) (or
    /// [`RateLimiter::block`](crate::RateLimiter::block)) is rejected until
    /// the block ends, and an override's deny answers 403, as without
    /// shadow mode.
    ///
    /// ```
    /// use axum::{Router, body::Body, routing::get};
    /// use http::{Request, StatusCode};
    /// use tollgate::{Algorithm, GlobalKey, Policy, RateLimitLayer};
    /// use tower::ServiceExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let policy = Policy::new("new-limit", Algorithm::FixedWindow, "1/h")?;
    /// let app = Router::new()
    ///     .route("/", get(|| async { "ok" }))
    ///     .layer(RateLimitLayer::new(policy, GlobalKey).shadow());
    ///
    /// for _ in 0..3 {
    ///     let response = app.clone().oneshot(Request::get("/").body(Body::empty())?).await?;
    ///     assert_eq!(response.status(), StatusCode::OK);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn shadow(mut self) -> Self {
        self.responder_mut().enforce_percent = 0;
        self
    }

    /// Enforces the policy for `percent` of keys and runs it in
    /// [shadow mode](RateLimitLayer::shadow) for the rest: a ramp for
    /// rolling a policy out. Which keys are enforced depends only on the
    /// key (a fixed hash, the same on every machine), and raising the
    /// percentage keeps every key enforced so far. 100 (the default)
    /// enforces every key.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] when `percent` is over 100.
    ///
    /// ```
    /// use tollgate::{Algorithm, GlobalKey, Policy, RateLimitLayer};
    ///
    /// let policy = Policy::new("api", Algorithm::Gcra, "100/min")?;
    /// let layer = RateLimitLayer::new(policy.clone(), GlobalKey).enforce_percent(10)?;
    /// # let _ = layer;
    /// assert!(RateLimitLayer::new(policy, GlobalKey).enforce_percent(101).is_err());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn enforce_percent(mut self, percent: u8) -> Result<Self, ConfigError> {
        if percent > 100 {
            return Err(ConfigError::InvalidSetting {
                setting: "enforce_percent",
                reason: "must be between 0 and 100",
            });
        }
        self.responder_mut().enforce_percent = percent;
        Ok(self)
    }

    /// What to do with a request that yields no key (default
    /// [`MissingKey::ByCause`]).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidValue`] for a [`MissingKey::Reject`] whose
    /// status is not a client or server error (4xx or 5xx).
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate::{Algorithm, GlobalKey, MissingKey, Policy, RateLimitLayer};
    ///
    /// let policy = Policy::new("api", Algorithm::Gcra, "100/min")?;
    /// let layer = RateLimitLayer::new(policy.clone(), GlobalKey)
    ///     .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))?;
    /// # let _ = layer;
    /// let redirect = MissingKey::Reject(StatusCode::FOUND);
    /// assert!(RateLimitLayer::new(policy, GlobalKey).on_missing_key(redirect).is_err());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn on_missing_key(mut self, missing: MissingKey) -> Result<Self, ConfigError> {
        self.responder_mut().missing = match missing {
            MissingKey::Reject(status) => {
                MissingKey::Reject(an_error_status("on_missing_key", status)?)
            }
            MissingKey::ByCause | MissingKey::Error | MissingKey::Allow => missing,
        };
        Ok(self)
    }

    failure_setters! {
        store;
        /// What to do when the store fails (default [`FailureMode::Local`]).
        on_store_error;
        /// How many instances share the limit, for [`FailureMode::Local`]:
        /// while the store fails, each instance enforces its share, the
        /// policy's limits divided by `instances` (see [`Policy::divided`](crate::Policy::divided)).
        /// Default 1: each instance enforces the whole limit.
        local_divisor;
        /// The instance count as a handle that may change at runtime, for
        /// fleets that autoscale (see [`InstanceCount`](crate::InstanceCount)),
        /// in place of a fixed `local_divisor`.
        local_instances;
        /// The in-memory store [`FailureMode::Local`] decides with (default:
        /// [`shared_fallback`](crate::shared_fallback), one store for every layer of the process).
        local_fallback;
    }
}

/// `status`, if it is a client or server error (4xx or 5xx): the status of
/// an answer that refuses a request, as `setting` sets.
fn an_error_status(setting: &'static str, status: StatusCode) -> Result<StatusCode, ConfigError> {
    match status.is_client_error() || status.is_server_error() {
        true => Ok(status),
        false => Err(ConfigError::InvalidValue {
            setting,
            value: status.as_u16().to_string(),
            reason: "a refusal's status must be a client or server error (4xx or 5xx)",
        }),
    }
}
