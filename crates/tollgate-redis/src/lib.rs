//! The Redis store for [tollgate](https://docs.rs/tollgate): one exact
//! limit per key, shared by every app server that uses the same Redis.
//!
//! [`RedisStore`] implements [`tollgate_core::Store`] for all six
//! algorithms, with the same decisions as the in-memory store, in one
//! round trip per decision, using Redis `TIME` as the clock. It needs Redis
//! 7.0 or later (or a compatible server such as Valkey).
//!
//! ```
//! use tollgate::{Algorithm, GlobalKey, Key, Policy, RateLimitLayer, Store};
//! use tollgate_redis::RedisStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // This example runs against a local Redis (apt install redis-server).
//! let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
//! let store = RedisStore::builder()
//!     .prefix("tollgate-doc")
//!     .connect(url.as_str())
//!     .await?;
//! let policy = Policy::new("api", Algorithm::Gcra, "100/min")?;
//!
//! // Directly, e.g. in a job:
//! let key = Key::user(format!("doc-{}", std::process::id()));
//! let decision = store.check(&key, &policy, 1).await?;
//! assert!(decision.is_allowed());
//! assert_eq!(decision.remaining(), 99);
//!
//! // Or behind a layer, shared by every server using this Redis:
//! let layer = RateLimitLayer::new(policy, GlobalKey).store(store);
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! See the [Redis guide](https://docs.rs/tollgate/latest/tollgate/guides/redis/index.html)
//! for operations: memory, eviction policy, clusters and failures.
//!
//! # Connections
//!
//! [`RedisStoreBuilder::connect`] uses redis-rs's multiplexed
//! `ConnectionManager` (the default), [`RedisStoreBuilder::connect_pool`] a
//! bb8 pool, and [`RedisStoreBuilder::connect_cluster`] a Redis Cluster.
//! Any [`RedisConnection`] works through [`RedisStoreBuilder::build`].
//!
//! # Keys
//!
//! `<prefix>:<policy>:{<hash>}`, where the hash is 128 bits of SHA-256 over
//! the length-prefixed policy name, key kind and key bytes (and an optional
//! secret). No raw identifier is stored, and every key of one decision is
//! in one cluster slot.
//!
//! # Scripts
//!
//! Every key records the configuration its state was written under (the
//! policy's [`state_descriptor`](tollgate_core::Policy::state_descriptor)).
//! A script that finds another one carries the state over to its own
//! configuration, as [`PolicyState::carry_to`](tollgate_core::state::PolicyState::carry_to)
//! does: a deploy that changes a policy's limits, with old and new servers
//! side by side, hands nobody a fresh quota (a limit's period is changed
//! in two deploys: see "When a policy changes" in the failure modes
//! guide).
//!
//! A policy of one GCRA, token-bucket or leaky-bucket limit keeps its state
//! in one string, a time in microseconds (in hexadecimal, which Lua reads
//! cheaply) and the descriptor, that expires
//! exactly when it stops mattering. An idle key is decided with `TIME` and
//! one `SET ... PXAT ... NX GET`; a busy key with `TIME`, a `GET` and a
//! `SET`; a denial with `TIME` and a `GET`, writing nothing. (The script
//! writes first, saving idle keys the `GET`, while fewer than a quarter of
//! the store's recent requests found their key busy, and reads first
//! otherwise, saving busy keys and denials a dearer first command.) Under
//! concurrent load, such decisions that arrive while a call is on its way
//! go together in the next call, up to 64 per call
//! ([`RedisStoreBuilder::batch_size`]), each decided as if alone; this
//! divides Redis's work per decision. A policy of one fixed-window limit
//! (below half a million a second) keeps one string too: the window's start in
//! microseconds plus the cost counted in it, and the descriptor, expiring
//! when the window ends. It is decided with `TIME`, a `GET` and, when
//! admitted, a `SET`, and such decisions are batched as well (among
//! themselves, by a script of their own). Every other policy keeps a hash
//! per key, with the descriptor in it. With the `testing` feature,
//! `testing::script_source` and `testing::script_args` give the exact
//! script and arguments the store sends.

mod algorithm;
mod batch;
mod breaker;
mod builder;
mod connect;
mod deny_cache;
mod error;
mod identity;
mod keys;
mod known;
mod lanes;
mod lease;
mod ledger;
mod op;
mod overrides;
mod patience;
mod running;
mod script;
#[cfg(feature = "metrics")]
mod series;
mod store;
#[cfg(feature = "testing")]
pub mod testing;
mod topkeys;
mod wire;

pub use breaker::BreakerState;
pub use builder::RedisStoreBuilder;
pub use connect::{
    ClusterConnection, ManagedConnection, Pool, RedisConnection, SentinelConnection,
};
pub use error::RedisStoreError;
pub use lease::{LeaseCalls, LeasedStore, LeasedStoreBuilder};
pub use ledger::{RedisLedger, RedisLedgerBuilder};
pub use overrides::{RedisOverrides, RedisOverridesBuilder};
pub use redis::sentinel::SentinelNodeConnectionInfo;
pub use store::RedisStore;
pub use topkeys::{RedisTopKeys, RedisTopKeysBuilder};
