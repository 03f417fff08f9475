//! `Flaky`: a shared store (in memory) whose checks and settlements fail
//! while told to, for the tests of the local fallback and of settling.
// Each test file uses a part of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tollgate::{Decision, Key, MemoryStore, Policy, Settlement, Store, StoreError};

/// Fails its checks while `fail_check` is set and its settlements while
/// `fail_settle` is, with a timeout. It remembers each key's last
/// decision, as the Redis store does, only if built `remembering`.
#[derive(Clone)]
pub(crate) struct Flaky {
    pub(crate) inner: MemoryStore,
    pub(crate) fail_check: Arc<AtomicBool>,
    pub(crate) fail_settle: Arc<AtomicBool>,
    remembers: bool,
}

impl Flaky {
    /// Over `inner`, remembering nothing.
    pub(crate) fn new(inner: MemoryStore) -> Self {
        Self {
            inner,
            fail_check: Arc::default(),
            fail_settle: Arc::default(),
            remembers: false,
        }
    }

    /// Over `inner`, remembering each key's last decision.
    pub(crate) fn remembering(inner: MemoryStore) -> Self {
        Self {
            remembers: true,
            ..Self::new(inner)
        }
    }

    /// Fails (or stops failing) both checks and settlements.
    pub(crate) fn fail(&self, failing: bool) {
        self.fail_check.store(failing, Ordering::SeqCst);
        self.fail_settle.store(failing, Ordering::SeqCst);
    }

    fn failing(flag: &AtomicBool) -> Result<(), StoreError> {
        match flag.load(Ordering::SeqCst) {
            true => Err(StoreError::Timeout(Duration::from_millis(50))),
            false => Ok(()),
        }
    }
}

impl Store for Flaky {
    async fn check(&self, key: &Key, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        Self::failing(&self.fail_check)?;
        self.inner.check(key, policy, cost).await
    }

    async fn settle(
        &self,
        key: &Key,
        policy: &Policy,
        settlement: Settlement,
    ) -> Result<Decision, StoreError> {
        Self::failing(&self.fail_settle)?;
        self.inner.settle(key, policy, settlement).await
    }

    async fn reset(&self, key: &Key, policy: &Policy) -> Result<(), StoreError> {
        self.inner.reset(key, policy).await
    }

    async fn block(
        &self,
        key: &Key,
        policy: &Policy,
        duration: Duration,
    ) -> Result<(), StoreError> {
        self.inner.block(key, policy, duration).await
    }

    fn last_known(&self, key: &Key, policy: &Policy) -> Option<Decision> {
        match self.remembers {
            true => self.inner.check_sync(key, policy, 0).ok(),
            false => None,
        }
    }
}
