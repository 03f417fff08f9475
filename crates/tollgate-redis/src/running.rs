//! Background work: one piece at a time (a connection's replacement, a
//! slot map's refresh, a check of which server answers), and work handed
//! on by a guard (a batch's place, a key's lane).

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::runtime::{Handle, RuntimeFlavor};

use crate::patience::Home;

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

thread_local! {
    /// Set while this thread spawns work handed on (see [`hand_on`]).
    static HANDING_ON: Cell<bool> = const { Cell::new(false) };
}

/// The runtime to hand work on to, for others' requests: the store's
/// `home` runtime when the current one is a current-thread runtime other
/// than it and the home has worker threads of its own; the current one
/// otherwise. A current-thread runtime runs tasks only while its thread
/// blocks on a future: a job worker's runtime that blocks on its own
/// decision and then goes on to other work would leave the work unrun,
/// and the requests in it waiting for its next decision. (Runtimes of
/// one thread each that always run, one per core, keep their work: a
/// home of one thread too would take all of it.) Outside a runtime, the
/// home, if known. `None` if there is none, or this thread is
/// handing work on already: a runtime shutting down drops what it is
/// given at once, unrun, inside the spawn, and the guard in that work
/// would hand on again, as deep as there is work queued; the nested
/// guard gets `None` instead, and gives up what it holds.
pub(crate) fn hand_on_runtime(home: &Home) -> Option<Handle> {
    if HANDING_ON.get() {
        return None;
    }
    let current = Handle::try_current().ok();
    match (current, home.handle()) {
        (Some(current), Some(home))
            if current.runtime_flavor() == RuntimeFlavor::CurrentThread
                && home.runtime_flavor() == RuntimeFlavor::MultiThread
                && current.id() != home.id() =>
        {
            Some(home.clone())
        }
        (Some(current), _) => Some(current),
        (None, home) => home.cloned(),
    }
}

/// Spawns `work`, which holds a guard that hands on what it holds when
/// dropped, on `runtime` (from [`hand_on_runtime`]).
pub(crate) fn hand_on(runtime: &Handle, work: impl Future<Output = ()> + Send + 'static) {
    struct Handing;
    impl Drop for Handing {
        fn drop(&mut self) {
            HANDING_ON.set(false);
        }
    }
    HANDING_ON.set(true);
    let _handing = Handing;
    drop(runtime.spawn(work));
}

/// The handle of a runtime already shut down: spawning on it drops the
/// work at once, unrun, inside the spawn.
#[cfg(test)]
pub(crate) fn shut_down_runtime() -> Handle {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let handle = runtime.handle().clone();
    runtime.shutdown_background();
    handle
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
