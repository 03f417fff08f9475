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

/// The methods of [`Store`](crate::Store) but `settle`, for a wrapper that
/// watches the decisions of the store in its `store` field: each check
/// passes to it, and its decision to `self.$seen(key, policy, cost,
/// &decision)`; the rest passes to it as it is. Inside the wrapper's
/// `impl Store`.
macro_rules! store_pass_through {
    (seen: $seen:ident) => {
        async fn check(
            &self,
            key: &$crate::Key,
            policy: &$crate::Policy,
            cost: u64,
        ) -> Result<$crate::Decision, $crate::StoreError> {
            let decision = self.store.check(key, policy, cost).await?;
            self.$seen(key, policy, cost, &decision);
            Ok(decision)
        }

        fn try_check_now(
            &self,
            key: &$crate::Key,
            policy: &$crate::Policy,
            cost: u64,
        ) -> Option<Result<$crate::Decision, $crate::StoreError>> {
            let result = self.store.try_check_now(key, policy, cost)?;
            if let Ok(decision) = &result {
                self.$seen(key, policy, cost, decision);
            }
            Some(result)
        }

        async fn status(
            &self,
            key: &$crate::Key,
            policy: &$crate::Policy,
        ) -> Result<$crate::Decision, $crate::StoreError> {
            self.store.status(key, policy).await
        }

        async fn reset(
            &self,
            key: &$crate::Key,
            policy: &$crate::Policy,
        ) -> Result<(), $crate::StoreError> {
            self.store.reset(key, policy).await
        }

        async fn block(
            &self,
            key: &$crate::Key,
            policy: &$crate::Policy,
            duration: std::time::Duration,
        ) -> Result<(), $crate::StoreError> {
            self.store.block(key, policy, duration).await
        }

        fn last_known(
            &self,
            key: &$crate::Key,
            policy: &$crate::Policy,
        ) -> Option<$crate::Decision> {
            self.store.last_known(key, policy)
        }

        fn name(&self) -> &'static str {
            self.store.name()
        }
    };
}
