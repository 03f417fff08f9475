//! Timestamps and clocks.
//!
//! Limiter time is wall-clock time in whole microseconds since the Unix
//! epoch, because state may be shared between processes (through Redis),
//! where monotonic instants mean nothing. The clock is always injected, so
//! tests drive it with a [`FakeClock`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time, in whole microseconds since the Unix epoch (UTC).
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::Timestamp;
///
/// let t = Timestamp::from_secs(1_700_000_000) + Duration::from_millis(1);
/// assert_eq!(t.as_micros(), 1_700_000_000_001_000);
/// assert_eq!(t.as_secs_ceil(), 1_700_000_001);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The Unix epoch.
    pub const UNIX_EPOCH: Self = Self(0);

    /// A timestamp `micros` microseconds after the Unix epoch.
    pub const fn from_micros(micros: u64) -> Self {
        Self(micros)
    }

    /// A timestamp `millis` milliseconds after the Unix epoch.
    pub const fn from_millis(millis: u64) -> Self {
        Self(millis.saturating_mul(1_000))
    }

    /// A timestamp `secs` seconds after the Unix epoch.
    pub const fn from_secs(secs: u64) -> Self {
        Self(secs.saturating_mul(1_000_000))
    }

    /// Microseconds since the Unix epoch.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// Whole seconds since the Unix epoch, rounded up: the form of the
    /// `x-ratelimit-reset` header.
    pub const fn as_secs_ceil(self) -> u64 {
        self.0.div_ceil(1_000_000)
    }

    /// The time from `earlier` to `self`, or zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }
}

impl std::ops::Add<Duration> for Timestamp {
    type Output = Timestamp;

    /// Adds whole microseconds of `rhs`, saturating at the end of time.
    #[inline]
    fn add(self, rhs: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(duration_micros(rhs)))
    }
}

impl std::ops::Sub<Duration> for Timestamp {
    type Output = Timestamp;

    /// Subtracts whole microseconds of `rhs`, saturating at the epoch.
    fn sub(self, rhs: Duration) -> Timestamp {
        Timestamp(self.0.saturating_sub(duration_micros(rhs)))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:06}", self.0 / 1_000_000, self.0 % 1_000_000)
    }
}

#[inline]
pub(crate) fn duration_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A source of wall-clock time for limiter decisions.
///
/// Implement it to drive a store from another time source; the crate ships
/// [`SystemClock`] and [`FakeClock`].
///
/// ```
/// use tollgate_core::{Clock, Timestamp};
///
/// #[derive(Debug)]
/// struct Frozen;
///
/// impl Clock for Frozen {
///     fn now(&self) -> Timestamp {
///         Timestamp::from_secs(42)
///     }
/// }
///
/// assert_eq!(Frozen.now(), Timestamp::from_secs(42));
/// ```
pub trait Clock: fmt::Debug + Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}

/// The system's wall clock, read cheaply.
///
/// Reading the wall clock (`clock_gettime`) costs more than the rest of a
/// memory-store decision, so each thread reads it once a second and counts
/// the time in between with the CPU's timestamp counter (through `quanta`,
/// which falls back to the monotonic clock where the counter is unusable).
/// Readings therefore follow the wall clock to within the counter's drift
/// over one second (microseconds), never run backwards within a second on
/// one thread, and pick up wall-clock steps within a second.
///
/// A clock set before 1970 reads as the Unix epoch rather than failing.
///
/// ```
/// use tollgate_core::{Clock, SystemClock, Timestamp};
///
/// assert!(SystemClock.now() > Timestamp::from_secs(1_600_000_000));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

/// How long a thread counts from one wall-clock reading before taking the next.
const REANCHOR_NANOS: u64 = 1_000_000_000;

#[derive(Clone, Copy)]
struct Anchor {
    /// The counter's raw value at `micros`.
    raw: u64,
    micros: u64,
}

fn counter() -> &'static quanta::Clock {
    static COUNTER: std::sync::OnceLock<quanta::Clock> = std::sync::OnceLock::new();
    COUNTER.get_or_init(quanta::Clock::new)
}

fn wall_clock_micros() -> u64 {
    #[allow(clippy::disallowed_methods)] // the one place that reads the system clock
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    duration_micros(since)
}

thread_local! {
    static ANCHOR: std::cell::Cell<Option<Anchor>> = const { std::cell::Cell::new(None) };
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Timestamp {
        let counter = counter();
        let raw = counter.raw();
        let anchored = ANCHOR.with(|cell| {
            let anchor = cell.get()?;
            let elapsed = counter.delta_as_nanos(anchor.raw, raw);
            if elapsed >= REANCHOR_NANOS {
                return None;
            }
            Some(anchor.micros + elapsed / 1_000)
        });
        Timestamp(anchored.unwrap_or_else(|| {
            let micros = wall_clock_micros();
            ANCHOR.with(|cell| cell.set(Some(Anchor { raw, micros })));
            micros
        }))
    }
}

/// A clock that only moves when told to. Clones share one time.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{Clock, FakeClock, Timestamp};
///
/// let clock = FakeClock::new(Timestamp::from_secs(100));
/// let other = clock.clone();
/// clock.advance(Duration::from_secs(5));
/// assert_eq!(other.now(), Timestamp::from_secs(105));
/// ```
#[derive(Debug, Clone)]
pub struct FakeClock {
    micros: Arc<AtomicU64>,
}

impl FakeClock {
    /// The time a [`FakeClock::default`] starts at: 2023-11-14T22:13:20Z.
    pub const DEFAULT_START: Timestamp = Timestamp::from_secs(1_700_000_000);

    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self {
            micros: Arc::new(AtomicU64::new(start.as_micros())),
        }
    }

    /// Moves the clock (and every clone) forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = duration_micros(by);
        let _ = self
            .micros
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// Sets the clock (and every clone) to `to`, which may be in the past.
    pub fn set(&self, to: Timestamp) {
        self.micros.store(to.as_micros(), Ordering::SeqCst);
    }
}

impl Default for FakeClock {
    fn default() -> Self {
        Self::new(Self::DEFAULT_START)
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.micros.load(Ordering::SeqCst))
    }
}
