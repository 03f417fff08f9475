//! Header values of numbers, made without allocating: what the
//! rate-limit headers and `Retry-After` carry.

use std::cell::RefCell;
use std::sync::LazyLock;

use bytes::{Bytes, BytesMut};
use http::header::HeaderValue;

/// The decimal digits of 0 to 9,999, back to back, built and checked at
/// compile time: header values of small numbers point into it instead of
/// allocating.
static DIGITS: &str = match std::str::from_utf8(&DIGIT_BYTES) {
    Ok(digits) => digits,
    // Unreachable (the bytes are ASCII digits); `number` then formats.
    Err(_) => "",
};
static DIGIT_BYTES: [u8; DIGITS_LEN] = digits();

/// The numbers below this are slices of [`DIGITS`].
pub(crate) const SMALL: u64 = 10_000;
const DIGITS_LEN: usize = 10 + 90 * 2 + 900 * 3 + 9_000 * 4;

const fn digits() -> [u8; DIGITS_LEN] {
    let mut out = [0u8; DIGITS_LEN];
    let (mut n, mut at) = (0, 0);
    while n < SMALL {
        let width = digits_of(n);
        let (mut i, mut rest) = (width, n);
        while i > 0 {
            i -= 1;
            out[at + i] = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        at += width;
        n += 1;
    }
    out
}

const fn digits_of(n: u64) -> usize {
    match n {
        0..10 => 1,
        10..100 => 2,
        100..1_000 => 3,
        _ => 4,
    }
}

/// The numbers below this have a header value made once, in [`VALUES`].
const MADE: u64 = 256;

/// The header values of 0 to [`MADE`] - 1: a copy of one costs no checking
/// of its bytes. The `used` of a policy with a large capacity, and both
/// figures of one with a small capacity, are mostly among them.
static VALUES: LazyLock<[HeaderValue; MADE as usize]> =
    LazyLock::new(|| std::array::from_fn(|n| sliced(n as u64)));

/// `n` as a header value, without allocating: a number below 10,000 is a
/// slice of the static table, a larger one is written into this thread's
/// [arena](in_arena).
pub(crate) fn number(n: u64) -> HeaderValue {
    if let Some(value) = usize::try_from(n).ok().and_then(|n| VALUES.get(n)) {
        return value.clone();
    }
    sliced(n)
}

/// [`number`], without [`VALUES`].
fn sliced(n: u64) -> HeaderValue {
    if n < SMALL {
        let width = digits_of(n);
        let start = match width {
            1 => n,
            2 => 10 + (n - 10) * 2,
            3 => 190 + (n - 100) * 3,
            _ => 2_890 + (n - 1_000) * 4,
        } as usize;
        if let Some(text) = DIGITS.get(start..start + width) {
            return HeaderValue::from_static(text);
        }
    }
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(n).as_bytes();
    let bytes = in_arena(digits).unwrap_or_else(|| Bytes::copy_from_slice(digits));
    HeaderValue::from_maybe_shared(bytes).unwrap_or_else(|_| HeaderValue::from(n))
}

/// The size of a thread's arena: about a thousand responses' numbers.
const ARENA_SIZE: usize = 16 * 1024;

thread_local! {
    /// The free end of this thread's arena.
    static ARENA: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// `text` copied into this thread's arena, a buffer the header values of
/// many responses share: each value is a slice of it that holds a
/// reference to the buffer, so making one costs a reference count, not an
/// allocation. When the arena is full, it is taken back if no value points
/// into it any more, and replaced otherwise (the values still in use keep
/// the old one alive until they are dropped). `None` while the thread is
/// being torn down.
fn in_arena(text: &[u8]) -> Option<Bytes> {
    ARENA
        .try_with(|arena| {
            let mut arena = arena.try_borrow_mut().ok()?;
            if arena.capacity() < text.len() {
                arena.reserve(ARENA_SIZE);
            }
            arena.extend_from_slice(text);
            Some(arena.split().freeze())
        })
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_their_decimal_digits() {
        // Every small number is a slice of the table, not formatted.
        assert_eq!(DIGITS.len(), DIGITS_LEN);
        for n in (0..12_000).chain([u64::MAX, 1_795_341_660]) {
            assert_eq!(number(n).to_str().ok(), Some(n.to_string().as_str()), "{n}");
        }
    }

    #[test]
    fn values_in_the_arena_stay_whole_when_it_is_taken_back_or_replaced() {
        // Seven digits each: 20,000 of them fill the arena several times.
        let n = |i: u64| 1_000_000 + i * 7;
        // Dropped at once: a full arena is taken back.
        for i in 0..20_000 {
            assert_eq!(number(n(i)).to_str().ok(), Some(n(i).to_string().as_str()));
        }
        // Kept: a full arena is replaced, and the values stay whole.
        let kept: Vec<HeaderValue> = (0..20_000).map(|i| number(n(i))).collect();
        for (i, value) in (0..).zip(&kept) {
            assert_eq!(value.to_str().ok(), Some(n(i).to_string().as_str()));
        }
    }
}
