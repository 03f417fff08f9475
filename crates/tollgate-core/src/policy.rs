//! Policies: a name, an algorithm and the limits that must all hold.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::algorithm::Algorithm;
use crate::calendar::Calendar;
use crate::calendar::period::CalendarPeriod;
use crate::error::ConfigError;
use crate::limit::Limit;

/// Parses the configuration name of an algorithm, such as `"gcra"`.
impl FromStr for Algorithm {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| ConfigError::UnknownAlgorithm {
                input: s.to_owned(),
            })
    }
}

/// The numbers an algorithm works with for one limit, derived once when the
/// policy is built. Stores use them; see the algorithm docs for meaning.
#[doc(hidden)] // a storage encoding, shared with tollgate-redis: not part of the API
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LimitParams {
    /// The limit itself.
    pub limit: Limit,
    /// The period in microseconds.
    pub period_us: u64,
    /// Microseconds per unit of cost for the rate-based algorithms
    /// ([`Limit::interval_micros`]).
    pub interval_us: u64,
    /// How much cost can be admitted at once: the burst for the rate-based
    /// algorithms when one is set, otherwise the limit's count. This is the
    /// value reported as `x-ratelimit-limit`.
    pub capacity: u64,
    /// `interval_us` prepared for fast division: a decision divides by it
    /// to count the remaining requests, and a 64-bit `div` instruction costs
    /// as much as the rest of a memory-store GCRA check's arithmetic.
    pub(crate) per_interval: Divisor,
    /// The longest interval of the policy's limits, prepared for division
    /// likewise: how far a joint queue (the leaky bucket's) moves on for
    /// each unit of cost admitted, whatever the limit.
    pub(crate) per_queue_step: Divisor,
    /// The calendar period of a limit per day, week or month under a
    /// calendar (and of every monthly limit); `None` for a window aligned
    /// to the epoch.
    pub(crate) calendar: Option<CalendarPeriod>,
}

impl LimitParams {
    /// `(start, end)` in µs of the fixed window that holds `t`: a multiple
    /// of the period, or the calendar period.
    #[inline]
    pub fn window(&self, t: u64) -> (u64, u64) {
        match &self.calendar {
            None => {
                let period = self.period_us.max(1);
                let start = t - t % period;
                (start, start.saturating_add(period))
            }
            Some(calendar) => calendar.window(t),
        }
    }

    /// For a calendar period, the starts of the periods around `t`: the
    /// one before the period holding `t`, its own, and the next two (what
    /// the Redis store sends its scripts, which pick the period holding
    /// Redis's time). `None` for a window aligned to the epoch.
    pub fn calendar_bounds(&self, t: u64) -> Option<[u64; 4]> {
        self.calendar.map(|c| c.bounds(t))
    }
}

/// A divisor fixed when the policy is built, dividing by a multiplication
/// and shifts ([`strength_reduce`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Divisor(strength_reduce::StrengthReducedU64);

impl Divisor {
    /// Divides by `d`, or by 1 when `d` is 0 (which validated limits never
    /// give).
    pub(crate) fn new(d: u64) -> Self {
        Self(strength_reduce::StrengthReducedU64::new(d.max(1)))
    }
}

impl std::ops::Div<Divisor> for u64 {
    type Output = u64;

    fn div(self, d: Divisor) -> u64 {
        self / d.0
    }
}

// Derived from the other fields, so equal and hashed by the divisor alone.
impl PartialEq for Divisor {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Eq for Divisor {}

impl std::hash::Hash for Divisor {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.get().hash(state);
    }
}

/// A named rate-limiting policy: one algorithm and one or more limits that
/// must all hold.
///
/// Cloning is cheap (the policy is shared behind an [`Arc`]). Build one with
/// [`Policy::builder`]; every invalid setting is a [`ConfigError`] from
/// [`PolicyBuilder::build`](crate::PolicyBuilder::build).
///
/// ```
/// use tollgate_core::{Algorithm, Policy};
///
/// let policy = Policy::builder("search")
///     .algorithm(Algorithm::SlidingWindow)
///     .limit("25/5s")
///     .limit("300/min")
///     .build()?;
/// assert_eq!(policy.name(), "search");
/// assert_eq!(policy.limits().len(), 2);
///
/// let err = Policy::builder("search").limit("0/s").build().unwrap_err();
/// assert_eq!(err.to_string(), "limit count must be at least 1, got 0");
/// # Ok::<(), tollgate_core::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct Policy {
    inner: Arc<Inner>,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Inner {
    name: Box<str>,
    algorithm: Algorithm,
    burst: Option<u64>,
    calendar: Option<Calendar>,
    params: Box<[LimitParams]>,
    limits: Box<[Limit]>,
    fingerprint: u64,
    descriptor: Box<str>,
    shape: Shape,
    /// A hash of the name: what identifies the policy's state in the
    /// memory store, in one number.
    identity: u64,
    /// The fingerprint, mixed to look random: the memory store tells the
    /// configurations of one name apart by it.
    config_mix: u64,
}

