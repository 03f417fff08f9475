//! The replay's chart: one lane per policy file, time across, admitted
//! requests per bucket as a green bar upwards and refused ones as a red
//! bar downwards; the requests answered neither by their route nor with a
//! refusal are counted beside the lane. PNG through
//! [`tollgate_sim::chart::png`].

use std::fmt::Write;

use tollgate_sim::chart::{Bars, bars, escape};

use crate::tally::LaneTally;

const WIDTH: f64 = 1_000.0;
const LEFT: f64 = 210.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 56.0;
const LANE: f64 = 150.0;
const BOTTOM: f64 = 30.0;
const ADMITTED: &str = "#2e7d32";
const REFUSED: &str = "#c62828";

/// Draws `lanes` as an SVG document. Heights grow with the square root of
/// a count, so that a trickle of refusals shows next to the traffic.
pub fn svg<'a>(lanes: impl IntoIterator<Item = &'a LaneTally>, title: &str) -> String {
    let lanes: Vec<&LaneTally> = lanes.into_iter().collect();
    let buckets = lanes
        .iter()
        .map(|l| l.timeline().admitted().len())
        .max()
        .unwrap_or(0)
        .max(1);
    let plot = WIDTH - LEFT - RIGHT;
    let bar = plot / buckets as f64;
    let height = TOP + LANE * lanes.len() as f64 + BOTTOM;
    let mut out = String::new();
    let (start, width) = lanes.first().map_or((None, 1), |l| {
        (l.timeline().start(), l.timeline().width_secs())
    });
    let from = start.map_or_else(String::new, |t| time(t.as_micros() / 1_000_000));
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Verdana, sans-serif" font-size="12">
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{}</text>
<text x="{LEFT}" y="40" fill="#555555">requests per {width} s from {from} (height ∝ √count): <tspan fill="{ADMITTED}">admitted ▲</tspan>, <tspan fill="{REFUSED}">refused ▼</tspan></text>
"##,
        escape(title),
    );
    for (i, lane) in lanes.iter().enumerate() {
        let top = TOP + LANE * i as f64;
        let mid = top + LANE / 2.0;
        let line = lane.timeline();
        let peak = line
            .admitted()
            .iter()
            .chain(line.refused())
            .copied()
            .max()
            .unwrap_or(0)
            .max(1);
        let scale = (LANE / 2.0 - 12.0) / (peak as f64).sqrt();
        let shade = if i % 2 == 0 { "#f6f6f6" } else { "#ffffff" };
        let _ = writeln!(
            out,
            r##"<rect x="0" y="{top}" width="{WIDTH}" height="{LANE}" fill="{shade}"/>
<line x1="{LEFT}" y1="{mid}" x2="{}" y2="{mid}" stroke="#999999" stroke-width="0.5"/>"##,
            WIDTH - RIGHT
        );
        let admitted: u64 = line.admitted().iter().sum();
        let mut texts = vec![
            (lane.name().chars().take(28).collect(), "bold"),
            (format!("admitted {admitted}"), "normal"),
            (format!("refused {}", lane.refused()), "normal"),
        ];
        let otherwise: u64 = lane.answered_otherwise().values().sum();
        if otherwise > 0 {
            texts.push((format!("other answers {otherwise}"), "normal"));
        }
        let mut policies: Vec<(&String, &u64)> = lane.by_policy().iter().collect();
        policies.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (policy, n) in policies.into_iter().take(4) {
            texts.push((format!("  {policy}: {n}"), "normal"));
        }
        for (j, (text, weight)) in texts.iter().enumerate() {
            let _ = writeln!(
                out,
                r#"<text x="10" y="{}" font-weight="{weight}">{}</text>"#,
                top + 20.0 + 17.0 * j as f64,
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
                up: (line.admitted(), ADMITTED),
                down: (line.refused(), REFUSED),
            },
        );
    }
    let axis = TOP + LANE * lanes.len() as f64;
    let _ = writeln!(
        out,
        r##"<line x1="{LEFT}" y1="{axis}" x2="{}" y2="{axis}" stroke="#000000"/>"##,
        WIDTH - RIGHT
    );
    if let Some(start) = start {
        let start = start.as_micros() / 1_000_000;
        for tick in (0..=buckets).step_by((buckets / 6).max(1)) {
            let _ = writeln!(
                out,
                r#"<text x="{:.2}" y="{}" text-anchor="middle">{}</text>"#,
                LEFT + tick as f64 * bar,
                axis + 16.0,
                clock(start + tick as u64 * width)
            );
        }
    }
    out.push_str("</svg>\n");
    out
}

/// `2026-11-20 00:00:00 UTC`.
fn time(secs: u64) -> String {
    jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(0))
        .map(|t| t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_default()
}

/// `00:00`.
fn clock(secs: u64) -> String {
    jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(0))
        .map(|t| t.strftime("%H:%M").to_string())
        .unwrap_or_default()
}
