//! The decision scripts, assembled from `src/lua`: one general script per
//! algorithm, and smaller ones for one-time and window-word policies.

use tollgate_core::{Algorithm, Policy, Settlement};

use crate::shape::Form;

macro_rules! decision_script {
    ($file:literal) => {
        concat!(
            include_str!("lua/lib/arith.lua"),
            include_str!("lua/lib/carry.lua"),
            include_str!("lua/lib/block.lua"),
            include_str!("lua/lib/prelude.lua"),
            include_str!(concat!("lua/algorithm/", $file)),
            include_str!("lua/lib/epilogue.lua"),
        )
    };
}

/// `carried_word`, the carry-over library of the word scripts, as one
/// function (see `lua/lib/word_carry_begin.lua`).
macro_rules! word_carry {
    () => {
        concat!(
            include_str!("lua/lib/word_carry_begin.lua"),
            include_str!("lua/lib/arith.lua"),
            include_str!("lua/lib/carry.lua"),
            include_str!("lua/lib/word_carry_end.lua"),
            include_str!("lua/lib/block.lua"),
        )
    };
}

/// The script of a single GCRA, token-bucket or leaky-bucket limit, in its
/// two orders: writing first and reading first. They differ only in their
/// first line, and have two SHA-1s, so that the store picks one without
/// sending another argument (each argument costs Redis a rehash of the
/// script's `ARGV` table as it grows; `BENCHMARKS.md` has the cost).
const TAT_WRITE_FIRST: &str = concat!(
    "local write_first = true\n",
    word_carry!(),
    include_str!("lua/shape/tat.lua")
);
const TAT_READ_FIRST: &str = concat!(
    "local write_first = false\n",
    word_carry!(),
    include_str!("lua/shape/tat.lua")
);

/// The script of a single fixed-window limit whose state is a window word
/// (see [`Shape::WindowWord`](tollgate_core::Shape::WindowWord)).
const WINDOW_WORD: &str = concat!(word_carry!(), include_str!("lua/shape/window_word.lua"));

/// The general script of `algorithm`.
fn general(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => decision_script!("fixed_window.lua"),
        Algorithm::SlidingLog => decision_script!("sliding_log.lua"),
        Algorithm::SlidingWindow => decision_script!("sliding_window.lua"),
        Algorithm::TokenBucket => decision_script!("token_bucket.lua"),
        Algorithm::LeakyBucket => decision_script!("leaky_bucket.lua"),
        Algorithm::Gcra => decision_script!("gcra.lua"),
    }
}

/// The source of the script that decides for `policy`, as sent (see
/// `testing::script_source`).
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) fn source(policy: &Policy) -> &'static str {
    match Form::of(policy) {
        Form::Tat => TAT_WRITE_FIRST,
        Form::WindowWord => WINDOW_WORD,
        Form::General => general(policy.algorithm()),
    }
}

/// The script that blocks a key (see `lua/block.lua`).
const BLOCK: &str = include_str!("lua/block.lua");

/// Every amount and backlog stops at 2^50, as tollgate-core's.
const MAX_SPAN: u64 = 1 << 50;

/// One argument of a script call.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    Number(u64),
    Text(&'a str),
}

/// The arguments of a settlement: to a word script, its period (0 for
/// the one-time script, which takes none), step and slack; to a general
/// script, its request.
pub(crate) struct SettleArgs {
    pub(crate) period: u64,
    pub(crate) step: String,
    pub(crate) slack: String,
}

