//! The refunds of a key that one instance sends to the store, counted
//! against the key's leases (see `Lease::unused`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[cfg(doc)]
use tollgate_core::StoreError;

/// The units of a key's refunds that this instance sent to the store
/// (settlements and lease returns): those started, and those known done.
/// A lease counts every unit started and not known done when its grant
/// was asked for as shortening its backlog (`Lease::unused`).
///
/// A refund is done once the store answered it, or failed in a way that
/// never reached it ([`StoreError::may_have_acted`]). One that timed out,
/// failed in its backend, or whose call was dropped may still land: it
/// stays not done for [`LATE_REFUND`], so that the leases asked for
/// meanwhile give back that much less (under-admission), then is counted
/// done.
#[derive(Default)]
pub(crate) struct Refunds {
    started: AtomicU64,
    done: AtomicU64,
}

impl Refunds {
    /// The units done so far: a grant asked for now counts every later
    /// one against its lease.
    pub(crate) fn done(&self) -> u64 {
        self.done.load(Ordering::Acquire)
    }

    /// The units started but not yet done when the done count read
    /// `done_before`: every one, once the started count saturates.
    pub(crate) fn since(&self, done_before: u64) -> u64 {
        match self.started.load(Ordering::Acquire) {
            u64::MAX => u64::MAX,
            started => started.saturating_sub(done_before),
        }
    }
}

/// How long a refund whose call may have reached the store, and failed
/// or was dropped, counts as possibly still landing there (see
/// [`Refunds`]).
pub(crate) const LATE_REFUND: Duration = Duration::from_secs(10);

/// A refund of a key's on its way to the store, counted in the key's
/// [`Refunds`] as started: [`done`](Self::done) once the store answered,
/// and done after [`LATE_REFUND`] if dropped before that (the call failed
/// in a way that may have reached the store, or was dropped itself).
pub(crate) struct Refunding {
    refunds: Option<Arc<Refunds>>,
    units: u64,
}

impl Refunding {
    /// Counts a refund of `units` as started in `refunds`.
    pub(crate) fn start(refunds: &Arc<Refunds>, units: u64) -> Self {
        add(&refunds.started, units);
        Self {
            refunds: Some(Arc::clone(refunds)),
            units,
        }
    }

    /// The store answered the refund, or it never reached the store.
    pub(crate) fn done(mut self) {
        if let Some(refunds) = self.refunds.take() {
            add(&refunds.done, self.units);
        }
    }
}

impl Drop for Refunding {
    fn drop(&mut self) {
        let Some(refunds) = self.refunds.take() else {
            return;
        };
        let units = self.units;
        // Without a runtime to wait on, it stays not done: under-admission.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                tokio::time::sleep(LATE_REFUND).await;
                add(&refunds.done, units);
            });
        }
    }
}

/// Adds `units` to `counter`, saturating.
fn add(counter: &AtomicU64, units: u64) {
    let _ = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
        Some(n.saturating_add(units))
    });
}
