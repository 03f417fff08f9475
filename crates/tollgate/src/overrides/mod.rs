//! Overrides from any async lookup: [`CachedLookup`] over an
//! [`OverrideLookup`]. The overrides themselves, their sources in memory
//! and the trait a layer asks are `tollgate_core`'s (re-exported here);
//! the Redis source is `tollgate_redis::RedisOverrides`. How a layer and
//! a limiter apply them is in `rate_limit/overridden.rs`.

mod lookup;

pub use lookup::{CachedLookup, CachedLookupBuilder, OverrideLookup};

use tollgate_core::{Applied, Key, OverrideSource, Policy};

/// `key`'s own limits under `policy`, if `source` has an override of them
/// in force: what its status and settlements go under. A key whose
/// override is not known yet waits for its first answer (up to the
/// source's bound), as its checks do.
pub(crate) async fn own_limits(
    source: Option<&dyn OverrideSource>,
    key: &Key,
    policy: &Policy,
) -> Option<Policy> {
    let source = source?;
    let applied = source.applied(key, policy);
    answered(source, key, policy, applied)
        .await
        .and_then(limits)
}

/// `key`'s own limits under each of `policies` that `source` has an
/// override of in force: what a reset or a block goes under too.
pub(crate) async fn own_limits_under(
    source: Option<&dyn OverrideSource>,
    key: &Key,
    policies: &[Policy],
) -> Vec<Policy> {
    own_limits_each(source, key, policies)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// `key`'s own limits under each of `policies`, in their order: `None`
/// under one without an override in force. Every policy is asked first,
/// so that the first lookups of a key not known yet run side by side,
/// then each is waited for.
pub(crate) async fn own_limits_each(
    source: Option<&dyn OverrideSource>,
    key: &Key,
    policies: &[Policy],
) -> Vec<Option<Policy>> {
    let Some(source) = source else {
        return vec![None; policies.len()];
    };
    let asked: Vec<Option<Applied>> = policies.iter().map(|p| source.applied(key, p)).collect();
    let mut owns = Vec::with_capacity(policies.len());
    for (policy, applied) in policies.iter().zip(asked) {
        owns.push(
            answered(source, key, policy, applied)
                .await
                .and_then(limits),
        );
    }
    owns
}

/// What `source` says of `key` under `policy`, `applied` or, where that
/// is not known yet, once the source's first answer is in (or it stops
/// waiting for it): asked again.
async fn answered(
    source: &dyn OverrideSource,
    key: &Key,
    policy: &Policy,
    applied: Option<Applied>,
) -> Option<Applied> {
    if !applied.as_ref().is_some_and(pending) {
        return applied;
    }
    // `None`: the answer came in meanwhile.
    if let Some(first) = source.first_answer(key, policy) {
        first.await;
    }
    source.applied(key, policy)
}

/// Whether an override is not known yet: the caller waits for the
/// source's first answer, if there is one to wait for, and asks again.
fn pending(applied: &Applied) -> bool {
    match applied {
        Applied::Pending => true,
        Applied::Limits(_) | Applied::Exempt | Applied::Deny { .. } => false,
    }
}

fn limits(applied: Applied) -> Option<Policy> {
    match applied {
        Applied::Limits(own) => Some(own),
        Applied::Exempt | Applied::Deny { .. } | Applied::Pending => None,
    }
}
