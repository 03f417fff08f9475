//! Macros the crate's store wrappers share.

/// Implements [`SlotStore`](crate::SlotStore) for a store wrapper whose
/// wrapped store is its `store` field, by passing every call to it: for
/// wrappers of decisions of a rate (the ledger's, the top keys'), to whom
/// in-flight slots are none of their business.
macro_rules! slots_pass_through {
    (impl<$($param:ident: $bound:path),+> for $wrapper:ty) => {
        impl<$($param: $bound),+> $crate::SlotStore for $wrapper {
            async fn acquire(
                &self,
                key: &$crate::Key,
                limit: &$crate::InFlightLimit,
                holder: u64,
            ) -> Result<$crate::Slots, $crate::StoreError> {
                self.store.acquire(key, limit, holder).await
            }

            async fn renew(
                &self,
                key: &$crate::Key,
                limit: &$crate::InFlightLimit,
                holder: u64,
            ) -> Result<$crate::Renewal, $crate::StoreError> {
                self.store.renew(key, limit, holder).await
            }

            async fn release(
                &self,
                key: &$crate::Key,
                limit: &$crate::InFlightLimit,
                holder: u64,
            ) -> Result<(), $crate::StoreError> {
                self.store.release(key, limit, holder).await
            }

            fn release_now(&self, key: &$crate::Key, limit: &$crate::InFlightLimit, holder: u64) -> bool {
                self.store.release_now(key, limit, holder)
            }

            fn leases(&self) -> bool {
                self.store.leases()
            }

            fn new_holder(&self) -> u64 {
                self.store.new_holder()
            }
        }
    };
}