/// What a settlement sends for `policy`, in the form of its shape (see
/// the scripts' headers: `tat.lua`, `window_word.lua`, `prelude.lua`).
pub(crate) fn settle_args(form: Form, policy: &Policy, settlement: &Settlement) -> SettleArgs {
    let (charge, refund) = (settlement.charge(), settlement.refund());
    let since = settlement.reserved_at().as_micros();
    let Some(p) = policy.params().first() else {
        return SettleArgs {
            period: 0,
            step: "0".into(),
            slack: "0".into(),
        };
    };
    let span = |n: u64| n.saturating_mul(p.interval_us).min(MAX_SPAN);
    let (period, step, slack) = match form {
        // A slack of 2^50 marks a settlement: the script admits it from
        // any time it holds, and caps a charge at 2^50 ahead of now.
        Form::Tat if charge > 0 => (0, span(charge).to_string(), MAX_SPAN),
        Form::Tat if refund > 0 => (0, format!("-{}", span(refund)), MAX_SPAN),
        Form::Tat => (0, "0".into(), 0),
        Form::WindowWord => {
            let period = p.period_us.max(1);
            if charge > 0 {
                let n = charge.min(period - 1);
                (period, format!("+{n}"), period - 1 - n)
            } else if refund > 0 {
                // The slack says which window the request was reserved in.
                let reserved_in = since - since % period;
                return SettleArgs {
                    period,
                    step: format!("-{refund}"),
                    slack: format!("-{}", reserved_in + 1),
                };
            } else {
                (period, "0".into(), 0)
            }
        }
        Form::General if charge > 0 => (0, format!("+{charge}"), 0),
        Form::General if refund > 0 => (0, format!("-{refund}@{since}"), 0),
        Form::General => (0, "0".into(), 0),
    };
    SettleArgs {
        period,
        step,
        slack: slack.to_string(),
    }
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

/// Feeds the `ARGV` of one decision to `arg`: `now` in µs, or 0 for Redis
/// TIME, and the shortest TTL in ms.
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) fn for_each_arg<'a>(
    policy: &'a Policy,
    cost: u64,
    now: u64,
    min_ttl_ms: u64,
    mut arg: impl FnMut(Arg<'a>),
) {
    let form = Form::of(policy);
    if form == Form::General {
        return general_args(policy, Arg::Number(cost), now, min_ttl_ms, arg);
    }
    let (period, step, slack) = word_args(form, policy, cost);
    // The one-time script takes no period.
    if form == Form::WindowWord {
        arg(Arg::Number(period));
    }
    arg(Arg::Number(step));
    arg(Arg::Number(slack));
    arg(Arg::Text(policy.state_descriptor()));
    // On Redis's clock, the script needs nothing more.
    if now > 0 {
        arg(Arg::Number(now));
        arg(Arg::Number(min_ttl_ms));
    }
}

/// Feeds the `ARGV` of a general script's call to `arg`: `costs` is one
/// cost, or the costs of several requests of one key separated by spaces.
pub(crate) fn general_args<'a>(
    policy: &'a Policy,
    costs: Arg<'a>,
    now: u64,
    min_ttl_ms: u64,
    mut arg: impl FnMut(Arg<'a>),
) {
    arg(Arg::Number(now));
    arg(costs);
    arg(Arg::Text(policy.state_descriptor()));
    arg(Arg::Number(min_ttl_ms));
    arg(Arg::Number(policy.params().len() as u64));
    for p in policy.params() {
        for n in [p.limit.count(), p.period_us, p.interval_us, p.capacity] {
            arg(Arg::Number(n));
        }
    }
}

/// The period (0 for the one-time script, which takes none), step and
/// slack of one request to a word script.
pub(crate) fn word_args(form: Form, policy: &Policy, cost: u64) -> (u64, u64, u64) {
    match form {
        Form::WindowWord => window_word_args(policy, cost),
        _ => {
            let (step, slack) = tat_args(policy, cost);
            (0, step, slack)
        }
    }
}

/// The two arguments of one request to the one-time script: the step, how
/// far an admitted request moves the key's time, and the slack, how far
/// ahead of now that time may be for the request to be admitted (capacity
/// less cost, times the interval), both in µs.
fn tat_args(policy: &Policy, cost: u64) -> (u64, u64) {
    let Some(p) = policy.params().first() else {
        return (0, 0);
    };
    // Capacity x interval is at most 2^50 (the policy checks its span). A
    // cost above capacity commits nothing: the step is 0 and the script
    // only reads.
    let tolerance = p.capacity * p.interval_us;
    if cost <= p.capacity {
        let step = cost * p.interval_us;
        (step, tolerance - step)
    } else {
        (0, tolerance)
    }
}

