//! The outcome of one rate-limit check.

use std::time::Duration;

use smallvec::SmallVec;

use crate::limit::Limit;
use crate::policy::Policy;
use crate::time::Timestamp;

/// Whether a request was admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Admitted; [`Decision::delay`] says how long to hold it first (only
    /// the leaky bucket delays).
    Allowed,
    /// Denied for now; the same request is admitted at `retry_after` from
    /// the decision, if nothing else consumes the limit meanwhile.
    Limited {
        /// The exact earliest time from the decision at which the same
        /// request would be admitted.
        retry_after: Duration,
    },
    /// Denied for good: the request's cost is larger than the capacity of
    /// one of the policy's limits, so no amount of waiting admits it.
    CostExceedsCapacity {
        /// The request's cost.
        cost: u64,
        /// The capacity it exceeds.
        capacity: u64,
    },
}

/// The state of one limit of a policy after a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitStatus {
    // Compact (56 bytes): a decision carries one per limit, and the memory
    // store's whole check costs about as much as moving a few of these.
    index: u32,
    limit: Limit,
    capacity: u64,
    remaining: u64,
    reset_us: u64,
    /// `NO_RETRY` when the limit admitted the request.
    retry_us: u64,
}

const NO_RETRY: u64 = u64::MAX;

fn micros(d: Duration) -> u64 {
    // Durations here are at most a year or so; saturate rather than wrap.
    u64::try_from(d.as_micros()).unwrap_or(NO_RETRY - 1)
}

impl LimitStatus {
    /// The status of limit number `index` of a policy. Stores build these;
    /// `remaining` is clamped to `capacity`.
    pub fn new(
        index: usize,
        limit: Limit,
        capacity: u64,
        remaining: u64,
        reset: Duration,
        retry_after: Option<Duration>,
    ) -> Self {
        Self::from_micros(
            index,
            limit,
            capacity,
            remaining,
            micros(reset),
            retry_after.map(micros),
        )
    }

    /// [`LimitStatus::new`] in microseconds, for stores.
    #[inline(always)]
    pub(crate) fn from_micros(
        index: usize,
        limit: Limit,
        capacity: u64,
        remaining: u64,
        reset_us: u64,
        retry_us: Option<u64>,
    ) -> Self {
        Self {
            index: u32::try_from(index).unwrap_or(u32::MAX),
            limit,
            capacity,
            remaining: remaining.min(capacity),
            reset_us: reset_us.min(NO_RETRY - 1),
            retry_us: retry_us.map_or(NO_RETRY, |r| r.min(NO_RETRY - 1)),
        }
    }

    /// The limit's position in [`Policy::limits`].
    pub fn index(&self) -> usize {
        self.index as usize
    }

    /// The limit.
    pub fn limit(&self) -> Limit {
        self.limit
    }

    /// How much cost the limit admits at once (`x-ratelimit-limit`).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// How many cost-1 requests this limit would admit right now.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// `capacity - remaining`.
    pub fn used(&self) -> u64 {
        self.capacity - self.remaining
    }

    /// When this limit is fully back: the window's end for a fixed window,
    /// otherwise the time until nothing counts against it.
    pub fn reset(&self) -> Duration {
        Duration::from_micros(self.reset_us)
    }

    /// When this limit would admit the request, if it denied it.
    pub fn retry_after(&self) -> Option<Duration> {
        (self.retry_us != NO_RETRY).then(|| Duration::from_micros(self.retry_us))
    }
}

/// The result of checking one request against a policy.
///
/// The *binding* limit is the one that decided: for a denial the limit
/// that admits the request last, otherwise the limit with the fewest
/// remaining requests. [`Decision::limit`], [`remaining`](Decision::remaining),
/// [`used`](Decision::used) and [`reset`](Decision::reset) describe it; every
/// limit's state is in [`Decision::limits`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    outcome: Outcome,
    now: Timestamp,
    delay: Duration,
    binding: u32,
    limits: SmallVec<[LimitStatus; 2]>,
}

