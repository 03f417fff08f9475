//! The word scripts on the wire: their arguments, replies, and the two
//! estimates their calls keep (which way the one-time script starts, and
//! Redis's clock).

use std::sync::atomic::{AtomicU32, Ordering};

use tollgate_core::{Clock, Policy};

use crate::connect::RedisConnection;
use crate::error::RedisStoreError;
use crate::script::{DecisionScript, SettleArgs};
use crate::shape::Form;
use crate::wire::{BLOCKED, Request, Wire, Word};

/// Which way the one-time script starts. Writing first (`SET ... NX GET`)
/// decides an idle key in one command but wastes work on a key that holds
/// a time; reading first (`GET`) costs an idle key one command more and
/// saves the rest more (`BENCHMARKS.md`, "Redis CPU per decision"). The
/// store writes first while fewer than a quarter of recent requests found
/// their key holding a time. Both ways decide exactly the same.
pub(crate) struct WriteOrder {
    fixed: Option<bool>,
    /// The share of recent requests whose key held a time, in 1/65,536,
    /// as a moving average over about 32 requests. Updated without a lock:
    /// a lost update only delays a switch.
    busy: AtomicU32,
}

impl WriteOrder {
    const SCALE: u32 = 1 << 16;
    /// A quarter: writing first saves an idle key a command and costs a
    /// busy key or a denial a dearer one, and by the instruction counts in
    /// `BENCHMARKS.md` ("Write order") it stops paying for denials first,
    /// at about this share.
    const THRESHOLD: u32 = Self::SCALE / 4;

    pub(crate) fn new(fixed: Option<bool>) -> Self {
        Self {
            fixed,
            busy: AtomicU32::new(0),
        }
    }

    fn write_first(&self) -> bool {
        self.fixed
            .unwrap_or_else(|| self.busy.load(Ordering::Relaxed) < Self::THRESHOLD)
    }

    fn observe(&self, words: &[Word]) {
        let mut share = self.busy.load(Ordering::Relaxed);
        for &(now, old) in words {
            share -= share / 32;
            if old > now {
                share += Self::SCALE / 32;
            }
        }
        self.busy.store(share, Ordering::Relaxed);
    }
}

/// Redis's clock as the store last saw it, for stamping the decisions
/// whose reply leaves out Redis's time: the one-time script answers a
/// single key whose time is ahead with the gap alone (see `lua/shape/tat.lua`),
/// which decides the request exactly; only [`Decision::now`] comes from
/// here. Kept as the offset in µs of Redis `TIME` from the store's
/// monotonic clock, taken from every reply that carries Redis's time, so
/// the estimate is within about half a round trip (plus, on a cluster, the
/// skew between nodes). Until such a reply, the system clock stands in.
pub(crate) struct RedisClock {
    offset: std::sync::atomic::AtomicI64,
}

impl RedisClock {
    /// Starts from the system clock, as the store's monotonic clock
    /// starts at 0.
    pub(crate) fn new() -> Self {
        let system = tollgate_core::SystemClock.now().as_micros();
        Self {
            offset: i64::try_from(system).unwrap_or(i64::MAX).into(),
        }
    }

    /// Redis said it was `redis_now` at about `local_now`.
    fn saw(&self, redis_now: u64, local_now: u64) {
        let offset = i64::try_from(redis_now)
            .unwrap_or(i64::MAX)
            .saturating_sub_unsigned(local_now);
        self.offset.store(offset, Ordering::Relaxed);
    }

    /// Redis's time at `local_now`, as estimated.
    pub(crate) fn at(&self, local_now: u64) -> u64 {
        local_now.saturating_add_signed(self.offset.load(Ordering::Relaxed))
    }
}

