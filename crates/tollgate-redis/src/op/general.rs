//! The general form: one script per algorithm (`lua/algorithm/`),
//! deciding in turn the requests of one key, with a reply per request;
//! its arguments, its call and the reading of its reply.

use std::time::Duration;

use tollgate_core::{Decision, LimitStatus, Outcome, Policy, Settlement, Timestamp};

use crate::connect::RedisConnection;
use crate::error::RedisStoreError;
use crate::keys::{fence_key, log_keys};
use crate::wire::Wire;

/// One argument of a script call.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    Number(u64),
    Text(&'a str),
}

impl redis::ToRedisArgs for Arg<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        match self {
            Arg::Number(n) => n.write_redis_args(out),
            Arg::Text(t) => t.write_redis_args(out),
        }
    }
}

impl std::fmt::Display for Arg<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Arg::Number(n) => n.fmt(f),
            Arg::Text(t) => f.write_str(t),
        }
    }
}

/// Feeds the `ARGV` of a general script's call to `arg`: `costs` is one
/// cost, or the costs of several requests of one key separated by spaces.
/// A calendar period's limit sends its period with the starts of the
/// calendar periods around `around` (the test clock's time, or the
/// estimate of Redis's), among which the script picks the one holding its
/// own now (see `prelude.lua`).
pub(crate) fn general_args(
    policy: &Policy,
    costs: Arg<'_>,
    (now, around): (u64, u64),
    min_ttl_ms: u64,
    mut arg: impl FnMut(Arg<'_>),
) {
    arg(Arg::Number(now));
    arg(costs);
    arg(Arg::Text(policy.state_descriptor()));
    arg(Arg::Number(min_ttl_ms));
    arg(Arg::Number(policy.params().len() as u64));
    for p in policy.params() {
        arg(Arg::Number(p.limit.count()));
        match p.calendar_bounds(around) {
            None => arg(Arg::Number(p.period_us)),
            Some([b1, b2, b3, b4]) => {
                arg(Arg::Text(&format!("{} {b1} {b2} {b3} {b4}", p.period_us)));
            }
        }
        arg(Arg::Number(p.interval_us));
        arg(Arg::Number(p.capacity));
    }
}

impl<C: RedisConnection> Wire<C> {
    /// Decides requests of `costs` for `state_key` under `policy`, a
    /// general-script policy, in turn, in one call of its script.
    pub(crate) async fn general(
        &self,
        state_key: &str,
        policy: &Policy,
        costs: &[u64],
    ) -> Result<Vec<Decision>, RedisStoreError> {
        let text: String;
        let costs_arg = match costs {
            [] => return Ok(Vec::new()),
            [cost] => Arg::Number(*cost),
            _ => {
                text = costs
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(" ");
                Arg::Text(&text)
            }
        };
        let reply = self
            .call_general(state_key, policy, costs_arg, false)
            .await?;
        decisions_from_reply(policy, costs, &reply, policy.params().len())
    }

    /// Settles a request of `state_key` under `policy`, a general-script
    /// policy: `request` is the script's request for it (see
    /// [`settle_request`]).
    pub(crate) async fn settle_general(
        &self,
        state_key: &str,
        policy: &Policy,
        request: &str,
    ) -> Result<Decision, RedisStoreError> {
        let reply = self
            .call_general(state_key, policy, Arg::Text(request), true)
            .await?;
        decisions_from_reply(policy, &[0], &reply, policy.params().len())?
            .pop()
            .ok_or_else(|| RedisStoreError::Protocol("no decision in the reply".into()))
    }

    /// Calls `policy`'s general script on `requests` of the key of
    /// `state_key`, passing its fence key too for a settlement (`fence`).
    async fn call_general(
        &self,
        state_key: &str,
        policy: &Policy,
        requests: Arg<'_>,
        fence: bool,
    ) -> Result<redis::Value, RedisStoreError> {
        let script = self.scripts.get(policy);
        let (now, min_ttl_ms) = self.test_time();
        let around = if now > 0 {
            now
        } else {
            self.redis_clock.at(self.local_now())
        };
        // A size hint (arguments, bytes): 16 arguments of 16 bytes or so,
        // besides the key names and the requests, hold most policies.
        let bytes = 256
            + 2 * state_key.len()
            + match requests {
                Arg::Text(text) => text.len(),
                Arg::Number(_) => 20,
            };
        let reply = self
            .eval(state_key, script, (16, bytes), |cmd| {
                general_keys(cmd, state_key, policy, fence);
                general_args(policy, requests, (now, around), min_ttl_ms, |arg| {
                    cmd.arg(arg);
                });
            })
            .await?;
        // Each decision's second number is Redis's time.
        if let redis::Value::Array(items) = &reply
            && let Some(&redis::Value::Int(redis_now)) = items.get(1)
        {
            self.saw_time(u64::try_from(redis_now).ok());
        }
        Ok(reply)
    }
}

/// The request a settlement sends a general script: a charge, a refund
/// of a request reserved at a time, or nothing.
pub(crate) fn settle_request(settlement: &Settlement) -> String {
    let (charge, refund) = (settlement.charge(), settlement.refund());
    // At most 2^52 µs, as the word scripts read it: the script's
    // arithmetic on it stays below 2^53, exact in a Lua double.
    let since = super::word::reserved_at(settlement);
    if charge > 0 {
        format!("+{charge}")
    } else if refund > 0 {
        format!("-{refund}@{since}")
    } else {
        "0".into()
    }
}

/// The keys of a general script's call: the state key, and a sliding log's
/// sorted set per limit, named after the limit's period so that a changed
/// configuration finds the log of that period; then, for a settlement
/// (`fence`), the key's fence key.
fn general_keys(cmd: &mut redis::Cmd, state_key: &str, policy: &Policy, fence: bool) {
    let logs: Vec<String> = log_keys(state_key, policy).collect();
    cmd.arg(1 + logs.len() + usize::from(fence))
        .arg(state_key)
        .arg(logs);
    if fence {
        cmd.arg(fence_key(state_key));
    }
}

/// Turns the general script's reply into a [`Decision`] per request.
fn decisions_from_reply(
    policy: &Policy,
    costs: &[u64],
    reply: &redis::Value,
    limits: usize,
) -> Result<Vec<Decision>, RedisStoreError> {
    let reply: Vec<i64> = redis::FromRedisValue::from_redis_value(reply.clone())
        .map_err(|e| RedisStoreError::Protocol(e.to_string()))?;
    let each = 3 + 3 * limits;
    if reply.len() != each * costs.len() {
        return Err(RedisStoreError::Protocol(format!("{reply:?}")));
    }
    reply
        .chunks_exact(each)
        .zip(costs)
        .map(|(chunk, &cost)| decision_from_reply(policy, cost, chunk))
        .collect()
}

/// Turns the general script's reply into a [`Decision`].
fn decision_from_reply(
    policy: &Policy,
    cost: u64,
    reply: &[i64],
) -> Result<Decision, RedisStoreError> {
    let params = policy.params();
    let bad = || RedisStoreError::Protocol(format!("{reply:?}"));
    if reply.len() != 3 + 3 * params.len() {
        return Err(bad());
    }
    let micros = |v: i64| u64::try_from(v).map_err(|_| bad());
    let now = Timestamp::from_micros(micros(reply[1])?);
    let delay = Duration::from_micros(micros(reply[2])?);
    let mut statuses = Vec::with_capacity(params.len());
    let mut longest_retry = 0;
    for (i, (p, chunk)) in params.iter().zip(reply[3..].chunks_exact(3)).enumerate() {
        let retry = match chunk[2] {
            -1 => None,
            r => Some(micros(r)?),
        };
        longest_retry = longest_retry.max(retry.unwrap_or(0));
        statuses.push(LimitStatus::new(
            i,
            p.limit,
            p.capacity,
            micros(chunk[0])?,
            Duration::from_micros(micros(chunk[1])?),
            retry.map(Duration::from_micros),
        ));
    }
    let outcome = match reply[0] {
        0 => Outcome::Allowed,
        1 => Outcome::Limited {
            retry_after: Duration::from_micros(longest_retry),
        },
        2 => Outcome::CostExceedsCapacity {
            cost,
            capacity: params
                .iter()
                .find(|p| cost > p.capacity)
                .map_or(0, |p| p.capacity),
        },
        // An operator's block: every limit waits for its end.
        3 => {
            let until = Timestamp::from_micros(now.as_micros().saturating_add(longest_retry));
            return Ok(tollgate_core::state::blocked(policy, now, until));
        }
        _ => return Err(bad()),
    };
    Ok(Decision::new(policy, outcome, now, delay, statuses))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::Algorithm;

    #[test]
    fn malformed_replies_are_protocol_errors() {
        let policy = Policy::new("p", Algorithm::Gcra, "1/s").unwrap();
        assert!(matches!(
            decision_from_reply(&policy, 1, &[0, 1, 0]),
            Err(RedisStoreError::Protocol(_))
        ));
        assert!(matches!(
            decision_from_reply(&policy, 1, &[7, 1, 0, 1, 0, -1]),
            Err(RedisStoreError::Protocol(_))
        ));
        assert!(matches!(
            decision_from_reply(&policy, 1, &[0, -5, 0, 1, 0, -1]),
            Err(RedisStoreError::Protocol(_))
        ));
        let ok = decision_from_reply(&policy, 1, &[0, 5_000_000, 0, 0, 1_000_000, -1]).unwrap();
        assert!(ok.is_allowed());
        assert_eq!(ok.reset_at(), Timestamp::from_secs(6));
    }
}
