//! The word scripts, one-time (`tat.rs`) and window-word
//! (`window_word.rs`): what every word form provides ([`WordForm`]), a
//! request to one, and their calls on the wire. A word script replies,
//! per request, the key's word before it: a time or a window's count.

use tollgate_core::{Decision, Policy, Settlement, Timestamp, state::blocked};

use crate::connect::RedisConnection;
use crate::error::RedisStoreError;
use crate::script::{DecisionScript, Scripts};
use crate::wire::{RedisClock, Wire, WriteOrder};

/// The flag of a word script's word that is the end of an operator's
/// block rather than a key's state (see `lua/lib/block.lua`).
pub(crate) const BLOCKED: u64 = 1 << 63;

/// The flag of a word script's word that a settlement left as it was: a
/// refund behind the fence of a reset or a block (see
/// `lua/lib/fence.lua`), or a refund or a charge of a key kept under a
/// configuration that does not carry over to the settlement's whole (see
/// `lua/lib/carry.lua`).
pub(crate) const FENCED: u64 = 1 << 62;

/// When the request a settlement settles was reserved, in µs, as a word
/// script reads it from a refund: at most 2^52 µs (in 2112), so that it
/// fits the refund's slack and a Lua double. Only a fence set after that
/// time, on a clock in the next century, could answer otherwise than
/// the memory store, which compares the time as it is.
pub(crate) fn reserved_at(settlement: &Settlement) -> u64 {
    settlement.reserved_at().as_micros().min(1 << 52)
}

/// Redis's time and a request's old word (see the word scripts), both in
/// µs; the word flagged [`BLOCKED`] for a key blocked until then, or
/// [`FENCED`] for a settlement that changed nothing.
pub(crate) type Word = (u64, u64);

/// One request to a word script: its state key and numbers (see each
/// form's [`WordForm::check_args`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request<'a> {
    pub(crate) key: &'a str,
    /// The window's period in µs (window words; 0 for one-time requests).
    pub(crate) period: u64,
    pub(crate) step: u64,
    pub(crate) slack: u64,
    /// The request's policy, whose descriptor the script writes the state
    /// under.
    pub(crate) policy: &'a Policy,
}

/// The arguments of a settlement: its mark (see [`RequestArg`]), the
/// period (0 for the one-time script, which takes none), the step and the
/// slack; to a general script, its request (see `general::settle_request`).
pub(crate) struct SettleArgs {
    pub(crate) mark: u8,
    pub(crate) period: u64,
    pub(crate) step: u64,
    pub(crate) slack: u64,
}

impl SettleArgs {
    /// A settlement of nothing.
    pub(crate) fn none() -> Self {
        SettleArgs {
            mark: CHECK,
            period: 0,
            step: 0,
            slack: 0,
        }
    }
}

/// The mark of a request that is no settlement (see [`RequestArg`]).
pub(crate) const CHECK: u8 = b'0';
/// The mark of a charge.
pub(crate) const CHARGE: u8 = b'+';
/// The mark of a refund, whose step (and, in the window-word script,
/// slack) the script negates.
pub(crate) const REFUND: u8 = b'-';

/// Hexadecimal digits per number of a [`RequestArg`]: enough for every
/// integer a Lua double holds exactly (below 2^53).
const DIGITS: usize = 14;
/// Room for the longest single-limit descriptor after three numbers.
const INLINE: usize = 160;

/// The argument of one request to a word script, `ARGV[i]` of request `i`
/// (see `lua/shape/tat.lua`): a mark, each number in [`DIGITS`]
/// hexadecimal digits, then the policy's descriptor. One argument per
/// request, and numbers Lua reads with `strtoul`, cost Redis less than an
/// argument per number in decimal. Built on the stack: a request costs no
/// allocation of its own.
pub(crate) struct RequestArg {
    inline: [u8; INLINE],
    len: usize,
    /// A descriptor too long for `inline` (none of a single limit is).
    heap: Vec<u8>,
}

