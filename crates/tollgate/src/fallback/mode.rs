//! The failure decision: [`FailureMode`], the one place it is applied
//! ([`FailureMode::apply`]), the typed answer every caller matches, and
//! what is reported of it.

use std::fmt;
use std::str::FromStr;

use tollgate_core::StoreError;

use crate::answer::StoreRefusal;

/// What a [`FallbackStore`](crate::FallbackStore) (and so a layer or a [`RateLimiter`](crate::RateLimiter))
/// does when the store it wraps cannot decide.
///
/// A store whose own queue of requests is full
/// ([`StoreError::Overloaded`]), or whose answer the app's own busy
/// runtime did not read in time ([`StoreError::Late`]), did not fail: the
/// app's own load is never let through nor decided locally. Such a request is refused under every
/// mode, as [`Closed`](FailureMode::Closed) refuses.
///
/// A mode is named in configuration by [`as_str`](FailureMode::as_str),
/// and parsed back with [`str::parse`]:
///
/// ```
/// use tollgate::FailureMode;
///
/// for mode in FailureMode::ALL {
///     assert_eq!(mode.as_str().parse::<FailureMode>(), Ok(mode));
/// }
/// assert!("sometimes".parse::<FailureMode>().is_err());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum FailureMode {
    /// Let the request through, and log a warning: a layer sends no
    /// rate-limit headers, and a [`RateLimiter`](crate::RateLimiter)
    /// admits, reporting every limit as full.
    Open,
    /// Fail: a layer answers 503 with `Retry-After: 1`, and a
    /// [`RateLimiter`](crate::RateLimiter) returns the store's error.
    Closed,
    /// Decide with an in-memory store instead, and log a warning: limiting
    /// goes on, per instance, with each instance's share of the limit (see
    /// [`RateLimitLayer::local_divisor`](crate::RateLimitLayer::local_divisor)).
    /// The default.
    #[default]
    Local,
}

impl FailureMode {
    /// Every mode, in a fixed order.
    pub const ALL: [FailureMode; 3] = [FailureMode::Open, FailureMode::Closed, FailureMode::Local];

    /// The mode after this one in [`ALL`](FailureMode::ALL). A new mode
    /// must be given its place here, and the check below then fails to
    /// compile until `ALL` holds it too.
    const fn next(self) -> Option<FailureMode> {
        match self {
            FailureMode::Open => Some(FailureMode::Closed),
            FailureMode::Closed => Some(FailureMode::Local),
            FailureMode::Local => None,
        }
    }

    /// The mode's name in configuration and in logs: `open`, `closed` or
    /// `local`.
    pub const fn as_str(self) -> &'static str {
        match self {
            FailureMode::Open => "open",
            FailureMode::Closed => "closed",
            FailureMode::Local => "local",
        }
    }
}

/// `ALL` holds every mode, in the order of [`FailureMode::next`].
const _: () = {
    let mut at = Some(FailureMode::ALL[0]);
    let mut i = 0;
    while let Some(mode) = at {
        assert!(
            FailureMode::ALL[i] as u8 == mode as u8,
            "FailureMode::ALL is out of order"
        );
        i += 1;
        at = mode.next();
    }
    assert!(
        i == FailureMode::ALL.len(),
        "FailureMode::ALL lists a mode twice"
    );
};

impl fmt::Display for FailureMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FailureMode {
    type Err = UnknownFailureMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FailureMode::ALL
            .into_iter()
            .find(|mode| mode.as_str() == s)
            .ok_or_else(|| UnknownFailureMode(s.to_owned()))
    }
}

/// A name that is not a [`FailureMode`]'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownFailureMode(String);

impl fmt::Display for UnknownFailureMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown failure mode {:?}: expected ", self.0)?;
        for (i, mode) in FailureMode::ALL.iter().enumerate() {
            let sep = match i {
                0 => "",
                i if i + 1 == FailureMode::ALL.len() => " or ",
                _ => ", ",
            };
            write!(f, "{sep}{mode}")?;
        }
        Ok(())
    }
}

impl std::error::Error for UnknownFailureMode {}

