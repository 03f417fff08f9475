//! `StallMeter`: how long the machine kept this process's threads waiting
//! while a test ran.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
