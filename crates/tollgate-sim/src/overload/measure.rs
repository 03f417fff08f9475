//! The figures of a run, per phase: goodput, critical latency against its
//! unloaded baseline, shedding order, and how fast the limit settles.

use tollgate_core::Priority;

use super::engine::{OverloadRun, Protection, WINDOW_US, Window, simulate};
use super::plan::{Plan, PlanPhase};

/// How long the unloaded baselines run, in seconds.
const BASELINE_SECONDS: u64 = 60;

/// The load of the unloaded baselines, as a multiple of their capacity.
const BASELINE_LOAD: f64 = 0.5;

/// The reference a limit settles to is its median over this last part of
/// its phase (or over the last half of a shorter phase), in µs.
pub const SETTLE_TAIL_US: u64 = 10_000_000;

/// How far from that median a settled limit may stray: ±20 %.
pub const SETTLE_BAND: f64 = 0.2;

/// A settled limit is judged by its median over this much time before
/// each sample, in µs: brief excursions (a Vegas probe halves the limit
/// for a few tens of ms) do not count, a level that moved does.
pub const SETTLE_SMOOTHING_US: u64 = 1_000_000;

/// The critical p99 of the backend unprotected at half its capacity, per
/// backend a plan uses: what "unloaded" means in [`PhaseSummary`].
#[derive(Debug, Clone, PartialEq)]
pub struct Baselines {
    /// (workers, service time in µs, critical p99 in µs).
    pub p99_us: Vec<(u32, u64, Option<u64>)>,
}

impl Baselines {
    /// Runs each distinct backend of `plan` for 60 s at half its capacity
    /// without protection, with the plan's seed and jitter, and keeps the
    /// p99 latency of its critical requests (the first second left out).
    pub fn new(plan: &Plan) -> Self {
        let mut p99_us: Vec<(u32, u64, Option<u64>)> = Vec::new();
        for phase in &plan.phases {
            if p99_us
                .iter()
                .any(|&(w, s, _)| (w, s) == (phase.workers, phase.service_us))
            {
                continue;
            }
            let steady = Plan::steady(
                &plan.options,
                phase.workers,
                phase.service_us,
                BASELINE_LOAD,
                BASELINE_SECONDS,
            );
            let run = simulate(&steady, &Protection::None);
            let mut critical: Vec<u64> = run
                .responses
                .iter()
                .filter(|r| r.class == Priority::Critical && r.done_us >= 1_000_000)
                .map(|r| r.latency_us)
                .collect();
            critical.sort_unstable();
            p99_us.push((phase.workers, phase.service_us, percentile(&critical, 0.99)));
        }
        Self { p99_us }
    }

    /// The critical p99 of `phase`'s backend, unloaded.
    pub fn p99_of(&self, phase: &PlanPhase) -> Option<u64> {
        self.p99_us
            .iter()
            .find(|&&(w, s, _)| (w, s) == (phase.workers, phase.service_us))
            .and_then(|&(_, _, p99)| p99)
    }
}

/// The figures of one phase of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseSummary {
    /// The phase's name.
    pub name: &'static str,
    /// Its backend's capacity, in requests per second.
    pub capacity: f64,
    /// Requests sent per second, as a multiple of that capacity.
    pub offered: f64,
    /// Responses within their deadline per second, as a multiple of that
    /// capacity.
    pub goodput: f64,
    /// The median latency of the critical requests finished in the phase.
    pub critical_p50_us: Option<u64>,
    /// Their p99 latency.
    pub critical_p99_us: Option<u64>,
    /// The critical p99 of the same backend unloaded (see [`Baselines`]).
    pub unloaded_p99_us: Option<u64>,
    /// The share of each class's requests refused, in
    /// [`Priority::ALL`]'s order.
    pub shed: [f64; 3],
    /// The 100 ms windows in which a critical request was refused while a
    /// sheddable one was admitted.
    pub order_windows: u64,
    /// The critical requests refused at a moment when a sheddable one
    /// would have been admitted.
    pub inverted: u64,
    /// The median limit over the last part of the phase (see
    /// [`SETTLE_TAIL_US`]); none without protection.
    pub limit_median: Option<f64>,
    /// How long after the phase started the limit entered, for good,
    /// the band of ±20 % around that median, judged every 10 ms by its
    /// median over the second before (see [`SETTLE_SMOOTHING_US`]); none
    /// if it was still outside at the phase's end, or without protection.
    pub settle_us: Option<u64>,
}

impl PhaseSummary {
    /// The critical p99 as a multiple of its unloaded p99.
    pub fn p99_ratio(&self) -> Option<f64> {
        match (self.critical_p99_us, self.unloaded_p99_us) {
            (Some(p99), Some(unloaded)) if unloaded > 0 => Some(p99 as f64 / unloaded as f64),
            (Some(_) | None, Some(_) | None) => None,
        }
    }
}

/// The figures of a run, phase by phase.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// The protection's name.
    pub name: &'static str,
    /// One per phase of the plan.
    pub phases: Vec<PhaseSummary>,
}

impl Summary {
    /// The phase named `name`.
    pub fn phase(&self, name: &str) -> Option<&PhaseSummary> {
        self.phases.iter().find(|p| p.name == name)
    }

