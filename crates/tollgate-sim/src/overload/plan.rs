//! The overload scenarios, laid out as phases of offered load and backend
//! capacity.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// How each request's service time varies around the backend's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Jitter {
    /// Uniform from 0.8 to 1.2 times the service time.
    #[default]
    Uniform,
    /// Exponential, with the service time as its mean: a much longer tail.
    Exponential,
}

impl Jitter {
    /// Every jitter, by name.
    pub const ALL: [(&'static str, Jitter); 2] = [
        ("uniform", Jitter::Uniform),
        ("exponential", Jitter::Exponential),
    ];
}

impl FromStr for Jitter {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        named(&Self::ALL, s, "jitter")
    }
}

impl fmt::Display for Jitter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(name_of(&Self::ALL, self))
    }
}

/// A named overload scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// 5 s at half the capacity, then a ramp over 30 s to `load` times it,
    /// held for 30 s.
    Ramp,
    /// `load` times the capacity throughout; the backend loses half its
    /// workers from 20 s to 40 s, then has them back for 30 s.
    Halving,
    /// As [`Halving`](Self::Halving), but the backend's service time
    /// doubles instead: the same capacity lost, with each request slower.
    Slowdown,
}

impl Scenario {
    /// Every scenario, by name.
    pub const ALL: [(&'static str, Scenario); 3] = [
        ("ramp", Scenario::Ramp),
        ("halving", Scenario::Halving),
        ("slowdown", Scenario::Slowdown),
    ];
}

impl FromStr for Scenario {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        named(&Self::ALL, s, "scenario")
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(name_of(&Self::ALL, self))
    }
}

fn named<T: Copy>(all: &[(&'static str, T)], s: &str, what: &str) -> Result<T, String> {
    all.iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(s))
        .map(|(_, value)| *value)
        .ok_or_else(|| {
            let names: Vec<&str> = all.iter().map(|(n, _)| *n).collect();
            format!("unknown {what} {s:?}: expected one of {}", names.join(", "))
        })
}

fn name_of<T: PartialEq>(all: &[(&'static str, T)], value: &T) -> &'static str {
    all.iter()
        .find(|(_, v)| v == value)
        .map_or("?", |(name, _)| *name)
}

/// The backend, the clients and the seed of an overload simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct OverloadOptions {
    /// Workers serving requests at once (default 40, the stand-in backend
    /// of the demo's acceptance run).
    pub workers: u32,
    /// A request's mean service time (default 20 ms). The capacity is
    /// `workers / service` requests per second.
    pub service: Duration,
    /// How each request's service time varies (default uniform ±20 %).
    pub jitter: Jitter,
    /// The peak offered load, as a multiple of the capacity (default 3).
    pub load: f64,
    /// How long a client waits for its response; one that comes later is
    /// not goodput (default 1 s).
    pub deadline: Duration,
    /// The shares of critical, default and sheddable requests (default
    /// 0.2, 0.5 and 0.3).
    pub mix: [f64; 3],
    /// Clients go away at their deadline (default false): the limit is
    /// told then that the request was abandoned
    /// ([`Completion::Abandoned`](tollgate_core::Completion::Abandoned)),
    /// and the backend still finishes it, as a service whose work is not
    /// cancelled with its caller does. Otherwise every client waits.
    pub give_up: bool,
    /// The seed of arrivals, classes and service times (default 1): the
    /// same seed gives every protection the same requests.
    pub seed: u64,
}

impl Default for OverloadOptions {
    fn default() -> Self {
        Self {
            workers: 40,
            service: Duration::from_millis(20),
            jitter: Jitter::Uniform,
            load: 3.0,
            deadline: Duration::from_secs(1),
            mix: [0.2, 0.5, 0.3],
            give_up: false,
            seed: 1,
        }
    }
}

/// Why an overload simulation cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OverloadError {
    /// An option is out of its range.
    #[error("invalid {option}: {reason}")]
    InvalidOption {
        /// The option.
        option: &'static str,
        /// What it must be.
        reason: &'static str,
    },
}

/// One stretch of a scenario: a backend and an offered load that moves
/// linearly from `load_from` to `load_to`.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanPhase {
    /// Its name in reports.
    pub name: &'static str,
    /// When it starts, in µs from the start of the run.
    pub start_us: u64,
    /// When it ends (exclusive), in µs.
    pub end_us: u64,
    /// The offered load at its start, as a multiple of the nominal
    /// capacity (that of [`OverloadOptions`], not of this phase).
    pub load_from: f64,
    /// The offered load at its end, likewise.
    pub load_to: f64,
    /// The backend's workers in this phase.
    pub workers: u32,
    /// The backend's mean service time in this phase, in µs.
    pub service_us: u64,
}

impl PlanPhase {
    /// This phase's capacity, in requests per second.
    pub fn capacity(&self) -> f64 {
        f64::from(self.workers) * 1e6 / self.service_us as f64
    }

    /// Its length in seconds.
    pub fn seconds(&self) -> f64 {
        self.end_us.saturating_sub(self.start_us) as f64 / 1e6
    }
}

/// A scenario laid out in phases for the given options.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The scenario.
    pub scenario: Scenario,
    /// The backend and clients.
    pub options: OverloadOptions,
    /// The phases, back to back from 0.
    pub phases: Vec<PlanPhase>,
}