impl RequestArg {
    pub(crate) fn new(mark: u8, numbers: &[u64], descriptor: &str) -> Self {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let len = 1 + DIGITS * numbers.len() + descriptor.len();
        let mut arg = RequestArg {
            inline: [0; INLINE],
            len,
            heap: Vec::new(),
        };
        let bytes: &mut [u8] = if len <= INLINE {
            &mut arg.inline[..len]
        } else {
            arg.heap.resize(len, 0);
            &mut arg.heap
        };
        bytes[0] = mark;
        for (field, &n) in bytes[1..].chunks_exact_mut(DIGITS).zip(numbers) {
            // Beyond 2^56 no Lua double holds the number exactly anyway.
            let n = n.min((1 << (4 * DIGITS)) - 1);
            for (i, digit) in field.iter_mut().enumerate() {
                *digit = HEX[((n >> (4 * (DIGITS - 1 - i))) & 0xf) as usize];
            }
        }
        bytes[1 + DIGITS * numbers.len()..].copy_from_slice(descriptor.as_bytes());
        arg
    }

    /// The argument's bytes.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        if self.len <= INLINE {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }

    /// The argument as text (it is ASCII but for the descriptor, which is
    /// text).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn to_text(&self) -> String {
        String::from_utf8_lossy(self.as_bytes()).into_owned()
    }
}

impl redis::ToRedisArgs for RequestArg {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        out.write_arg(self.as_bytes());
    }
}

/// What a reply is read with: the `now` sent (0 on Redis's clock), the
/// store's local time when it was sent, and the store's estimates.
pub(crate) struct Reading<'a> {
    pub(crate) sent_now: u64,
    /// The store's local time in µs when the call was sent: Redis's clock
    /// estimated then is at most its time when it ran the script (see
    /// `RedisClock`).
    pub(crate) sent_local: u64,
    pub(crate) order: &'a WriteOrder,
    pub(crate) redis_clock: &'a RedisClock,
    /// The store's local time in µs, read only when needed.
    pub(crate) local_now: &'a dyn Fn() -> u64,
}

/// The batcher that queues a word form's decisions: one per form, so
/// that a batch runs one script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchOf {
    /// The one-time form's.
    Tat,
    /// The window word's.
    WindowWord,
}

/// A compact form whose script replies words: everything that differs
/// between the one-time and the window-word form, so that the operations
/// never ask which form they hold.
pub(crate) trait WordForm: Send + Sync {
    /// Which of the store's batchers queues this form's decisions.
    fn batcher(&self) -> BatchOf;
    /// The script's source, as `testing::script_source` gives it.
    fn source(&self) -> &'static str;
    /// The script a decision runs, as the store's write order says.
    fn script<'s>(&self, scripts: &'s Scripts, order: &WriteOrder) -> &'s DecisionScript;
    /// The script a settlement runs, alone.
    fn settle_script<'s>(&self, scripts: &'s Scripts) -> &'s DecisionScript;
    /// Whether the script takes a period per request.
    fn takes_period(&self) -> bool;
    /// The period (0 where the script takes none), step and slack of a
    /// decision of `cost` under `policy`.
    fn check_args(&self, policy: &Policy, cost: u64) -> (u64, u64, u64);
    /// What a settlement sends, for `policy`'s first limit of
    /// `interval_us` and `period_us`.
    fn settle_args(&self, interval_us: u64, period_us: u64, settlement: &Settlement) -> SettleArgs;
    /// The argument of `request`, a decision.
    fn check_arg(&self, request: &Request<'_>) -> RequestArg {
        self.arg(
            CHECK,
            request.period,
            request.step,
            request.slack,
            request.policy,
        )
    }
    /// The argument of a request of `mark` with these numbers under
    /// `policy`: the period only where the script takes one, after the
    /// step, which the script reads with the mark.
    fn arg(&self, mark: u8, period: u64, step: u64, slack: u64, policy: &Policy) -> RequestArg {
        let descriptor = policy.state_descriptor();
        if self.takes_period() {
            RequestArg::new(mark, &[step, period, slack], descriptor)
        } else {
            RequestArg::new(mark, &[step, slack], descriptor)
        }
    }
    /// The words of a reply to `n` requests of a batch.
    fn words(
        &self,
        reply: &redis::Value,
        n: usize,
        reading: &Reading<'_>,
    ) -> Result<Vec<Word>, RedisStoreError>;
    /// The decision of a request of `cost` on its key's `word` at `now`.
    fn decide(&self, policy: &Policy, word: u64, now: Timestamp, cost: u64) -> Decision;
    /// The decision of a settlement on its key's `word` at `now`, if the
    /// word holds a state of `policy`.
    fn settled(
        &self,
        policy: &Policy,
        word: u64,
        now: Timestamp,
        settlement: &Settlement,
    ) -> Option<Decision>;
}

