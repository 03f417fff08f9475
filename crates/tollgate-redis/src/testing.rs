//! What the store sends Redis, for benchmarks and tools (feature
//! `testing`): the exact script and arguments of a decision, to load into
//! `redis-benchmark` or compare with another implementation.

use tollgate_core::Policy;

/// The Lua source of the script that decides for `policy`, as sent to
/// Redis, or `None` for an algorithm this version does not implement.
///
/// A policy of one GCRA, token-bucket or leaky-bucket limit runs a smaller
/// script than the others (see [`Shape::Tat`](tollgate_core::Shape::Tat)); this is its
/// variant that writes first, which the store sends while few of its recent
/// requests found their key busy. Once more did, it sends the same script
/// with `local write_first = false` as its first line. A policy of one
/// fixed-window limit below half a million a second runs a small script of its
/// own (see [`Shape::WindowWord`](tollgate_core::Shape::WindowWord)). Together with
/// [`script_args`] this is exactly what the store sends, useful to load it
/// elsewhere, such as into `redis-benchmark`.
///
/// ```
/// use tollgate_core::{Algorithm, Policy};
/// use tollgate_redis::testing::script_source;
///
/// let gcra = Policy::new("api", Algorithm::Gcra, "10/s")?;
/// assert!(script_source(&gcra).contains("PXAT"));
/// let window = Policy::new("api", Algorithm::FixedWindow, "10/s")?;
/// assert!(script_source(&window).contains("KEEPTTL"));
/// let sliding = Policy::new("api", Algorithm::SlidingWindow, "10/s")?;
/// assert!(script_source(&sliding).contains("HGETALL"));
/// # Ok::<(), tollgate_core::ConfigError>(())
/// ```
pub fn script_source(policy: &Policy) -> &'static str {
    crate::op::decide::source(policy)
}

/// The `ARGV` of one decision of `cost` under `policy`, on Redis's clock,
/// as the store sends it after the script's single state key (a
/// sliding-log policy also passes one key per limit,
/// `<state key>:<period in µs>`).
///
/// ```
/// use tollgate_core::{Algorithm, Policy};
/// use tollgate_redis::testing::script_args;
///
/// let gcra = Policy::new("api", Algorithm::Gcra, "10/s")?;
/// // One argument: the mark of a decision, the step and the slack in 14
/// // hexadecimal digits each (100 ms per request, and a burst of 10 leaves
/// // room for 9 more intervals ahead of now), then the descriptor the
/// // state is written under.
/// assert_eq!(
///     script_args(&gcra, 1),
///     ["0000000000186a0000000000dbba0gcra 1000000/100000/10"]
/// );
/// let window = Policy::new("api", Algorithm::FixedWindow, "10/s")?;
/// // The step, the period and the slack: 9 more may be counted already.
/// assert_eq!(
///     script_args(&window, 1),
///     ["000000000000001000000000f424000000000000009fixed_window 1000000/100000/10"]
/// );
/// let sliding = Policy::new("api", Algorithm::SlidingWindow, "10/s")?;
/// // Now (0: Redis TIME), cost, descriptor, minimum TTL, one limit:
/// // count, period, interval and capacity.
/// let args = script_args(&sliding, 1);
/// assert_eq!(args.len(), 9);
/// assert_eq!(args[2], "sliding_window 1000000/100000/10");
/// assert_eq!(args[5..], ["10", "1000000", "100000", "10"]);
/// # Ok::<(), tollgate_core::ConfigError>(())
/// ```
pub fn script_args(policy: &Policy, cost: u64) -> Vec<String> {
    let mut args = Vec::new();
    crate::op::decide::for_each_arg(policy, cost, 0, 0, |arg| args.push(arg.to_string()));
    args
}
