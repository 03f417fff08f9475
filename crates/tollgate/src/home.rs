//! The runtime a layer was built on, where its work in the background
//! runs when the request's own runtime would leave it unrun.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::runtime::{Handle, RuntimeFlavor};

/// The runtime a layer was built on, if any, while it runs. A job
/// worker's runtime of its own thread runs tasks only while that thread
/// blocks on a future: work spawned there as a job ends (an in-flight
/// slot's give-back) would wait for the worker's next job, and meet it
/// there, late.
#[derive(Clone, Debug)]
pub(crate) struct Home(Option<(Handle, Arc<AtomicBool>)>);

/// Held by a task on the home that never ends: dropped, and the home
/// marked as shut down, when the runtime drops its tasks.
struct ShutDown(Arc<AtomicBool>);

impl Drop for ShutDown {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

impl Home {
    /// No runtime: background work runs on the current one, if any.
    pub(crate) const NONE: Self = Self(None);

    /// The runtime this runs on, if any.
    pub(crate) fn here() -> Self {
        Self(Handle::try_current().ok().map(|home| {
            let shut_down = Arc::new(AtomicBool::new(false));
            let watch = ShutDown(Arc::clone(&shut_down));
            drop(home.spawn(async move {
                let _watch = watch;
                std::future::pending::<()>().await;
            }));
            (home, shut_down)
        }))
    }

    /// The runtime to spawn background work on: this home when the
    /// current runtime is a current-thread one other than it and the home
    /// has worker threads of its own (runtimes of one thread each that
    /// always run, one per core, keep their work: a home of one thread
    /// too would take all of it); the current one otherwise; outside any
    /// runtime, the home. A home that has shut down (a runtime the layer
    /// was built on for its set-up only) is passed over: it would drop
    /// the work unrun. `None` if there is neither. The Redis store hands
    /// its own work on by the same rule.
    pub(crate) fn runtime(&self) -> Option<Handle> {
        let home = self
            .0
            .as_ref()
            .and_then(|(home, shut_down)| (!shut_down.load(Ordering::Acquire)).then_some(home));
        match (Handle::try_current().ok(), home) {
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
}
