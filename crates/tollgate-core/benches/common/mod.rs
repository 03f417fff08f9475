//! What the memory-store benches share.

use std::time::{Duration, Instant};

/// Runs `check(i)` for every `i` of `range`, spread over `threads` threads
/// (thread `t` takes every `threads`-th value from `range.start + t`), and
/// returns the wall time.
pub(crate) fn spread(
    range: std::ops::Range<u64>,
    threads: u64,
    check: impl Fn(u64) + Sync,
) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let check = &check;
            let range = range.clone();
            s.spawn(move || {
                for i in (range.start + t..range.end).step_by(threads as usize) {
                    check(i);
                }
            });
        }
    });
    start.elapsed()
}