/// What a store's caller does under the failure policy: the rate-limit
/// layer, [`RateLimiter`](crate::RateLimiter) and the in-flight layer
/// each match on it, with no arm for "anything else", so that a new mode
/// or a new caller cannot miss a case.
#[derive(Debug)]
pub(crate) enum Answer<T> {
    /// The store decided.
    Decided(T),
    /// [`FailureMode::Local`]: the local fallback decided, in the store's
    /// place. What follows from the decision (a settlement of its cost)
    /// belongs there too, not in the store, which never saw it.
    Local(T),
    /// [`FailureMode::Open`]: the request goes on, unlimited.
    LetThrough(StoreError),
    /// [`FailureMode::Closed`], or a local fallback that failed too: the
    /// request is refused, as the refusal says.
    Refused(StoreRefusal),
}

/// What became of a request whose store failed: the outcome label of
/// [`FALLBACKS`](tollgate_core::telemetry::FALLBACKS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "metrics", derive(enum_map::Enum))]
pub(crate) enum Handled {
    /// Let through unlimited ([`FailureMode::Open`]).
    LetThrough,
    /// Refused ([`FailureMode::Closed`], or a local fallback that failed).
    Refused,
    /// Decided by the local fallback: admitted.
    LocalAllowed,
    /// Decided by the local fallback: limited.
    LocalLimited,
}

impl Handled {
    /// The outcome's label, in metrics and on spans.
    pub(crate) const fn label(self) -> &'static str {
        match self {
            Handled::LetThrough => "open",
            Handled::Refused => "closed",
            Handled::LocalAllowed => "local_allowed",
            Handled::LocalLimited => "local_limited",
        }
    }
}

impl<T> Answer<T> {
    /// As a store's result: a failure let through or refused stays the
    /// store's error.
    pub(crate) fn into_result(self) -> Result<T, StoreError> {
        match self {
            Answer::Decided(value) | Answer::Local(value) => Ok(value),
            Answer::LetThrough(error) => Err(error),
            Answer::Refused(refusal) => refusal.into_result(),
        }
    }
}

impl FailureMode {
    /// The failure policy, in the one place it is decided: `result` is the
    /// store's; on its failure, `local` decides under
    /// [`FailureMode::Local`]. Every failure is reported to `report`, with
    /// what became of the request.
    #[inline]
    pub(crate) fn apply<T>(
        self,
        result: Result<T, StoreError>,
        local: impl FnOnce() -> Result<T, StoreError>,
        report: &impl FailureReport,
    ) -> Answer<T> {
        match result {
            Ok(value) => Answer::Decided(value),
            Err(error) => self.failed(error, local, report),
        }
    }

    /// What [`apply`](Self::apply) makes of a failure: kept out of the
    /// path of every decided request, whose code stays small.
    #[cold]
    #[inline(never)]
    fn failed<T>(
        self,
        error: StoreError,
        local: impl FnOnce() -> Result<T, StoreError>,
        report: &impl FailureReport,
    ) -> Answer<T> {
        report.store_failed(self, &error);
        // The store's own queue being full, or its answer left unread by
        // the app's busy runtime, is the app's own load, not a failure: no
        // mode decides it, it is refused.
        if error.is_own_load() {
            report.handled(Handled::Refused);
            return Answer::Refused(StoreRefusal { error });
        }
        match self {
            FailureMode::Open => {
                report.handled(Handled::LetThrough);
                Answer::LetThrough(error)
            }
            FailureMode::Closed => {
                report.handled(Handled::Refused);
                Answer::Refused(StoreRefusal { error })
            }
            FailureMode::Local => match local() {
                Ok(value) => Answer::Local(value),
                Err(error) => {
                    report.handled(Handled::Refused);
                    Answer::Refused(StoreRefusal { error })
                }
            },
        }
    }
}

/// What a fallback reports of the failures it handles: the layers' and
/// the limiter's telemetry; `()` reports nothing.
pub(crate) trait FailureReport {
    /// The store failed, and `mode` handles it.
    fn store_failed(&self, mode: FailureMode, error: &StoreError);
    /// What became of the request.
    fn handled(&self, outcome: Handled);
}

impl FailureReport for () {
    fn store_failed(&self, _mode: FailureMode, _error: &StoreError) {}
    fn handled(&self, _outcome: Handled) {}
}