/// How a store may keep a key's state under a policy: one of the compact
/// forms that a single number holds, or the full
/// [`PolicyState`](crate::state::PolicyState). Known from the moment the
/// policy is built, so that a store dispatches on it once per decision.
///
/// ```
/// use tollgate_core::{Algorithm, Policy, Shape};
///
/// assert_eq!(Policy::new("api", Algorithm::Gcra, "10/s")?.shape(), Shape::Tat);
/// assert_eq!(Policy::new("api", Algorithm::FixedWindow, "100/min")?.shape(), Shape::WindowWord);
/// // A million per second counts up to the period in µs: not one word.
/// let dense = Policy::new("api", Algorithm::FixedWindow, "1000000/s")?;
/// assert_eq!(dense.shape(), Shape::Full);
/// let two = Policy::builder("api").limit("10/s").limit("100/min").build()?;
/// assert_eq!(two.shape(), Shape::Full);
/// # Ok::<(), tollgate_core::ConfigError>(())
/// ```
#[doc(hidden)] // a storage encoding, shared with tollgate-redis: not part of the API
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shape {
    /// One time in µs, when the limit's backlog clears: a single GCRA
    /// limit (its theoretical arrival time), token-bucket limit (when the
    /// bucket is full again; its level is the whole intervals until then)
    /// or leaky-bucket limit (when the queue is next free). Decided by
    /// [`decide_tat`](crate::state::decide_tat).
    Tat,
    /// A window's start plus its count: a single fixed-window limit whose
    /// count is below half its period in µs (any limit short of half a
    /// million a second). Decided by
    /// [`decide_window_word`](crate::state::decide_window_word).
    WindowWord,
    /// Anything else: the full [`PolicyState`](crate::state::PolicyState).
    Full,
}

impl Shape {
    fn of(algorithm: Algorithm, params: &[LimitParams]) -> Self {
        let [p] = params else {
            return Shape::Full;
        };
        if p.calendar.is_some() {
            // A window word's start is a multiple of its period.
            return Shape::Full;
        }
        match algorithm {
            Algorithm::Gcra | Algorithm::LeakyBucket | Algorithm::TokenBucket => Shape::Tat,
            // A word counts up to its period in µs less one: for twice the
            // limit at least, so that a charge past the cap, then refunds
            // of every request the window admitted, still leave it full.
            Algorithm::FixedWindow if p.limit.count().saturating_mul(2) < p.period_us => {
                Shape::WindowWord
            }
            Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow => {
                Shape::Full
            }
        }
    }
}

impl Policy {
    /// The largest number of limits one policy may have.
    pub const MAX_LIMITS: usize = 8;

    /// The policy of validated parts: the one place a policy's derived
    /// values (fingerprint, descriptor, shape, identity) are made.
    pub(crate) fn from_parts(
        name: String,
        algorithm: Algorithm,
        burst: Option<u64>,
        calendar: Option<Calendar>,
        limits: Vec<Limit>,
        params: Box<[LimitParams]>,
    ) -> Policy {
        let fingerprint = fingerprint(algorithm, &params);
        let shape = Shape::of(algorithm, &params);
        let mut descriptor = String::from(algorithm.as_str());
        for p in &params {
            descriptor.push_str(&format!(
                " {}/{}/{}",
                p.period_us, p.interval_us, p.capacity
            ));
        }
        if let Some(calendar) = params.iter().find_map(|p| p.calendar) {
            calendar.describe(&mut descriptor);
        }
        let mut identity = Fnv::new();
        identity.feed(name.as_bytes());
        Policy {
            inner: Arc::new(Inner {
                fingerprint,
                descriptor: descriptor.into_boxed_str(),
                shape,
                config_mix: mix(fingerprint),
                identity: identity.0,
                name: name.into_boxed_str(),
                algorithm,
                burst,
                calendar,
                params,
                limits: limits.into_boxed_slice(),
            }),
        }
    }