/// The three arguments of one request to the window-word script: the
/// period in µs, the step (the cost, or 0 when nothing can be committed)
/// and the slack (how much the window may hold already for the request to
/// be admitted).
fn window_word_args(policy: &Policy, cost: u64) -> (u64, u64, u64) {
    let Some(p) = policy.params().first() else {
        return (1, 0, 0);
    };
    let count = p.limit.count();
    if cost <= count {
        (p.period_us, cost, count - cost)
    } else {
        (p.period_us, 0, count)
    }
}

/// A decision script: its source and SHA-1.
#[derive(Debug)]
pub(crate) struct DecisionScript {
    pub(crate) source: &'static str,
    pub(crate) sha: String,
}

impl DecisionScript {
    fn new(source: &'static str) -> Self {
        let sha = redis::Script::new(source).get_hash().to_owned();
        Self { source, sha }
    }
}

/// Each algorithm's general script, hashed once.
#[derive(Debug)]
struct General {
    fixed_window: DecisionScript,
    sliding_log: DecisionScript,
    sliding_window: DecisionScript,
    token_bucket: DecisionScript,
    leaky_bucket: DecisionScript,
    gcra: DecisionScript,
}

impl General {
    fn new() -> Self {
        let script = |algorithm| DecisionScript::new(general(algorithm));
        Self {
            fixed_window: script(Algorithm::FixedWindow),
            sliding_log: script(Algorithm::SlidingLog),
            sliding_window: script(Algorithm::SlidingWindow),
            token_bucket: script(Algorithm::TokenBucket),
            leaky_bucket: script(Algorithm::LeakyBucket),
            gcra: script(Algorithm::Gcra),
        }
    }

    fn of(&self, algorithm: Algorithm) -> &DecisionScript {
        match algorithm {
            Algorithm::FixedWindow => &self.fixed_window,
            Algorithm::SlidingLog => &self.sliding_log,
            Algorithm::SlidingWindow => &self.sliding_window,
            Algorithm::TokenBucket => &self.token_bucket,
            Algorithm::LeakyBucket => &self.leaky_bucket,
            Algorithm::Gcra => &self.gcra,
        }
    }

    fn all(&self) -> [&DecisionScript; 6] {
        [
            &self.fixed_window,
            &self.sliding_log,
            &self.sliding_window,
            &self.token_bucket,
            &self.leaky_bucket,
            &self.gcra,
        ]
    }
}

/// The scripts, hashed once.
#[derive(Debug)]
pub(crate) struct Scripts {
    general: General,
    /// Writing first, then reading first.
    tat: [DecisionScript; 2],
    pub(crate) window_word: DecisionScript,
    pub(crate) block: DecisionScript,
    /// The in-flight limit's scripts: taking a slot, renewing its lease.
    pub(crate) acquire: DecisionScript,
    pub(crate) renew: DecisionScript,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            general: General::new(),
            tat: [
                DecisionScript::new(TAT_WRITE_FIRST),
                DecisionScript::new(TAT_READ_FIRST),
            ],
            window_word: DecisionScript::new(WINDOW_WORD),
            block: DecisionScript::new(BLOCK),
            acquire: DecisionScript::new(include_str!("lua/inflight/acquire.lua")),
            renew: DecisionScript::new(include_str!("lua/inflight/renew.lua")),
        }
    }

    /// The general script of `policy`'s algorithm.
    pub(crate) fn get(&self, policy: &Policy) -> &DecisionScript {
        self.general.of(policy.algorithm())
    }

    /// The script of one-time policies, which takes one or more keys,
    /// writing first or reading first.
    pub(crate) fn tat(&self, write_first: bool) -> &DecisionScript {
        &self.tat[usize::from(!write_first)]
    }

    pub(crate) fn all(&self) -> impl Iterator<Item = &DecisionScript> {
        self.general.all().into_iter().chain(&self.tat).chain([
            &self.window_word,
            &self.block,
            &self.acquire,
            &self.renew,
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_algorithm_finds_its_own_general_script() {
        let scripts = Scripts::new();
        for algorithm in Algorithm::ALL {
            let policy = Policy::new("p", algorithm, "10/s").unwrap();
            assert_eq!(
                scripts.get(&policy).source,
                general(algorithm),
                "{algorithm}"
            );
        }
    }
}
