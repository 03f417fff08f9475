//! Metric handles by policy name, with the `metrics` feature: registered
//! once each, so that counting allocates nothing, and bounded, so that a
//! deployment with a policy per tenant cannot grow the series without end.

use std::collections::HashMap;
use std::sync::{OnceLock, PoisonError, RwLock};

use tollgate_core::telemetry::{MAX_POLICY_LABELS, OTHER_POLICIES};

/// The handles `T` of each policy seen, up to [`MAX_POLICY_LABELS`] names;
/// the policies past those share one `T`, labelled [`OTHER_POLICIES`].
pub(crate) struct ByPolicy<T> {
    known: RwLock<HashMap<Box<str>, T>>,
    others: OnceLock<T>,
}

impl<T> Default for ByPolicy<T> {
    fn default() -> Self {
        Self {
            known: RwLock::default(),
            others: OnceLock::new(),
        }
    }
}

impl<T> ByPolicy<T> {
    /// Runs `using` on the handles of `policy`, made by `make` (given the
    /// label to register them under) on the policy's first use.
    pub(crate) fn with<R>(
        &self,
        policy: &str,
        make: impl Fn(&str) -> T,
        using: impl FnOnce(&T) -> R,
    ) -> R {
        let known = self.known.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(handles) = known.get(policy) {
            return using(handles);
        }
        // Full: no write lock for the policies past the bound.
        if known.len() >= MAX_POLICY_LABELS {
            return using(self.others.get_or_init(|| make(OTHER_POLICIES)));
        }
        drop(known);
        let mut known = self.known.write().unwrap_or_else(PoisonError::into_inner);
        if known.len() >= MAX_POLICY_LABELS && !known.contains_key(policy) {
            drop(known);
            return using(self.others.get_or_init(|| make(OTHER_POLICIES)));
        }
        let handles = known.entry(policy.into()).or_insert_with(|| make(policy));
        using(handles)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_bound_every_policy_shares_the_others_handles() {
        let series = ByPolicy::<String>::default();
        let made = std::cell::Cell::new(0);
        let make = |label: &str| {
            made.set(made.get() + 1);
            label.to_owned()
        };
        for round in 0..2 {
            for i in 0..MAX_POLICY_LABELS + 100 {
                let name = format!("tenant-{i}");
                let label = series.with(&name, make, Clone::clone);
                let expected = match i < MAX_POLICY_LABELS {
                    true => name.as_str(),
                    false => OTHER_POLICIES,
                };
                assert_eq!(label, expected, "round {round}, policy {i}");
            }
        }
        // Each name's handles, and the others', made once.
        assert_eq!(made.get(), MAX_POLICY_LABELS + 1);
    }
}
