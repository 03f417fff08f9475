//! The runtime a layer was built on, where its work in the background
//! runs when the request's own runtime would leave it unrun.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use tokio::runtime::{Handle, Id, RuntimeFlavor};

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

/// The runtimes watched for shutting down (see [`shut_down`]).
static WATCHED: Mutex<Vec<(Id, Arc<AtomicBool>)>> = Mutex::new(Vec::new());

/// The flag set once `runtime` has shut down: one per runtime, whatever
/// the number of layers built on it (a server may build its layers anew
/// for each connection), held by a task that never ends. Runtimes shut
/// down are forgotten.
fn shut_down(runtime: &Handle) -> Arc<AtomicBool> {
    let mut watched = WATCHED.lock();
    watched.retain(|(_, shut_down)| !shut_down.load(Ordering::Acquire));
    let id = runtime.id();
    if let Some((_, shut_down)) = watched.iter().find(|(watched, _)| *watched == id) {
        return Arc::clone(shut_down);
    }
    let shut_down = Arc::new(AtomicBool::new(false));
    let watch = ShutDown(Arc::clone(&shut_down));
    drop(runtime.spawn(async move {
        let _watch = watch;
        std::future::pending::<()>().await;
    }));
    watched.push((id, Arc::clone(&shut_down)));
    shut_down
}

impl Home {
    /// No runtime: background work runs on the current one, if any.
    pub(crate) const NONE: Self = Self(None);

    /// The runtime this runs on, if any.
    pub(crate) fn here() -> Self {
        Self(Handle::try_current().ok().map(|home| {
            let shut_down = shut_down(&home);
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
    /// its own work on by the same rule, but for the pass-over: its
    /// connection's tasks live on its home, and without it the store
    /// has no connection to work on.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn multi_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap()
    }

    #[test]
    fn one_watch_a_runtime_however_many_layers_are_built_on_it() {
        let home = multi_thread();
        let homes: Vec<Home> = (0..100)
            .map(|_| home.block_on(async { Home::here() }))
            .collect();
        assert_eq!(home.metrics().num_alive_tasks(), 1);
        let worker = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let chosen = worker.block_on(async { homes[99].runtime().unwrap().id() });
        assert_eq!(chosen, home.handle().id(), "handed on to the home");

        // Shut down: passed over, and forgotten.
        drop(home);
        let chosen = worker.block_on(async { homes[0].runtime().unwrap().id() });
        assert_eq!(chosen, worker.handle().id(), "kept on the worker's");
        assert!(homes[0].runtime().is_none(), "none outside a runtime");
        let gone = homes[0].0.as_ref().unwrap().0.id();
        let other = multi_thread();
        other.block_on(async { Home::here() });
        let watched: Vec<Id> = WATCHED.lock().iter().map(|(id, _)| *id).collect();
        assert!(watched.contains(&other.handle().id()));
        assert!(!watched.contains(&gone));
    }
}
