//! [`AdaptiveLimit`]: the settings of an adaptive concurrency limit, its
//! [`LimitAlgorithm`] and the [`Priority`] classes it sheds by.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use crate::builder::validate_name;
use crate::error::ConfigError;

/// A request's class when the service is over its capacity: the lowest
/// class is refused first.
///
/// Ordered from the most important: `Critical > Default > Sheddable`.
///
/// ```
/// use tollgate_core::Priority;
///
/// assert!(Priority::Critical > Priority::Sheddable);
/// assert_eq!("sheddable".parse::<Priority>()?, Priority::Sheddable);
/// assert_eq!(Priority::default(), Priority::Default);
/// # Ok::<(), tollgate_core::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Priority {
    /// Requests the service exists for (a checkout, a login): refused last.
    Critical,
    /// Everything not marked otherwise.
    #[default]
    Default,
    /// Requests that can wait or be lost (prefetches, analytics, retries
    /// of background jobs): refused first.
    Sheddable,
}

impl Priority {
    /// Every class, from the most important to the least.
    pub const ALL: [Priority; 3] = [Self::Critical, Self::Default, Self::Sheddable];

    /// The class's position in [`ALL`](Self::ALL).
    pub const fn index(self) -> usize {
        match self {
            Self::Critical => 0,
            Self::Default => 1,
            Self::Sheddable => 2,
        }
    }

    /// The class's name, as it parses.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Critical => "critical",
            Self::Default => "default",
            Self::Sheddable => "sheddable",
        }
    }

    /// The classes more important than this one.
    pub fn above(self) -> &'static [Priority] {
        &Self::ALL[..self.index()]
    }
}

impl PartialOrd for Priority {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Priority {
    /// The more important class is the greater.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.index().cmp(&self.index())
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Priority {
    type Err = ConfigError;

    /// `critical`, `default` or `sheddable`, in any case.
    fn from_str(text: &str) -> Result<Self, ConfigError> {
        Self::ALL
            .into_iter()
            .find(|class| class.as_str().eq_ignore_ascii_case(text))
            .ok_or_else(|| ConfigError::InvalidValue {
                setting: "priority",
                value: text.to_owned(),
                reason: "expected critical, default or sheddable",
            })
    }
}

/// How an [`AdaptiveLimit`] finds its limit from the latency of the
/// requests it lets through.
///
/// The three are the ones of Netflix's concurrency-limits, compared on
/// the same overload scenarios by `tollgate-sim overload` (figures in
/// `BENCHMARKS.md`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LimitAlgorithm {
    /// TCP Vegas, applied to requests (the default): the queue in front of
    /// the service is estimated as `limit × (1 − rtt_noload / rtt)`; the
    /// limit grows while it is short and shrinks once it is longer than
    /// about 6 log₁₀(limit). It keeps latency near its minimum. The no-load
    /// latency is measured by halving the limit for one window of samples,
    /// now and then and whenever the limit rose by half or fell by a third
    /// since the last time, but only while the limit holds requests back;
    /// a window that ran at half the limit or less measures it by itself.
    Vegas,
    /// Gradient2: the limit follows the ratio of a long-term average
    /// latency to the latest one, tolerating 1.5 times the average. Under a
    /// standing queue the average drifts up with it. A drop lowers the
    /// limit by about a tenth (Netflix's Gradient2 ignores drops).
    Gradient2,
    /// Additive increase, multiplicative decrease: the limit grows by one
    /// per sample while it is used, and is cut by 10 % when a request
    /// takes longer than `latency_ceiling` or is dropped. Blind to latency
    /// below the ceiling.
    Aimd {
        /// The latency taken as a sign of overload.
        latency_ceiling: Duration,
    },
}

impl LimitAlgorithm {
    /// The algorithm's name, for reports and metrics.
    pub const fn name(&self) -> &'static str {
        match self {
            Self::Vegas => "vegas",
            Self::Gradient2 => "gradient2",
            Self::Aimd { .. } => "aimd",
        }
    }
}

/// A ramp of the limit's ceiling after the instance starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct WarmUp {
    /// The ceiling at the start.
    pub(super) from: u32,
    /// How long the ceiling takes to rise linearly to the maximum.
    pub(super) over: Duration,
}

/// When a window of latency samples stops admitting requests into it (see
/// [`AdaptiveLimitBuilder::sample_window`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct SampleWindow {
    /// The fewest requests it admits.
    pub(super) min_samples: u32,
    /// The shortest it admits for.
    pub(super) min_time: Duration,
}

