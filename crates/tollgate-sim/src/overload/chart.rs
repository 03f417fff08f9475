//! Charts of overload runs: per protection, the limit, the requests in
//! flight and the workers above, goodput and offered load below, in the
//! style of [`crate::chart`].

use std::fmt::Write;

use super::engine::{OverloadRun, TICK_US, WINDOW_US};
use super::measure::Summary;
use super::plan::Scenario;
use crate::chart::{escape, human, nice_step, time_axis};

const WIDTH: f64 = 1_000.0;
const LEFT: f64 = 230.0;
const RIGHT: f64 = 44.0;
const TOP: f64 = 74.0;
const LANE: f64 = 200.0;
const BOTTOM: f64 = 44.0;
/// The upper panel of a lane (counts), and the lower one (rates).
const UPPER: f64 = 104.0;
const LOWER: f64 = 66.0;
const GAP: f64 = 12.0;
const LIMIT: &str = "#6a1b9a";
const IN_FLIGHT: &str = "#ef6c00";
const WORKERS: &str = "#000000";
const GOODPUT: &str = "#2e7d32";
const OFFERED: &str = "#9e9e9e";
const PHASE: &str = "#1565c0";

/// Draws `runs` (with their `summaries`, in the same order) as an SVG
/// document: `title`, then `subtitle`, then one lane per protection, time
/// across. A lane's upper panel shows the limit (its mean per bucket of
/// at least 100 ms, with its range as a band), the requests in flight and
/// the backend's workers, on one scale for every lane (what is above it
/// is drawn at its top); its lower panel the goodput and the offered load
/// per bucket, as multiples of the nominal capacity. A dashed line marks
/// each phase's start.
///
/// ```
/// use tollgate_sim::overload::{Baselines, OverloadOptions, Plan, Protection, Scenario, chart, simulate, summarize};
///
/// let plan = Plan::new(Scenario::Halving, &OverloadOptions::default())?;
/// let run = simulate(&plan, &Protection::None);
/// let summary = summarize(&run, &Baselines::new(&plan));
/// let svg = chart::svg(&[run], &[summary], "halving", "no protection");
/// assert!(svg.starts_with("<svg"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn svg(runs: &[OverloadRun], summaries: &[Summary], title: &str, subtitle: &str) -> String {
    let end_us = runs
        .iter()
        .map(|r| r.plan.end_us())
        .max()
        .unwrap_or(0)
        .max(1_000_000);
    let tick_us = nice_step(end_us / 8);
    // About one bucket per 2.5 pixels, whole windows.
    let bucket_us = nice_step(end_us / 300).max(WINDOW_US);
    let plot_width = WIDTH - LEFT - RIGHT;
    let x = |us: u64| LEFT + us as f64 / end_us as f64 * plot_width;
    let height = TOP + LANE * runs.len() as f64 + BOTTOM;
    let most_workers = runs
        .iter()
        .flat_map(|r| r.plan.phases.iter().map(|p| p.workers))
        .max()
        .unwrap_or(1);
    // One scale for the counts of every lane: up to the highest limit of a
    // protected run, at most four times the workers.
    let highest = runs
        .iter()
        .flat_map(|r| r.ticks.iter().filter_map(|t| t.limit))
        .max()
        .unwrap_or(0)
        .max(most_workers.saturating_mul(2));
    let count_max = nice_count(highest.min(most_workers.saturating_mul(4))) as f64;
    let rate_max = runs
        .iter()
        .map(|r| r.plan.peak_load())
        .fold(1.0, f64::max)
        .ceil();

    let mut out = String::new();
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Verdana, sans-serif" font-size="12">
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="10" y="22" font-size="15" font-weight="bold">{}</text>
<text x="10" y="40" fill="#555555">{}</text>
<text x="10" y="58" fill="#555555">per {}: <tspan fill="{LIMIT}">limit (band: its range)</tspan>, <tspan fill="{IN_FLIGHT}">in flight</tspan>, <tspan fill="{WORKERS}">workers</tspan> (0 to {count_max}); <tspan fill="{GOODPUT}">goodput</tspan>, <tspan fill="{OFFERED}">offered load</tspan> (0 to {rate_max}× capacity); dashed: phase start</text>
"##,
        escape(title),
        escape(subtitle),
        human(bucket_us),
    );

    for (lane, run) in runs.iter().enumerate() {
        let top = TOP + LANE * lane as f64;
        let upper_bottom = top + 8.0 + UPPER;
        let lower_top = upper_bottom + GAP;
        let lower_bottom = lower_top + LOWER;
        let count_y = |n: f64| upper_bottom - n.min(count_max) / count_max * UPPER;
        let rate_y = |r: f64| lower_bottom - r.min(rate_max) / rate_max * LOWER;
        let shade = if lane % 2 == 0 { "#f6f6f6" } else { "#ffffff" };
        let _ = writeln!(
            out,
            r##"<rect x="0" y="{top}" width="{WIDTH}" height="{LANE}" fill="{shade}"/>
<line x1="{LEFT}" y1="{upper_bottom}" x2="{0}" y2="{upper_bottom}" stroke="#999999" stroke-width="0.5"/>
<line x1="{LEFT}" y1="{lower_bottom}" x2="{0}" y2="{lower_bottom}" stroke="#999999" stroke-width="0.5"/>
<line x1="{LEFT}" y1="{1}" x2="{0}" y2="{1}" stroke="#cccccc" stroke-width="0.5" stroke-dasharray="2 2"/>
<text x="{2}" y="{3}" fill="#555555" font-size="10">{count_max}</text>
<text x="{2}" y="{upper_bottom}" fill="#555555" font-size="10">0</text>
<text x="{2}" y="{4}" fill="#555555" font-size="10">{rate_max}×</text>
<text x="{2}" y="{1:.1}" fill="#555555" font-size="10">1×</text>"##,
            WIDTH - RIGHT,
            rate_y(1.0),
            WIDTH - RIGHT + 4.0,
            top + 8.0 + 9.0,
            lower_top + 9.0,
        );
        let summary = summaries.get(lane);
        for (i, (text, weight)) in lane_text(run, summary).iter().enumerate() {
            let _ = writeln!(
                out,
                r#"<text x="10" y="{}" font-weight="{weight}">{}</text>"#,
                top + 22.0 + 17.0 * i as f64,
                escape(text)
            );
        }

        // Per bucket: the limit's mean and range, the mean in flight, the
        // workers.
        let per = (bucket_us / TICK_US).max(1) as usize;
        let mut band_top = Vec::new();
        let mut band_bottom = Vec::new();
        let mut limit_line = Vec::new();
        let mut flight_line = Vec::new();
        let mut worker_line = Vec::new();
        for chunk in run.ticks.chunks(per) {
            let (Some(first), Some(last)) = (chunk.first(), chunk.last()) else {
                continue;
            };
            let mid = (first.at_us + last.at_us) / 2;
            let limits: Vec<u32> = chunk.iter().filter_map(|t| t.limit).collect();
            if let (Some(low), Some(high)) = (limits.iter().min(), limits.iter().max()) {
                let mean = limits.iter().map(|&l| f64::from(l)).sum::<f64>() / limits.len() as f64;
                band_top.push(format!("{:.1},{:.1}", x(mid), count_y(f64::from(*high))));
                band_bottom.push(format!("{:.1},{:.1}", x(mid), count_y(f64::from(*low))));
                limit_line.push(format!("{:.1},{:.1}", x(mid), count_y(mean)));
            }
            let flight = chunk.iter().map(|t| t.in_flight as f64).sum::<f64>() / chunk.len() as f64;
            flight_line.push(format!("{:.1},{:.1}", x(mid), count_y(flight)));
            worker_line.push(format!(
                "{:.1},{:.1} {:.1},{:.1}",
                x(first.at_us),
                count_y(f64::from(first.workers)),
                x(last.at_us + TICK_US),
                count_y(f64::from(last.workers))
            ));
        }
        if !band_top.is_empty() {
            band_bottom.reverse();
            let _ = writeln!(
                out,
                r#"<polygon points="{} {}" fill="{LIMIT}" fill-opacity="0.18"/>"#,
                band_top.join(" "),
                band_bottom.join(" ")
            );
        }
        polyline(&mut out, &worker_line, WORKERS, 1.0, Some("3 2"));
        polyline(&mut out, &flight_line, IN_FLIGHT, 1.0, None);
        polyline(&mut out, &limit_line, LIMIT, 1.4, None);

        // Per bucket: goodput and offered load, over the nominal capacity.
        let windows_per = (bucket_us / WINDOW_US).max(1) as usize;
        let per_bucket = run.plan.capacity() * bucket_us as f64 / 1e6;
        let mut good_line = Vec::new();
        let mut offered_line = Vec::new();
        for (i, chunk) in run.windows.chunks(windows_per).enumerate() {
            let mid = i as u64 * bucket_us + bucket_us / 2;
            let good: u64 = chunk.iter().map(|w| w.good).sum();
            let offered: u64 = chunk.iter().flat_map(|w| w.offered).sum();
            good_line.push(format!(
                "{:.1},{:.1}",
                x(mid),
                rate_y(good as f64 / per_bucket)
            ));
            offered_line.push(format!(
                "{:.1},{:.1}",
                x(mid),
                rate_y(offered as f64 / per_bucket)
            ));
        }
        polyline(&mut out, &offered_line, OFFERED, 1.0, None);
        polyline(&mut out, &good_line, GOODPUT, 1.2, None);

        for phase in run.plan.phases.iter().skip(1) {
            let _ = writeln!(
                out,
                r##"<line x1="{0:.2}" y1="{1}" x2="{0:.2}" y2="{2}" stroke="{PHASE}" stroke-dasharray="4 3"/>"##,
                x(phase.start_us),
                top + 4.0,
                top + LANE - 4.0
            );
        }
    }

    let axis = TOP + LANE * runs.len() as f64;
    time_axis(&mut out, axis, (LEFT, WIDTH - RIGHT), (end_us, tick_us), x);
    out.push_str("</svg>\n");
    out
}

