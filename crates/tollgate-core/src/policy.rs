//! Policies: a name, an algorithm and the limits that must all hold.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::error::ConfigError;
use crate::limit::Limit;

/// The rate-limiting algorithm of a policy.
///
/// Every store implements all six with identical decisions. The guide
/// "choosing an algorithm" compares them; in short:
///
/// | algorithm | admits | state per limit |
/// |---|---|---|
/// | [`FixedWindow`](Algorithm::FixedWindow) | N per window aligned to the Unix epoch; up to 2N across a boundary | 2 integers |
/// | [`SlidingLog`](Algorithm::SlidingLog) | exactly N in any period-long interval | one entry per admitted request |
/// | [`SlidingWindow`](Algorithm::SlidingWindow) | weighted estimate of the previous and current window | 3 integers |
/// | [`TokenBucket`](Algorithm::TokenBucket) | bursts up to the capacity, refilled continuously | 2 integers |
/// | [`LeakyBucket`](Algorithm::LeakyBucket) | shapes: admits with a delay so requests leave at the rate | 1 integer |
/// | [`Gcra`](Algorithm::Gcra) | rate plus burst, like `governor` | 1 integer |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Algorithm {
    /// Counts per window; windows are aligned to multiples of the period
    /// since the Unix epoch, as GitHub does.
    FixedWindow,
    /// Remembers every admitted request for one period: exact.
    SlidingLog,
    /// Sliding window counter: the current window's count plus the previous
    /// window's count weighted by how much of it still overlaps the sliding
    /// period.
    SlidingWindow,
    /// A bucket of `burst` tokens (default: the limit's count), refilled
    /// continuously at count per period.
    TokenBucket,
    /// A leaky bucket used as a queue: requests are admitted with a delay so
    /// that they leave at count per period; a request that finds the queue
    /// (`burst` places, default count) full is rejected.
    LeakyBucket,
    /// Generic cell rate algorithm: count per period with bursts of `burst`
    /// (default: the limit's count).
    Gcra,
}

impl Algorithm {
    /// Every algorithm, in a fixed order.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Gcra,
    ];

    /// The configuration name, such as `"sliding_window"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::Gcra => "gcra",
        }
    }

    /// Whether a policy with this algorithm accepts a `burst`.
    pub const fn has_burst(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra
        )
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

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
}

/// A divisor fixed when the policy is built, dividing by a multiplication
/// and shifts ([`strength_reduce`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Divisor(strength_reduce::StrengthReducedU64);

impl Divisor {
    /// Divides by `d`, or by 1 when `d` is 0 (which validated limits never
    /// give).
    fn new(d: u64) -> Self {
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
/// [`PolicyBuilder::build`].
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
    params: Box<[LimitParams]>,
    limits: Box<[Limit]>,
    fingerprint: u64,
    descriptor: Box<str>,
    layout: Layout,
    /// A hash of the name: what identifies the policy's state in the
    /// memory store, in one number.
    identity: u64,
    /// The fingerprint, mixed to look random: the memory store tells the
    /// configurations of one name apart by it.
    config_mix: u64,
}

/// How a store may keep a key's state under a policy: the compact forms
/// one number holds, or the full [`PolicyState`](crate::PolicyState).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Layout {
    /// One time in µs: a single GCRA, token-bucket or leaky-bucket limit.
    Word,
    /// A window's start plus its count: a single fixed-window limit whose
    /// count is below its period in µs.
    WindowWord,
    /// Anything else.
    Full,
}

impl Layout {
    fn of(algorithm: Algorithm, params: &[LimitParams]) -> Self {
        match (algorithm, params) {
            (Algorithm::Gcra | Algorithm::LeakyBucket | Algorithm::TokenBucket, [_]) => {
                Layout::Word
            }
            (Algorithm::FixedWindow, [p]) if p.limit.count() < p.period_us => Layout::WindowWord,
            _ => Layout::Full,
        }
    }
}

impl Policy {
    /// The largest number of limits one policy may have.
    pub const MAX_LIMITS: usize = 8;

    /// Starts a policy named `name`. The algorithm defaults to
    /// [`Algorithm::Gcra`].
    pub fn builder(name: impl Into<String>) -> PolicyBuilder {
        PolicyBuilder {
            name: name.into(),
            algorithm: Algorithm::Gcra,
            limits: Vec::new(),
            burst: None,
            error: None,
        }
    }

