//! The fault matrix: each store composition (Redis, leased Redis, both
//! behind the local fallback, and in-flight slots) under each fault (Redis
//! killed, paused, restarted empty, `FLUSHALL`, the script cache flushed,
//! the app's own runtime saturated) and each operator action (reset, block,
//! a limit change while a lease is out). Every cell asserts:
//! - admitted ≤ the limit plus the bound the guide documents for that
//!   fault (0 where it documents none);
//! - no failure reaches the caller: under `local`, every request is
//!   decided (an HTTP layer would answer 200 or 429, never 5xx);
//! - recovery within the documented time: decisions go through Redis
//!   again within 5 s of the fault ending.
//!
//! Each cell runs on a private `redis-server`, on the real clock (faults
//! are real), with a limit of 100 an hour, so that no unit comes back
//! within a cell. The table it prints is the one in the failure-modes
//! guide.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

#[path = "fault_matrix/cell.rs"]
mod cell;
#[path = "fault_matrix/compositions.rs"]
mod compositions;
#[path = "fault_matrix/in_flight.rs"]
mod in_flight;

use std::time::Duration;

const LIMIT: u64 = 100;
/// Requests admitted before the fault.
const USED: u64 = 60;
/// How long recovery may take once the fault ends: a reconnection, and
/// the breaker's cooldown.
const RECOVERY: Duration = Duration::from_secs(5);
/// The leased composition's share: a lease holds at most a quarter.
const SHARE: u64 = 4;
