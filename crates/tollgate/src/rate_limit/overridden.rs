//! What a key's override makes of a request: its own limits (and the
//! responder whose headers tell them), a pass, or a refusal.

use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use tollgate_core::{Applied, Key, OverrideSource, Policy};

use crate::response::Responder;

use super::responders::Responders;

/// What an override in force makes of a request.
pub(super) enum Overridden {
    /// Decided under the key's own limits (the policy's name), told by
    /// this responder.
    Limits(Policy, Arc<Responder>),
    /// Called through without asking the store, and without headers.
    Exempt,
    /// Refused with this answer (403).
    Denied(Response<Bytes>),
    /// Not known yet: the source's first lookup of the key is under way.
    Pending,
}

/// What `key`'s override under `policy`, if `source` has one in force,
/// makes of its request. Kept out of `call`, whose code stays small.
#[inline(never)]
pub(super) fn overridden(
    responders: &Responders,
    source: &dyn OverrideSource,
    key: &Key,
    policy: &Policy,
    responder: &Arc<Responder>,
) -> Option<Overridden> {
    Some(match source.applied(key, policy)? {
        Applied::Limits(own) => {
            let responder = responders.overridden(responder, &own);
            Overridden::Limits(own, responder)
        }
        Applied::Exempt => Overridden::Exempt,
        Applied::Deny { ends_in } => Overridden::Denied(responder.denied_by_operator(ends_in)),
        Applied::Pending => Overridden::Pending,
    })
}
