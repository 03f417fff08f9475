//! Replays a real access log through the demo's own router and policy
//! files, on a fake clock: how many requests each policy file would have
//! refused, to whom and when.
//!
//! Run with: `cargo run --release -p log-replay -- replay --log access.log
//! --format combined --policies examples/axum-app/policies.toml [--policies
//! candidate.toml] --chart replay`
//!
//! Each logged request is sent through the demo's router
//! ([`axum_app::app_with_handler_layer`]), built from the policy file on
//! a [`MemoryStore`](tollgate::MemoryStore) whose
//! [`FakeClock`](tollgate::FakeClock) is set to the logged time: the real
//! routes, key extractors, plans and stacked layers decide, not a second
//! implementation of them. A `429` is a refusal, unless the route's
//! handler answered it (below). Any other answer not the route's is
//! counted by status, per policy file, and reported beside the refusals
//! ([`LaneTally::answered_otherwise`]): the demo's auth (`401` for a call
//! of `/api/*` without a user), a path or method without a route (`404`,
//! `405`), or a failure policy answering in the store's place (`503`).
//! The log is read as a stream ([`tollgate_sim::access::AccessLog`]);
//! what is kept grows with the clients and keys, not with the lines: the
//! stores hold every key still inside its window ([`Replay::MAX_KEYS`]),
//! so that no store turns a key away and its failure policy answers.
//!
//! The clock never goes back. A line logged before the latest time
//! replayed, by at most [`Replay::OUT_OF_ORDER_TOLERANCE`] (a minute: a
//! log is written as responses finish, a little out of order), is
//! replayed at that latest time; one further behind is not replayed but
//! counted out of order, and the report warns of it with the line
//! furthest behind and the clock's time then. A single line dated ahead
//! of the log (`01/Jan/2099`) so shows as every later line out of order,
//! not as refusals at the wrong time. A line dated ahead is not rejected:
//! without reading ahead, it cannot be told from the log going on after
//! a quiet spell.
//!
//! What a log does not hold is supplied the demo's way: a logged user
//! `<user>` becomes `Authorization: Bearer demo-<user>` (so `pro-<user>`
//! is on the pro plan) unless the line logged an `authorization` header;
//! the client's address is the peer address. Bodies are not logged, so
//! the route's handler cannot tell a right password from a wrong one: it
//! runs (what it reports to the layers, the tokens of a completion, say,
//! stands), and its response takes the status the line logged. A
//! `settle = "failures"` policy (`login-failures`) so counts the logins
//! the server failed, not every one; a JSON line without a status keeps
//! the handler's own (a `POST /login` without a body fails). A logged
//! `429` that the replayed policies admit is the route's answer, not a
//! refusal. A response's body is dropped at once, so an in-flight slot is
//! held for no time.
//!
//! ```
//! use log_replay::Replay;
//! use tollgate_sim::access::{AccessFormat, AccessLog};
//!
//! let policies = axum_app::AppConfig::parse(include_str!("../../axum-app/policies.toml"))?;
//! let mut replay = Replay::new(vec![("demo".to_owned(), policies)])?;
//! // Twelve reads of one user in one second: the burst is 10.
//! let line = "198.51.100.7 - ada [20/Nov/2026:10:00:00 +0000] \"GET /api/items HTTP/1.1\" 200 12\n";
//! let text = line.repeat(12);
//! let log = AccessLog::new(text.as_bytes(), AccessFormat::Common);
//! let runtime = log_replay::runtime()?;
//! runtime.block_on(async {
//!     for record in log {
//!         replay.send(&record?).await;
//!     }
//!     Ok::<(), std::io::Error>(())
//! })?;
//! let ada = replay.client("ada").unwrap();
//! assert_eq!((ada.requests(), ada.refused(0)), (12, 2));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod chart;
pub mod generate;
mod replay;
pub mod report;
mod request;
mod tally;

pub use replay::{Replay, ReplayError};
pub use tally::{ClientTally, LaneTally, Timeline};

/// The runtime a replay runs on: one thread, whose timers run on a paused
/// clock that jumps ahead whenever the replay waits. The stores decide on
/// their fake clock, set to each line's time; a wait the layers make
/// meanwhile (a leaky bucket's delay before it calls the route) so takes
/// no wall time, where on the real clock a replay slept through every
/// delay it shaped.
///
/// # Errors
///
/// When the runtime cannot be built.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
}
