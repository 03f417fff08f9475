//! Overload scenarios for issue 33's adaptive concurrency limit: a
//! backend with a fixed number of workers behind a FIFO queue, Poisson
//! clients with deadlines and priority classes, and a
//! [`tollgate_core::Concurrency`] (or nothing) in front, simulated event by
//! event on simulated time.
//!
//! ```
//! use tollgate_core::{AdaptiveLimit, Priority};
//! use tollgate_sim::overload::{Baselines, OverloadOptions, Plan, Protection, Scenario, simulate, summarize};
//!
//! let plan = Plan::new(Scenario::Ramp, &OverloadOptions::default())?;
//! let baselines = Baselines::new(&plan);
//! let config = AdaptiveLimit::builder("backend")
//!     .reserve(Priority::Critical, 0.2)
//!     .reserve(Priority::Default, 0.1)
//!     .build()?;
//! let vegas = summarize(&simulate(&plan, &Protection::Adaptive(config)), &baselines);
//! let none = summarize(&simulate(&plan, &Protection::None), &baselines);
//! let hold = |s: &tollgate_sim::overload::Summary| s.phase("hold").map_or(0.0, |p| p.goodput);
//! assert!(hold(&vegas) > 0.9 && hold(&none) < 0.1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod chart;
mod engine;
mod measure;
mod plan;
pub mod report;

pub use engine::{OverloadRun, Protection, Response, TICK_US, Tick, WINDOW_US, Window, simulate};
pub use measure::{
    Baselines, PhaseSummary, SETTLE_BAND, SETTLE_SMOOTHING_US, SETTLE_TAIL_US, Summary, summarize,
};
pub use plan::{Jitter, OverloadError, OverloadOptions, Plan, PlanPhase, Scenario};
