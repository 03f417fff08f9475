//! The core of [tollgate](https://docs.rs/tollgate): the policy model,
//! decisions, the [`Store`] trait, clocks, the reference algorithms and the
//! embedded in-memory store.
//!
//! This crate has no HTTP, Tower or Tokio dependency. The `tollgate` crate
//! puts it behind a Tower layer; `tollgate-redis` provides a distributed
//! store with the same decisions.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::{Algorithm, FakeClock, Key, MemoryStore, Outcome, Policy};
//!
//! let clock = FakeClock::default();
//! let store = MemoryStore::builder().clock(clock.clone()).build()?;
//! // 25 per 5 seconds and 300 per minute, both enforced.
//! let policy = Policy::builder("search")
//!     .algorithm(Algorithm::SlidingLog)
//!     .limit("25/5s")
//!     .limit("300/min")
//!     .build()?;
//!
//! let key = Key::user("ada");
//! for _ in 0..25 {
//!     assert!(store.check_sync(&key, &policy, 1)?.is_allowed());
//! }
//! let denied = store.check_sync(&key, &policy, 1)?;
//! assert_eq!(denied.outcome(), Outcome::Limited { retry_after: Duration::from_secs(5) });
//! assert_eq!(denied.binding().limit().to_string(), "25/5s");
//!
//! clock.advance(Duration::from_secs(5));
//! let allowed = store.check_sync(&key, &policy, 1)?;
//! assert!(allowed.is_allowed());
//! assert_eq!(allowed.limits()[1].remaining(), 300 - 26);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Feature flags
//!
//! | feature | default | enables |
//! |---|---|---|
//! | `serde` | yes | `Serialize`/`Deserialize` for [`Limit`], [`Policy`] (with its [`Calendar`]) and [`Algorithm`] |
//! | `metrics` | no | the [memory-store gauge](telemetry) through the `metrics` facade |
//! | `testing` | no | `testing`: the conformance suite for stores |
//!
//! # Time
//!
//! Limiter time is wall-clock time in whole microseconds since the Unix
//! epoch ([`Timestamp`]), read from an injected [`Clock`]. Every algorithm
//! uses integer arithmetic only, so that a Lua script in Redis can compute
//! exactly the same decisions.

#[macro_use]
mod macros;

pub mod adaptive;
mod algorithm;
mod boxed;
mod builder;
mod calendar;
mod decision;
mod error;
mod family;
mod inflight;
mod key;
pub mod ledger;
mod limit;
mod memory;
mod overrides;
mod policy;
mod settle;
pub mod state;
mod store;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
mod time;
pub mod topkeys;

pub use adaptive::{
    AdaptiveLimit, AdaptiveLimitBuilder, Completion, Concurrency, ConcurrencySnapshot,
    LimitAlgorithm, Permit, Priority,
};
pub use algorithm::Algorithm;
pub use boxed::BoxStore;
pub use builder::{IntoLimit, PolicyBuilder};
pub use calendar::Calendar;
pub use decision::{DecidedBy, Decision, LimitStatus, Outcome};
pub use error::{ConfigError, OverrideError, StoreError};
pub use family::PolicyFamily;
pub use inflight::{InFlightLimit, Renewal, SlotStore, Slots};
pub use key::{Key, KeyKind, TypeTag};
pub use limit::Limit;
pub use memory::{MemoryStore, MemoryStoreBuilder};
pub use overrides::{
    Applied, FirstAnswer, MemoryOverrides, Override, OverrideSource, OverrideStore, OverrideTable,
};
pub use policy::Policy;
#[doc(hidden)] // storage encodings, shared with tollgate-redis: not part of the API
pub use policy::{LimitParams, Shape};
pub use settle::Settlement;
pub use store::Store;
pub use time::{Clock, FakeClock, SystemClock, Timestamp};
