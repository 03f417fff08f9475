//! Reading a word script's reply: the words of its requests, or the gap
//! of one request whose key's time was ahead.

use crate::error::RedisStoreError;
use crate::op::word::{BLOCKED, FENCED, Reading, Word};

/// The words of a reply to `n` requests: a gap is read against the `now`
/// sent or, on Redis's clock, against Redis's clock as estimated; a reply
/// that carries Redis's time updates the estimate.
pub(crate) fn words_at(
    reply: &redis::Value,
    n: usize,
    reading: &Reading<'_>,
) -> Result<Vec<Word>, RedisStoreError> {
    let now = reading.sent_now;
    Ok(match words(reply, n)? {
        Reply::Words(words) => {
            if let (0, Some(&(redis_now, _))) = (now, words.first()) {
                reading.redis_clock.saw(redis_now, (reading.local_now)());
            }
            words
        }
        Reply::Ahead(gap) => {
            // Under a test clock the script decided at the `now` sent. On
            // Redis's clock, its estimate when the call was sent, which is
            // never later than when the script ran: a settlement of this
            // decision meets the fence of a reset that ran after it.
            let now = match now {
                0 => reading.redis_clock.at(reading.sent_local),
                sent => sent,
            };
            let old = now.checked_add(gap).ok_or_else(|| {
                RedisStoreError::Protocol(format!("a time {gap} µs ahead of {now}"))
            })?;
            vec![(now, old)]
        }
    })
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

/// Reads a reply of a word script for `n` requests: `now` alone, as a
/// positive integer (no key's word counted); for one request whose key's
/// time was ahead, now minus that time, a negative integer (the one-time
/// script only); an array of integers, now and each request's word, minus
/// the end of the block for a blocked key (flagged [`BLOCKED`]); for a
/// settlement that changed nothing (a refund that a fence dropped, or a
/// settlement that another configuration dropped), `now`, the word and 0
/// (flagged [`FENCED`]); or the
/// string `"<seconds> <microseconds> <word_1> ... <word_n>"`, now as Redis
/// `TIME` gave it and each word in decimal or as `0x` and hexadecimal (the
/// window-word script's reply to one request).
pub(crate) fn words(reply: &redis::Value, n: usize) -> Result<Reply, RedisStoreError> {
    use redis::Value;
    let bad = || RedisStoreError::Protocol(format!("{reply:?}"));
    match reply {
        Value::Int(now) if *now >= 0 => Ok(Reply::Words(vec![(now.unsigned_abs(), 0); n])),
        Value::Int(gap) if n == 1 => Ok(Reply::Ahead(gap.unsigned_abs())),
        // A settlement that changed nothing (a refund behind a fence, or
        // a settlement of a key kept under another configuration):
        // `{now, word, 0}`.
        Value::Array(items) if n == 1 && items.len() == 3 => match items[..] {
            [Value::Int(now), Value::Int(word), Value::Int(0)] if now >= 0 && word >= 0 => {
                let word = word.unsigned_abs();
                (word < FENCED)
                    .then(|| Reply::Words(vec![(now.unsigned_abs(), word | FENCED)]))
                    .ok_or_else(bad)
            }
            _ => Err(bad()),
        },
        Value::Array(items) if items.len() == n + 1 => {
            let now = match items[0] {
                Value::Int(now) if now >= 0 => now.unsigned_abs(),
                _ => return Err(bad()),
            };
            items[1..]
                .iter()
                .map(|item| match *item {
                    Value::Int(old) if old >= 0 => Some((now, old.unsigned_abs())),
                    Value::Int(until) if until.unsigned_abs() < BLOCKED => {
                        Some((now, until.unsigned_abs() | BLOCKED))
                    }
                    _ => None,
                })
                .collect::<Option<Vec<Word>>>()
                .map(Reply::Words)
                .ok_or_else(bad)
        }
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
                .map(|old| number(old).map(|old| (now, old)))
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

/// A word in a string reply: decimal, or `0x` and hexadecimal, below 2^63.
fn number(field: &[u8]) -> Option<u64> {
    let n = match field.strip_prefix(b"0x") {
        Some(hex) if !hex.is_empty() && hex.iter().all(u8::is_ascii_hexdigit) => {
            u64::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?
        }
        Some(_) => return None,
        None => decimal(field)?,
    };
    (n < BLOCKED).then_some(n)
}

/// A non-empty run of ASCII digits as a `u64`, or `None`.
pub(crate) fn decimal(digits: &[u8]) -> Option<u64> {
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

    /// A gap is stamped with Redis's clock as estimated when the call was
    /// sent, never later than when the script ran; the offset is learned
    /// from the replies that carry Redis's time, when they are read.
    #[test]
    fn a_gap_is_stamped_with_the_estimate_made_when_the_call_was_sent() {
        use crate::wire::{RedisClock, WriteOrder};
        let (redis_clock, order) = (RedisClock::new(), WriteOrder::new(None));
        let read = |reply: Value, sent_local: u64, read_at: u64| {
            let local_now = move || read_at;
            let reading = Reading {
                sent_now: 0,
                sent_local,
                order: &order,
                redis_clock: &redis_clock,
                local_now: &local_now,
            };
            words_at(&reply, 1, &reading).unwrap()
        };
        // Redis said 5,000,000 µs in a reply read at 1,000 µs local.
        assert_eq!(read(Value::Int(5_000_000), 0, 1_000), vec![(5_000_000, 0)]);
        // Sent at 2,000 µs local, read at 9,000: stamped at 5,001,000,
        // 9 µs behind a key's time 5,001,009.
        assert_eq!(
            read(Value::Int(-9), 2_000, 9_000),
            vec![(5_001_000, 5_001_009)]
        );
    }

    #[test]
    fn replies_are_read_per_request() {
        let ints = |v: &[i64]| Value::Array(v.iter().map(|&i| Value::Int(i)).collect());
        let read = |reply: Value, n| match words(&reply, n) {
            Ok(Reply::Words(words)) => words,
            other => panic!("{other:?}"),
        };
        assert_eq!(read(Value::Int(7), 3), vec![(7, 0); 3]);
        assert_eq!(
            read(ints(&[2_000_005, 0, 3_000_009]), 2),
            vec![(2_000_005, 0), (2_000_005, 3_000_009)]
        );
        assert_eq!(
            read(ints(&[1_795_000_000_999_999, 1_795_000_001_000_000]), 1),
            vec![(1_795_000_000_999_999, 1_795_000_001_000_000)]
        );
        assert_eq!(
            read(ints(&[2_000_005, 0, -3_000_009]), 2),
            vec![(2_000_005, 0), (2_000_005, 3_000_009 | BLOCKED)]
        );
        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert_eq!(
            read(text("2 5 0x0000000002dc6c9"), 1),
            vec![(2_000_005, 3_000_009)]
        );
        assert_eq!(
            read(text("2 5 0 3000009"), 2),
            vec![(2_000_005, 0), (2_000_005, 3_000_009)]
        );
        assert_eq!(
            read(ints(&[2_000_005, 3_000_009, 0]), 1),
            vec![(2_000_005, 3_000_009 | FENCED)]
        );
        assert_eq!(words(&Value::Int(-9), 1).unwrap(), Reply::Ahead(9));
        assert_eq!(
            words(&Value::Int(i64::MIN), 1).unwrap(),
            Reply::Ahead(1 << 63)
        );
        for bad in [
            words(&ints(&[2, 0, 9]), 3),
            words(&ints(&[2, 0, 9]), 1),
            words(&ints(&[2, -9, 0]), 1),
            words(&ints(&[2, 1 << 62, 0]), 1),
            words(&ints(&[2]), 1),
            words(&ints(&[]), 0),
            words(&ints(&[-2, 9]), 1),
            words(&ints(&[2, i64::MIN]), 1),
            words(
                &Value::Array(vec![Value::Int(2), Value::BulkString(b"9".to_vec())]),
                1,
            ),
            words(&text("2 5 0 9"), 3),
            words(&text("2 5"), 1),
            words(&text("2 1000000 9"), 1),
            words(&text("2 5 -9"), 1),
            words(&text("2 5 9 "), 1),
            words(&text("2 5 0x"), 1),
            words(&text("2 5 0xg"), 1),
            words(&text("2 5 0x8000000000000000"), 1),
            words(&text("2 5 b9"), 1),
            // A gap is for one request alone.
            words(&Value::Int(-1), 2),
            words(&Value::Nil, 1),
        ] {
            assert!(matches!(bad, Err(RedisStoreError::Protocol(_))), "{bad:?}");
        }
    }
}
