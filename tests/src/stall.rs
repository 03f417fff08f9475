//! `StallMeter`: how long the machine kept this process's threads waiting
//! while a test ran; and [`stalled`]: a request through a stall of its
//! runtime.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

/// The longest this process's threads were kept waiting by the machine
/// while a test ran: a plain thread sleeps 2 ms in a loop and records how
/// late it woke. On a loaded 2-core CI machine a whole process can stall
/// for a few hundred milliseconds, which no deadline of the store can
/// prevent, so latency bounds allow for it. A plain thread, not a task: a
/// runtime worker that the store blocked (a bug) stalls the requests, not
/// this thread, and is not excused.
#[derive(Debug)]
pub struct StallMeter {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Duration>,
}

impl StallMeter {
    /// Starts measuring.
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let mut worst = Duration::ZERO;
                while !stop.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    std::thread::sleep(Duration::from_millis(2));
                    let late = asked.elapsed().saturating_sub(Duration::from_millis(2));
                    worst = worst.max(late);
                }
                worst
            }
        });
        Self { stop, thread }
    }

    /// Stops, and returns the longest stall seen.
    pub fn stop(self) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(Duration::from_secs(3600))
    }
}

/// Runs `request` until it waits (on Redis), then blocks the calling
/// thread, the runtime's one, for `stall`, as a handler's CPU-bound work
/// does (so the store's deadline passes while the request, and the
/// connection that would read its reply, wait to be polled), then lets it
/// finish. Also whether it stalled: `false` for a request answered at its
/// first poll.
///
/// The thread is blocked without burning a core: on a busy 2-core machine
/// a test that spins is itself starved by the OS, and its Redis replies
/// then arrive 100 ms and more late as observed (1 run in 4 failed so),
/// which no deadline logic inside the process can tell from Redis's own
/// latency. To the runtime, a blocked thread is a busy one.
pub async fn stalled<F: Future>(request: F, stall: Duration) -> (F::Output, bool) {
    let mut request = pin!(request);
    let first = std::future::poll_fn(|cx| Poll::Ready(request.as_mut().poll(cx))).await;
    if let Poll::Ready(output) = first {
        return (output, false);
    }
    std::thread::sleep(stall);
    (request.await, true)
}
