//! [`RateLimitLayer`]: a rate-limit policy applied to every request.
//!
//! The layer and its settings (`layer.rs`, and `answers.rs` for how it
//! answers) make the service
//! (`service.rs`), which extracts the key and asks the store; its
//! response future (`future.rs`, with its states in `state.rs` and the
//! inner service's call in `call.rs`) answers, waits, or calls the inner
//! service, settles the cost (`settle.rs`) and adds the headers. A key's
//! override (its own limits, exempt, deny) is applied by `overridden.rs`.

mod answers;
mod body;
mod call;
mod choose;
mod deadline;
mod future;
mod layer;
mod overridden;
mod responders;
mod service;
mod settle;
mod state;

pub use body::{BodyKind, KeepBody, WrapBody};
pub use choose::{Choice, ChosenPolicy};
pub use future::ResponseFuture;
pub use layer::RateLimitLayer;
pub use service::RateLimit;
pub use settle::{ActualCost, Settle};
