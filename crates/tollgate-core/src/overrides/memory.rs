//! [`MemoryOverrides`]: overrides kept in this process.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{OverrideError, StoreError};
use crate::key::Key;
use crate::policy::Policy;
use crate::time::{Clock, SystemClock, Timestamp};

use super::rule::{Applied, Override};
use super::table::OverrideTable;
use super::{OverrideSource, OverrideStore};

/// Overrides kept in this process, for tests and single instances:
/// an [`OverrideTable`] on a clock. An override applies from the moment it
/// is set; an expiring one stops applying at its expiry by the clock (a
/// [`FakeClock`](crate::FakeClock) in tests), and is dropped on the next
/// write. Cloning is cheap; clones share the overrides.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{
///     Algorithm, Applied, FakeClock, Key, MemoryOverrides, Override, OverrideSource,
///     OverrideStore, Policy,
/// };
///
/// # tokio_test_block_on(async {
/// let clock = FakeClock::default();
/// let overrides = MemoryOverrides::with_clock(clock.clone());
/// let api = Policy::new("api", Algorithm::Gcra, "100/min")?;
/// let ada = Key::user("ada");
/// overrides.set(&ada, &api, Override::Deny, Some(Duration::from_secs(60))).await?;
/// assert!(matches!(overrides.applied(&ada, &api), Some(Applied::Deny { ends_in: Some(_) })));
/// clock.advance(Duration::from_secs(60));
/// assert!(overrides.applied(&ada, &api).is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     let mut f = std::pin::pin!(f);
/// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
/// #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryOverrides {
    inner: Arc<Inner>,
}

struct Inner {
    table: OverrideTable,
    clock: Arc<dyn Clock>,
}

impl MemoryOverrides {
    /// Overrides on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// Overrides whose expiries are read on `clock`.
    pub fn with_clock(clock: impl Clock) -> Self {
        Self {
            inner: Arc::new(Inner {
                table: OverrideTable::new(),
                clock: Arc::new(clock),
            }),
        }
    }

    /// The table of overrides.
    pub fn table(&self) -> &OverrideTable {
        &self.inner.table
    }

    fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }
}

impl Default for MemoryOverrides {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryOverrides {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryOverrides")
            .field("table", &self.inner.table)
            .field("clock", &self.inner.clock)
            .finish()
    }
}

impl OverrideSource for MemoryOverrides {
    #[inline]
    fn applied(&self, key: &Key, policy: &Policy) -> Option<Applied> {
        let table = &self.inner.table;
        if table.is_empty() {
            return None;
        }
        table.applied(key, policy, self.now())
    }

    #[inline]
    fn is_empty(&self) -> bool {
        self.inner.table.is_empty()
    }
}

impl OverrideStore for MemoryOverrides {
    async fn set(
        &self,
        key: &Key,
        policy: &Policy,
        rule: Override,
        expires_in: Option<Duration>,
    ) -> Result<(), OverrideError> {
        rule.check(policy).map_err(OverrideError::Config)?;
        let now = self.now();
        let table = &self.inner.table;
        table.sweep(now);
        table.set(
            key.clone(),
            policy.name(),
            rule,
            expires_in.map(|d| now + d),
        );
        Ok(())
    }

    async fn clear(&self, key: &Key, policy: &Policy) -> Result<(), StoreError> {
        self.inner.table.remove(key, policy.name());
        Ok(())
    }

    fn get(&self, key: &Key, policy: &Policy) -> Option<(Override, Option<Timestamp>)> {
        self.inner.table.get(key, policy.name(), self.now())
    }
}