/// The lines of text at the left of a lane.
fn lane_text(run: &OverloadRun, summary: Option<&Summary>) -> Vec<(String, &'static str)> {
    let mut lines = vec![(run.name.to_owned(), "bold")];
    let Some(summary) = summary else {
        return lines;
    };
    for p in &summary.phases {
        let p99 = p.p99_ratio().map_or("-".to_owned(), |r| format!("{r:.1}×"));
        lines.push((
            format!("{}: goodput {:.2}, p99 {p99}", p.name, p.goodput),
            "normal",
        ));
    }
    let seconds =
        |us: Option<u64>| us.map_or("never".to_owned(), |us| format!("{:.1} s", us as f64 / 1e6));
    match run.plan.scenario {
        Scenario::Ramp => {
            if let Some(limit) = summary.phases.last().and_then(|p| p.limit_median) {
                lines.push((format!("limit at the end: {limit:.0}"), "normal"));
            }
        }
        Scenario::Halving | Scenario::Slowdown => {
            if let (Some(changed), Some(restored)) = (summary.phases.get(1), summary.phases.get(2))
                && changed.limit_median.is_some()
            {
                lines.push((
                    format!(
                        "settles {}, recovers {}",
                        seconds(changed.settle_us),
                        seconds(restored.settle_us)
                    ),
                    "normal",
                ));
            }
        }
    }
    if run.ticks.iter().all(|t| t.limit.is_none()) {
        return lines;
    }
    lines.push(("critical shed beside sheddable".to_owned(), "normal"));
    lines.push((
        format!(
            "admitted: {} at once, {} in 100 ms",
            summary.inverted(),
            summary.order_windows()
        ),
        "normal",
    ));
    lines
}

fn polyline(out: &mut String, points: &[String], color: &str, width: f64, dash: Option<&str>) {
    if points.is_empty() {
        return;
    }
    let dash = dash.map_or(String::new(), |d| format!(r#" stroke-dasharray="{d}""#));
    let _ = writeln!(
        out,
        r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="{width}"{dash}/>"#,
        points.join(" ")
    );
}

/// The smallest of 1, 2, 5 × 10ⁿ at least `n`.
fn nice_count(n: u32) -> u64 {
    let n = u64::from(n);
    let mut step = 1;
    loop {
        for m in [1, 2, 5] {
            if step * m >= n {
                return step * m;
            }
        }
        step *= 10;
    }
}
