//! Memory and Redis give identical decisions: a property-based differential
//! test against real Redis, 1,000 random cases per algorithm, as many again
//! with two configurations of a policy served in turn, plus extremes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

#[path = "redis_conformance/extremes.rs"]
mod extremes;
#[path = "redis_conformance/fence.rs"]
mod fence;
#[path = "redis_conformance/harness.rs"]
mod harness;
#[path = "redis_conformance/layer_and_suite.rs"]
mod layer_and_suite;
#[path = "redis_conformance/moved_on.rs"]
mod moved_on;
#[path = "redis_conformance/properties.rs"]
mod properties;
#[path = "redis_conformance/strategies.rs"]
mod strategies;