/// The settings of an adaptive concurrency limit: how many requests one
/// instance lets run at once, found from their latency between a minimum
/// and a maximum, with capacity reserved for the more important
/// [`Priority`] classes and an optional warm-up.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{AdaptiveLimit, LimitAlgorithm, Priority};
///
/// let api = AdaptiveLimit::builder("api")
///     .algorithm(LimitAlgorithm::Vegas)
///     .bounds(4, 400)
///     .initial(20)
///     .reserve(Priority::Critical, 0.2) // sheddable and default never take the last 20 %
///     .reserve(Priority::Default, 0.1)  // sheddable never takes the 10 % below that
///     .warm_up(8, Duration::from_secs(30))
///     .build()?;
/// assert_eq!((api.min(), api.max(), api.initial()), (4, 400, 20));
///
/// let error = AdaptiveLimit::builder("api").reserve(Priority::Sheddable, 0.1).build();
/// assert!(error.is_err()); // nothing is below sheddable to keep capacity from
/// # Ok::<(), tollgate_core::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveLimit {
    pub(super) name: Arc<str>,
    pub(super) algorithm: LimitAlgorithm,
    pub(super) min: u32,
    pub(super) max: u32,
    pub(super) initial: u32,
    pub(super) reserved: [f64; 3],
    pub(super) warm_up: Option<WarmUp>,
    pub(super) window: SampleWindow,
}

impl AdaptiveLimit {
    /// The largest maximum accepted.
    pub const MAX: u32 = 1_000_000;

    /// The settings of a limit named `name` (the name its metrics and
    /// answers carry), to be built.
    pub fn builder(name: impl Into<String>) -> AdaptiveLimitBuilder {
        AdaptiveLimitBuilder {
            name: name.into(),
            algorithm: LimitAlgorithm::Vegas,
            min: 4,
            max: 1_000,
            initial: None,
            fixed: None,
            reserved: [0.0; 3],
            warm_up: None,
            window: AdaptiveLimitBuilder::DEFAULT_WINDOW,
        }
    }

    /// The limit's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How the limit is found.
    pub fn algorithm(&self) -> LimitAlgorithm {
        self.algorithm
    }

    /// The lowest the limit goes.
    pub fn min(&self) -> u32 {
        self.min
    }

    /// The highest the limit goes.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// The limit before any latency was observed.
    pub fn initial(&self) -> u32 {
        self.initial
    }

    /// The share of the limit kept for `class` and the classes above it.
    pub fn reserved(&self, class: Priority) -> f64 {
        self.reserved[class.index()]
    }

    /// The shortest a window of latency samples lasts, and the fewest
    /// samples it holds (see [`AdaptiveLimitBuilder::sample_window`]).
    pub fn sample_window(&self) -> (Duration, u32) {
        (self.window.min_time, self.window.min_samples)
    }
}

/// Builds an [`AdaptiveLimit`]; see [`AdaptiveLimit::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct AdaptiveLimitBuilder {
    name: String,
    algorithm: LimitAlgorithm,
    min: u32,
    max: u32,
    initial: Option<u32>,
    fixed: Option<u32>,
    reserved: [f64; 3],
    warm_up: Option<WarmUp>,
    window: SampleWindow,
}

impl AdaptiveLimitBuilder {
    /// The initial limit unless one is set.
    const DEFAULT_INITIAL: u32 = 20;

    const DEFAULT_WINDOW: SampleWindow = SampleWindow {
        min_samples: 10,
        min_time: Duration::ZERO,
    };

