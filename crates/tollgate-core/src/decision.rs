//! The outcome of one rate-limit check.

use std::fmt;
use std::time::Duration;

use smallvec::SmallVec;

use crate::limit::Limit;
use crate::policy::Policy;
use crate::time::Timestamp;

/// Whether a request was admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted; [`Decision::delay`] says how long to hold it first (only
    /// the leaky bucket delays).
    Allowed,
    /// Denied for now; the same request is admitted at `retry_after` from
    /// the decision, if nothing else consumes the limit meanwhile. (One
    /// exception: a local fallback deciding for a store that failed
    /// refuses a request that costs more than its share of a limit, but no
    /// more than the limit, with the time the limit makes that cost at its
    /// rate, at most its period, and of a fixed window at most the time to
    /// its end: an estimate of when the store, back, could admit it.)
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
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct LimitStatus {
    // Compact (40 bytes): a decision carries one per limit, and the memory
    // store's whole check costs about as much as moving a few of these.
    // Counts and capacities fit 32 bits (`Limit::MAX_COUNT`).
    index: u32,
    count: u32,
    capacity: u32,
    remaining: u32,
    /// The limit's period, with [`MONTHLY`] set for a monthly limit.
    period_us: u64,
    reset_us: u64,
    /// `NO_RETRY` when the limit admitted the request.
    retry_us: u64,
}

const NO_RETRY: u64 = u64::MAX;

/// Marks a monthly limit's period in [`LimitStatus`]: far above any period.
const MONTHLY: u64 = 1 << 63;

impl LimitStatus {
    /// A placeholder for unused inline room in a [`Decision`].
    const EMPTY: Self = Self {
        index: 0,
        count: 0,
        capacity: 0,
        remaining: 0,
        period_us: 0,
        reset_us: 0,
        retry_us: NO_RETRY,
    };
}

/// `d` in whole microseconds, rounded up (a retry or a delay is never made
/// shorter), saturating rather than wrapping.
fn micros(d: Duration) -> u64 {
    let us = d.as_micros() + u128::from(!d.subsec_nanos().is_multiple_of(1_000));
    u64::try_from(us).unwrap_or(NO_RETRY - 1).min(NO_RETRY - 1)
}

/// `n` in 32 bits, saturating: counts and capacities of valid policies fit.
fn narrow(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
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
        let capacity = narrow(capacity);
        Self {
            index: u32::try_from(index).unwrap_or(u32::MAX),
            count: narrow(limit.count()),
            capacity,
            remaining: narrow(remaining).min(capacity),
            period_us: limit.period_micros() | if limit.is_monthly() { MONTHLY } else { 0 },
            reset_us: reset_us.min(NO_RETRY - 1),
            retry_us: retry_us.map_or(NO_RETRY, |r| r.min(NO_RETRY - 1)),
        }
    }

    /// The limit's position in [`Policy::limits`].
    #[inline]
    pub fn index(&self) -> usize {
        self.index as usize
    }

    /// The limit.
    #[inline]
    pub fn limit(&self) -> Limit {
        Limit::from_parts(
            u64::from(self.count),
            self.period_us & !MONTHLY,
            self.period_us & MONTHLY != 0,
        )
    }

    /// How much cost the limit admits at once (`x-ratelimit-limit`).
    #[inline]
    pub fn capacity(&self) -> u64 {
        u64::from(self.capacity)
    }

    /// How many cost-1 requests this limit would admit right now.
    #[inline]
    pub fn remaining(&self) -> u64 {
        u64::from(self.remaining)
    }

    /// `capacity - remaining`.
    #[inline]
    pub fn used(&self) -> u64 {
        u64::from(self.capacity - self.remaining)
    }

    /// When this limit is fully back: the window's end for a fixed window,
    /// otherwise the time until nothing counts against it.
    #[inline]
    pub fn reset(&self) -> Duration {
        Duration::from_micros(self.reset_us)
    }

    /// When this limit would admit the request, if it denied it.
    #[inline]
    pub fn retry_after(&self) -> Option<Duration> {
        (self.retry_us != NO_RETRY).then(|| Duration::from_micros(self.retry_us))
    }
}

