//! [`InstanceCount`]: how many instances share a limit, changeable while
//! they run.

use std::fmt;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// How many instances share each limit, for
/// [`FailureMode::Local`](crate::FailureMode::Local): while the store
/// fails, each instance enforces the limit divided by this count. A
/// handle: clones share one count, and a change through any of them
/// takes effect at the next local decision of every layer, limiter and
/// store given it, so that a fleet that autoscales keeps its fallback
/// share right.
///
/// ```
/// use std::num::NonZeroU64;
/// use tollgate::{Algorithm, GlobalKey, InstanceCount, Policy, RateLimitLayer};
///
/// let instances = InstanceCount::new(NonZeroU64::new(4).unwrap());
/// let policy = Policy::new("api", Algorithm::Gcra, "100/s")?;
/// let layer = RateLimitLayer::new(policy, GlobalKey).local_instances(instances.clone());
/// // Later, when the orchestrator reports six instances:
/// instances.set(NonZeroU64::new(6).unwrap());
/// assert_eq!(instances.get().get(), 6);
/// # let _ = layer;
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct InstanceCount {
    count: Arc<AtomicU64>,
}

impl InstanceCount {
    /// A count of `instances`.
    pub fn new(instances: NonZeroU64) -> Self {
        Self {
            count: Arc::new(AtomicU64::new(instances.get())),
        }
    }

    /// Sets the count, for every holder of this handle.
    pub fn set(&self, instances: NonZeroU64) {
        self.count.store(instances.get(), Ordering::Relaxed);
    }

    /// The count.
    pub fn get(&self) -> NonZeroU64 {
        // Only `new` and `set` write it, both with a non-zero count.
        NonZeroU64::new(self.count.load(Ordering::Relaxed)).unwrap_or(NonZeroU64::MIN)
    }
}

impl Default for InstanceCount {
    /// One instance: each enforces the whole limit.
    fn default() -> Self {
        Self::new(NonZeroU64::MIN)
    }
}

impl From<NonZeroU64> for InstanceCount {
    fn from(instances: NonZeroU64) -> Self {
        Self::new(instances)
    }
}

impl fmt::Debug for InstanceCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("InstanceCount").field(&self.get()).finish()
    }
}
