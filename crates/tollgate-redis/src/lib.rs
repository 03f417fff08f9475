//! The Redis store for tollgate.
//!
//! Not implemented yet: this crate will provide `RedisStore`, an
//! implementation of [`tollgate_core::Store`] whose decisions are identical
//! to the in-memory store's, made in one Redis round trip with Redis `TIME`
//! as the clock. Until then, use [`tollgate_core::MemoryStore`].
