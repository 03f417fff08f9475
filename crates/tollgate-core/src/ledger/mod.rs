//! The usage ledger: each key's exact settled usage per policy, in hour,
//! day and month buckets, for billing and for showing callers what they
//! used.
//!
//! A [`MeteredStore`] wraps any store and records in a [`Ledger`] the cost
//! of every request it admits and every settlement it takes (see
//! [`MeteredStore`] for what is recorded where features meet: leases,
//! settling, the failure policy, resets and blocks). The ledger is asked
//! a key's [`Usage`] over a [`UsageQuery`]: a range of time, per bucket and
//! in total. [`MemoryLedger`] keeps it in this process; the Redis ledger
//! (`tollgate_redis::RedisLedger`) shares it between instances and keeps
//! it across restarts.
//!
//! Days and months follow a time zone ([`LedgerSettings::time_zone`], UTC
//! by default), and each granularity's buckets are kept for a retention of
//! their own. Every amount saturates: a record counts at most
//! [`MAX_RECORD_UNITS`] (2^50, the bound of a settlement), and a bucket at
//! most [`MAX_BUCKET_UNITS`] (2^62); a bucket never shows less than 0.
//!
//! ```
//! use tollgate_core::ledger::{Granularity, Ledger, MemoryLedger, MeteredStore, UsageQuery};
//! use tollgate_core::{Algorithm, FakeClock, Key, MemoryStore, Policy, Store, Timestamp};
//!
//! # futures_lite_block_on(async {
//! let clock = FakeClock::new(Timestamp::from_secs(1_767_222_000)); // 2025-12-31 23:00 UTC
//! let ledger = MemoryLedger::new();
//! let store = MeteredStore::new(MemoryStore::builder().clock(clock.clone()).build()?, ledger.clone());
//! let policy = Policy::new("api", Algorithm::Gcra, "100/s")?;
//! let ada = Key::user("ada");
//! store.check(&ada, &policy, 3).await?;
//! clock.advance(std::time::Duration::from_secs(3_600)); // 2026-01-01 00:00
//! store.check(&ada, &policy, 5).await?;
//!
//! let year = UsageQuery::new(
//!     Granularity::Month,
//!     Timestamp::from_secs(1_764_547_200), // 2025-12-01
//!     Timestamp::from_secs(1_769_904_000), // 2026-02-01
//! )?;
//! let usage = ledger.usage(&ada, "api", year).await?;
//! let months: Vec<u64> = usage.buckets().iter().map(|b| b.units()).collect();
//! assert_eq!(months, [3, 5]);
//! assert_eq!(usage.total(), 8);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! # fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     let mut f = std::pin::pin!(f);
//! #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
//! #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
//! # }
//! ```

mod calendar;
mod memory;
mod metered;
mod usage;

use std::future::Future;

use crate::error::StoreError;
use crate::key::Key;
use crate::time::Timestamp;

pub use calendar::{Granularity, LedgerSettings};
pub use memory::{LedgerEntry, MemoryLedger};
pub use metered::MeteredStore;
pub use usage::{MAX_BUCKETS, Usage, UsageBucket, UsageQuery};

/// The most units one record counts: 2^50, the bound of a settlement.
pub const MAX_RECORD_UNITS: u64 = 1 << 50;

/// The most units a bucket holds: 2^62.
pub const MAX_BUCKET_UNITS: i64 = 1 << 62;

/// Where usage is recorded and read back.
///
/// Recording is local and never waits: a ledger that keeps its buckets
/// elsewhere sums records here and sends them on
/// [`flush`](Ledger::flush) (and on its own schedule).
pub trait Ledger: Send + Sync + 'static {
    /// Its calendar and retention.
    fn settings(&self) -> &LedgerSettings;

    /// Records `units` (at most [`MAX_RECORD_UNITS`]) used by `key` under
    /// the policy named `policy`, in the buckets of `at`. 0 records
    /// nothing.
    fn record(&self, key: &Key, policy: &str, at: Timestamp, units: u64);

    /// Takes `units` back from the buckets of `at`: a refund of a
    /// reservation recorded at `at`.
    fn refund(&self, key: &Key, policy: &str, at: Timestamp, units: u64);

    /// `key`'s usage under the policy named `policy` over `query`'s range:
    /// every record of this ledger (a ledger that keeps its buckets
    /// elsewhere flushes first), and those of other instances sharing the
    /// buckets as far as they have flushed.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the buckets cannot be read.
    fn usage(
        &self,
        key: &Key,
        policy: &str,
        query: UsageQuery,
    ) -> impl Future<Output = Result<Usage, StoreError>> + Send;

    /// Sends what was recorded to where the buckets are kept: `Ok` means
    /// every record made before the call is written.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when they could not be written; what was not
    /// written is kept for the next flush.
    fn flush(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

impl<L: Ledger> Ledger for std::sync::Arc<L> {
    fn settings(&self) -> &LedgerSettings {
        (**self).settings()
    }

    fn record(&self, key: &Key, policy: &str, at: Timestamp, units: u64) {
        (**self).record(key, policy, at, units);
    }

    fn refund(&self, key: &Key, policy: &str, at: Timestamp, units: u64) {
        (**self).refund(key, policy, at, units);
    }

    fn usage(
        &self,
        key: &Key,
        policy: &str,
        query: UsageQuery,
    ) -> impl Future<Output = Result<Usage, StoreError>> + Send {
        (**self).usage(key, policy, query)
    }

    fn flush(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).flush()
    }
}
