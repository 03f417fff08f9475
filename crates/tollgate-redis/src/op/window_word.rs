//! The window-word form ([`Shape::WindowWord`](tollgate_core::Shape::WindowWord)):
//! a single fixed-window limit whose state is the window's start plus its
//! count (`lua/shape/window_word.lua`).

use tollgate_core::state::{PolicyState, decide_window_word};
use tollgate_core::{Decision, Policy, Settlement, Timestamp};

use crate::error::RedisStoreError;
use crate::op::word::{
    BatchOf, CHARGE, CHECK, REFUND, Reading, SettleArgs, Word, WordForm, reserved_at,
};
use crate::op::word_reply::{Reply, words};
use crate::script::{DecisionScript, Scripts, WINDOW_WORD};
use crate::wire::WriteOrder;

/// The window-word form.
pub(crate) struct WindowWord;

impl WordForm for WindowWord {
    fn batcher(&self) -> BatchOf {
        BatchOf::WindowWord
    }

    fn source(&self) -> &'static str {
        WINDOW_WORD
    }

    fn script<'s>(&self, scripts: &'s Scripts, _order: &WriteOrder) -> &'s DecisionScript {
        &scripts.window_word
    }

    fn settle_script<'s>(&self, scripts: &'s Scripts) -> &'s DecisionScript {
        &scripts.window_word
    }

    fn takes_period(&self) -> bool {
        true
    }

    /// The period in µs, the step (the cost, or 0 when nothing can be
    /// committed) and the slack (how much the window may hold already for
    /// the request to be admitted).
    fn check_args(&self, policy: &Policy, cost: u64) -> (u64, u64, u64) {
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

    fn settle_args(
        &self,
        _interval_us: u64,
        period_us: u64,
        settlement: &Settlement,
    ) -> SettleArgs {
        let (charge, refund) = (settlement.charge(), settlement.refund());
        let period = period_us.max(1);
        if charge > 0 {
            let n = charge.min(period - 1);
            SettleArgs {
                mark: CHARGE,
                period,
                step: n,
                slack: period - 1 - n,
            }
        } else if refund > 0 {
            // The slack, negated by the script, says when the request was
            // reserved: in which window, and whether before a reset's
            // fence.
            SettleArgs {
                mark: REFUND,
                period,
                step: refund,
                slack: reserved_at(settlement) + 1,
            }
        } else {
            SettleArgs {
                mark: CHECK,
                period,
                step: 0,
                slack: 0,
            }
        }
    }

    /// The script never replies a negative number (a gap), which only
    /// the one-time script does.
    fn words(
        &self,
        reply: &redis::Value,
        n: usize,
        _reading: &Reading<'_>,
    ) -> Result<Vec<Word>, RedisStoreError> {
        match words(reply, n)? {
            Reply::Words(words) => Ok(words),
            Reply::Ahead(_) => Err(RedisStoreError::Protocol(format!("{reply:?}"))),
        }
    }

    fn decide(&self, policy: &Policy, mut word: u64, now: Timestamp, cost: u64) -> Decision {
        decide_window_word(policy, &mut word, now, cost)
    }

    fn settled(
        &self,
        policy: &Policy,
        word: u64,
        now: Timestamp,
        settlement: &Settlement,
    ) -> Option<Decision> {
        Some(PolicyState::from_window_word(policy, word)?.settle(policy, now, settlement))
    }
}
