//! Error types of the core crate.

use std::time::Duration;

use crate::algorithm::Algorithm;

/// Why a limit or a policy could not be built.
///
/// Every variant names the value that was rejected, so the message can be
/// shown to whoever wrote the configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A limit allows zero requests per period.
    #[error("limit count must be at least 1, got 0")]
    ZeroCount,
    /// A limit's count is larger than [`Limit::MAX_COUNT`](crate::Limit::MAX_COUNT).
    #[error("limit count {count} is larger than the maximum {max}")]
    CountTooLarge {
        /// The count that was given.
        count: u64,
        /// The largest count accepted.
        max: u64,
    },
    /// A limit's period is zero.
    #[error("limit period must not be zero")]
    ZeroPeriod,
    /// A limit's period is shorter than one millisecond.
    #[error("limit period {period:?} is shorter than the minimum of 1ms")]
    PeriodTooShort {
        /// The period that was given.
        period: Duration,
    },
    /// A limit's period is longer than [`Limit::MAX_PERIOD`](crate::Limit::MAX_PERIOD).
    #[error("limit period {period:?} is longer than the maximum of {max:?}")]
    PeriodTooLong {
        /// The period that was given.
        period: Duration,
        /// The longest period accepted.
        max: Duration,
    },
    /// A limit's period is not a whole number of microseconds.
    #[error("limit period {period:?} is not a whole number of microseconds")]
    SubMicrosecondPeriod {
        /// The period that was given.
        period: Duration,
    },
    /// A limit string such as `"100/min"` could not be parsed.
    #[error("invalid limit {input:?}: {reason}")]
    InvalidLimit {
        /// The text that was given.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An algorithm name could not be parsed.
    #[error(
        "unknown algorithm {input:?}: expected one of fixed_window, sliding_log, \
         sliding_window, token_bucket, leaky_bucket, gcra"
    )]
    UnknownAlgorithm {
        /// The text that was given.
        input: String,
    },
    /// A policy name is empty, too long, or holds characters that cannot be
    /// sent in a header.
    #[error(
        "invalid policy name {name:?}: use 1 to 64 characters from A-Z, a-z, 0-9, '_', '-', '.' and ':'"
    )]
    InvalidName {
        /// The name that was given.
        name: String,
    },
    /// A policy has no limit.
    #[error("policy {policy:?} has no limit")]
    NoLimits {
        /// The policy's name.
        policy: String,
    },
    /// A policy has two limits with one period. A limit's period is its
    /// identity within the policy (a changed limit keeps the use counted
    /// under the old one of its period), and of two such limits the one
    /// with the smaller count decides anyway.
    #[error(
        "policy {policy:?} has two limits per {period:?}: keep the stricter one, \
         a policy holds one limit per period"
    )]
    DuplicatePeriod {
        /// The policy's name.
        policy: String,
        /// The period given twice.
        period: Duration,
    },
    /// A policy has more limits than [`Policy::MAX_LIMITS`](crate::Policy::MAX_LIMITS).
    #[error("policy {policy:?} has {count} limits, more than the maximum of {max}")]
    TooManyLimits {
        /// The policy's name.
        policy: String,
        /// How many limits were given.
        count: usize,
        /// The largest number accepted.
        max: usize,
    },
    /// A burst of zero was given.
    #[error("burst must be at least 1, got 0")]
    ZeroBurst,
    /// A burst was given for an algorithm that has no burst.
    #[error(
        "algorithm {algorithm} has no burst setting (only token_bucket, leaky_bucket and gcra do)"
    )]
    BurstNotSupported {
        /// The policy's algorithm.
        algorithm: Algorithm,
    },
    /// A [`PolicyFamily`](crate::PolicyFamily) has no member.
    #[error("policy family {family:?} has no policy")]
    EmptyFamily {
        /// The family's name.
        family: String,
    },
    /// A [`PolicyFamily`](crate::PolicyFamily) has two members of one
    /// name. Stores keep a key's state by the policy's name, so the two
    /// would share it.
    #[error(
        "policy family {family:?} has policy {policy:?} twice: each member needs a name of its own"
    )]
    DuplicateMember {
        /// The family's name.
        family: String,
        /// The name given twice.
        policy: String,
    },
    /// A policy is not a member of the family it was put with (a
    /// [`RateLimiter`](https://docs.rs/tollgate)'s own policy must be one
    /// of its family's).
    #[error("policy {policy:?} is not a member of policy family {family:?}")]
    NotAMember {
        /// The family's name.
        family: String,
        /// The policy's name.
        policy: String,
    },
    /// A plan map names one plan twice: which of the two policies a
    /// request of that plan is limited by would be a guess.
    #[error("plan {plan:?} is given twice: each plan needs a name of its own")]
    DuplicatePlan {
        /// The plan named twice.
        plan: String,
    },
    /// A plan of a plan map has the policy (by name) of the map's default
    /// or of an earlier plan. Stores keep a key's state by the policy's
    /// name, so the two plans would share it.
    #[error(
        "plan {plan:?} has policy {policy:?}, which the default or an earlier plan has already: \
         a policy's name identifies its state, so give each plan a policy of its own"
    )]
    SharedPlanPolicy {
        /// The plan whose policy is taken.
        plan: String,
        /// The policy's name.
        policy: String,
    },
    /// A store or layer setting is out of range.
    #[error("invalid setting {setting}: {reason}")]
    InvalidSetting {
        /// The setting's name.
        setting: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A setting's value could not be used.
    #[error("invalid {setting} {value:?}: {reason}")]
    InvalidValue {
        /// The setting's name.
        setting: &'static str,
        /// The value that was given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A calendar's time zone is not in the time-zone database.
    #[error("unknown time zone {zone:?}: use an IANA name such as \"Europe/Berlin\" or \"UTC\"")]
    UnknownTimeZone {
        /// The zone that was given.
        zone: String,
    },
    /// A calendar's reset offset is not shorter than the shortest calendar
    /// period of the policy (a day: 24 h; a week: 7 days; a month: 28
    /// days), so some period would never reset.
    #[error(
        "calendar offset {offset:?} of policy {policy:?} must be shorter than {max:?}, its shortest calendar period"
    )]
    CalendarOffsetTooLong {
        /// The policy's name.
        policy: String,
        /// The offset that was given.
        offset: std::time::Duration,
        /// The longest offset plus 1 µs: the shortest period's least length.
        max: std::time::Duration,
    },
    /// A calendar period was given to an algorithm that has no windows to
    /// align. Only the fixed window resets its count at a boundary; the
    /// rate-based and sliding algorithms spread a limit over a rolling
    /// period, which a calendar cannot align.
    #[error(
        "policy {policy:?}: calendar periods need the fixed_window algorithm (its count resets at the boundary), not {algorithm}"
    )]
    CalendarNeedsFixedWindow {
        /// The policy's name.
        policy: String,
        /// The algorithm that was given.
        algorithm: crate::Algorithm,
    },
    /// A calendar policy has a limit of a day or more that is not a
    /// calendar day, week or month.
    #[error(
        "policy {policy:?}: under a calendar, a limit of a day or more must be per day, week or month, not {limit}"
    )]
    NotACalendarPeriod {
        /// The policy's name.
        policy: String,
        /// The limit that was given.
        limit: crate::Limit,
    },
    /// Numbers derived from the configuration do not fit the supported range.
    #[error("{what} overflows the supported range")]
    Overflow {
        /// Which derived value overflowed.
        what: &'static str,
    },
}