    /// The windows of the whole run in which a critical request was
    /// refused while a sheddable one was admitted.
    pub fn order_windows(&self) -> u64 {
        self.phases.iter().map(|p| p.order_windows).sum()
    }

    /// The critical requests of the whole run refused at a moment when a
    /// sheddable one would have been admitted.
    pub fn inverted(&self) -> u64 {
        self.phases.iter().map(|p| p.inverted).sum()
    }
}

/// The figures of `run`, against `baselines` (made for its plan).
pub fn summarize(run: &OverloadRun, baselines: &Baselines) -> Summary {
    let phases = run
        .plan
        .phases
        .iter()
        .map(|phase| summarize_phase(run, phase, baselines))
        .collect();
    Summary {
        name: run.name,
        phases,
    }
}

fn summarize_phase(run: &OverloadRun, phase: &PlanPhase, baselines: &Baselines) -> PhaseSummary {
    let first = (phase.start_us / WINDOW_US) as usize;
    let last = (phase.end_us / WINDOW_US) as usize;
    let windows = run
        .windows
        .get(first..last.min(run.windows.len()))
        .unwrap_or(&[]);
    let seconds = phase.seconds().max(1e-9);
    let capacity = phase.capacity();
    let per_second = |n: u64| n as f64 / seconds / capacity;
    let offered: [u64; 3] = sum_by_class(windows, |w| w.offered);
    let shed_counts: [u64; 3] = sum_by_class(windows, |w| w.shed);
    let shed = [0, 1, 2].map(|i| {
        let sent = offered.get(i).copied().unwrap_or(0);
        let refused = shed_counts.get(i).copied().unwrap_or(0);
        if sent == 0 {
            0.0
        } else {
            refused as f64 / sent as f64
        }
    });
    let critical = Priority::Critical.index();
    let sheddable = Priority::Sheddable.index();
    let order_windows = windows
        .iter()
        .filter(|w| w.shed[critical] > 0 && w.admitted[sheddable] > 0)
        .count() as u64;

    let mut latencies: Vec<u64> = run
        .responses
        .iter()
        .filter(|r| {
            r.class == Priority::Critical && (phase.start_us..phase.end_us).contains(&r.done_us)
        })
        .map(|r| r.latency_us)
        .collect();
    latencies.sort_unstable();

    let (limit_median, settle_us) = settle(run, phase);
    PhaseSummary {
        name: phase.name,
        capacity,
        offered: per_second(offered.iter().sum()),
        goodput: per_second(windows.iter().map(|w| w.good).sum()),
        critical_p50_us: percentile(&latencies, 0.5),
        critical_p99_us: percentile(&latencies, 0.99),
        unloaded_p99_us: baselines.p99_of(phase),
        shed,
        order_windows,
        inverted: windows.iter().map(|w| w.inverted).sum(),
        limit_median,
        settle_us,
    }
}

fn sum_by_class(windows: &[Window], field: impl Fn(&Window) -> [u64; 3]) -> [u64; 3] {
    windows.iter().fold([0; 3], |mut sum, w| {
        for (total, n) in sum.iter_mut().zip(field(w)) {
            *total += n;
        }
        sum
    })
}

/// The limit's median over the phase's tail, and when it settled: the
/// first time in the phase from which the limit's median over the second
/// before each sample stays within the band around the tail's median.
fn settle(run: &OverloadRun, phase: &PlanPhase) -> (Option<f64>, Option<u64>) {
    let limits: Vec<(u64, f64)> = run
        .ticks
        .iter()
        .filter_map(|t| t.limit.map(|l| (t.at_us, f64::from(l))))
        .collect();
    let length = phase.end_us.saturating_sub(phase.start_us);
    let tail_from = phase.end_us - SETTLE_TAIL_US.min(length / 2);
    let in_phase = |at: u64, from: u64| (from..phase.end_us).contains(&at);
    let mut tail: Vec<f64> = limits
        .iter()
        .filter(|&&(at, _)| in_phase(at, tail_from))
        .map(|&(_, l)| l)
        .collect();
    if tail.is_empty() {
        return (None, None);
    }
    tail.sort_by(f64::total_cmp);
    let median = middle(&tail);
    let (low, high) = (median * (1.0 - SETTLE_BAND), median * (1.0 + SETTLE_BAND));
    let mut settled = None;
    let mut window: Vec<f64> = Vec::new();
    for (i, &(at, _)) in limits.iter().enumerate() {
        if !in_phase(at, phase.start_us) {
            continue;
        }
        let from = at.saturating_sub(SETTLE_SMOOTHING_US);
        window.clear();
        window.extend(
            limits[..=i]
                .iter()
                .rev()
                .take_while(|&&(t, _)| t >= from)
                .map(|&(_, l)| l),
        );
        window.sort_by(f64::total_cmp);
        let smoothed = middle(&window);
        if (low..=high).contains(&smoothed) {
            settled.get_or_insert(at.saturating_sub(phase.start_us));
        } else {
            settled = None;
        }
    }
    (Some(median), settled)
}

/// The median of sorted `values` (the upper one of an even count).
fn middle(values: &[f64]) -> f64 {
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// The `p` quantile of `sorted` by nearest rank.
fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}