impl Plan {
    /// Lays `scenario` out for `options`.
    ///
    /// ```
    /// use tollgate_sim::overload::{OverloadOptions, Plan, Scenario};
    ///
    /// let plan = Plan::new(Scenario::Halving, &OverloadOptions::default())?;
    /// let workers: Vec<u32> = plan.phases.iter().map(|p| p.workers).collect();
    /// assert_eq!(workers, [40, 20, 40]);
    /// assert_eq!(plan.capacity(), 2_000.0);
    /// # Ok::<(), tollgate_sim::overload::OverloadError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`OverloadError::InvalidOption`] for no workers or more than
    /// 1,000,000, a service time or deadline under 1 µs or over a day, a
    /// load that is not a positive number, a run of more than 20,000,000
    /// requests offered, or a mix whose shares are negative or add up to
    /// nothing.
    pub fn new(scenario: Scenario, options: &OverloadOptions) -> Result<Self, OverloadError> {
        check(options)?;
        let (w, s, load) = (options.workers, micros(options.service), options.load);
        let phase =
            |name, from_s: u64, to_s: u64, load_from, load_to, workers, service_us| PlanPhase {
                name,
                start_us: from_s * 1_000_000,
                end_us: to_s * 1_000_000,
                load_from,
                load_to,
                workers,
                service_us,
            };
        let phases = match scenario {
            Scenario::Ramp => vec![
                phase("unloaded", 0, 5, 0.5, 0.5, w, s),
                phase("ramp", 5, 35, 0.5, load, w, s),
                phase("hold", 35, 65, load, load, w, s),
            ],
            Scenario::Halving => vec![
                phase("full", 0, 20, load, load, w, s),
                phase("halved", 20, 40, load, load, (w / 2).max(1), s),
                phase("restored", 40, 70, load, load, w, s),
            ],
            Scenario::Slowdown => vec![
                phase("full", 0, 20, load, load, w, s),
                phase("slowed", 20, 40, load, load, w, s.saturating_mul(2)),
                phase("restored", 40, 70, load, load, w, s),
            ],
        };
        Ok(Self {
            scenario,
            options: options.clone(),
            phases,
        })
    }

    /// A single phase of `seconds` at a steady `load` (a multiple of the
    /// capacity of `workers` and `service_us`), for unloaded baselines.
    pub(super) fn steady(
        options: &OverloadOptions,
        workers: u32,
        service_us: u64,
        load: f64,
        seconds: u64,
    ) -> Self {
        let nominal = f64::from(options.workers) / micros(options.service) as f64;
        let own = f64::from(workers) / service_us.max(1) as f64;
        let load = load * own / nominal;
        Self {
            scenario: Scenario::Ramp,
            options: options.clone(),
            phases: vec![PlanPhase {
                name: "unloaded",
                start_us: 0,
                end_us: seconds * 1_000_000,
                load_from: load,
                load_to: load,
                workers,
                service_us,
            }],
        }
    }

    /// The nominal capacity, `workers / service`, in requests per second.
    pub fn capacity(&self) -> f64 {
        f64::from(self.options.workers) * 1e6 / micros(self.options.service) as f64
    }

    /// When the run ends, in µs.
    pub fn end_us(&self) -> u64 {
        self.phases.last().map_or(0, |p| p.end_us)
    }

    /// The phase in force at `t_us` (the last one after the end).
    pub fn phase_at(&self, t_us: u64) -> Option<&PlanPhase> {
        self.phases
            .iter()
            .find(|p| t_us < p.end_us)
            .or(self.phases.last())
    }

    /// The offered load at `t_us`, as a multiple of the nominal capacity.
    pub fn load_at(&self, t_us: u64) -> f64 {
        self.phase_at(t_us).map_or(0.0, |p| {
            let span = p.end_us.saturating_sub(p.start_us).max(1) as f64;
            let along = (t_us.saturating_sub(p.start_us) as f64 / span).min(1.0);
            p.load_from + (p.load_to - p.load_from) * along
        })
    }

    /// The highest offered load of the run.
    pub fn peak_load(&self) -> f64 {
        self.phases
            .iter()
            .map(|p| p.load_from.max(p.load_to))
            .fold(0.0, f64::max)
    }
}

fn check(options: &OverloadOptions) -> Result<(), OverloadError> {
    let invalid = |option, reason| Err(OverloadError::InvalidOption { option, reason });
    if !(1..=MAX_WORKERS).contains(&options.workers) {
        return invalid("workers", "must be at least 1 and at most 1,000,000");
    }
    if !(1..=DAY_US).contains(&micros(options.service)) {
        return invalid("service time", "must be at least 1 µs and at most a day");
    }
    if !(1..=DAY_US).contains(&micros(options.deadline)) {
        return invalid("deadline", "must be at least 1 µs and at most a day");
    }
    if !(options.load.is_finite() && options.load > 0.0 && options.load <= 1_000.0) {
        return invalid("load", "must be above 0 and at most 1,000");
    }
    // The offered requests of the longest scenario (70 s), each held for
    // the whole run.
    let offered =
        f64::from(options.workers) * 1e6 / micros(options.service) as f64 * options.load * 70.0;
    if offered > MAX_OFFERED {
        return invalid(
            "load",
            "with the workers and the service time, more than 20,000,000 requests in a run",
        );
    }
    if options
        .mix
        .iter()
        .any(|share| !share.is_finite() || *share < 0.0)
        || options.mix.iter().sum::<f64>() <= 0.0
    {
        return invalid(
            "mix",
            "shares must not be negative, and must add up to more than 0",
        );
    }
    Ok(())
}

/// The most workers a backend has.
const MAX_WORKERS: u32 = 1_000_000;

/// The most requests a run offers.
const MAX_OFFERED: f64 = 20_000_000.0;

/// The longest service time or deadline a run takes: a day, in µs.
const DAY_US: u64 = 86_400_000_000;

/// Whole microseconds of `duration`, saturating.
pub(super) fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}
