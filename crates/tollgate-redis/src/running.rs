//! One piece of background work at a time: a connection's replacement, a
//! slot map's refresh, a check of which server answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The flag that marks background work as under way, held by that work.
/// Taken before the work is spawned and moved into its future, it is let
/// go when that future is dropped, however it ends: done, panicked, or
/// dropped unrun by a runtime shutting down. A flag cleared by the work's
/// last line would stay set after the last two, and no such work would
/// ever run again.
pub(crate) struct Running(Arc<AtomicBool>);

impl Running {
    /// Takes `flag`, unless other work holds it.
    pub(crate) fn take(flag: &Arc<AtomicBool>) -> Option<Self> {
        let taken = !flag.swap(true, Ordering::AcqRel);
        taken.then(|| Self(Arc::clone(flag)))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_that_panics_or_never_runs_lets_its_flag_go() {
        let flag = Arc::new(AtomicBool::new(false));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let running = Running::take(&flag).unwrap();
        assert!(Running::take(&flag).is_none(), "one at a time");
        let task = runtime.spawn(async move {
            let _running = running;
            panic!("the work's own bug");
        });
        assert!(runtime.block_on(task).is_err());
        assert!(!flag.load(Ordering::Acquire), "let go by the panic");

        let handle = runtime.handle().clone();
        runtime.shutdown_background();
        let running = Running::take(&flag).unwrap();
        drop(handle.spawn(async move {
            let _running = running;
        }));
        assert!(!flag.load(Ordering::Acquire), "let go unrun");
        assert!(Running::take(&flag).is_some());
    }
}
