//! The one-time form ([`Shape::Tat`](tollgate_core::Shape::Tat)): a
//! single GCRA, token-bucket or leaky-bucket limit whose state is one
//! time (`lua/shape/tat.lua`), decided in either write order.

use tollgate_core::state::{PolicyState, decide_tat};
use tollgate_core::{Decision, Policy, Settlement, Timestamp};

use crate::error::RedisStoreError;
use crate::op::word::{
    BatchOf, CHARGE, CHECK, REFUND, Reading, SettleArgs, Word, WordForm, reserved_at,
};
use crate::op::word_reply::words_at;
use crate::script::{DecisionScript, Scripts, TAT_WRITE_FIRST};
use crate::wire::WriteOrder;

/// Every amount and backlog stops at 2^50, as tollgate-core's.
const MAX_SPAN: u64 = 1 << 50;

/// The one-time form.
pub(crate) struct Tat;

impl WordForm for Tat {
    fn batcher(&self) -> BatchOf {
        BatchOf::Tat
    }

    fn source(&self) -> &'static str {
        TAT_WRITE_FIRST
    }

    fn script<'s>(&self, scripts: &'s Scripts, order: &WriteOrder) -> &'s DecisionScript {
        scripts.tat(order.write_first())
    }

    /// Reading first: a settlement is alone, and seldom of an idle key.
    fn settle_script<'s>(&self, scripts: &'s Scripts) -> &'s DecisionScript {
        scripts.tat(false)
    }

    fn takes_period(&self) -> bool {
        false
    }

    /// The step, how far an admitted request moves the key's time, and
    /// the slack, how far ahead of now that time may be for the request to
    /// be admitted (capacity less cost, times the interval), both in µs.
    fn check_args(&self, policy: &Policy, cost: u64) -> (u64, u64, u64) {
        let Some(p) = policy.params().first() else {
            return (0, 0, 0);
        };
        // Capacity x interval is at most 2^50 (the policy checks its span).
        // A cost above capacity commits nothing: the step is 0 and the
        // script only reads.
        let tolerance = p.capacity * p.interval_us;
        if cost <= p.capacity {
            let step = cost * p.interval_us;
            (0, step, tolerance - step)
        } else {
            (0, 0, tolerance)
        }
    }

    /// A slack of 2^50 marks a settlement: the script admits it from any
    /// time it holds, and caps a charge at 2^50 ahead of now.
    fn settle_args(
        &self,
        interval_us: u64,
        _period_us: u64,
        settlement: &Settlement,
    ) -> SettleArgs {
        let (charge, refund) = (settlement.charge(), settlement.refund());
        let span = |n: u64| n.saturating_mul(interval_us).min(MAX_SPAN);
        let (mark, step, slack) = if charge > 0 {
            (CHARGE, span(charge), MAX_SPAN)
        } else if refund > 0 {
            // The slack also says when the request was reserved, for the
            // fence of a reset (see `lua/shape/tat.lua`).
            (REFUND, span(refund), MAX_SPAN + reserved_at(settlement))
        } else {
            (CHECK, 0, 0)
        };
        SettleArgs {
            mark,
            period: 0,
            step,
            slack,
        }
    }

    /// Also counts, for the write order, how many found their key busy.
    fn words(
        &self,
        reply: &redis::Value,
        n: usize,
        reading: &Reading<'_>,
    ) -> Result<Vec<Word>, RedisStoreError> {
        let words = words_at(reply, n, reading)?;
        reading.order.observe(&words);
        Ok(words)
    }

    fn decide(&self, policy: &Policy, mut word: u64, now: Timestamp, cost: u64) -> Decision {
        decide_tat(policy, &mut word, now, cost)
    }

    fn settled(
        &self,
        policy: &Policy,
        word: u64,
        now: Timestamp,
        settlement: &Settlement,
    ) -> Option<Decision> {
        Some(PolicyState::from_tat(policy, word, now)?.settle(policy, now, settlement))
    }
}