impl<C: RedisConnection> Wire<C> {
    /// Decides `requests` of one-time policies in one call of the one-time
    /// script, in order, and returns each request's word.
    pub(super) async fn send_tats(
        &self,
        requests: &[Request<'_>],
    ) -> Result<Vec<Word>, RedisStoreError> {
        let script = self.scripts.tat(self.order.write_first());
        // Per request: the step and the slack.
        let (reply, now) = self
            .call_words(script, requests, 2, |cmd, r| {
                cmd.arg(r.step).arg(r.slack);
            })
            .await?;
        let words = self.tat_words(&reply, now, requests.len())?;
        self.order.observe(&words);
        Ok(words)
    }

    /// The words of a reply of the one-time script to `n` requests sent
    /// at `now` (0 on Redis's clock).
    fn tat_words(
        &self,
        reply: &redis::Value,
        now: u64,
        n: usize,
    ) -> Result<Vec<Word>, RedisStoreError> {
        Ok(match words(reply, n)? {
            Reply::Words(words) => {
                if let (0, Some(&(redis_now, _))) = (now, words.first()) {
                    self.redis_clock.saw(redis_now, self.local_now());
                }
                words
            }
            Reply::Ahead(gap) => {
                // Under a test clock the script decided at the `now` sent.
                let now = match now {
                    0 => self.redis_clock.at(self.local_now()),
                    sent => sent,
                };
                let old = now.checked_add(gap).ok_or_else(|| {
                    RedisStoreError::Protocol(format!("a time {gap} µs ahead of {now}"))
                })?;
                vec![(now, old)]
            }
        })
    }

    /// Sends a settlement of a key of a word form, alone (the one-time
    /// script reading first): the key's word before it.
    pub(crate) async fn settle_word(
        &self,
        form: Form,
        key: &str,
        policy: &Policy,
        args: &SettleArgs,
    ) -> Result<Word, RedisStoreError> {
        let script = match form {
            Form::WindowWord => &self.scripts.window_word,
            _ => self.scripts.tat(false),
        };
        let (now, min_ttl_ms) = self.test_time();
        let bytes = 128 + key.len() + policy.state_descriptor().len();
        let reply = self
            .eval(key, script, (9, bytes), |cmd| {
                cmd.arg(1).arg(key);
                if form == Form::WindowWord {
                    cmd.arg(args.period);
                }
                cmd.arg(&args.step)
                    .arg(&args.slack)
                    .arg(policy.state_descriptor());
                if now > 0 {
                    cmd.arg(now).arg(min_ttl_ms);
                }
            })
            .await?;
        self.tat_words(&reply, now, 1)?
            .first()
            .copied()
            .ok_or_else(|| RedisStoreError::Protocol("no word in the reply".into()))
    }

    /// Blocks the key of `keys` (its state key, then a sliding log's sets)
    /// for `duration` µs: when the block ends, on Redis's clock.
    pub(crate) async fn block(
        &self,
        keys: &[String],
        duration: u64,
    ) -> Result<u64, RedisStoreError> {
        let Some(first) = keys.first() else {
            return Ok(0);
        };
        let (now, min_ttl_ms) = self.test_time();
        let reply = self
            .eval(first, &self.scripts.block, (8, 64 * keys.len()), |cmd| {
                cmd.arg(keys.len()).arg(keys).arg(duration);
                if now > 0 {
                    cmd.arg(now).arg(min_ttl_ms);
                }
            })
            .await?;
        match &reply {
            redis::Value::BulkString(text) => decimal(text),
            _ => None,
        }
        .ok_or_else(|| RedisStoreError::Protocol(format!("{reply:?}")))
    }

    /// Decides `requests` of window-word policies in one call of the
    /// window-word script, in order, and returns each request's word (0
    /// where its key held no count of the current window).
    pub(super) async fn send_window_words(
        &self,
        requests: &[Request<'_>],
    ) -> Result<Vec<Word>, RedisStoreError> {
        // Per request: the period, the step and the slack.
        let (reply, _) = self
            .call_words(&self.scripts.window_word, requests, 3, |cmd, r| {
                cmd.arg(r.period).arg(r.step).arg(r.slack);
            })
            .await?;
        // The script never replies a negative number (a gap), which only
        // the one-time script does.
        match words(&reply, requests.len())? {
            Reply::Words(words) => Ok(words),
            Reply::Ahead(_) => Err(RedisStoreError::Protocol(format!("{reply:?}"))),
        }
    }

    /// Calls a word script on `requests`: the key count, the keys, then
    /// per request the `numbers` arguments `numbers_of` adds and its
    /// descriptor, then (test clock) now and the shortest TTL. Returns the
    /// reply and the `now` sent (0: Redis's clock).
    async fn call_words(
        &self,
        script: &DecisionScript,
        requests: &[Request<'_>],
        numbers: usize,
        numbers_of: impl Fn(&mut redis::Cmd, &Request<'_>),
    ) -> Result<(redis::Value, u64), RedisStoreError> {
        let Some(first) = requests.first() else {
            return Ok((redis::Value::Int(0), 0));
        };
        let (now, min_ttl_ms) = self.test_time();
        // Numbers of up to 20 digits each.
        let count = 3 + (2 + numbers) * requests.len();
        let bytes = 60
            + requests
                .iter()
                .map(|r| r.key.len() + 20 * numbers + r.policy.state_descriptor().len())
                .sum::<usize>();
        let reply = self
            .eval(first.key, script, (count, bytes), |cmd| {
                cmd.arg(requests.len());
                for r in requests {
                    cmd.arg(r.key);
                }
                for r in requests {
                    numbers_of(cmd, r);
                    cmd.arg(r.policy.state_descriptor());
                }
                if now > 0 {
                    cmd.arg(now).arg(min_ttl_ms);
                }
            })
            .await?;
        Ok((reply, now))
    }
}

/// A reply of the one-time script, read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Each request's word, at Redis's `now`, which the reply carried.
    Words(Vec<Word>),
    /// One request, whose key's time was this many µs ahead of Redis's
    /// `now`, which the reply did not carry.
    Ahead(u64),
}

/// Reads a reply of the one-time script for `n` requests: `now` alone, as
/// a positive integer (no key's time was ahead of now); for one request
/// whose key's time was ahead, now minus that time, a negative integer; or
/// else the string `"<seconds> <microseconds> <old_1> ... <old_n>"`, now as
/// Redis `TIME` gave it.
pub(crate) fn words(reply: &redis::Value, n: usize) -> Result<Reply, RedisStoreError> {
    use redis::Value;
    let bad = || RedisStoreError::Protocol(format!("{reply:?}"));
    match reply {
        Value::Int(now) if *now >= 0 => Ok(Reply::Words(vec![(now.unsigned_abs(), 0); n])),
        Value::Int(gap) if n == 1 => Ok(Reply::Ahead(gap.unsigned_abs())),
        Value::BulkString(text) => {
            let mut fields = text.split(|&b| b == b' ');
            let now = match (
                fields.next().and_then(decimal),
                fields.next().and_then(decimal),
            ) {
                (Some(sec), Some(usec)) if usec < 1_000_000 => sec
                    .checked_mul(1_000_000)
                    .and_then(|s| s.checked_add(usec))
                    .ok_or_else(bad)?,
                _ => return Err(bad()),
            };
            let words = fields
                .map(|old| old_word(old).map(|old| (now, old)))
                .collect::<Option<Vec<Word>>>()
                .ok_or_else(bad)?;
            if words.len() == n {
                Ok(Reply::Words(words))
            } else {
                Err(bad())
            }
        }
        _ => Err(bad()),
    }
}

/// A non-empty run of ASCII digits as a `u64`, or `None`.
/// A request's old word in a reply: a decimal, or "b<until>" for a key
/// blocked until then, flagged [`BLOCKED`].
fn old_word(field: &[u8]) -> Option<u64> {
    match field.split_first() {
        Some((b'b', until)) => decimal(until).filter(|&u| u < BLOCKED).map(|u| u | BLOCKED),
        _ => decimal(field),
    }
}

fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        if d.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    #[test]
    fn replies_are_read_per_request() {
        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let read = |reply: Value, n| match words(&reply, n) {
            Ok(Reply::Words(words)) => words,
            other => panic!("{other:?}"),
        };
        assert_eq!(read(Value::Int(7), 3), vec![(7, 0); 3]);
        assert_eq!(
            read(text("2 5 0 3000009"), 2),
            vec![(2_000_005, 0), (2_000_005, 3_000_009)]
        );
        assert_eq!(
            read(text("1795000000 999999 1795000001000000"), 1),
            vec![(1_795_000_000_999_999, 1_795_000_001_000_000)]
        );
        assert_eq!(
            read(text("2 5 0 b3000009"), 2),
            vec![(2_000_005, 0), (2_000_005, 3_000_009 | BLOCKED)]
        );
        assert_eq!(words(&Value::Int(-9), 1).unwrap(), Reply::Ahead(9));
        assert_eq!(
            words(&Value::Int(i64::MIN), 1).unwrap(),
            Reply::Ahead(1 << 63)
        );
        for bad in [
            words(&text("2 5 0 9"), 3),
            words(&text("2 5 0 9"), 1),
            words(&text("2 5"), 1),
            words(&text("2"), 0),
            words(&text("2 1000000 9"), 1),
            words(&text("2 5 -9"), 1),
            words(&text("2 5 9 "), 1),
            words(&text("2  5 9"), 1),
            words(&text("2 5 1e9"), 1),
            words(&text("2 5 b"), 1),
            words(&text("2 5 bb9"), 1),
            words(&text("2 5 b9223372036854775808"), 1),
            words(&text("2 5 18446744073709551616"), 1),
            words(&text("18446744073710 5 9"), 1),
            // A gap is for one request alone.
            words(&Value::Int(-1), 2),
            words(&Value::Array(vec![Value::Int(7), Value::Int(9)]), 1),
            words(&Value::Nil, 1),
        ] {
            assert!(matches!(bad, Err(RedisStoreError::Protocol(_))), "{bad:?}");
        }
    }
}
