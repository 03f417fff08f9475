//! What is replayed: requests from a traffic log or a synthetic pattern.

mod log;
mod pattern;

pub use log::{EpochUnit, LineError, Log, LogError};
pub use pattern::{MAX_PATTERN_REQUESTS, Pattern, PatternError, PatternOptions};

use tollgate_core::Timestamp;

/// One request: when it is sent, relative to its phase's start, by which
/// key, at which cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// Microseconds after the phase starts.
    pub offset_us: u64,
    /// An index into [`Workload::keys`].
    pub key: u32,
    /// The request's cost.
    pub cost: u64,
}

/// When a phase starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// At a fixed time.
    At(Timestamp),
    /// When every request of the previous phase has been admitted (or has
    /// given up): a client that waits for one batch before the next.
    AfterPrevious,
}

/// A group of requests that start together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phase {
    /// When the phase starts.
    pub start: Start,
    /// Its requests, sorted by offset.
    pub arrivals: Vec<Arrival>,
}

/// Everything one replay sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Time zero of reports and charts.
    pub origin: Timestamp,
    /// The distinct keys, by index.
    pub keys: Vec<String>,
    /// The phases, in order; the first starts [`Start::At`] a time.
    pub phases: Vec<Phase>,
    /// Whether a rejected request is sent again after its `Retry-After`,
    /// whole seconds as the layer sends it, until admitted, as a
    /// well-behaved client does.
    pub retry: bool,
}

impl Workload {
    /// The number of requests (not counting retries).
    pub fn len(&self) -> usize {
        self.phases.iter().map(|p| p.arrivals.len()).sum()
    }

    /// Whether there is no request.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
