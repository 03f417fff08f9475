//! The text report of a replay.

use std::fmt::Write;

use crate::chart::human_exact;
use crate::sim::Run;

/// A table of every run (requests, allowed, denied, delayed, never
/// admitted, when the last request was served), then each policy's `top`
/// keys by denials. `keys` names the key indexes.
///
/// ```
/// use tollgate_core::{Algorithm, Policy};
/// use tollgate_sim::{Pattern, PatternOptions, SimOptions, report, simulate};
///
/// let workload = Pattern::Burst.workload(&PatternOptions::default())?;
/// let policy = Policy::new("per-min", Algorithm::FixedWindow, "60/min")?;
/// let run = simulate(&workload, &policy, SimOptions::default())?;
/// let text = report::text(&[run], &workload.keys, 5);
/// assert!(text.contains("per-min"));
/// assert!(text.contains("client: 400"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn text(runs: &[Run], keys: &[String], top: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<44} {:>9} {:>9} {:>9} {:>9} {:>9} {:>14}",
        "policy", "requests", "allowed", "denied", "delayed", "never", "last served"
    );
    for run in runs {
        let _ = writeln!(
            out,
            "{:<44} {:>9} {:>9} {:>9} {:>9} {:>9} {:>14}",
            run.policy.to_string(),
            run.requests,
            run.allowed,
            run.denied,
            run.delayed,
            run.never_admitted,
            run.finished_us.map_or("-".to_owned(), human_exact),
        );
    }
    if top > 0 {
        for run in runs.iter().filter(|r| !r.denials_by_key.is_empty()) {
            let _ = writeln!(out, "\ntop keys by denials, {}:", run.policy.name());
            for &(key, denials) in run.denials_by_key.iter().take(top) {
                let name = keys.get(key as usize).map_or("?", String::as_str);
                let _ = writeln!(out, "  {name}: {denials}");
            }
        }
    }
    out
}
