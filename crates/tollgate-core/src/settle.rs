//! [`Settlement`]: a request's real cost, known after it ran, settled
//! against the cost it reserved before.

use std::time::Duration;

use crate::Algorithm;
use crate::decision::{DecidedBy, Decision};
use crate::policy::{MAX_SPAN_US, Policy};
use crate::time::Timestamp;

/// The shortest fence a reset or a block leaves (see [`Settlement::fence`]).
const SHORTEST_FENCE: Duration = Duration::from_secs(60);

/// How much longer than its nominal period a calendar period can last: a
/// change of daylight saving time (two hours at most, in any zone).
const CALENDAR_SHIFT_US: u64 = 2 * 3600 * 1_000_000;

/// A request's actual cost, settled against what it reserved: the store
/// refunds the unused part or charges the rest (see
/// [`Store::settle`](crate::Store::settle)).
///
/// A charge is never denied: it is work already done. A key charged
/// beyond its remaining allowance goes into debt, and its next admission
/// waits until the debt is paid off. What that means per algorithm:
///
/// | algorithm | charge beyond the allowance | refund |
/// |---|---|---|
/// | GCRA, leaky bucket | the backlog grows past capacity: the next request waits until it drains | the backlog shrinks, never below empty, by no more than the reservation's units still in it (they are gone capacity × interval after it) |
/// | token bucket | the bucket goes below empty: refills pay the debt first | tokens come back, never above capacity, and no more than the reservation's that have not refilled (all have, capacity × interval after it) |
/// | fixed window | the window counts past its limit and denies until it ends; the debt ends with the window | taken from the window the request was reserved in, if it is still the current one |
/// | sliding window | the current window counts past its limit, which also weighs on the next window | taken from the window the request was reserved in, current or previous |
/// | sliding log | an entry of the charged cost, now; it ages out after the period | taken from the entries of the reservation's own time, while they have not aged out |
///
/// Every amount and every debt saturates at 2^50 (a backlog of at most
/// about 35 years): a charge that would take a backlog beyond it takes it
/// to 2^50 µs from now (never lower than it was), and a count to 2^50. So
/// a larger actual cost never leaves a key more remaining, or an earlier
/// retry, than a smaller one: a request that cost `u64::MAX` leaves its
/// key unable to admit anything for decades.
///
/// **Resets and blocks fence refunds.** [`Store::reset`](crate::Store::reset)
/// and [`Store::block`](crate::Store::block) forget the key's state, and
/// with it every unit reserved before them. A refund of a request reserved
/// before that moment would give those units back a second time, to the
/// fresh state: tollgate's stores drop it, and the settlement changes
/// nothing (its decision is the key's status). Dropped are the refunds of
/// requests reserved at or before the reset or the block's start, on the
/// store's clock, that come within [`Settlement::fence`] after the reset,
/// or after the block ends (a later reset or block never shortens a fence
/// already there). A charge is work done, and lands whenever it comes,
/// but on a key still blocked, whose state holds nothing until the block
/// ends (the settlement's decision is the block's denial). So
/// a refund that was on its way when an operator reset a key (the unused
/// part of a quota lease given back, a request that reserved more than it
/// used) gives the fresh state nothing; one that comes after the fence
/// lands as on any key.
///
/// On Redis, a busy key's decision sent alone is dated by the store's
/// estimate of Redis's clock, made when the call was sent: never later
/// than the script ran, on one server whose clock does not step, but
/// perhaps earlier, so a request sent just before a reset and decided just
/// after it may have its refund dropped too, which can only under-admit.
/// Before the store has seen Redis (it was down at boot) the system clock
/// stands in, and on a cluster the estimate is off by the skew between
/// nodes: there a refund may escape the fence by that much.
///
/// ```
/// use tollgate_core::{Algorithm, Policy, Settlement, Timestamp};
/// use tollgate_core::state::PolicyState;
///
/// let policy = Policy::new("tokens", Algorithm::Gcra, "60/min")?;
/// let now = Timestamp::from_secs(1_700_000_000);
/// let mut state = PolicyState::new(&policy, now);
/// // Reserve 10 tokens, then learn that the call used 4.
/// let reserved = state.decide(&policy, now, 10);
/// assert_eq!(reserved.remaining(), 50);
/// let settled = state.settle(&policy, now, &Settlement::of(&reserved, 10, 4));
/// assert_eq!(settled.remaining(), 56);
/// // A call that used 74 leaves the key 18 tokens in debt: at one token a
/// // second, the next request of 1 waits 19 seconds.
/// let reserved = state.decide(&policy, now, 10);
/// let settled = state.settle(&policy, now, &Settlement::of(&reserved, 10, 74));
/// assert_eq!(settled.remaining(), 0);
/// let next = state.decide(&policy, now, 1);
/// assert_eq!(next.retry_after().unwrap().as_secs(), 19);
/// # Ok::<(), tollgate_core::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settlement {
    reserved: u64,
    actual: u64,
    reserved_at: Timestamp,
    decided_by: DecidedBy,
}

