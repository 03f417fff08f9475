//! The wait a refusal's text tells, in the words every refusal of ours
//! ends with ("..., retry in 10 s"): raised with the wait its headers tell,
//! when an outer layer raises that (see `headers::raise_wait`), so that a
//! client's message does not contradict its `retry-after`.

/// How the text tells its wait: these words, the whole seconds, then
/// [`SECONDS`], at its end.
const RETRY_IN: &[u8] = b"retry in ";

/// The unit after the number.
const SECONDS: &[u8] = b" s";

/// `text` with the whole seconds of the wait it ends by telling raised to
/// `secs`: `None` if it tells none, or not fewer.
pub(super) fn raised(text: &[u8], secs: u64) -> Option<Vec<u8>> {
    let told = text.strip_suffix(SECONDS)?;
    let digits = told.iter().rev().take_while(|b| b.is_ascii_digit()).count();
    let (head, digits) = told.split_at(told.len() - digits);
    if digits.is_empty() || !head.ends_with(RETRY_IN) {
        return None;
    }
    // Past u64, the text tells more than any wait.
    let told: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    if told >= secs {
        return None;
    }
    let mut out = head.to_vec();
    out.extend_from_slice(itoa::Buffer::new().format(secs).as_bytes());
    out.extend_from_slice(SECONDS);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::raised;

    #[test]
    fn the_closing_wait_is_raised_and_nothing_else() {
        let text =
            |t: &str, secs| raised(t.as_bytes(), secs).map(|r| String::from_utf8(r).unwrap());
        assert_eq!(
            text("limit 'a' exceeded, retry in 10 s", 60).as_deref(),
            Some("limit 'a' exceeded, retry in 60 s")
        );
        assert_eq!(
            text(
                "blocked under 'retry in 3 s' by an operator, retry in 9 s",
                10
            )
            .as_deref(),
            Some("blocked under 'retry in 3 s' by an operator, retry in 10 s")
        );
        // Already as long or longer, or no wait told at its end.
        assert_eq!(text("limit 'a' exceeded, retry in 60 s", 60), None);
        assert_eq!(text("limit 'a' exceeded, retry in 90 s", 60), None);
        assert_eq!(
            text("limit 'a' exceeded; it can never be admitted", 60),
            None
        );
        assert_eq!(text("retry in  s", 60), None);
        assert_eq!(text("retry in 1 min", 60), None);
        assert_eq!(text("", 60), None);
        // More digits than a u64 holds: told more than any wait.
        assert_eq!(text("retry in 99999999999999999999999 s", u64::MAX), None);
        assert_eq!(
            text("retry in 1 s", u64::MAX).as_deref(),
            Some("retry in 18446744073709551615 s")
        );
    }
}
