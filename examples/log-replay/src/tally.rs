//! What a replay counts: per client, per policy file, over time.

use std::collections::BTreeMap;

use tollgate::Timestamp;

/// The most buckets of a [`Timeline`]: past them, pairs merge and the
/// width doubles, so a timeline's memory is bounded whatever the span.
const BUCKETS: usize = 240;

/// Admitted and refused requests over time, in buckets of equal width.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    start: Option<Timestamp>,
    /// Seconds per bucket (at least 1).
    width: u64,
    admitted: Vec<u64>,
    refused: Vec<u64>,
}

impl Timeline {
    pub(crate) fn add(&mut self, at: Timestamp, refused: bool) {
        let start = *self.start.get_or_insert(at);
        if self.width == 0 {
            self.width = 1;
        }
        let secs = at.saturating_duration_since(start).as_secs();
        let mut index = secs / self.width;
        while index >= BUCKETS as u64 {
            self.halve();
            index = secs / self.width;
        }
        // Below BUCKETS, so it fits a usize.
        let index = usize::try_from(index).unwrap_or(BUCKETS - 1);
        if self.admitted.len() <= index {
            self.admitted.resize(index + 1, 0);
            self.refused.resize(index + 1, 0);
        }
        let counts = if refused {
            &mut self.refused
        } else {
            &mut self.admitted
        };
        counts[index] += 1;
    }

    fn halve(&mut self) {
        for counts in [&mut self.admitted, &mut self.refused] {
            let merged: Vec<u64> = counts.chunks(2).map(|pair| pair.iter().sum()).collect();
            *counts = merged;
        }
        self.width *= 2;
    }

    /// When the first bucket starts (the first request's time).
    pub fn start(&self) -> Option<Timestamp> {
        self.start
    }

    /// Seconds per bucket.
    pub fn width_secs(&self) -> u64 {
        self.width.max(1)
    }

    /// Requests admitted per bucket.
    pub fn admitted(&self) -> &[u64] {
        &self.admitted
    }

    /// Requests refused per bucket.
    pub fn refused(&self) -> &[u64] {
        &self.refused
    }
}

/// What one policy file did to the whole log.
#[derive(Debug, Clone, Default)]
pub struct LaneTally {
    pub(crate) name: String,
    pub(crate) refused: u64,
    pub(crate) by_policy: BTreeMap<String, u64>,
    pub(crate) timeline: Timeline,
}

impl LaneTally {
    /// The policy file's name in the report.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The requests it refused (429).
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Its refusals by the policy that fired (`x-ratelimit-resource`;
    /// `in-flight` for an in-flight limit, `unnamed` without headers).
    pub fn by_policy(&self) -> &BTreeMap<String, u64> {
        &self.by_policy
    }

    /// Its admissions and refusals over time.
    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }
}

/// One client's requests and, per policy file, its refusals. A client is
/// the logged user, or the address of a request without one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTally {
    pub(crate) requests: u64,
    pub(crate) lanes: Vec<Refusals>,
}

/// One client's refusals under one policy file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Refusals {
    pub(crate) count: u64,
    pub(crate) first: Option<Timestamp>,
    pub(crate) last: Option<Timestamp>,
}

impl ClientTally {
    pub(crate) fn new(lanes: usize) -> Self {
        ClientTally {
            requests: 0,
            lanes: vec![Refusals::default(); lanes],
        }
    }

    /// Its replayed requests.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// How many the policy file `lane` (its place in [`Replay::new`])
    /// refused; 0 for a lane that does not exist.
    ///
    /// [`Replay::new`]: crate::Replay::new
    pub fn refused(&self, lane: usize) -> u64 {
        self.lanes.get(lane).map_or(0, |r| r.count)
    }

    /// When the policy file `lane` first and last refused it.
    pub fn refused_between(&self, lane: usize) -> Option<(Timestamp, Timestamp)> {
        let r = self.lanes.get(lane)?;
        r.first.zip(r.last)
    }
}