/// What a settlement does to a key's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Nothing: the request cost what it reserved.
    None,
    /// Charges this much more, admitted or not.
    Charge(u64),
    /// Gives back this much of what was reserved at `since` (µs).
    Refund { amount: u64, since: u64 },
}

impl Settlement {
    /// A request that reserved `reserved` at `reserved_at` (the store's
    /// time of the reservation, [`Decision::reserved_at`]) and cost
    /// `actual`.
    /// Its reservation is taken as made by the store it is settled in
    /// ([`DecidedBy::Store`]).
    pub fn new(reserved: u64, actual: u64, reserved_at: Timestamp) -> Self {
        Self {
            reserved,
            actual,
            reserved_at,
            decided_by: DecidedBy::Store,
        }
    }

    /// The settlement of the request `reservation` admitted at cost
    /// `reserved`, which cost `actual`. It keeps who decided the
    /// reservation ([`Decision::decided_by`]), so that a store with a local
    /// fallback settles it where it was made.
    ///
    /// ```
    /// use tollgate_core::{Algorithm, DecidedBy, MemoryStore, Key, Policy, Settlement};
    ///
    /// let policy = Policy::new("tokens", Algorithm::TokenBucket, "1000/min")?;
    /// let reservation = MemoryStore::new().check_sync(&Key::user("acme"), &policy, 300)?;
    /// let local = reservation.clone().with_decided_by(DecidedBy::LocalFallback);
    /// assert_eq!(Settlement::of(&reservation, 300, 0).decided_by(), DecidedBy::Store);
    /// assert_eq!(Settlement::of(&local, 300, 0).decided_by(), DecidedBy::LocalFallback);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn of(reservation: &Decision, reserved: u64, actual: u64) -> Self {
        Self {
            decided_by: reservation.decided_by(),
            ..Self::new(reserved, actual, reservation.reserved_at())
        }
    }

    /// Who decided the reservation: the store it is settled in, unless it
    /// was made [of](Settlement::of) a decision that says otherwise.
    pub fn decided_by(&self) -> DecidedBy {
        self.decided_by
    }

    /// The same settlement, of a reservation `by` decided (as
    /// [`Settlement::of`] keeps it from a decision).
    ///
    /// ```
    /// use tollgate_core::{DecidedBy, Settlement, Timestamp};
    ///
    /// let settlement = Settlement::new(300, 0, Timestamp::from_secs(5));
    /// let local = settlement.with_decided_by(DecidedBy::LocalFallback);
    /// assert_eq!(local.decided_by(), DecidedBy::LocalFallback);
    /// assert_eq!((local.reserved(), local.actual()), (300, 0));
    /// ```
    pub fn with_decided_by(self, by: DecidedBy) -> Self {
        Self {
            decided_by: by,
            ..self
        }
    }

    /// The cost reserved before the request ran.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// What the request really cost.
    pub fn actual(&self) -> u64 {
        self.actual
    }

    /// When the reservation was admitted, on the store's clock.
    pub fn reserved_at(&self) -> Timestamp {
        self.reserved_at
    }

    /// How long after a reset of a key under `policy` (or after a block of
    /// it ends) a refund of a request reserved at or before the reset or
    /// block is dropped: as long as a refund can give back anything of a
    /// request reserved then, and at least a minute. That is, per limit,
    /// its period for a fixed window or a sliding log (a calendar day,
    /// week or month two hours more, for a change of daylight saving
    /// time), two periods for a sliding window (whose refund may come from
    /// the previous window), and capacity × interval for a rate-based
    /// algorithm (when its burst is above its count, longer than the
    /// period). Each reset or block keeps a small record of its fence that
    /// long, in either store, even of a key that held no state.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::{Algorithm, Policy, Settlement};
    ///
    /// let per_second = Policy::new("api", Algorithm::Gcra, "100/s")?;
    /// assert_eq!(Settlement::fence(&per_second), Duration::from_secs(60));
    /// let per_hour = Policy::new("api", Algorithm::FixedWindow, "5000/h")?;
    /// assert_eq!(Settlement::fence(&per_hour), Duration::from_secs(3600));
    /// let sliding = Policy::new("api", Algorithm::SlidingWindow, "5000/h")?;
    /// assert_eq!(Settlement::fence(&sliding), Duration::from_secs(7200));
    /// let bursty = Policy::builder("api").algorithm(Algorithm::Gcra).limit("10/min").burst(100).build()?;
    /// assert_eq!(Settlement::fence(&bursty), Duration::from_secs(600));
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    pub fn fence(policy: &Policy) -> Duration {
        let reach = |p: &crate::policy::LimitParams| {
            let period = match p.calendar {
                Some(_) => p.period_us.saturating_add(CALENDAR_SHIFT_US),
                None => p.period_us,
            };
            match policy.algorithm() {
                Algorithm::FixedWindow | Algorithm::SlidingLog => period,
                Algorithm::SlidingWindow => period.saturating_mul(2),
                Algorithm::Gcra | Algorithm::LeakyBucket | Algorithm::TokenBucket => {
                    crate::algorithm::rule::backlog(p, p.capacity)
                }
            }
        };
        let longest = policy.params().iter().map(reach).max();
        let longest = Duration::from_micros(longest.unwrap_or(0).min(MAX_SPAN_US));
        longest.max(SHORTEST_FENCE)
    }

    /// What the fence of a reset or a block leaves of this settlement (see
    /// [`Settlement::fence`]): a refund becomes the request settled at
    /// what it reserved, which changes nothing; a charge, or a request
    /// that cost what it reserved, stays as it is. (Tollgate's stores
    /// settle a refund or a charge of a key kept under another
    /// configuration that does not carry over whole, and still holds use,
    /// at what it reserved: see [`Store::settle`](crate::Store::settle).)
    ///
    /// ```
    /// use tollgate_core::{Settlement, Timestamp};
    ///
    /// let at = Timestamp::from_secs(5);
    /// let refund = Settlement::new(10, 4, at).behind_fence();
    /// assert_eq!(refund, Settlement::new(10, 10, at));
    /// assert_eq!((refund.charge(), refund.refund()), (0, 0));
    /// let charge = Settlement::new(10, 15, at);
    /// assert_eq!(charge.behind_fence(), charge);
    /// ```
    pub fn behind_fence(&self) -> Self {
        if self.actual < self.reserved {
            Self {
                actual: self.reserved,
                ..*self
            }
        } else {
            *self
        }
    }

    /// The settlement of this request at what it reserved, which changes
    /// nothing: what a store settles in place of a refund or a charge of a
    /// key kept under another configuration that does not carry over
    /// whole and still holds use.
    pub(crate) fn unchanged(&self) -> Self {
        Self {
            actual: self.reserved,
            ..*self
        }
    }

    /// Whether a fence that a reset or a block set at `at` drops this
    /// settlement: a refund of a request reserved at or before `at`.
    pub(crate) fn fenced_by(&self, at: Timestamp) -> bool {
        self.actual < self.reserved && self.reserved_at <= at
    }

    /// What the settlement changes, each amount capped at 2^50.
    pub(crate) fn change(&self) -> Change {
        let (reserved, actual) = (self.reserved, self.actual);
        if actual > reserved {
            Change::Charge((actual - reserved).min(MAX_SPAN_US))
        } else if actual < reserved {
            Change::Refund {
                amount: (reserved - actual).min(MAX_SPAN_US),
                since: self.reserved_at.as_micros(),
            }
        } else {
            Change::None
        }
    }

    /// How much more the settlement charges (0 if none), at most 2^50.
    pub fn charge(&self) -> u64 {
        match self.change() {
            Change::Charge(n) => n,
            Change::None | Change::Refund { .. } => 0,
        }
    }

    /// How much the settlement gives back (0 if none), at most 2^50.
    pub fn refund(&self) -> u64 {
        match self.change() {
            Change::Refund { amount, .. } => amount,
            Change::None | Change::Charge(_) => 0,
        }
    }
}