/// What a word script did to a key's word.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WordOp<'a> {
    /// Decided a request of this cost.
    Check(u64),
    /// Settled a request's cost.
    Settle(&'a Settlement),
}

/// The decision of `op` on `word`, a word script's reply for a key at
/// Redis's `now` (the script did the same to the key's word): the
/// block's, for a blocked key.
pub(crate) fn decision(
    form: &dyn WordForm,
    policy: &Policy,
    now: u64,
    word: u64,
    op: WordOp<'_>,
) -> Option<Decision> {
    let now = Timestamp::from_micros(now);
    if word & BLOCKED != 0 {
        let until = Timestamp::from_micros(word & !BLOCKED);
        return Some(blocked(policy, now, until));
    }
    match op {
        WordOp::Check(cost) => Some(form.decide(policy, word & !FENCED, now, cost)),
        WordOp::Settle(settlement) if word & FENCED != 0 => {
            // Settled at what it reserved: nothing changed.
            let (reserved, at) = (settlement.reserved(), settlement.reserved_at());
            let unchanged = Settlement::new(reserved, reserved, at);
            form.settled(policy, word & !FENCED, now, &unchanged)
        }
        WordOp::Settle(settlement) => form.settled(policy, word, now, settlement),
    }
}

impl<C> Wire<C> {
    /// Reads a reply to a call that sent `sent_now` at the local time
    /// `sent_local` with `read`.
    pub(crate) fn read<T>(
        &self,
        (sent_now, sent_local): (u64, u64),
        read: impl FnOnce(&Reading<'_>) -> T,
    ) -> T {
        let local_now = || self.local_now();
        read(&Reading {
            sent_now,
            sent_local,
            order: &self.order,
            redis_clock: &self.redis_clock,
            local_now: &local_now,
        })
    }
}

impl<C: RedisConnection> Wire<C> {
    /// Decides `requests` of `form` in one call of its script, in order,
    /// and returns each request's word.
    pub(crate) async fn send(
        &self,
        form: &dyn WordForm,
        requests: &[Request<'_>],
    ) -> Result<Vec<Word>, RedisStoreError> {
        let script = form.script(&self.scripts, &self.order);
        let (reply, sent) = self
            .call_words(script, requests, |r| form.check_arg(r))
            .await?;
        self.read(sent, |reading| form.words(&reply, requests.len(), reading))
    }

    /// Calls a word script on `requests`: the key count, the keys, then
    /// each request's argument, `arg_of`, then (test clock) now and the
    /// shortest TTL. Returns the reply, and the `now` sent (0: Redis's
    /// clock) with the local time it was sent at.
    async fn call_words(
        &self,
        script: &DecisionScript,
        requests: &[Request<'_>],
        arg_of: impl Fn(&Request<'_>) -> RequestArg,
    ) -> Result<(redis::Value, (u64, u64)), RedisStoreError> {
        let Some(first) = requests.first() else {
            return Ok((redis::Value::Int(0), (0, 0)));
        };
        let (now, min_ttl_ms) = self.test_time();
        let sent_local = self.local_now();
        let count = 3 + 2 * requests.len();
        // The numbers of a request's argument, and two numbers of up to 20
        // digits under a test clock.
        let bytes = 60
            + requests
                .iter()
                .map(|r| r.key.len() + 1 + 3 * DIGITS + r.policy.state_descriptor().len())
                .sum::<usize>();
        let reply = self
            .eval(first.key, script, (count, bytes), |cmd| {
                cmd.arg(requests.len());
                for r in requests {
                    cmd.arg(r.key);
                }
                for r in requests {
                    cmd.arg(arg_of(r));
                }
                if now > 0 {
                    cmd.arg(now).arg(min_ttl_ms);
                }
            })
            .await?;
        Ok((reply, (now, sent_local)))
    }
}
