//! Plans without boilerplate: a [`PlanMap`] names each plan's policy on a
//! route and where a request's plan comes from ([`PlanSource`]), in place
//! of a hand-written chooser; [`RateLimitStatus`] (feature `axum`) answers
//! a caller's `GET /rate_limit` over every route's plan map.
//!
//! `map.rs` holds the map and its checks, `source.rs` the plan's sources,
//! and `status.rs` the handler; the JSON it answers is
//! [`RateLimitReport`](crate::RateLimitReport)'s, in `answer/`, where
//! everything a client is told lives.

mod map;
mod source;
#[cfg(feature = "axum")]
mod status;
#[cfg(feature = "axum")]
mod usage;

pub use map::{PlanMap, PlanMapBuilder};
pub use source::{PlanExtension, PlanSource};
#[cfg(feature = "axum")]
pub use status::RateLimitStatus;
#[cfg(feature = "axum")]
pub use usage::UsageStatus;
