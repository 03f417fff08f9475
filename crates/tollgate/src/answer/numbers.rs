//! Header values of numbers, made without formatting: what the
//! rate-limit headers and `Retry-After` carry.

use bytes::Bytes;
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

const SMALL: u64 = 10_000;
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

/// `n` as a header value, without allocating below 10,000 and with one
/// allocation above (`HeaderValue::from(n)` makes two: a buffer with room
/// to spare, then a box to share it).
pub(crate) fn number(n: u64) -> HeaderValue {
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
    // Copied to a buffer of its exact length, which `Bytes` takes as it is.
    let digits = Bytes::copy_from_slice(itoa::Buffer::new().format(n).as_bytes());
    HeaderValue::from_maybe_shared(digits).unwrap_or_else(|_| HeaderValue::from(n))
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
}
