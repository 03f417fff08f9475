//! An adaptive concurrency limit: how many requests this instance lets
//! run at once, found from their observed latency, with priority classes
//! and reserved capacity.
//!
//! [`AdaptiveLimit`] is the configuration; [`Concurrency`] is the state of
//! one instance, driven by its caller with timestamps: the HTTP layer of
//! the `tollgate` crate drives it with the wall clock, the simulator of
//! `tollgate-sim` with simulated time. Both run the same code.
//!
//! A request of [`Priority`] `p` is admitted while the requests in flight
//! are fewer than the limit minus the capacity reserved for the classes
//! above `p`. So when the limit is reached the lowest class is refused
//! first, and a class above it is refused only once no request of a lower
//! class can be admitted. And while a class is being refused (one of its
//! requests was refused in the last 100 ms) no class below it is
//! admitted: the slots that free up go to the class that wants them.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::{AdaptiveLimit, Completion, Concurrency, Priority, Timestamp};
//!
//! let config = AdaptiveLimit::builder("api")
//!     .fixed(10) // no adapting: a limit of 10
//!     .reserve(Priority::Critical, 0.2)
//!     .build()?;
//! let start = Timestamp::from_secs(1_700_000_000);
//! let mut state = Concurrency::new(&config, start);
//! // Sheddable requests get at most 8 slots: 2 are kept for critical ones.
//! let mut held = Vec::new();
//! while let Some(permit) = state.try_acquire(Priority::Sheddable, start) {
//!     held.push(permit);
//! }
//! assert_eq!(held.len(), 8);
//! assert!(state.try_acquire(Priority::Critical, start).is_some());
//! for permit in held {
//!     state.release(permit, start + Duration::from_millis(20), Completion::Served);
//! }
//! assert_eq!(state.in_flight(), 1);
//! # Ok::<(), tollgate_core::ConfigError>(())
//! ```

mod admit;
mod config;
mod estimate;
mod window;

pub use admit::{Completion, Concurrency, ConcurrencySnapshot, Permit};
pub use config::{AdaptiveLimit, AdaptiveLimitBuilder, LimitAlgorithm, Priority};
