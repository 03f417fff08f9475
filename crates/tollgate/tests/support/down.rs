//! A store of in-flight slots that is down, for tests of what the layer
//! does then.

use std::time::Duration;

/// A slot store that is down: every call times out.
#[derive(Clone)]
pub(crate) struct Down;

impl tollgate::SlotStore for Down {
    async fn acquire(
        &self,
        _: &tollgate::Key,
        _: &tollgate::InFlightLimit,
        _: u64,
    ) -> Result<tollgate::Slots, tollgate::StoreError> {
        Err(tollgate::StoreError::Timeout(Duration::from_millis(50)))
    }

    async fn renew(
        &self,
        _: &tollgate::Key,
        _: &tollgate::InFlightLimit,
        _: u64,
    ) -> Result<tollgate::Renewal, tollgate::StoreError> {
        Err(tollgate::StoreError::Timeout(Duration::from_millis(50)))
    }

    async fn release(
        &self,
        _: &tollgate::Key,
        _: &tollgate::InFlightLimit,
        _: u64,
    ) -> Result<(), tollgate::StoreError> {
        Err(tollgate::StoreError::Timeout(Duration::from_millis(50)))
    }
}