impl fmt::Debug for LimitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitStatus")
            .field("index", &self.index)
            .field("limit", &self.limit())
            .field("capacity", &self.capacity)
            .field("remaining", &self.remaining)
            .field("reset", &self.reset())
            .field("retry_after", &self.retry_after())
            .finish()
    }
}

/// The result of checking one request against a policy.
///
/// The *binding* limit is the one that decided: for a denial the limit
/// that admits the request last, otherwise the limit with the fewest
/// remaining requests. [`Decision::limit`], [`remaining`](Decision::remaining),
/// [`used`](Decision::used) and [`reset`](Decision::reset) describe it; every
/// limit's state is in [`Decision::limits`].
#[derive(Clone, PartialEq, Eq)]
pub struct Decision {
    // 128 bytes, so that moving one is a few vector moves rather than a
    // call to memcpy: the outcome is packed into `kind` and `arg`, times
    // are whole microseconds, and two limits fit inline.
    now: Timestamp,
    delay_us: u64,
    /// The retry time in µs (`Limited`), the cost (`CostExceedsCapacity`),
    /// or how long before `now` the units were taken (`Allowed`, see
    /// `reserved_at`).
    arg: u64,
    /// The capacity exceeded (`CostExceedsCapacity`), else the request's
    /// cost (within capacity, so within 32 bits).
    aux: u32,
    binding: u16,
    kind: Kind,
    decided_by: DecidedBy,
    limits: SmallVec<[LimitStatus; 2]>,
}