impl Decision {
    /// Assembles a decision from the state of each limit and picks the
    /// binding limit. Stores call this with one status per limit of the
    /// policy, in the policy's order. (An empty `limits` is taken as every
    /// limit exhausted.)
    pub fn new(
        policy: &Policy,
        outcome: Outcome,
        now: Timestamp,
        delay: Duration,
        limits: impl IntoIterator<Item = LimitStatus>,
    ) -> Self {
        let mut limits: SmallVec<[LimitStatus; 2]> = limits.into_iter().collect();
        if limits.is_empty() {
            // A store that reports no limit is a bug in the store; report the
            // policy's limits as exhausted rather than panic later.
            limits = policy
                .params()
                .iter()
                .enumerate()
                .map(|(i, p)| LimitStatus::new(i, p.limit, p.capacity, 0, Duration::ZERO, None))
                .collect();
        }
        let binding = match outcome {
            Outcome::Allowed => {
                position_min_by_key(&limits, |s| (s.remaining, std::cmp::Reverse(s.reset_us)))
            }
            Outcome::Limited { .. } => position_min_by_key(&limits, |s| {
                std::cmp::Reverse(if s.retry_us == NO_RETRY {
                    0
                } else {
                    s.retry_us
                })
            }),
            Outcome::CostExceedsCapacity { capacity, .. } => limits
                .iter()
                .position(|s| s.capacity == capacity)
                .unwrap_or(0),
        };
        Self {
            outcome,
            now,
            delay,
            binding: u32::try_from(binding).unwrap_or(0),
            limits,
        }
    }

    /// A decision of a one-limit policy: [`Decision::new`] without the
    /// search for the binding limit.
    #[inline(always)]
    pub(crate) fn single(
        outcome: Outcome,
        now: Timestamp,
        delay: Duration,
        status: LimitStatus,
    ) -> Self {
        let mut limits = SmallVec::new();
        limits.push(status);
        Self {
            outcome,
            now,
            delay,
            binding: 0,
            limits,
        }
    }

    /// Whether the request was admitted.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// `true` when the request was admitted.
    pub fn is_allowed(&self) -> bool {
        self.outcome == Outcome::Allowed
    }

    /// When the decision was made, by the store's clock.
    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// How long to hold an admitted request before it proceeds; non-zero
    /// only for the leaky bucket, which shapes traffic.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// For a denial that waiting can cure, the exact earliest time from
    /// [`Decision::now`] at which the same request would be admitted.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.outcome {
            Outcome::Limited { retry_after } => Some(retry_after),
            _ => None,
        }
    }

    /// The binding limit's state.
    pub fn binding(&self) -> &LimitStatus {
        // `new` keeps `binding` in range whenever `limits` is non-empty.
        &self.limits[(self.binding as usize).min(self.limits.len().saturating_sub(1))]
    }

    /// The binding limit's capacity.
    pub fn limit(&self) -> u64 {
        self.binding().capacity
    }

    /// How many cost-1 requests the binding limit would admit right now.
    pub fn remaining(&self) -> u64 {
        self.binding().remaining
    }

    /// `limit - remaining` for the binding limit.
    pub fn used(&self) -> u64 {
        self.binding().used()
    }

    /// How long until the binding limit is fully back.
    pub fn reset(&self) -> Duration {
        self.binding().reset()
    }

    /// When the binding limit is fully back, by the store's clock.
    pub fn reset_at(&self) -> Timestamp {
        self.now + self.binding().reset()
    }

    /// Every limit's state, in the order of the policy's limits.
    pub fn limits(&self) -> &[LimitStatus] {
        &self.limits
    }
}

fn position_min_by_key<K: Ord>(limits: &[LimitStatus], key: impl Fn(&LimitStatus) -> K) -> usize {
    limits
        .iter()
        .enumerate()
        .min_by_key(|(i, s)| (key(s), *i))
        .map_or(0, |(i, _)| i)
}
