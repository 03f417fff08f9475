//! The IETF headers' values (`RateLimit-Policy` and `RateLimit`, draft
//! -10), and when a limit's next unit comes back, which `Retry-After` and
//! the IETF `t` both tell.

use std::time::Duration;

use http::header::HeaderValue;
use tollgate_core::{Decision, LimitStatus};

fn ceil_secs(d: std::time::Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The values of `RateLimit-Policy` and `RateLimit`, one item per limit;
/// `drains` as [`PolicyValues`](super::headers::PolicyValues) has it.
pub(super) fn ietf_values(
    decision: &Decision,
    name: &str,
    drains: bool,
) -> Option<[HeaderValue; 2]> {
    use std::fmt::Write;
    let several = decision.limits().len() > 1;
    let (mut policy, mut state) = (String::new(), String::new());
    for status in decision.limits() {
        let sep = if status.index() == 0 { "" } else { ", " };
        let item = if several {
            format!("\"{name}-{}\"", status.index())
        } else {
            format!("\"{name}\"")
        };
        let window = ceil_secs(status.limit().period());
        let _ = write!(policy, "{sep}{item};q={};w={window}", status.capacity());
        let more_in = ceil_secs(more_in(status, drains));
        let _ = write!(state, "{sep}{item};r={};t={more_in}", status.remaining());
    }
    // Policy names are validated tokens, so both values are valid header values.
    Some([
        HeaderValue::try_from(policy).ok()?,
        HeaderValue::try_from(state).ok()?,
    ])
}

/// The IETF `t` of `status`, "the seconds until additional quota is made
/// available" (draft -10), with `drains` as [`PolicyValues`](super::headers::PolicyValues) has it:
/// nothing while none of it is used; for a limit with none left, when a
/// unit comes back ([`next_unit`]); for one with some left, when its next
/// unit comes back if it `drains`, otherwise when it is fully back (a
/// fixed window's end; a sliding window or log, the stores telling
/// nothing sooner).
fn more_in(status: &LimitStatus, drains: bool) -> Duration {
    let used = status.used();
    if used == 0 {
        return Duration::ZERO;
    }
    if status.remaining() == 0 {
        return next_unit(status, drains, 1);
    }
    let reset = status.reset();
    if !drains {
        return reset;
    }
    let backlog = (used - 1).saturating_mul(status.limit().interval_micros());
    let reset_us = u64::try_from(reset.as_micros()).unwrap_or(u64::MAX);
    match reset_us.saturating_sub(backlog) {
        // Used by another count than its own backlog: nothing sooner known.
        0 => reset,
        wait => Duration::from_micros(wait),
    }
}

/// When a limit that has less than `cost` left has room for it again:
/// when it would admit the request it denied; for a limit that `drains`
/// one unit every interval, when its backlog (the reset) has drained to
/// what leaves room for `cost`, the capacity less `cost` in intervals (a
/// backlog past the capacity, a debt settled or several limits' joint
/// queue, drains first); otherwise, when it is fully back (a fixed
/// window's end; the sliding window and log report nothing sooner).
pub(super) fn next_unit(status: &LimitStatus, drains: bool, cost: u64) -> Duration {
    if let Some(retry) = status.retry_after() {
        return retry;
    }
    let reset = status.reset();
    if !drains {
        return reset;
    }
    let interval = status.limit().interval_micros();
    let room = status
        .capacity()
        .saturating_sub(cost)
        .saturating_mul(interval);
    let reset_us = u64::try_from(reset.as_micros()).unwrap_or(u64::MAX);
    match reset_us.saturating_sub(room) {
        // Room for the cost now: a joint queue (the leaky bucket's) moves
        // by the longest interval per unit, so a limit of a shorter one may
        // count less than a larger cost yet hold it.
        0 if cost > 1 => Duration::ZERO,
        // Empty by another count than its own backlog: nothing sooner known.
        0 => reset,
        wait => Duration::from_micros(wait),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The IETF `t` of an emptied limit of 10 a minute (one unit back
    /// every 6 s) whose backlog is `reset`: the backlog less the 54 s that
    /// leave room for one unit. Past the capacity (a debt settled, or a
    /// leaky bucket's queue shared with a slower limit) the debt drains
    /// first; a token-bucket, leaky-bucket or GCRA limit only.
    #[test]
    fn the_next_unit_of_an_emptied_limit_drains_its_debt_first() {
        use tollgate_core::{Algorithm, Limit, Outcome, Policy, Timestamp};
        let limit = Limit::per_minute(10).unwrap();
        let policy = Policy::new("one", Algorithm::Gcra, "10/min").unwrap();
        let t = |reset_secs: u64, drains: bool| {
            let reset = Duration::from_secs(reset_secs);
            let status = LimitStatus::new(0, limit, 10, 0, reset, None);
            let now = Timestamp::from_secs(1_700_000_000);
            let decision = Decision::new(&policy, Outcome::Allowed, now, Duration::ZERO, [status]);
            let [_, state] = ietf_values(&decision, "one", drains).unwrap();
            state.to_str().unwrap().to_owned()
        };
        assert_eq!(t(60, true), r#""one";r=0;t=6"#, "all ten used");
        assert_eq!(t(72, true), r#""one";r=0;t=18"#, "a shared queue");
        assert_eq!(t(120, true), r#""one";r=0;t=66"#, "a debt of ten");
        assert_eq!(t(120, false), r#""one";r=0;t=120"#, "a window");
    }
}