/// Who made a [`Decision`], and so where settling its request's cost
/// goes (see `RateLimiter::settle` in the `tollgate` crate).
///
/// ```
/// use tollgate_core::{Algorithm, DecidedBy, Key, MemoryStore, Policy, Store};
///
/// # block_on(async {
/// let policy = Policy::new("api", Algorithm::Gcra, "10/s")?;
/// let decision = MemoryStore::new().check(&Key::user("ada"), &policy, 1).await?;
/// assert_eq!(decision.decided_by(), DecidedBy::Store);
/// let local = decision.with_decided_by(DecidedBy::LocalFallback);
/// assert_eq!(local.decided_by(), DecidedBy::LocalFallback);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     let mut f = std::pin::pin!(f);
/// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
/// #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum DecidedBy {
    /// The store, which counted the request: its cost settles there. Every
    /// store's own decisions.
    #[default]
    Store,
    /// A local fallback, deciding while the store failed: its cost settles
    /// in that fallback, as the store never counted it.
    LocalFallback,
    /// No one counted the request: let through while the store failed,
    /// exempt by an override, or refused by an operator's deny. Settling
    /// it changes nothing anywhere.
    NoOne,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Allowed,
    Limited,
    /// Limited by an operator's block ([`Store::block`](crate::Store::block)):
    /// `Limited` in every respect but [`Decision::is_blocked`].
    Blocked,
    CostExceedsCapacity,
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
                .position(|s| s.capacity() == capacity)
                .unwrap_or(0),
        };
        let mut decision = Self::single(outcome, now, delay, LimitStatus::EMPTY, 0);
        decision.limits = limits;
        decision.binding = u16::try_from(binding).unwrap_or(0);
        decision
    }

    /// A decision of a one-limit policy for a request of `cost`:
    /// [`Decision::new`] without the search for the binding limit.
    #[inline(always)]
    pub(crate) fn single(
        outcome: Outcome,
        now: Timestamp,
        delay: Duration,
        status: LimitStatus,
        cost: u64,
    ) -> Self {
        let (kind, arg, aux) = match outcome {
            Outcome::Allowed => (Kind::Allowed, 0, narrow(cost)),
            Outcome::Limited { retry_after } => (Kind::Limited, micros(retry_after), narrow(cost)),
            Outcome::CostExceedsCapacity { cost, capacity } => {
                (Kind::CostExceedsCapacity, cost, narrow(capacity))
            }
        };
        Self {
            now,
            delay_us: micros(delay),
            arg,
            aux,
            binding: 0,
            kind,
            decided_by: DecidedBy::Store,
            limits: SmallVec::from_buf_and_len([status, LimitStatus::EMPTY], 1),
        }
    }

    /// Whether the request was admitted.
    pub fn outcome(&self) -> Outcome {
        match self.kind {
            Kind::Allowed => Outcome::Allowed,
            Kind::Limited | Kind::Blocked => Outcome::Limited {
                retry_after: Duration::from_micros(self.arg),
            },
            Kind::CostExceedsCapacity => Outcome::CostExceedsCapacity {
                cost: self.arg,
                capacity: u64::from(self.aux),
            },
        }
    }

    /// The cost the request asked for: what a refused request (a refused
    /// reservation, say) needed, beside what
    /// [`remaining`](Decision::remaining) says was left. Every store of
    /// this workspace reports it; a decision made with [`Decision::new`]
    /// says 0 until [`with_cost`](Decision::with_cost) sets it. A cost
    /// beyond what 32 bits hold can only exceed a capacity, and is
    /// reported whole by [`Outcome::CostExceedsCapacity`].
    ///
    /// ```
    /// use tollgate_core::{Algorithm, Key, MemoryStore, Policy};
    ///
    /// let store = MemoryStore::new();
    /// let policy = Policy::new("llm-tokens", Algorithm::TokenBucket, "1000/min")?;
    /// let key = Key::user("acme");
    /// store.check_sync(&key, &policy, 900)?;
    /// let refused = store.check_sync(&key, &policy, 300)?;
    /// assert!(!refused.is_allowed());
    /// assert_eq!((refused.cost(), refused.remaining()), (300, 100));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cost(&self) -> u64 {
        match self.kind {
            Kind::Allowed | Kind::Limited | Kind::Blocked => u64::from(self.aux),
            Kind::CostExceedsCapacity => self.arg,
        }
    }

    /// This decision as the answer to a request of `cost`: for a store
    /// that builds its decisions with [`Decision::new`], so that
    /// [`Decision::cost`] says what the request asked for. (A decision of
    /// [`Outcome::CostExceedsCapacity`] carries its cost already.)
    #[must_use]
    pub fn with_cost(mut self, cost: u64) -> Self {
        match self.kind {
            Kind::Allowed | Kind::Limited | Kind::Blocked => self.aux = narrow(cost),
            Kind::CostExceedsCapacity => {}
        }
        self
    }

    /// Who made this decision: [`DecidedBy::Store`] unless a caller that
    /// decided without the store said otherwise
    /// ([`with_decided_by`](Decision::with_decided_by)).
    #[inline]
    pub fn decided_by(&self) -> DecidedBy {
        self.decided_by
    }

    /// This decision, made by `by`: for a failure policy or an override
    /// that decides in the store's place.
    #[must_use]
    #[inline]
    pub fn with_decided_by(mut self, by: DecidedBy) -> Self {
        self.decided_by = by;
        self
    }

    /// `true` when the request was admitted.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.kind == Kind::Allowed
    }

    /// When the decision was made, by the store's clock.
    #[inline]
    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// When the request's units were taken from the store, by its clock:
    /// [`now`](Decision::now), unless the request was admitted from units
    /// the store granted ahead of it (a lease), which the store counted
    /// when it granted them. A settlement of the request is reserved then
    /// ([`Settlement::of`](crate::Settlement::of)): a reset or a block
    /// after the grant fences its refund, as it fences the lease's.
    ///
    /// ```
    /// use tollgate_core::{Algorithm, Key, MemoryStore, Policy, Timestamp};
    ///
    /// let policy = Policy::new("api", Algorithm::Gcra, "10/s")?;
    /// let decision = MemoryStore::new().check_sync(&Key::user("ada"), &policy, 1)?;
    /// assert_eq!(decision.reserved_at(), decision.now());
    /// let granted = Timestamp::from_micros(decision.now().as_micros() - 500_000);
    /// let leased = decision.with_reserved_at(granted);
    /// assert_eq!(leased.reserved_at(), granted);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn reserved_at(&self) -> Timestamp {
        match self.kind {
            Kind::Allowed => Timestamp::from_micros(self.now.as_micros().saturating_sub(self.arg)),
            Kind::Limited | Kind::Blocked | Kind::CostExceedsCapacity => self.now,
        }
    }

    /// This admitted decision, its units taken from the store at `at`,
    /// before [`now`](Decision::now): for a store that admits from units
    /// it was granted ahead. A time after `now` is taken as `now`, and a
    /// decision that refused its request is returned as it is.
    #[must_use]
    pub fn with_reserved_at(mut self, at: Timestamp) -> Self {
        match self.kind {
            Kind::Allowed => self.arg = self.now.as_micros().saturating_sub(at.as_micros()),
            Kind::Limited | Kind::Blocked | Kind::CostExceedsCapacity => {}
        }
        self
    }

    /// How long to hold an admitted request before it proceeds; non-zero
    /// only for the leaky bucket, which shapes traffic.
    #[inline]
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.delay_us)
    }

    /// For a denial that waiting can cure, the exact earliest time from
    /// [`Decision::now`] at which the same request would be admitted.
    #[inline]
    pub fn retry_after(&self) -> Option<Duration> {
        match self.kind {
            Kind::Limited | Kind::Blocked => Some(Duration::from_micros(self.arg)),
            Kind::Allowed | Kind::CostExceedsCapacity => None,
        }
    }

    /// `true` when the request was denied because an operator blocked its
    /// key ([`Store::block`](crate::Store::block)), until the block ends
    /// ([`retry_after`](Decision::retry_after)). Such a denial is one a
    /// dry run does not waive: the `tollgate` layer's shadow mode lets
    /// requests over the limit through, and rejects a blocked key's.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::{Algorithm, FakeClock, Key, MemoryStore, Policy, Store, Timestamp};
    ///
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     let mut f = std::pin::pin!(f);
    /// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    /// #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
    /// # }
    /// let clock = FakeClock::new(Timestamp::from_secs(1_700_000_000));
    /// let store = MemoryStore::builder().clock(clock).build()?;
    /// let policy = Policy::new("api", Algorithm::Gcra, "1/min")?;
    /// let (ada, bob) = (Key::user("ada"), Key::user("bob"));
    /// store.check_sync(&ada, &policy, 1)?;
    /// let over = store.check_sync(&ada, &policy, 1)?;
    /// assert!(!over.is_allowed() && !over.is_blocked());
    ///
    /// block_on(store.block(&bob, &policy, Duration::from_secs(3600)))?;
    /// let blocked = store.check_sync(&bob, &policy, 1)?;
    /// assert!(blocked.is_blocked());
    /// assert_eq!(blocked.retry_after(), Some(Duration::from_secs(3600)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn is_blocked(&self) -> bool {
        self.kind == Kind::Blocked
    }

    /// This denial as an operator's block's (see [`Decision::is_blocked`]).
    pub(crate) fn into_blocked(mut self) -> Self {
        if self.kind == Kind::Limited {
            self.kind = Kind::Blocked;
        }
        self
    }

    /// The binding limit's state.
    #[inline]
    pub fn binding(&self) -> &LimitStatus {
        // `new` keeps `binding` in range whenever `limits` is non-empty.
        &self.limits[(self.binding as usize).min(self.limits.len().saturating_sub(1))]
    }

    /// The binding limit's capacity.
    #[inline]
    pub fn limit(&self) -> u64 {
        self.binding().capacity()
    }

    /// How many cost-1 requests the binding limit would admit right now.
    #[inline]
    pub fn remaining(&self) -> u64 {
        self.binding().remaining()
    }

    /// `limit - remaining` for the binding limit.
    #[inline]
    pub fn used(&self) -> u64 {
        self.binding().used()
    }

    /// How long until the binding limit is fully back.
    #[inline]
    pub fn reset(&self) -> Duration {
        self.binding().reset()
    }

    /// When the binding limit is fully back, by the store's clock.
    #[inline]
    pub fn reset_at(&self) -> Timestamp {
        self.now + self.binding().reset()
    }

    /// Every limit's state, in the order of the policy's limits.
    #[inline]
    pub fn limits(&self) -> &[LimitStatus] {
        &self.limits
    }
}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decision")
            .field("outcome", &self.outcome())
            .field("now", &self.now)
            .field("reserved_at", &self.reserved_at())
            .field("delay", &self.delay())
            .field("binding", &self.binding)
            .field("blocked", &self.is_blocked())
            .field("decided_by", &self.decided_by)
            .field("limits", &self.limits)
            .finish()
    }
}

fn position_min_by_key<K: Ord>(limits: &[LimitStatus], key: impl Fn(&LimitStatus) -> K) -> usize {
    limits
        .iter()
        .enumerate()
        .min_by_key(|(i, s)| (key(s), *i))
        .map_or(0, |(i, _)| i)
}

#[cfg(test)]
mod tests;
