//! Builder setters written once for the types that share them. Each type
//! still documents each setter in its own words.

/// The failure policy's setters, `on_store_error`, `local_divisor`,
/// `local_instances` and `local_fallback`, for a builder whose field `$field` has the same
/// setters by value: a [`FallbackStore`](crate::FallbackStore) (the
/// rate-limit layer's and the limiter's) or the
/// [`FailureSettings`](crate::fallback::FailureSettings) themselves (the
/// store's own and the in-flight layer's). `FailureMode`, `InstanceCount`
/// and `MemoryStore` are the caller's, whose documentation links to them
/// anyway. The documentation of each setter goes before its name, in this
/// order:
///
/// ```text
/// failure_setters! {
///     store;
///     /// What to do when the store fails.
///     on_store_error;
///     /// How many instances share the limit.
///     local_divisor;
///     /// The same, as a count that may change at runtime.
///     local_instances;
///     /// The in-memory store `FailureMode::Local` decides with.
///     local_fallback;
/// }
/// ```
macro_rules! failure_setters {
    (
        $field:ident;
        $(#[$on_store_error:meta])*
        on_store_error;
        $(#[$local_divisor:meta])*
        local_divisor;
        $(#[$local_instances:meta])*
        local_instances;
        $(#[$local_fallback:meta])*
        local_fallback;
    ) => {
        $(#[$on_store_error])*
        pub fn on_store_error(mut self, mode: FailureMode) -> Self {
            self.$field = self.$field.on_store_error(mode);
            self
        }

        $(#[$local_divisor])*
        pub fn local_divisor(mut self, instances: ::std::num::NonZeroU64) -> Self {
            self.$field = self.$field.local_divisor(instances);
            self
        }

        $(#[$local_instances])*
        pub fn local_instances(mut self, instances: InstanceCount) -> Self {
            self.$field = self.$field.local_instances(instances);
            self
        }

        $(#[$local_fallback])*
        pub fn local_fallback(mut self, store: MemoryStore) -> Self {
            self.$field = self.$field.local_fallback(store);
            self
        }
    };
}

/// A layer's `grpc` setter, for a layer with
/// `fn responder_mut(&mut self) -> &mut Responder`: its own answers
/// become gRPC statuses. The layer gives the documentation.
macro_rules! grpc_setter {
    ($(#[$doc:meta])*) => {
        $(#[$doc])*
        pub fn grpc(mut self) -> Self {
            self.responder_mut().protocol = $crate::answer::Protocol::Grpc;
            self
        }
    };
}

pub(crate) use failure_setters;
pub(crate) use grpc_setter;
