//! The text report of an overload comparison: a table per phase, then the
//! issue's targets per protection.

use std::fmt::Write;

use super::engine::{OverloadRun, WINDOW_US};
use super::measure::{PhaseSummary, SETTLE_BAND, SETTLE_SMOOTHING_US, SETTLE_TAIL_US, Summary};
use super::plan::{Jitter, Plan, Scenario};

/// The goodput a protection keeps at overload, as a share of capacity.
pub const GOODPUT_TARGET: f64 = 0.9;
/// The most a critical p99 may grow over its unloaded p99.
pub const P99_TARGET: f64 = 2.0;
/// The longest a limit may take to settle after capacity halves, in µs.
pub const SETTLE_TARGET_US: u64 = 5_000_000;
/// The longest it may take to recover once capacity is back, in µs.
pub const RECOVER_TARGET_US: u64 = 10_000_000;

/// The setup of `plan` in one line.
pub fn setup(plan: &Plan) -> String {
    let o = &plan.options;
    let jitter = match o.jitter {
        Jitter::Uniform => "uniform ±20 %",
        Jitter::Exponential => "exponential",
    };
    let total: f64 = o.mix.iter().sum();
    let mix: Vec<String> = o
        .mix
        .iter()
        .map(|m| format!("{:.0}", m / total * 100.0))
        .collect();
    let clients = if o.give_up {
        " (clients give up at it)"
    } else {
        ""
    };
    format!(
        "scenario {}: {} workers × {} ms ({jitter}), capacity C = {:.0}/s; load up to {}× C; \
         deadline {} ms{clients}; mix critical/default/sheddable {} %; seed {}",
        plan.scenario,
        o.workers,
        o.service.as_secs_f64() * 1e3,
        plan.capacity(),
        o.load,
        o.deadline.as_millis(),
        mix.join("/"),
        o.seed
    )
}

/// The report: the setup, a row per phase and protection, then each
/// target of issue 33 with each protection's figure.
pub fn text(plan: &Plan, summaries: &[Summary]) -> String {
    let mut out = setup(plan);
    out.push_str("\n\n");
    let _ = writeln!(
        out,
        "{:<9} {:<10} {:>7} {:>7} {:>9} {:>9} {:>6} {:>17} {:>6} {:>6} {:>7}",
        "phase",
        "protection",
        "offered",
        "goodput",
        "crit p50",
        "crit p99",
        "×unld",
        "shed % c/d/s",
        "order",
        "limit",
        "settle"
    );
    for phase in &plan.phases {
        for summary in summaries {
            let Some(p) = summary.phase(phase.name) else {
                continue;
            };
            let shed: Vec<String> = p.shed.iter().map(|s| format!("{:.1}", s * 100.0)).collect();
            let _ = writeln!(
                out,
                "{:<9} {:<10} {:>7.2} {:>7.2} {:>9} {:>9} {:>6} {:>17} {:>6} {:>6} {:>7}",
                phase.name,
                summary.name,
                p.offered,
                p.goodput,
                ms(p.critical_p50_us),
                ms(p.critical_p99_us),
                p.p99_ratio().map_or("-".to_owned(), |r| format!("{r:.2}")),
                shed.join("/"),
                p.order_windows,
                p.limit_median.map_or("-".to_owned(), |l| format!("{l:.0}")),
                settle(p),
            );
        }
    }
    let _ = writeln!(
        out,
        "\noffered and goodput as multiples of the phase's capacity; ×unld: critical p99 over the \
         unloaded one (the same backend at 0.5× without protection); order: 100 ms windows with \
         a critical request shed and a sheddable one admitted; limit: median over the phase's \
         last {} s; settle: when the limit's median over the {} ms before entered ±{:.0} % of \
         that for good",
        SETTLE_TAIL_US / 1_000_000,
        SETTLE_SMOOTHING_US / 1_000,
        SETTLE_BAND * 100.0
    );
    out.push('\n');
    out.push_str(&targets(plan, summaries));
    out
}

/// One row of the targets table: its label, and each protection's cell.
type Row = (String, Vec<String>);

