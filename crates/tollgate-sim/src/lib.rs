//! Replay traffic through tollgate policies before enforcing them.
//!
//! `tollgate-sim` answers two questions every rate-limit rollout raises:
//! *what would this policy do to my real traffic?* and *which algorithm
//! fits it?* It replays a traffic log (a CSV of `timestamp,key[,cost]`) or
//! a named synthetic [`Pattern`] through one or more policies, using the
//! same algorithms as the layer and the Redis store, on a fake clock, so a
//! day of traffic replays in seconds. It reports allowed, denied and
//! delayed requests per policy with the keys denied most, and draws a
//! chart (SVG and PNG) with one lane per policy.
//!
//! ```text
//! tollgate-sim --pattern burst-then-steady \
//!     --policy "log=sliding_log:300/5min" --policy "fixed=fixed_window:60/min" \
//!     --chart docs/burst-then-steady
//! tollgate-sim --log traffic.csv --policy "api=gcra:100/min" --top 20
//! ```
//!
//! It reads real access logs too ([`access`]: the common and combined
//! formats and JSON lines, streamed); `examples/log-replay` in the
//! repository sends them through the demo app's own router and policy
//! file.
//!
//! It also simulates a backend at overload behind an adaptive concurrency
//! limit ([`overload`]), to compare the limit's algorithms:
//!
//! ```text
//! tollgate-sim overload --scenario halving --algorithm all --chart docs/overload-halving
//! ```
//!
//! As a library:
//!
//! ```
//! use tollgate_core::{Algorithm, Policy};
//! use tollgate_sim::{Pattern, PatternOptions, SimOptions, simulate};
//!
//! let workload = Pattern::BurstThenSteady.workload(&PatternOptions::default())?;
//! let policy = Policy::new("log", Algorithm::SlidingLog, "300/5min")?;
//! let run = simulate(&workload, &policy, SimOptions::default())?;
//! assert_eq!(run.denied, 0);
//! assert_eq!(run.finished().map(|d| d.as_secs()), Some(452));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod access;
pub mod chart;
pub mod overload;
pub mod report;
mod sim;
mod spec;
mod workload;

pub use sim::{Attempt, Run, SimError, SimOptions, simulate};
pub use spec::parse_policy;
pub use workload::{
    Arrival, EpochUnit, LineError, Log, LogError, MAX_PATTERN_REQUESTS, Pattern, PatternError,
    PatternOptions, Phase, Start, Workload,
};
