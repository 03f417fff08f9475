//! Charts of a replay: admitted and rejected requests over time, one lane
//! per policy, as SVG and PNG.

use std::fmt::Write;

use crate::sim::Run;

const WIDTH: f64 = 1_000.0;
const LEFT: f64 = 190.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 56.0;
const LANE: f64 = 150.0;
const BOTTOM: f64 = 44.0;
const ADMITTED: &str = "#2e7d32";
const REJECTED: &str = "#c62828";

/// Why a chart could not be drawn.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChartError {
    /// The SVG could not be parsed back for rasterising (a bug).
    #[error("cannot render the chart: {0}")]
    Svg(String),
    /// The PNG could not be encoded.
    #[error("cannot encode the PNG: {0}")]
    Png(String),
}

/// Draws `runs` as an SVG document: one lane per policy, time across, the
/// requests admitted in each time bucket as a green bar upwards and those
/// rejected as a red bar downwards (heights grow with the square root of
/// the count, so that a trickle stays visible next to a burst). A dashed line marks when each phase
/// started, a solid one when the last request was served.
///
/// ```
/// use tollgate_core::{Algorithm, Policy};
/// use tollgate_sim::{Pattern, PatternOptions, SimOptions, chart, simulate};
///
/// let workload = Pattern::Boundary.workload(&PatternOptions::default())?;
/// let policy = Policy::new("fixed", Algorithm::FixedWindow, "60/min")?;
/// let run = simulate(&workload, &policy, SimOptions::default())?;
/// let svg = chart::svg(&[run], "boundary");
/// assert!(svg.starts_with("<svg"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn svg(runs: &[Run], title: &str) -> String {
    let end_us = runs
        .iter()
        .flat_map(|r| {
            r.attempts
                .iter()
                .map(|a| a.at_us + a.delay_us)
                .chain(r.finished_us)
        })
        .max()
        .unwrap_or(0)
        .max(1_000_000);
    let tick_us = nice_step(end_us / 8);
    let end_us = end_us.div_ceil(tick_us) * tick_us;
    let plot_width = WIDTH - LEFT - RIGHT;
    // About one bucket per 4 pixels, rounded to a nice duration.
    let bucket_us = nice_step((end_us as f64 / (plot_width / 4.0)) as u64);
    let buckets = end_us.div_ceil(bucket_us) as usize;
    let bar = plot_width / buckets as f64;
    let x = |us: u64| LEFT + us as f64 / end_us as f64 * plot_width;
    let height = TOP + LANE * runs.len() as f64 + BOTTOM;

    let mut out = String::new();
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Verdana, sans-serif" font-size="12">
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{}</text>
<text x="{LEFT}" y="40" fill="#555555">requests per {} bucket (height ∝ √count): <tspan fill="{ADMITTED}">admitted ▲</tspan>, <tspan fill="{REJECTED}">rejected ▼</tspan>; dashed: phase start; solid: last request served</text>
"##,
        escape(title),
        human(bucket_us),
    );

    for (lane, run) in runs.iter().enumerate() {
        let top = TOP + LANE * lane as f64;
        let mid = top + LANE / 2.0;
        let mut admitted = vec![0_u64; buckets];
        let mut rejected = vec![0_u64; buckets];
        for a in &run.attempts {
            let b = ((a.at_us / bucket_us) as usize).min(buckets - 1);
            if a.admitted {
                admitted[b] += 1;
            } else {
                rejected[b] += 1;
            }
        }
        let peak = admitted
            .iter()
            .chain(&rejected)
            .copied()
            .max()
            .unwrap_or(0)
            .max(1);
        // Heights grow with the square root of the count, so that a steady
        // trickle stays visible next to a burst.
        let scale = (LANE / 2.0 - 12.0) / (peak as f64).sqrt();
        let shade = if lane % 2 == 0 { "#f6f6f6" } else { "#ffffff" };
        let _ = writeln!(
            out,
            r##"<rect x="0" y="{top}" width="{WIDTH}" height="{LANE}" fill="{shade}"/>
<line x1="{LEFT}" y1="{mid}" x2="{}" y2="{mid}" stroke="#999999" stroke-width="0.5"/>"##,
            WIDTH - RIGHT
        );
        let policy = &run.policy;
        let limits: Vec<String> = policy.limits().iter().map(ToString::to_string).collect();
        let lines = [
            (policy.name().to_owned(), "bold"),
            (
                format!("{} {}", policy.algorithm(), limits.join(" + ")),
                "normal",
            ),
            (
                format!("allowed {}, denied {}", run.allowed, run.denied),
                "normal",
            ),
            (
                format!("delayed {}, never {}", run.delayed, run.never_admitted),
                "normal",
            ),
            (
                match run.finished_us {
                    Some(f) => format!("last served at {}", human_exact(f)),
                    None => "nothing served".to_owned(),
                },
                "normal",
            ),
            (format!("peak {peak} per bucket"), "normal"),
        ];
        for (i, (text, weight)) in lines.iter().enumerate() {
            let _ = writeln!(
                out,
                r#"<text x="10" y="{}" font-weight="{weight}">{}</text>"#,
                top + 22.0 + 18.0 * i as f64,
                escape(text)
            );
        }
        bars(
            &mut out,
            Bars {
                left: LEFT,
                bar,
                mid,
                scale,
                up: (&admitted, ADMITTED),
                down: (&rejected, REJECTED),
            },
        );
        for &start in &run.phase_starts_us {
            let _ = writeln!(
                out,
                r##"<line x1="{0:.2}" y1="{1}" x2="{0:.2}" y2="{2}" stroke="#1565c0" stroke-dasharray="4 3"/>"##,
                x(start),
                top + 4.0,
                top + LANE - 4.0
            );
        }
        if let Some(finished) = run.finished_us {
            let _ = writeln!(
                out,
                r##"<line x1="{0:.2}" y1="{1}" x2="{0:.2}" y2="{2}" stroke="#000000"/>"##,
                x(finished),
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

/// The time axis under the lanes, at height `axis`: a line across the
/// plot from `left` to `right`, a tick and its label every `tick_us` up
/// to `end_us`, and the axis's title; `x` places a time.
pub(crate) fn time_axis(
    out: &mut String,
    axis: f64,
    (left, right): (f64, f64),
    (end_us, tick_us): (u64, u64),
    x: impl Fn(u64) -> f64,
) {
    let _ = writeln!(
        out,
        r##"<line x1="{left}" y1="{axis}" x2="{right}" y2="{axis}" stroke="#000000"/>"##,
    );
    let mut t = 0;
    while t <= end_us {
        let _ = writeln!(
            out,
            r##"<line x1="{0:.2}" y1="{axis}" x2="{0:.2}" y2="{1}" stroke="#000000"/><text x="{0:.2}" y="{2}" text-anchor="middle">{3}</text>"##,
            x(t),
            axis + 5.0,
            axis + 20.0,
            human(t)
        );
        t += tick_us;
    }
    let _ = writeln!(
        out,
        r##"<text x="{}" y="{}" text-anchor="middle" fill="#555555">time since start</text>"##,
        left + (right - left) / 2.0,
        axis + 38.0
    );
}

/// Rasterises an SVG made by [`svg`] to PNG, with the system's fonts.
///
/// # Errors
///
/// [`ChartError`] if the SVG cannot be parsed or the PNG encoded.
pub fn png(svg: &str) -> Result<Vec<u8>, ChartError> {
    use resvg::{tiny_skia, usvg};

    let mut options = usvg::Options::default();
    options.fontdb_mut().load_system_fonts();
    let tree = usvg::Tree::from_str(svg, &options).map_err(|e| ChartError::Svg(e.to_string()))?;
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| ChartError::Png("empty image".to_owned()))?;
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    pixmap
        .encode_png()
        .map_err(|e| ChartError::Png(e.to_string()))
}

/// The smallest of 1, 2, 5 x 10^n µs (and minutes, hours) at least `us`.
pub(crate) fn nice_step(us: u64) -> u64 {
    const STEPS: [u64; 20] = [
        1_000,
        2_000,
        5_000,
        10_000,
        20_000,
        50_000,
        100_000,
        200_000,
        500_000,
        1_000_000,
        2_000_000,
        5_000_000,
        10_000_000,
        15_000_000,
        30_000_000,
        60_000_000,
        120_000_000,
        300_000_000,
        600_000_000,
        3_600_000_000,
    ];
    STEPS
        .iter()
        .copied()
        .find(|&s| s >= us)
        .unwrap_or_else(|| us.div_ceil(3_600_000_000) * 3_600_000_000)
}

/// A round duration in the largest unit that keeps it whole.
pub(crate) fn human(us: u64) -> String {
    match us {
        0 => "0 s".to_owned(),
        _ if us.is_multiple_of(3_600_000_000) && us >= 7_200_000_000 => {
            format!("{} h", us / 3_600_000_000)
        }
        _ if us.is_multiple_of(1_000_000) => format!("{} s", us / 1_000_000),
        _ if us.is_multiple_of(1_000) => format!("{} ms", us / 1_000),
        _ => format!("{us} µs"),
    }
}

/// Seconds with three decimals.
pub(crate) fn human_exact(us: u64) -> String {
    format!("{}.{:03} s", us / 1_000_000, us % 1_000_000 / 1_000)
}

/// One lane of bars, a bucket each: a count above the lane's middle line
/// and one below it, each as tall as its square root times `scale` (at
/// least a pixel), so that a trickle shows next to a burst.
#[derive(Debug, Clone, Copy)]
pub struct Bars<'a> {
    /// Where the first bucket starts, in pixels.
    pub left: f64,
    /// A bucket's width, in pixels.
    pub bar: f64,
    /// The lane's middle line, in pixels from the top.
    pub mid: f64,
    /// Pixels per square root of a count.
    pub scale: f64,
    /// The counts drawn upwards, and their fill colour.
    pub up: (&'a [u64], &'a str),
    /// The counts drawn downwards, and their fill colour.
    pub down: (&'a [u64], &'a str),
}

/// Appends the SVG rectangles of `bars` to `out`.
///
/// ```
/// use tollgate_sim::chart::{Bars, bars};
///
/// let mut out = String::new();
/// let up = [4, 0];
/// let down = [0, 1];
/// bars(&mut out, Bars { left: 0.0, bar: 10.0, mid: 50.0, scale: 5.0, up: (&up, "green"), down: (&down, "red") });
/// assert_eq!(out.matches("<rect").count(), 2);
/// assert!(out.contains(r#"y="40.00" width="9.70" height="10.00" fill="green""#));
/// ```
pub fn bars(out: &mut String, bars: Bars<'_>) {
    let Bars {
        left,
        bar,
        mid,
        scale,
        up: (up, up_fill),
        down: (down, down_fill),
    } = bars;
    for (b, (&up, &down)) in up.iter().zip(down).enumerate() {
        let left = left + b as f64 * bar;
        let w = (bar - 0.3).max(0.5);
        if up > 0 {
            let h = ((up as f64).sqrt() * scale).max(1.0);
            let _ = writeln!(
                out,
                r#"<rect x="{left:.2}" y="{:.2}" width="{w:.2}" height="{h:.2}" fill="{up_fill}"/>"#,
                mid - h
            );
        }
        if down > 0 {
            let h = ((down as f64).sqrt() * scale).max(1.0);
            let _ = writeln!(
                out,
                r#"<rect x="{left:.2}" y="{mid:.2}" width="{w:.2}" height="{h:.2}" fill="{down_fill}"/>"#
            );
        }
    }
}

/// `text` escaped for SVG or XML text and attribute values.
///
/// ```
/// assert_eq!(tollgate_sim::chart::escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
/// ```
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
