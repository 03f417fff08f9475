//! Policy families: the policies one thing is limited by, acted on
//! together by operators.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::builder::validate_name;
use crate::decision::Decision;
use crate::error::{ConfigError, OverrideError, StoreError};
use crate::key::Key;
use crate::overrides::{Override, OverrideStore};
use crate::policy::Policy;
use crate::store::Store;

/// A named set of policies that limit one thing in turn: a route's own
/// policy and the policy of each of its plans (`export`, `export-pro`),
/// or the tiers of a job queue. A key is limited by one member at a time,
/// but an operator means all of them: a user blocked on a route stays
/// blocked after upgrading to the pro plan. [`block`](Self::block),
/// [`reset`](Self::reset) and [`status`](Self::status) act on every member,
/// on any [`Store`].
///
/// Members are told apart by name, as stores keep state by name: two
/// members of one name are a [`ConfigError::DuplicateMember`], and a family
/// with no member a [`ConfigError::EmptyFamily`]. A family of one (from a
/// [`Policy`]) acts as the policy alone. Cloning is cheap.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{Algorithm, FakeClock, Key, MemoryStore, Policy, PolicyFamily};
///
/// # block_on(async {
/// let clock = FakeClock::default();
/// let store = MemoryStore::builder().clock(clock.clone()).build()?;
/// let free = Policy::new("export", Algorithm::TokenBucket, "50/h")?;
/// let pro = Policy::new("export-pro", Algorithm::TokenBucket, "200/h")?;
/// let export = PolicyFamily::new("export", [free.clone(), pro.clone()])?;
///
/// let bob = Key::user("bob");
/// export.block(&store, &bob, Duration::from_secs(90)).await?;
/// // Blocked on every plan, with the rest of the block as Retry-After.
/// for policy in [&free, &pro] {
///     let denied = store.check_sync(&bob, policy, 1)?;
///     assert_eq!(denied.retry_after(), Some(Duration::from_secs(90)));
/// }
/// let status = export.status(&store, &bob).await?;
/// assert_eq!(status.len(), 2);
/// assert_eq!(status[1].0.name(), "export-pro");
/// assert_eq!(status[1].1.remaining(), 0);
///
/// export.reset(&store, &bob).await?;
/// assert!(store.check_sync(&bob, &pro, 1)?.is_allowed());
///
/// // A policy named twice is refused, naming it.
/// let err = PolicyFamily::new("export", [free.clone(), free]).unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "policy family \"export\" has policy \"export\" twice: each member needs a name of its own"
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     let mut f = std::pin::pin!(f);
/// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
/// #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
/// # }
/// ```
#[derive(Clone)]
pub struct PolicyFamily {
    inner: Arc<Inner>,
}

struct Inner {
    name: Box<str>,
    members: Box<[Policy]>,
}

impl PolicyFamily {
    /// The family `name` of `members`, in their order.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidName`] for a name a policy could not have,
    /// [`ConfigError::EmptyFamily`] without members, and
    /// [`ConfigError::DuplicateMember`] for two members of one name.
    pub fn new(name: &str, members: impl IntoIterator<Item = Policy>) -> Result<Self, ConfigError> {
        validate_name(name)?;
        let members: Box<[Policy]> = members.into_iter().collect();
        if members.is_empty() {
            return Err(ConfigError::EmptyFamily {
                family: name.to_owned(),
            });
        }
        for (i, policy) in members.iter().enumerate() {
            if members[..i].iter().any(|p| p.name() == policy.name()) {
                return Err(ConfigError::DuplicateMember {
                    family: name.to_owned(),
                    policy: policy.name().to_owned(),
                });
            }
        }
        Ok(Self {
            inner: Arc::new(Inner {
                name: name.into(),
                members,
            }),
        })
    }

    /// The family's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Every member, in the order given.
    pub fn members(&self) -> &[Policy] {
        &self.inner.members
    }

    /// The member named `name`, if there is one.
    pub fn member(&self, name: &str) -> Option<&Policy> {
        self.members().iter().find(|p| p.name() == name)
    }

    /// Blocks `key` under every member for `duration`, as
    /// [`Store::block`] does under one: each member's state is forgotten
    /// and every request denied with a `Retry-After` of the rest of the
    /// block. One store call per member, in order, and not one
    /// transaction: after an error, the members before the failing one
    /// are blocked; a new block replaces an old one, so blocking again is
    /// the remedy.
    ///
    /// # Errors
    ///
    /// The first member's [`StoreError`]; the members after it are not
    /// tried.
    pub async fn block<S: Store>(
        &self,
        store: &S,
        key: &Key,
        duration: Duration,
    ) -> Result<(), StoreError> {
        for policy in self.members() {
            store.block(key, policy, duration).await?;
        }
        Ok(())
    }

    /// Forgets what `key` has used under every member, and lifts its
    /// blocks, as [`Store::reset`] does under one. One store call per
    /// member, in order, as for [`block`](Self::block).
    ///
    /// # Errors
    ///
    /// The first member's [`StoreError`]; the members after it are not
    /// tried.
    pub async fn reset<S: Store>(&self, store: &S, key: &Key) -> Result<(), StoreError> {
        for policy in self.members() {
            store.reset(key, policy).await?;
        }
        Ok(())
    }

    /// The state of `key` under each member ([`Store::status`]: consuming
    /// nothing), in the members' order. A status is read under a member's
    /// own limits: for a key with limits of its own under a member (an
    /// override in force), read it under those instead, as
    /// `tollgate::RateLimiter::family_status` does. Read under the
    /// member's, its state is carried over to them, and a limit only the
    /// override has (a daily one, say) is dropped from it.
    ///
    /// # Errors
    ///
    /// The first member's [`StoreError`].
    pub async fn status<S: Store>(
        &self,
        store: &S,
        key: &Key,
    ) -> Result<Vec<(Policy, Decision)>, StoreError> {
        let mut states = Vec::with_capacity(self.members().len());
        for policy in self.members() {
            states.push((policy.clone(), store.status(key, policy).await?));
        }
        Ok(states)
    }
}

