//! The replay: every request through the core algorithms on a fake clock.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use tollgate_core::{
    ConfigError, FakeClock, Key, MemoryStore, Outcome, Policy, StoreError, Timestamp,
};

use crate::workload::{Start, Workload};

/// One attempt of one request, as decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    /// When it was decided, in µs after the workload's origin.
    pub at_us: u64,
    /// An index into [`Workload::keys`].
    pub key: u32,
    /// Whether it was admitted.
    pub admitted: bool,
    /// For an admitted attempt, how long the policy holds it first (leaky
    /// bucket shaping); zero otherwise.
    pub delay_us: u64,
}

/// What one policy did with a workload.
#[derive(Debug, Clone)]
pub struct Run {
    /// The policy.
    pub policy: Policy,
    /// Every attempt, in the order decided.
    pub attempts: Vec<Attempt>,
    /// Requests sent (retries not counted).
    pub requests: u64,
    /// Requests admitted.
    pub allowed: u64,
    /// Rejections (a request retried three times before admission counts
    /// three).
    pub denied: u64,
    /// Admitted requests that were served later than first sent: retried
    /// after a rejection, or held by a shaping delay.
    pub delayed: u64,
    /// Requests never admitted: rejected without retry, over the retry
    /// limit, or costing more than a limit's capacity.
    pub never_admitted: u64,
    /// When each phase started, in µs after the origin.
    pub phase_starts_us: Vec<u64>,
    /// When the last admitted request was served (decision plus delay), in
    /// µs after the origin.
    pub finished_us: Option<u64>,
    /// Rejections per key, most first (ties by key index).
    pub denials_by_key: Vec<(u32, u64)>,
}

impl Run {
    /// When the last request was served, after the origin.
    pub fn finished(&self) -> Option<Duration> {
        self.finished_us.map(Duration::from_micros)
    }
}

/// Why a replay failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The in-memory store could not be built.
    #[error("cannot build the store: {0}")]
    Config(#[from] ConfigError),
    /// The store refused a decision.
    #[error("the store failed: {0}")]
    Store(#[from] StoreError),
}

/// How a replay treats rejected requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimOptions {
    /// The most times one request is retried when the workload retries
    /// (default 1,000).
    pub max_retries: u32,
}

impl Default for SimOptions {
    fn default() -> Self {
        Self { max_retries: 1_000 }
    }
}

/// The wait a client of the layer is told, in µs: `Retry-After` carries
/// whole seconds, rounded up and at least 1, so a client that honours it
/// comes back no sooner. (Retried at the exact wait instead, every client
/// refused in one second came back at one instant, one was admitted and
/// the rest were refused again: ten times the denials a real client
/// meets, for GCRA at 10/s.)
fn told_wait_us(wait: std::time::Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1).saturating_mul(1_000_000)
}

/// A queued attempt: (time, sequence number, key, cost, attempt number,
/// time first sent). The sequence number keeps equal times in send order.
type Queued = Reverse<(u64, u64, u32, u64, u32, u64)>;

