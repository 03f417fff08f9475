//! What a replay counts: per client, per policy file, over time.

use std::collections::BTreeMap;

use tollgate::Timestamp;

/// The most buckets of a [`Timeline`]: past them, pairs merge and the
/// width doubles, so a timeline's memory is bounded whatever the span.
const BUCKETS: usize = 240;

/// Who answered a replayed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The route's handler: the request was admitted.
    Route,
    /// A limit, with `429`.
    Refused,
    /// Neither: the demo's auth (`401`), no route (`404`, `405`), or a
    /// failure policy in a store's place (`503`).
    Otherwise,
}

/// Admitted and refused requests over time, in buckets of equal width.
/// Requests answered neither by their route nor with a refusal are in
/// neither.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    start: Option<Timestamp>,
    /// Seconds per bucket (at least 1).
    width: u64,
    admitted: Vec<u64>,
    refused: Vec<u64>,
}

impl Timeline {
    pub(crate) fn add(&mut self, at: Timestamp, answer: Answer) {
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
        match answer {
            Answer::Route => self.admitted[index] += 1,
            Answer::Refused => self.refused[index] += 1,
            Answer::Otherwise => {}
        }
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

    /// Requests admitted (answered by their route) per bucket.
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
    pub(crate) otherwise: BTreeMap<u16, u64>,
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

    /// The requests answered neither by their route nor with a `429`, by
    /// status: the demo's auth (`401`, a call of `/api/*` without a user),
    /// a path or method without a route (`404`, `405`), a failure
    /// policy's answer in the store's place (`503` under `closed`, see
    /// [`Replay::MAX_KEYS`](crate::Replay::MAX_KEYS)). Neither admitted
    /// nor refused, they are counted here so that none goes unseen.
    pub fn answered_otherwise(&self) -> &BTreeMap<u16, u64> {
        &self.otherwise
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