impl PolicyFamily {
    /// Sets `key`'s override under every member, for `expires_in` or
    /// until cleared, as [`OverrideStore::set`] does under one: a user's
    /// own limits (or exempt, or deny) on a route whichever plan they are
    /// on. Raised or lowered limits apply as they are under each member
    /// (each member keeps its algorithm, and the key its use). The
    /// override is checked against every member before any is set.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::{
    ///     Algorithm, Applied, Key, MemoryOverrides, Override, OverrideSource, Policy, PolicyFamily,
    /// };
    ///
    /// # block_on(async {
    /// let free = Policy::new("export", Algorithm::TokenBucket, "50/h")?;
    /// let pro = Policy::new("export-pro", Algorithm::TokenBucket, "200/h")?;
    /// let export = PolicyFamily::new("export", [free.clone(), pro.clone()])?;
    /// let overrides = MemoryOverrides::new();
    /// let bob = Key::user("bob");
    /// export.set_override(&overrides, &bob, Override::limit("5000/h")?, None).await?;
    /// for policy in [&free, &pro] {
    ///     let Some(Applied::Limits(own)) = overrides.applied(&bob, policy) else { panic!() };
    ///     assert_eq!((own.name(), own.limits()[0].count()), (policy.name(), 5000));
    /// }
    /// export.clear_override(&overrides, &bob).await?;
    /// assert!(overrides.applied(&bob, &pro).is_none());
    ///
    /// // A burst the fixed window of a member does not have: nothing is set.
    /// let daily = Policy::new("export-daily", Algorithm::FixedWindow, "500/d")?;
    /// let mixed = PolicyFamily::new("export", [free, daily])?;
    /// let burst: Override = "100/h burst 10".parse()?;
    /// assert!(mixed.set_override(&overrides, &bob, burst, None).await.is_err());
    /// assert!(overrides.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     let mut f = std::pin::pin!(f);
    /// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    /// #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`OverrideError::Config`] naming the first member the override
    /// cannot apply to (nothing is set then); the first member's
    /// [`OverrideError::Store`] otherwise, the members after it not tried.
    pub async fn set_override<O: OverrideStore>(
        &self,
        overrides: &O,
        key: &Key,
        rule: Override,
        expires_in: Option<Duration>,
    ) -> Result<(), OverrideError> {
        for policy in self.members() {
            rule.check(policy).map_err(OverrideError::Config)?;
        }
        for policy in self.members() {
            overrides.set(key, policy, rule.clone(), expires_in).await?;
        }
        Ok(())
    }

    /// Clears `key`'s override under every member: each member's policy
    /// applies again.
    ///
    /// # Errors
    ///
    /// The first member's [`StoreError`]; the members after it are not
    /// tried.
    pub async fn clear_override<O: OverrideStore>(
        &self,
        overrides: &O,
        key: &Key,
    ) -> Result<(), StoreError> {
        for policy in self.members() {
            overrides.clear(key, policy).await?;
        }
        Ok(())
    }

    /// `key`'s override under each member that has one in force, with its
    /// expiry, as this instance knows them, in the members' order.
    pub fn overrides<O: OverrideStore>(
        &self,
        overrides: &O,
        key: &Key,
    ) -> Vec<(Policy, Override, Option<crate::time::Timestamp>)> {
        let members = self.members().iter();
        members
            .filter_map(|p| {
                let (rule, ends) = overrides.get(key, p)?;
                Some((p.clone(), rule, ends))
            })
            .collect()
    }
}

/// The family of one policy, named after it: it acts as the policy alone.
impl From<Policy> for PolicyFamily {
    fn from(policy: Policy) -> Self {
        Self {
            inner: Arc::new(Inner {
                name: policy.name().into(),
                members: Box::new([policy]),
            }),
        }
    }
}

impl fmt::Debug for PolicyFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.members().iter().map(Policy::name).collect();
        f.debug_struct("PolicyFamily")
            .field("name", &self.name())
            .field("members", &names)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;

    fn policy(name: &str) -> Policy {
        Policy::new(name, Algorithm::Gcra, "1/s").unwrap()
    }

    #[test]
    fn an_invalid_family_is_a_typed_error_naming_it() {
        assert_eq!(
            PolicyFamily::new("export", []).unwrap_err(),
            ConfigError::EmptyFamily {
                family: "export".into()
            }
        );
        assert_eq!(
            PolicyFamily::new("export", [policy("a"), policy("b"), policy("a")]).unwrap_err(),
            ConfigError::DuplicateMember {
                family: "export".into(),
                policy: "a".into()
            }
        );
        assert_eq!(
            PolicyFamily::new("no spaces", [policy("a")]).unwrap_err(),
            ConfigError::InvalidName {
                name: "no spaces".into()
            }
        );
        assert_eq!(
            PolicyFamily::new("e", []).unwrap_err().to_string(),
            "policy family \"e\" has no policy"
        );
    }

    #[test]
    fn a_family_of_one_is_named_after_its_policy() {
        let one = PolicyFamily::from(policy("api"));
        assert_eq!(one.name(), "api");
        assert_eq!(one.members().len(), 1);
        assert!(one.member("api").is_some());
        assert!(one.member("other").is_none());
        assert_eq!(
            format!("{one:?}"),
            "PolicyFamily { name: \"api\", members: [\"api\"] }"
        );
    }
}