/// Replays `workload` through `policy`, on a fresh [`MemoryStore`] whose
/// fake clock is set to each request's time: the decisions are exactly the
/// ones the layer or Redis would make for that traffic.
///
/// ```
/// use tollgate_core::{Algorithm, Policy};
/// use tollgate_sim::{Pattern, PatternOptions, SimOptions, simulate};
///
/// let workload = Pattern::Burst.workload(&PatternOptions::default())?;
/// let policy = Policy::new("60-per-min", Algorithm::FixedWindow, "60/min")?;
/// let run = simulate(&workload, &policy, SimOptions::default())?;
/// // Ten bursts of 100, each in its own minute: 60 of each admitted.
/// assert_eq!((run.allowed, run.denied), (600, 400));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// [`SimError`] if the store cannot be built or fails.
pub fn simulate(
    workload: &Workload,
    policy: &Policy,
    options: SimOptions,
) -> Result<Run, SimError> {
    let clock = FakeClock::new(workload.origin);
    let store = MemoryStore::builder()
        .shards(1)
        .max_keys(workload.keys.len().max(1))
        .clock(clock.clone())
        .build()?;
    let keys: Vec<Key> = workload.keys.iter().map(Key::custom).collect();
    let origin = workload.origin.as_micros();

    let mut run = Run {
        policy: policy.clone(),
        attempts: Vec::with_capacity(workload.len()),
        requests: 0,
        allowed: 0,
        denied: 0,
        delayed: 0,
        never_admitted: 0,
        phase_starts_us: Vec::new(),
        finished_us: None,
        denials_by_key: Vec::new(),
    };
    let mut denials = vec![0_u64; workload.keys.len()];
    let mut queue: BinaryHeap<Queued> = BinaryHeap::new();
    let mut seq = 0_u64;
    let mut phase = 0;
    let mut outstanding = 0_usize;
    let mut phase_done_us = 0_u64;

    let start_phase = |index: usize,
                       after_us: u64,
                       queue: &mut BinaryHeap<Queued>,
                       run: &mut Run,
                       seq: &mut u64|
     -> usize {
        let Some(p) = workload.phases.get(index) else {
            return 0;
        };
        let start_us = match p.start {
            Start::At(t) => t.as_micros().saturating_sub(origin).max(after_us),
            Start::AfterPrevious => after_us,
        };
        run.phase_starts_us.push(start_us);
        for a in &p.arrivals {
            let at = start_us + a.offset_us;
            queue.push(Reverse((at, *seq, a.key, a.cost, 0, at)));
            *seq += 1;
        }
        run.requests += p.arrivals.len() as u64;
        p.arrivals.len()
    };

    // Empty phases start and end at once.
    while outstanding == 0 && phase < workload.phases.len() {
        outstanding = start_phase(phase, phase_done_us, &mut queue, &mut run, &mut seq);
        phase += 1;
    }

    while let Some(Reverse((at, _, key, cost, attempt, first_sent))) = queue.pop() {
        clock.set(Timestamp::from_micros(origin + at));
        let Some(id) = keys.get(key as usize) else {
            continue;
        };
        let decision = store.check_sync(id, policy, cost)?;
        let mut resolved = true;
        match decision.outcome() {
            Outcome::Allowed => {
                let delay_us = u64::try_from(decision.delay().as_micros()).unwrap_or(u64::MAX);
                run.attempts.push(Attempt {
                    at_us: at,
                    key,
                    admitted: true,
                    delay_us,
                });
                run.allowed += 1;
                let served = at.saturating_add(delay_us);
                if served > first_sent {
                    run.delayed += 1;
                }
                run.finished_us = Some(run.finished_us.unwrap_or(0).max(served));
                phase_done_us = phase_done_us.max(served);
            }
            outcome => {
                run.attempts.push(Attempt {
                    at_us: at,
                    key,
                    admitted: false,
                    delay_us: 0,
                });
                run.denied += 1;
                if let Some(n) = denials.get_mut(key as usize) {
                    *n += 1;
                }
                match outcome {
                    Outcome::Limited { retry_after }
                        if workload.retry && attempt < options.max_retries =>
                    {
                        let again = at.saturating_add(told_wait_us(retry_after));
                        queue.push(Reverse((again, seq, key, cost, attempt + 1, first_sent)));
                        seq += 1;
                        resolved = false;
                    }
                    // (`Allowed` was answered above.)
                    Outcome::Limited { .. }
                    | Outcome::CostExceedsCapacity { .. }
                    | Outcome::Allowed => {
                        run.never_admitted += 1;
                        phase_done_us = phase_done_us.max(at);
                    }
                }
            }
        }
        if resolved {
            outstanding = outstanding.saturating_sub(1);
            while outstanding == 0 && phase < workload.phases.len() {
                outstanding = start_phase(phase, phase_done_us, &mut queue, &mut run, &mut seq);
                phase += 1;
            }
        }
    }

    let mut by_key: Vec<(u32, u64)> = denials
        .into_iter()
        .enumerate()
        .filter(|&(_, n)| n > 0)
        .map(|(k, n)| (u32::try_from(k).unwrap_or(u32::MAX), n))
        .collect();
    by_key.sort_by_key(|&(k, n)| (Reverse(n), k));
    run.denials_by_key = by_key;
    Ok(run)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::told_wait_us;

    /// A client comes back after the whole seconds `Retry-After` told it,
    /// at least one.
    #[test]
    fn a_retry_waits_what_retry_after_tells() {
        assert_eq!(told_wait_us(Duration::ZERO), 1_000_000);
        assert_eq!(told_wait_us(Duration::from_micros(1)), 1_000_000);
        assert_eq!(told_wait_us(Duration::from_millis(1_001)), 2_000_000);
        assert_eq!(told_wait_us(Duration::from_secs(3_600)), 3_600_000_000);
    }
}