/// Why an override was not set.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OverrideError {
    /// The override cannot apply to the policy (see
    /// [`Override::check`](crate::Override::check)).
    #[error("invalid override: {0}")]
    Config(#[source] ConfigError),
    /// The override could not be saved.
    #[error("override not saved: {0}")]
    Store(#[source] StoreError),
}

/// Why a store could not reach a decision.
///
/// A store error never means "allowed": the caller applies its failure
/// policy instead, except to [`Overloaded`](StoreError::Overloaded), the
/// app's own load, which it refuses.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The memory store holds its maximum number of keys, all still inside
    /// their windows, so a new key cannot be tracked.
    #[error("store is full: all {max_keys} keys are still inside their windows")]
    Full {
        /// The configured maximum number of keys.
        max_keys: usize,
    },
    /// The store's circuit breaker is open: it failed repeatedly and is not
    /// being called until it has had time to recover.
    #[error("store circuit breaker is open")]
    CircuitOpen,
    /// The store did not answer within its deadline.
    #[error("store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store's backend failed; the message says how, and the backend's
    /// error is kept as the [`source`](std::error::Error::source).
    #[error("store backend failed: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The store's backend could not take the request: no connection to it
    /// could be made (refused, or none yet), or it turned the request away
    /// whole before running it (Redis read-only, loading or out of
    /// memory). Unlike [`Backend`](StoreError::Backend), the request was
    /// not applied. The failure policy decides it, and it counts towards a
    /// circuit breaker. The backend's error is kept as the
    /// [`source`](std::error::Error::source).
    #[error("store unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The store's own queue of requests is full: the app's own load, not
    /// a failure of the backend. The request was never sent. A failure
    /// policy never decides it (no local quota, never let through): it is
    /// refused, to be retried shortly, and it does not count towards a
    /// circuit breaker.
    #[error("store overloaded: its queue of requests is full")]
    Overloaded,
    /// The store's answer was not read within this wait (the store's
    /// ceiling) because the app's own runtime was too busy to run the
    /// call: a burst of work queued on its workers, or the process
    /// starved of CPU. It is the app's own load, as
    /// [`Overloaded`](StoreError::Overloaded) is: a failure policy never
    /// decides it (it is refused) and a circuit breaker does not count it.
    /// Unlike `Overloaded`, the request was sent, and the store may have
    /// applied it.
    #[error("the app was too busy to read the store's answer within {0:?}")]
    Late(Duration),
}

