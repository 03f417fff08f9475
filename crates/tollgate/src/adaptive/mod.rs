//! [`AdaptiveConcurrencyLayer`]: protects the service itself, with a
//! concurrency limit found from latency, shedding the least important
//! requests first.
//!
//! The layer and its settings (`layer.rs`) make the service
//! (`service.rs`), which classifies each request (`classify.rs`) and asks
//! the gate (`gate.rs`, the shared [`Concurrency`](tollgate_core::Concurrency)
//! and the requests waiting); an admitted request runs holding its slot
//! (`future.rs`); the metrics are in `telemetry.rs`.

mod classify;
mod future;
mod gate;
mod layer;
mod service;
mod telemetry;

pub use classify::{Classify, SameClass};
pub use layer::{AdaptiveConcurrencyLayer, AdaptiveHandle};
pub use service::AdaptiveConcurrency;