    /// A policy with a single limit.
    ///
    /// ```
    /// use tollgate_core::{Algorithm, Policy};
    ///
    /// let policy = Policy::new("api", Algorithm::FixedWindow, "100/min")?;
    /// assert_eq!(policy.limits()[0].count(), 100);
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`PolicyBuilder::build`].
    pub fn new(
        name: impl Into<String>,
        algorithm: Algorithm,
        limit: impl IntoLimit,
    ) -> Result<Self, ConfigError> {
        Self::builder(name)
            .algorithm(algorithm)
            .limit(limit)
            .build()
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

    /// The derived numbers for each limit, in the order of [`Policy::limits`].
    pub fn params(&self) -> &[LimitParams] {
        &self.inner.params
    }

    /// A hash of the algorithm and the derived numbers of every limit (not
    /// the name). State built under one fingerprint is carried over to
    /// another (see [`PolicyState::carry_to`](crate::PolicyState::carry_to))
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

    /// How a store may keep the state of a key.
    pub(crate) fn layout(&self) -> Layout {
        self.inner.layout
    }

    /// This policy with every limit (and the burst) divided by `instances`,
    /// rounded down but at least 1: each of `instances` servers deciding
    /// alone gets a fair share of the global limit. Used for the local
    /// fallback when a shared store fails.
    ///
    /// ```
    /// use tollgate_core::{Algorithm, Policy};
    ///
    /// let global = Policy::builder("api").limit("100/min").limit("10/s").build()?;
    /// let share = global.divided(4)?;
    /// assert_eq!(share.limits()[0].count(), 25);
    /// assert_eq!(share.limits()[1].count(), 2);
    /// # Ok::<(), tollgate_core::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidSetting`] when `instances` is zero.
    pub fn divided(&self, instances: u64) -> Result<Policy, ConfigError> {
        if instances == 0 {
            return Err(ConfigError::InvalidSetting {
                setting: "instances",
                reason: "must be at least 1",
            });
        }
        let share = |n: u64| (n / instances).max(1);
        let mut builder = Policy::builder(self.name()).algorithm(self.algorithm());
        for limit in self.limits() {
            builder = builder.limit(Limit::new(share(limit.count()), limit.period()));
        }
        if let Some(burst) = self.burst() {
            builder = builder.burst(share(burst));
        }
        builder.build()
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
        f.write_str(")")
    }
}

impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        self.inner == other.inner
    }
}

impl Eq for Policy {}

/// Something that can become a [`Limit`]: a `Limit` or a string such as
/// `"100/min"`. A string that does not parse is reported by
/// [`PolicyBuilder::build`].
pub trait IntoLimit {
    /// Converts into a limit.
    ///
    /// # Errors
    ///
    /// When the value does not describe a valid limit.
    fn into_limit(self) -> Result<Limit, ConfigError>;
}

impl IntoLimit for Limit {
    fn into_limit(self) -> Result<Limit, ConfigError> {
        Ok(self)
    }
}

impl IntoLimit for &str {
    fn into_limit(self) -> Result<Limit, ConfigError> {
        self.parse()
    }
}

impl IntoLimit for String {
    fn into_limit(self) -> Result<Limit, ConfigError> {
        self.parse()
    }
}

impl IntoLimit for Result<Limit, ConfigError> {
    fn into_limit(self) -> Result<Limit, ConfigError> {
        self
    }
}

/// Builds a [`Policy`]; see [`Policy::builder`].
#[derive(Debug, Clone)]
#[must_use = "call .build() to get the policy"]
pub struct PolicyBuilder {
    name: String,
    algorithm: Algorithm,
    limits: Vec<Limit>,
    burst: Option<u64>,
    error: Option<ConfigError>,
}