fn targets(plan: &Plan, summaries: &[Summary]) -> String {
    let load = plan.options.load;
    let mut rows: Vec<Row> = Vec::new();
    let mut row = |label: String, cell: &dyn Fn(&Summary) -> String| {
        rows.push((label, summaries.iter().map(cell).collect()));
    };
    let goodput = |phase: &'static str| {
        move |s: &Summary| {
            s.phase(phase).map_or("-".to_owned(), |p| {
                format!("{:.2} {}", p.goodput, mark(p.goodput >= GOODPUT_TARGET))
            })
        }
    };
    let p99 = |phase: &'static str| {
        move |s: &Summary| {
            s.phase(phase)
                .and_then(PhaseSummary::p99_ratio)
                .map_or("-".to_owned(), |r| {
                    format!("{r:.2}× {}", mark(r <= P99_TARGET))
                })
        }
    };
    let order = |s: &Summary| {
        let n = s.order_windows();
        format!("{n} {}", mark(n == 0))
    };
    let inverted = |s: &Summary| {
        let n = s.inverted();
        format!("{n} {}", mark(n == 0))
    };
    match plan.scenario {
        Scenario::Ramp => {
            row(format!("goodput at {load}× ≥ 0.9 C"), &goodput("hold"));
            row(
                format!("critical p99 at {load}× ≤ 2× unloaded"),
                &p99("hold"),
            );
            row(
                "critical shed while sheddable admitted: at once".to_owned(),
                &inverted,
            );
            row("... within one 100 ms window (windows)".to_owned(), &order);
        }
        Scenario::Halving | Scenario::Slowdown => {
            let changed = plan.phases.get(1).map_or("halved", |p| p.name);
            let settle_cell = move |phase: &'static str, target: u64| {
                move |s: &Summary| {
                    s.phase(phase)
                        .map_or("-".to_owned(), |p| match (p.limit_median, p.settle_us) {
                            (None, _) => "-".to_owned(),
                            (Some(_), None) => format!("never {}", mark(false)),
                            (Some(_), Some(us)) => {
                                format!("{:.2} s {}", us as f64 / 1e6, mark(us <= target))
                            }
                        })
                }
            };
            row(
                format!("limit settles ≤ 5 s ({changed})"),
                &settle_cell(changed, SETTLE_TARGET_US),
            );
            row(
                "limit recovers ≤ 10 s (restored)".to_owned(),
                &settle_cell("restored", RECOVER_TARGET_US),
            );
            for phase in &plan.phases {
                row(
                    format!("goodput ≥ 0.9 of capacity ({})", phase.name),
                    &goodput(phase.name),
                );
            }
            for phase in &plan.phases {
                row(
                    format!("critical p99 ≤ 2× unloaded ({})", phase.name),
                    &p99(phase.name),
                );
            }
            row(
                "critical shed while sheddable admitted: at once".to_owned(),
                &inverted,
            );
            row("... within one 100 ms window (windows)".to_owned(), &order);
        }
    }
    let mut out = String::new();
    let _ = write!(out, "{:<46}", "target");
    for s in summaries {
        let _ = write!(out, " {:>12}", s.name);
    }
    out.push('\n');
    for (label, cells) in rows {
        let _ = write!(out, "{label:<46}");
        for cell in cells {
            let _ = write!(out, " {cell:>12}");
        }
        out.push('\n');
    }
    out
}

/// Every run's state every 10 ms, as CSV: `protection,at_ms,limit,
/// in_flight,queued,workers` (`limit` empty without protection), then the
/// windows of 100 ms as `protection,window_ms,offered,admitted_critical,
/// shed_critical,admitted_sheddable,completed,good` under a second header.
pub fn csv(runs: &[OverloadRun]) -> String {
    let mut out = String::from("protection,at_ms,limit,in_flight,queued,workers\n");
    for run in runs {
        for t in &run.ticks {
            let limit = t.limit.map_or(String::new(), |l| l.to_string());
            let _ = writeln!(
                out,
                "{},{},{limit},{},{},{}",
                run.name,
                t.at_us / 1_000,
                t.in_flight,
                t.queued,
                t.workers
            );
        }
    }
    out.push_str("protection,window_ms,offered,admitted_critical,shed_critical,admitted_sheddable,completed,good\n");
    for run in runs {
        for (i, w) in run.windows.iter().enumerate() {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{}",
                run.name,
                i as u64 * WINDOW_US / 1_000,
                w.offered.iter().sum::<u64>(),
                w.admitted[0],
                w.shed[0],
                w.admitted[2],
                w.completed,
                w.good
            );
        }
    }
    out
}

fn mark(ok: bool) -> &'static str {
    if ok { "yes" } else { "NO" }
}

fn ms(us: Option<u64>) -> String {
    us.map_or("-".to_owned(), |us| format!("{:.1} ms", us as f64 / 1e3))
}

fn settle(p: &PhaseSummary) -> String {
    match (p.limit_median, p.settle_us) {
        (None, _) => "-".to_owned(),
        (Some(_), None) => "never".to_owned(),
        (Some(_), Some(us)) => format!("{:.2} s", us as f64 / 1e6),
    }
}
