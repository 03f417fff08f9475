//! Overrides from any async lookup: [`CachedLookup`] over an
//! [`OverrideLookup`]. The overrides themselves, their sources in memory
//! and the trait a layer asks are `tollgate_core`'s (re-exported here);
//! the Redis source is `tollgate_redis::RedisOverrides`. How a layer and
//! a limiter apply them is in `rate_limit/overridden.rs`.

mod lookup;

pub use lookup::{CachedLookup, CachedLookupBuilder, OverrideLookup};
