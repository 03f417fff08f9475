//! Cost settled after the response: [`ActualCost`], the rule a layer
//! settles by, and the call a request carries to settle.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::{Extensions, StatusCode};
use tollgate_core::{DecidedBy, Decision, StoreError, Timestamp};

use crate::fallback::Reserved;

/// What a request really cost, put into its response's extensions by the
/// handler, for a layer that settles costs
/// ([`RateLimitLayer::settle`](crate::RateLimitLayer::settle)): the layer
/// reserved the request's cost before calling the handler, and now refunds
/// the unused part or charges the rest (see
/// [`Settlement`](tollgate_core::Settlement) for what a charge past the
/// allowance does). The response's rate-limit headers then show the state
/// after settling.
///
/// ```
/// use axum::response::IntoResponse;
/// use tollgate::ActualCost;
///
/// async fn complete() -> impl IntoResponse {
///     let tokens_used = 412; // what the model really produced
///     (axum::Extension(ActualCost(tokens_used)), "...")
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActualCost(pub u64);

/// How a layer settles each request's cost after its response (see
/// [`RateLimitLayer::settle`](crate::RateLimitLayer::settle)).
///
/// A response that carries [`ActualCost`] is settled to it, whatever the
/// rule. Otherwise the rule decides:
///
/// ```
/// use tollgate::Settle;
///
/// // Only what the handler reports: a response without ActualCost keeps
/// // its reservation.
/// let tokens = Settle::actual_cost();
/// // Only failed logins count: a response below 400 is refunded.
/// let failures = Settle::count_only(|status| status.as_u16() >= 400);
/// # let _ = (tokens, failures);
/// ```
#[derive(Clone)]
pub struct Settle {
    count: Option<Arc<dyn Fn(StatusCode) -> bool + Send + Sync>>,
}

impl Settle {
    /// Settles a response that carries [`ActualCost`] to it; others keep
    /// what they reserved.
    pub fn actual_cost() -> Self {
        Self { count: None }
    }

    /// Counts a response only if `counts` says so of its status: one it
    /// does not count is refunded in full. (A response that carries
    /// [`ActualCost`] is settled to it.) Every request still reserves its
    /// cost first, so concurrent requests cannot slip past the limit while
    /// their outcome is unknown. On a [gRPC](crate::RateLimitLayer::grpc)
    /// layer, a call's status is its code's when its answer carries one in
    /// its headers (a trailers-only answer, as tonic gives every error),
    /// mapped as grpc-gateway maps them: `UNAUTHENTICATED` is 401,
    /// `PERMISSION_DENIED` 403, `INVALID_ARGUMENT` 400, `INTERNAL` 500, and
    /// so on; a call whose code comes in trailers, after its messages, is a
    /// 200.
    pub fn count_only(counts: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Self {
        Self {
            count: Some(Arc::new(counts)),
        }
    }

    /// The actual cost of a response with `status` and `extensions` whose
    /// request reserved `reserved`.
    pub(crate) fn actual(&self, status: StatusCode, extensions: &Extensions, reserved: u64) -> u64 {
        if let Some(ActualCost(actual)) = extensions.get() {
            return *actual;
        }
        match &self.count {
            Some(counts) if !counts(status) => 0,
            _ => reserved,
        }
    }
}

impl fmt::Debug for Settle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rule = if self.count.is_some() {
            "count_only"
        } else {
            "actual_cost"
        };
        f.debug_tuple("Settle").field(&rule).finish()
    }
}

/// What an admitted request of a settling layer carries to settle its
/// cost once its response is in.
pub(crate) struct Settling {
    reservation: Reservation,
    reserved: Reserved,
    call: SettleCall,
}

/// Of a reservation, what its settlement carries: its time, and who
/// decided it (which a store with a fallback of its own, under the layer's,
/// settles by).
#[derive(Clone, Copy)]
pub(crate) struct Reservation {
    pub(crate) at: Timestamp,
    pub(crate) by: DecidedBy,
}

/// The store call of a settlement: given the reservation and where it was
/// made, the response's status and extensions, the call to await, or
/// `None` when the request cost what it reserved.
pub(crate) type SettleCall =
    Box<dyn FnOnce(Reservation, Reserved, StatusCode, &Extensions) -> Option<Settled> + Send>;

/// A settlement on its way to the store.
pub(crate) type Settled = Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + Send>>;

impl Settling {
    /// The settlement of the request `reservation` admitted, made where
    /// `reserved` says.
    pub(crate) fn new(reservation: &Decision, reserved: Reserved, call: SettleCall) -> Self {
        Self {
            reservation: Reservation {
                at: reservation.reserved_at(),
                by: reservation.decided_by(),
            },
            reserved,
            call,
        }
    }

    /// The settlement of a response with `status` and `extensions`, if one
    /// is due: on its way to its end on the runtime, whether or not the
    /// response is still awaited. A client gone, or a timeout, while it
    /// is on its way would drop it after the store may have settled, and
    /// before a usage ledger recorded it (`MeteredStore`): the ledger would
    /// keep the reservation where the limit counts the actual cost.
    pub(crate) fn start(self, status: StatusCode, extensions: &Extensions) -> Option<Settled> {
        let settled = (self.call)(self.reservation, self.reserved, status, extensions)?;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Some(settled);
        };
        let settling = runtime.spawn(settled);
        Some(Box::pin(async move {
            // Its runtime shut down, or it panicked.
            settling
                .await
                .unwrap_or_else(|error| Err(StoreError::backend(error)))
        }))
    }
}