    /// The name reported to clients (`x-ratelimit-resource`).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.inner.algorithm
    }

    /// The limits, all of which must hold.
    pub fn limits(&self) -> &[Limit] {
        &self.inner.limits
    }

    /// The burst, if one was set.
    pub fn burst(&self) -> Option<u64> {
        self.inner.burst
    }

    /// The calendar its limits per day, week and month follow, if one was
    /// set ([`PolicyBuilder::calendar`](crate::PolicyBuilder::calendar));
    /// a monthly limit without one follows UTC's.
    pub fn calendar(&self) -> Option<Calendar> {
        self.inner.calendar
    }

    /// The derived numbers for each limit, in the order of [`Policy::limits`].
    #[doc(hidden)] // a storage encoding, shared with tollgate-redis: not part of the API
    pub fn params(&self) -> &[LimitParams] {
        &self.inner.params
    }

    /// A hash of the algorithm and the derived numbers of every limit (not
    /// the name). State built under one fingerprint is carried over to
    /// another (see [`PolicyState::carry_to`](crate::state::PolicyState::carry_to))
    /// when the configuration changes.
    /// It is FNV-1a over a fixed encoding, so every process and every
    /// version of this crate computes the same value for the same policy.
    pub fn fingerprint(&self) -> u64 {
        self.inner.fingerprint
    }

    /// What a store records with a key's state to know, when the policy's
    /// configuration has changed, what the state was written under: the
    /// algorithm, then each limit's period, interval and capacity in µs
    /// and units of cost (see [`LimitParams`]). Two policies with the same
    /// descriptor decide alike; the Redis store keeps it with every key.
    ///
    /// ```
    /// use tollgate_core::{Algorithm, Policy};
    ///
    /// let policy = Policy::builder("api").limit("100/h").limit("20/min").burst(30).build()?;
    /// assert_eq!(
    ///     policy.state_descriptor(),
    ///     "gcra 3600000000/36000000/30 60000000/3000000/30"
    /// );
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    #[doc(hidden)] // a storage encoding, shared with tollgate-redis: not part of the API
    pub fn state_descriptor(&self) -> &str {
        &self.inner.descriptor
    }

    /// A hash of the name, made when the policy was built: the memory
    /// store feeds this one number to its keyed hash instead of the name on
    /// every check. Every configuration of one name shares it, so that its
    /// state carries over.
    pub(crate) fn identity(&self) -> u64 {
        self.inner.identity
    }

    /// The fingerprint mixed to look random (see [`mix`]).
    pub(crate) fn config_mix(&self) -> u64 {
        self.inner.config_mix
    }

    /// How a store may keep the state of a key under this policy.
    #[doc(hidden)] // a storage encoding, shared with tollgate-redis: not part of the API
    pub fn shape(&self) -> Shape {
        self.inner.shape
    }

    /// Whether two handles point at the same policy value.
    pub fn ptr_eq(&self, other: &Policy) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.inner.name)
            .field("algorithm", &self.inner.algorithm)
            .field("limits", &self.inner.limits)
            .field("burst", &self.inner.burst)
            .field("calendar", &self.inner.calendar)
            .finish()
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}", self.name(), self.algorithm())?;
        for limit in self.limits() {
            write!(f, ", {limit}")?;
        }
        if let Some(burst) = self.burst() {
            write!(f, ", burst {burst}")?;
        }
        if let Some(calendar) = self.calendar() {
            write!(f, ", calendar {calendar}")?;
        }
        f.write_str(")")
    }
}

impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        self.inner == other.inner
    }
}

impl Eq for Policy {}

/// The longest span of time any algorithm's state may cover, in
/// microseconds (about 35 years). Keeps every timestamp well inside the
/// 2^53 range that Lua numbers represent exactly.
pub(crate) const MAX_SPAN_US: u64 = 1 << 50;

/// FNV-1a, 64 bits: fixed, so every process computes the same value.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// SplitMix64's finaliser: spreads every bit of `x` over the result.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn fingerprint(algorithm: Algorithm, params: &[LimitParams]) -> u64 {
    let mut hash = Fnv::new();
    hash.feed(algorithm.as_str().as_bytes());
    for p in params {
        for n in [p.limit.count(), p.period_us, p.interval_us, p.capacity] {
            hash.feed(&n.to_be_bytes());
        }
    }
    if let Some(calendar) = params.iter().find_map(|p| p.calendar) {
        let mut word = String::new();
        calendar.describe(&mut word);
        hash.feed(word.as_bytes());
    }
    hash.0
}