impl StoreError {
    /// Wraps a backend error, keeping it as the [`source`](std::error::Error::source).
    pub fn backend(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Backend(Box::new(error))
    }

    /// Wraps a backend error after which the request was not applied (see
    /// [`Unavailable`](StoreError::Unavailable)), keeping it as the
    /// [`source`](std::error::Error::source).
    ///
    /// ```
    /// use tollgate_core::StoreError;
    ///
    /// let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
    /// let error = StoreError::unavailable(refused);
    /// assert_eq!(error.to_string(), "store unavailable: refused");
    /// assert!(!error.may_have_acted());
    /// ```
    pub fn unavailable(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Unavailable(Box::new(error))
    }

    /// Every [`kind`](StoreError::kind), in a fixed order: the labels a
    /// metric of store errors can have, to register them all up front.
    ///
    /// ```
    /// use tollgate_core::StoreError;
    ///
    /// assert_eq!(
    ///     StoreError::KINDS,
    ///     ["full", "circuit_open", "timeout", "backend", "unavailable", "overloaded", "late"]
    /// );
    /// ```
    pub const KINDS: [&'static str; 7] = [
        "full",
        "circuit_open",
        "timeout",
        "backend",
        "unavailable",
        "overloaded",
        "late",
    ];

    /// A short name of the kind of failure, as used in metrics labels:
    /// `full`, `circuit_open`, `timeout`, `backend`, `unavailable`,
    /// `overloaded` or `late`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::StoreError;
    ///
    /// assert_eq!(StoreError::Timeout(Duration::from_millis(50)).kind(), "timeout");
    /// ```
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Full { .. } => "full",
            Self::CircuitOpen => "circuit_open",
            Self::Timeout(_) => "timeout",
            Self::Backend(_) => "backend",
            Self::Unavailable(_) => "unavailable",
            Self::Overloaded => "overloaded",
            Self::Late(_) => "late",
        }
    }

    /// Whether the error is the app's own load rather than a failure of
    /// the store ([`Overloaded`](StoreError::Overloaded),
    /// [`Late`](StoreError::Late)): a failure policy refuses it whatever
    /// its mode, and a circuit breaker does not count it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::StoreError;
    ///
    /// assert!(StoreError::Overloaded.is_own_load());
    /// assert!(StoreError::Late(Duration::from_millis(200)).is_own_load());
    /// assert!(!StoreError::Timeout(Duration::from_millis(50)).is_own_load());
    /// ```
    pub fn is_own_load(&self) -> bool {
        match self {
            Self::Overloaded | Self::Late(_) => true,
            Self::Full { .. }
            | Self::CircuitOpen
            | Self::Timeout(_)
            | Self::Backend(_)
            | Self::Unavailable(_) => false,
        }
    }

    /// Whether the store did not answer within its deadline
    /// ([`Timeout`](StoreError::Timeout)): it is slow, so a caller that
    /// tries again on its own waits longer than after a failure that came
    /// at once (a refused or dropped connection, an error reply), rather
    /// than add to the store's load.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::StoreError;
    ///
    /// assert!(StoreError::Timeout(Duration::from_millis(50)).is_timeout());
    /// let dropped = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
    /// assert!(!StoreError::backend(dropped).is_timeout());
    /// ```
    pub fn is_timeout(&self) -> bool {
        match self {
            Self::Timeout(_) => true,
            Self::Full { .. }
            | Self::CircuitOpen
            | Self::Backend(_)
            | Self::Unavailable(_)
            | Self::Overloaded
            | Self::Late(_) => false,
        }
    }

    /// Whether the store may have acted on the request before this error:
    /// a [`Timeout`](StoreError::Timeout), a [`Late`](StoreError::Late)
    /// answer or a [`Backend`](StoreError::Backend) failure may come after
    /// the store applied it (a reply lost on its way back, or not read). The other kinds were
    /// never applied: the request was not sent, or the store refused it
    /// whole ([`Unavailable`](StoreError::Unavailable) among them). What a
    /// caller took, such as an in-flight slot, is given back after an
    /// error that may have acted.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::StoreError;
    ///
    /// assert!(StoreError::Timeout(Duration::from_millis(50)).may_have_acted());
    /// assert!(StoreError::backend(std::fmt::Error).may_have_acted());
    /// assert!(!StoreError::CircuitOpen.may_have_acted());
    /// ```
    pub fn may_have_acted(&self) -> bool {
        match self {
            Self::Timeout(_) | Self::Backend(_) | Self::Late(_) => true,
            Self::Full { .. } | Self::CircuitOpen | Self::Unavailable(_) | Self::Overloaded => {
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_failure_says_why_and_keeps_its_source() {
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let error = StoreError::backend(reset);
        assert_eq!(error.to_string(), "store backend failed: reset");
        let source = std::error::Error::source(&error).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("reset"));
    }
}

#[cfg(test)]
mod kinds {
    use super::StoreError;
    use std::time::Duration;

    /// One error of each kind: a new kind fails to compile here until it
    /// is listed, and then fails the test until `KINDS` names it.
    fn one_of_each() -> Vec<StoreError> {
        let all = vec![
            StoreError::Full { max_keys: 1 },
            StoreError::CircuitOpen,
            StoreError::Timeout(Duration::ZERO),
            StoreError::backend(std::fmt::Error),
            StoreError::unavailable(std::fmt::Error),
            StoreError::Overloaded,
            StoreError::Late(Duration::ZERO),
        ];
        for error in &all {
            match error {
                StoreError::Full { .. }
                | StoreError::CircuitOpen
                | StoreError::Timeout(_)
                | StoreError::Backend(_)
                | StoreError::Unavailable(_)
                | StoreError::Overloaded
                | StoreError::Late(_) => {}
            }
        }
        all
    }

    #[test]
    fn kinds_lists_every_kind_once_in_order() {
        let kinds: Vec<_> = one_of_each().iter().map(StoreError::kind).collect();
        assert_eq!(kinds, StoreError::KINDS);
    }
}
