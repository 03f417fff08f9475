//! A key's override, for a limiter: what its check decides under it.

use std::time::Duration;

use tollgate_core::{
    Applied, DecidedBy, Decision, Key, LimitStatus, Outcome, OverrideSource, Policy,
};

use crate::fallback::let_through;

/// What `key`'s override under `policy` makes of a check of `cost`: the
/// key's own limits to check under, or the decision itself.
pub(super) enum Checked {
    /// Check under these limits (the policy's name, the key's own limits).
    Limits(Policy),
    /// Decided without the store.
    Decided(Decision),
    /// Not known yet: the source's first lookup of the key is under way.
    Pending,
}

/// What `source` says of `key` under `policy`, for a check of `cost`: an
/// exempt key is admitted without the store, reported with every limit
/// full (as a request let through); a denied one is refused, for the rest
/// of the deny if it expires, or for good
/// ([`Outcome::CostExceedsCapacity`] of a capacity of 0: no waiting admits
/// it, so `until_ready` returns at once). [`denial`] tells such a refusal
/// from the store's.
pub(super) fn checked(
    source: &dyn OverrideSource,
    key: &Key,
    policy: &Policy,
    cost: u64,
) -> Option<Checked> {
    if source.is_empty() {
        return None;
    }
    Some(match source.applied(key, policy)? {
        Applied::Limits(own) => Checked::Limits(own),
        Applied::Exempt => Checked::Decided(let_through(policy).with_cost(cost)),
        Applied::Deny { ends_in } => {
            let outcome = match ends_in {
                Some(retry_after) => Outcome::Limited { retry_after },
                None => Outcome::CostExceedsCapacity { cost, capacity: 0 },
            };
            // Every limit is back, for the key, when the deny ends.
            let reset = ends_in.unwrap_or(Duration::ZERO);
            let empty = (policy.params().iter().enumerate())
                .map(|(i, p)| LimitStatus::new(i, p.limit, p.capacity, 0, reset, ends_in));
            let now = tollgate_core::Clock::now(&tollgate_core::SystemClock);
            Checked::Decided(
                Decision::new(policy, outcome, now, Duration::ZERO, empty)
                    .with_cost(cost)
                    .with_decided_by(DecidedBy::NoOne),
            )
        }
        Applied::Pending => Checked::Pending,
    })
}

/// The operator's deny that `decision` stands for, if [`checked`] made it:
/// `Some(ends_in)`, `None` for a decision of the store's (or the local
/// fallback's). Only a deny is a refusal that no one counted.
pub(super) fn denial(decision: &Decision) -> Option<Option<Duration>> {
    let by_no_one = match decision.decided_by() {
        DecidedBy::NoOne => true,
        DecidedBy::Store | DecidedBy::LocalFallback => false,
    };
    (by_no_one && !decision.is_allowed()).then(|| decision.retry_after())
}
