//! [`InFlightLayer`]: at most N requests of one key in progress at once.

mod body;
mod future;
mod layer;
mod service;
mod slot;
mod telemetry;

pub use body::InFlightBody;
pub use layer::InFlightLayer;
pub use service::InFlight;