    /// How the limit is found (default [`LimitAlgorithm::Vegas`]).
    pub fn algorithm(mut self, algorithm: LimitAlgorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// The lowest and the highest the limit goes (default 4 and 1,000).
    pub fn bounds(mut self, min: u32, max: u32) -> Self {
        self.min = min;
        self.max = max;
        self
    }

    /// The limit before any latency is observed (default 20, or the
    /// bound nearest it when the bounds leave 20 out; one set below the
    /// minimum starts at the minimum).
    pub fn initial(mut self, initial: u32) -> Self {
        self.initial = Some(initial);
        self
    }

    /// A limit that does not adapt: always `limit` (the minimum, maximum
    /// and initial limit all at once). For tests, and for a service whose
    /// capacity is known.
    pub fn fixed(mut self, limit: u32) -> Self {
        self.fixed = Some(limit);
        self
    }

    /// Keeps `share` of the limit (rounded up to whole requests) for
    /// `class` and the classes above it: the classes below never take it.
    /// Each share is rounded up on its own, so at a limit of one or two
    /// the classes below may get no slot at all: set the minimum so that
    /// they keep one.
    /// With `Critical` at 0.2 and `Default` at 0.1, sheddable requests
    /// stop at 70 % of the limit, default ones at 80 %, and critical ones
    /// may use all of it.
    pub fn reserve(mut self, class: Priority, share: f64) -> Self {
        self.reserved[class.index()] = share;
        self
    }

    /// Starts the limit's ceiling at `from` and raises it linearly to the
    /// maximum over `over`, from the moment the limit's state is made: a
    /// new instance does not take a full share of traffic before its
    /// caches and connections are warm.
    pub fn warm_up(mut self, from: u32, over: Duration) -> Self {
        self.warm_up = Some(WarmUp { from, over });
        self
    }

    /// Takes in the latency of finished requests a window at a time, as
    /// one sample: their average latency, the most requests that were in
    /// flight, and whether any was dropped. A window admits requests until
    /// it holds `min_samples` of them and `min_time` has passed since its
    /// first, and is taken in once they have all come back (default 10
    /// samples and no minimum time: a window then lasts about the time 10
    /// requests take to arrive plus the slowest one's latency). So every
    /// request of a window was admitted under the limit in force, and the
    /// slow ones count as much as the fast. With
    /// `sample_window(Duration::ZERO, 1)` every request is a window of its
    /// own, and the limit follows the noise of single requests.
    pub fn sample_window(mut self, min_time: Duration, min_samples: u32) -> Self {
        self.window = SampleWindow {
            min_samples,
            min_time,
        };
        self
    }

    /// The settings, checked.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidName`] for a name a policy could not have, and
    /// [`ConfigError::InvalidSetting`] naming the setting when: the
    /// minimum is 0 or above the maximum; the maximum is above
    /// [`AdaptiveLimit::MAX`]; the initial limit is outside the bounds; a
    /// reservation is not a share from 0 up to 1, is made for
    /// [`Priority::Sheddable`] (no class is below it), or the reservations
    /// add up to 1 or more; a warm-up starts outside the bounds or lasts
    /// 0 or more than an hour; a sample window holds no sample or lasts
    /// more than an hour.
    pub fn build(self) -> Result<AdaptiveLimit, ConfigError> {
        validate_name(&self.name)?;
        let (min, max, initial) = match self.fixed {
            Some(limit) => (limit, limit, limit),
            None => {
                // The default within the bounds, whatever they are.
                let initial = self.initial.unwrap_or(Self::DEFAULT_INITIAL.min(self.max));
                (self.min, self.max, initial.max(self.min))
            }
        };
        let invalid = |setting, reason| Err(ConfigError::InvalidSetting { setting, reason });
        if min == 0 {
            return invalid("adaptive limit minimum", "must be at least 1");
        }
        if max > AdaptiveLimit::MAX {
            return invalid("adaptive limit maximum", "must be at most 1,000,000");
        }
        if min > max {
            return invalid("adaptive limit bounds", "the minimum is above the maximum");
        }
        if initial > max {
            return invalid("adaptive limit initial", "must be within the bounds");
        }
        if self
            .reserved
            .iter()
            .any(|share| !(0.0..1.0).contains(share))
        {
            return invalid("reserve", "a share must be from 0 up to (not including) 1");
        }
        if self.reserved[Priority::Sheddable.index()] > 0.0 {
            return invalid(
                "reserve",
                "sheddable is the lowest class: there is no class to keep capacity from",
            );
        }
        if self.reserved.iter().sum::<f64>() >= 1.0 {
            return invalid("reserve", "the reserved shares must add up to less than 1");
        }
        if let Some(warm_up) = self.warm_up {
            if warm_up.from < min || warm_up.from > max {
                return invalid("warm_up", "must start within the bounds");
            }
            if warm_up.over.is_zero() || warm_up.over > Duration::from_secs(3_600) {
                return invalid("warm_up", "must last more than zero and at most an hour");
            }
        }
        if self.window.min_samples == 0 {
            return invalid("sample_window", "must hold at least 1 sample");
        }
        if self.window.min_time > Duration::from_secs(3_600) {
            return invalid("sample_window", "must last at most an hour");
        }
        if let LimitAlgorithm::Aimd { latency_ceiling } = self.algorithm
            && latency_ceiling.is_zero()
        {
            return invalid("aimd latency_ceiling", "must be above zero");
        }
        Ok(AdaptiveLimit {
            name: self.name.into(),
            algorithm: self.algorithm,
            min,
            max,
            initial,
            reserved: self.reserved,
            warm_up: self.warm_up,
            window: self.window,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bounds that leave out the default initial limit of 20 start the
    /// limit at the nearest bound: `bounds(2, 10)` alone was refused,
    /// "adaptive limit initial: must be within the bounds", for a setting
    /// never made. One set outside them is still refused above the
    /// maximum.
    #[test]
    fn the_default_initial_limit_is_kept_within_the_bounds() {
        let initial = |builder: AdaptiveLimitBuilder| builder.build().map(|limit| limit.initial());
        let api = || AdaptiveLimit::builder("api");
        assert_eq!(initial(api()), Ok(20));
        assert_eq!(initial(api().bounds(2, 10)), Ok(10));
        assert_eq!(initial(api().bounds(30, 100)), Ok(30));
        assert_eq!(initial(api().bounds(2, 10).initial(5)), Ok(5));
        assert_eq!(initial(api().bounds(30, 100).initial(5)), Ok(30));
        assert!(matches!(
            api().bounds(2, 10).initial(20).build(),
            Err(ConfigError::InvalidSetting {
                setting: "adaptive limit initial",
                ..
            })
        ));
    }
}
