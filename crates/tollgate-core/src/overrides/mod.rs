//! Live per-key overrides: a key's own limits under a policy (raise,
//! lower), or exempt, or deny, set at runtime with an optional expiry.
//!
//! An [`OverrideSource`] is what a layer or limiter asks, per request: a
//! local lookup, never a round trip (a key's first requests may wait for
//! a source's first lookup of it, see [`Applied::Pending`]). An
//! [`OverrideStore`] is a source operators write to as well:
//! [`MemoryOverrides`] for tests and single instances, the Redis store's
//! source (in `tollgate-redis`) for a fleet. [`Override`] says what an
//! override does (and why exempt is not counted and deny is 403), and
//! [`OverrideTable`] is the lookup table the sources keep.
//!
//! `rule.rs` holds the override and its text form, `table.rs` the table,
//! `memory.rs` the in-memory source.

mod memory;
mod rule;
mod table;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{OverrideError, StoreError};
use crate::key::Key;
use crate::policy::Policy;
use crate::time::Timestamp;

pub use memory::MemoryOverrides;
pub use rule::{Applied, Override};
pub use table::OverrideTable;

/// Where a layer or limiter finds a key's override under a policy, per
/// request: a local lookup that never waits. A source kept fresh from
/// elsewhere (Redis, a database) refreshes its local view in the
/// background and answers from it; one that has yet to hear of a key
/// answers [`Applied::Pending`], and hands callers that can wait its
/// [`first_answer`](OverrideSource::first_answer). A source that wraps
/// others forwards both.
///
/// Implemented by [`MemoryOverrides`], by the Redis store's source, and by
/// `tollgate`'s cached lookup of any async source. A source of your own
/// keeps an [`OverrideTable`] and answers from it:
///
/// ```
/// use std::sync::Arc;
/// use tollgate_core::{
///     Algorithm, Applied, Clock, Key, OverrideSource, OverrideTable, Policy, SystemClock,
/// };
///
/// /// Overrides read from a file at start-up.
/// struct FromFile(OverrideTable);
///
/// impl OverrideSource for FromFile {
///     fn applied(&self, key: &Key, policy: &Policy) -> Option<Applied> {
///         self.0.applied(key, policy, SystemClock.now())
///     }
///     fn is_empty(&self) -> bool {
///         self.0.is_empty()
///     }
/// }
///
/// let table = OverrideTable::new();
/// table.set(Key::user("ci-bot"), "api", "exempt".parse()?, None);
/// let source: Arc<dyn OverrideSource> = Arc::new(FromFile(table));
/// let api = Policy::new("api", Algorithm::Gcra, "10/s")?;
/// assert!(matches!(source.applied(&Key::user("ci-bot"), &api), Some(Applied::Exempt)));
/// assert!(source.applied(&Key::user("ada"), &api).is_none());
/// # Ok::<(), tollgate_core::ConfigError>(())
/// ```
pub trait OverrideSource: Send + Sync + 'static {
    /// What `key`'s override under `policy` (by its name), if one is in
    /// force, makes of a request: `None` for the policy as it is.
    fn applied(&self, key: &Key, policy: &Policy) -> Option<Applied>;

    /// Whether the source knows no override at all, so that a caller may
    /// skip [`applied`](Self::applied). The default says `false`.
    fn is_empty(&self) -> bool {
        false
    }

    /// When [`applied`](Self::applied) answered [`Applied::Pending`] for
    /// `key` under `policy`: a future that ends once the source's first
    /// answer about them is in, or once the source stops waiting for it
    /// (its own bound), after which `applied` says what to do. `None` when
    /// there is nothing to wait for. The default says `None`: a source
    /// that never answers `Pending` need not implement it.
    fn first_answer(&self, key: &Key, policy: &Policy) -> Option<FirstAnswer> {
        let _ = (key, policy);
        None
    }
}

/// What [`OverrideSource::first_answer`] hands a caller to wait on.
pub type FirstAnswer = Pin<Box<dyn Future<Output = ()> + Send>>;

impl<T: OverrideSource + ?Sized> OverrideSource for Arc<T> {
    #[inline]
    fn applied(&self, key: &Key, policy: &Policy) -> Option<Applied> {
        (**self).applied(key, policy)
    }

    #[inline]
    fn is_empty(&self) -> bool {
        (**self).is_empty()
    }

    fn first_answer(&self, key: &Key, policy: &Policy) -> Option<FirstAnswer> {
        (**self).first_answer(key, policy)
    }
}

/// An [`OverrideSource`] that operators set overrides in, and clear them
/// from. [`PolicyFamily::set_override`](crate::PolicyFamily::set_override)
/// sets one on every plan of a route.
pub trait OverrideStore: OverrideSource {
    /// Sets `key`'s override under `policy` (by its name), replacing any,
    /// for `expires_in` from now by the source's clock, or until cleared.
    ///
    /// # Errors
    ///
    /// [`OverrideError::Config`] when the override cannot apply to
    /// `policy` (see [`Override::check`]); [`OverrideError::Store`] when it
    /// could not be saved.
    fn set(
        &self,
        key: &Key,
        policy: &Policy,
        rule: Override,
        expires_in: Option<Duration>,
    ) -> impl Future<Output = Result<(), OverrideError>> + Send;

    /// Clears `key`'s override under `policy` (by its name): the policy
    /// applies again. Clearing where there is none is not an error.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the clearing could not be saved.
    fn clear(
        &self,
        key: &Key,
        policy: &Policy,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// `key`'s override under `policy` and its expiry, if one is in force,
    /// as this instance knows it.
    fn get(&self, key: &Key, policy: &Policy) -> Option<(Override, Option<Timestamp>)>;
}