impl PolicyBuilder {
    /// Sets the algorithm.
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Adds a limit. All limits of a policy must hold for a request to be
    /// admitted, and a request denied by one consumes nothing from the others.
    pub fn limit(mut self, limit: impl IntoLimit) -> Self {
        match limit.into_limit() {
            Ok(limit) => self.limits.push(limit),
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
        self
    }

    /// Sets the burst of a token bucket (its capacity), a leaky bucket (its
    /// queue size) or GCRA (its burst). It applies to every limit of the
    /// policy; the default is each limit's count.
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Checks the configuration and builds the policy.
    ///
    /// # Errors
    ///
    /// The first problem found: a limit that did not parse or is out of
    /// range, an invalid name, no limits or too many, two limits with one
    /// period, a zero burst or a burst
    /// for an algorithm without one, or derived values that overflow.
    pub fn build(self) -> Result<Policy, ConfigError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        validate_name(&self.name)?;
        if self.limits.is_empty() {
            return Err(ConfigError::NoLimits { policy: self.name });
        }
        if self.limits.len() > Policy::MAX_LIMITS {
            return Err(ConfigError::TooManyLimits {
                policy: self.name,
                count: self.limits.len(),
                max: Policy::MAX_LIMITS,
            });
        }
        for (i, limit) in self.limits.iter().enumerate() {
            if self.limits[..i]
                .iter()
                .any(|l| l.period() == limit.period())
            {
                return Err(ConfigError::DuplicatePeriod {
                    policy: self.name,
                    period: limit.period(),
                });
            }
        }
        if let Some(burst) = self.burst {
            if burst == 0 {
                return Err(ConfigError::ZeroBurst);
            }
            if !self.algorithm.has_burst() {
                return Err(ConfigError::BurstNotSupported {
                    algorithm: self.algorithm,
                });
            }
            if burst > Limit::MAX_COUNT {
                return Err(ConfigError::Overflow { what: "burst" });
            }
        }
        let params = self
            .limits
            .iter()
            .map(|&limit| params_for(self.algorithm, limit, self.burst))
            .collect::<Result<Box<[_]>, _>>()?;
        let fingerprint = fingerprint(self.algorithm, &params);
        let layout = Layout::of(self.algorithm, &params);
        let mut descriptor = String::from(self.algorithm.as_str());
        for p in &params {
            descriptor.push_str(&format!(
                " {}/{}/{}",
                p.period_us, p.interval_us, p.capacity
            ));
        }
        let mut identity = Fnv::new();
        identity.feed(self.name.as_bytes());
        Ok(Policy {
            inner: Arc::new(Inner {
                fingerprint,
                descriptor: descriptor.into_boxed_str(),
                layout,
                config_mix: mix(fingerprint),
                identity: identity.0,
                name: self.name.into_boxed_str(),
                algorithm: self.algorithm,
                burst: self.burst,
                params,
                limits: self.limits.into_boxed_slice(),
            }),
        })
    }
}

/// The longest span of time any algorithm's state may cover, in
/// microseconds (about 35 years). Keeps every timestamp well inside the
/// 2^53 range that Lua numbers represent exactly.
pub(crate) const MAX_SPAN_US: u64 = 1 << 50;

fn params_for(
    algorithm: Algorithm,
    limit: Limit,
    burst: Option<u64>,
) -> Result<LimitParams, ConfigError> {
    let capacity = if algorithm.has_burst() {
        burst.unwrap_or(limit.count())
    } else {
        limit.count()
    };
    let interval_us = limit.interval_micros();
    if algorithm.has_burst()
        && capacity
            .checked_mul(interval_us)
            .is_none_or(|span| span > MAX_SPAN_US)
    {
        return Err(ConfigError::Overflow {
            what: "burst x interval",
        });
    }
    Ok(LimitParams {
        limit,
        period_us: limit.period_micros(),
        interval_us,
        capacity,
        per_interval: Divisor::new(interval_us),
    })
}

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
    hash.0
}

fn validate_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::InvalidName {
            name: name.to_owned(),
        })
    }
}

/// The serialized form of a [`Policy`].
#[cfg(feature = "serde")]
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyConfig {
    name: String,
    algorithm: Algorithm,
    limits: Vec<Limit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    burst: Option<u64>,
}

#[cfg(feature = "serde")]
impl serde::Serialize for Policy {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        PolicyConfig {
            name: self.name().to_owned(),
            algorithm: self.algorithm(),
            limits: self.limits().to_vec(),
            burst: self.burst(),
        }
        .serialize(serializer)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Policy {
    /// Deserializes `{ name, algorithm, limits = ["N/period", ...], burst? }`
    /// and validates it like [`PolicyBuilder::build`].
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let config = PolicyConfig::deserialize(deserializer)?;
        let mut builder = Policy::builder(config.name).algorithm(config.algorithm);
        for limit in config.limits {
            builder = builder.limit(limit);
        }
        if let Some(burst) = config.burst {
            builder = builder.burst(burst);
        }
        builder.build().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bad_setting_is_a_named_error() {
        let cases: Vec<(PolicyBuilder, ConfigError)> = vec![
            (
                Policy::builder("").limit("1/s"),
                ConfigError::InvalidName {
                    name: String::new(),
                },
            ),
            (
                Policy::builder("has space").limit("1/s"),
                ConfigError::InvalidName {
                    name: "has space".into(),
                },
            ),
            (
                Policy::builder("x".repeat(65)).limit("1/s"),
                ConfigError::InvalidName {
                    name: "x".repeat(65),
                },
            ),
            (
                Policy::builder("p"),
                ConfigError::NoLimits { policy: "p".into() },
            ),
            (
                (0..9).fold(Policy::builder("p"), |b, _| b.limit("1/s")),
                ConfigError::TooManyLimits {
                    policy: "p".into(),
                    count: 9,
                    max: 8,
                },
            ),
            (
                Policy::builder("p").limit("1/s").burst(0),
                ConfigError::ZeroBurst,
            ),
            (
                Policy::builder("p").limit("5/s").limit("9/1000ms"),
                ConfigError::DuplicatePeriod {
                    policy: "p".into(),
                    period: std::time::Duration::from_secs(1),
                },
            ),
            (
                Policy::builder("p")
                    .algorithm(Algorithm::FixedWindow)
                    .limit("1/s")
                    .burst(3),
                ConfigError::BurstNotSupported {
                    algorithm: Algorithm::FixedWindow,
                },
            ),
            (
                Policy::builder("p").limit("1/366d").burst(1_000_000_000),
                ConfigError::Overflow {
                    what: "burst x interval",
                },
            ),
            (
                Policy::builder("p").limit("1/s").limit("0/s"),
                ConfigError::ZeroCount,
            ),
        ];
        for (builder, expected) in cases {
            assert_eq!(builder.build(), Err(expected));
        }
    }

    #[test]
    fn capacity_is_burst_for_rate_algorithms_only() {
        let gcra = Policy::builder("g")
            .limit("10/s")
            .burst(3)
            .build()
            .expect("valid");
        assert_eq!(gcra.params()[0].capacity, 3);
        assert_eq!(gcra.params()[0].interval_us, 100_000);
        let fixed = Policy::new("f", Algorithm::FixedWindow, "10/s").expect("valid");
        assert_eq!(fixed.params()[0].capacity, 10);
    }

    #[test]
    fn fingerprints_are_stable_across_builds() {
        let policy = Policy::builder("a")
            .limit("10/s")
            .limit("300/min")
            .build()
            .expect("valid");
        // Pinned (checked with an independent FNV-1a): a change here resets
        // every key in every shared store.
        assert_eq!(policy.fingerprint(), 0x5256_f54a_0cd4_4c95);
        let renamed = Policy::builder("b")
            .limit("10/s")
            .limit("300/min")
            .build()
            .expect("valid");
        assert_eq!(renamed.fingerprint(), policy.fingerprint());
        let other = Policy::builder("a")
            .limit("10/s")
            .limit("301/min")
            .build()
            .expect("valid");
        assert_ne!(other.fingerprint(), policy.fingerprint());
    }

    #[test]
    fn algorithm_names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.as_str().parse::<Algorithm>(), Ok(a));
        }
        assert!(matches!(
            "lru".parse::<Algorithm>(),
            Err(ConfigError::UnknownAlgorithm { .. })
        ));
    }

    #[cfg(feature = "serde")]
    #[test]
    fn serde_validates() {
        let json = r#"{"name":"search","algorithm":"gcra","limits":["25/5s","300/min"],"burst":5}"#;
        let policy: Policy = serde_json::from_str(json).expect("valid");
        assert_eq!(policy.limits().len(), 2);
        assert_eq!(policy.burst(), Some(5));
        assert_eq!(serde_json::to_string(&policy).expect("serializes"), json);
        let err = serde_json::from_str::<Policy>(
            r#"{"name":"s","algorithm":"fixed_window","limits":["1/s"],"burst":5}"#,
        )
        .expect_err("burst on fixed window");
        assert!(err.to_string().contains("has no burst"), "{err}");
        let err = serde_json::from_str::<Policy>(
            r#"{"name":"s","algorithm":"gcra","limits":["1/s"],"colour":5}"#,
        )
        .expect_err("unknown field");
        assert!(err.to_string().contains("colour"), "{err}");
    }
}
