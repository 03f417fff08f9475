//! How long a request may wait in waiting mode: the layer's `max_wait`, or
//! less if the request carries a deadline of its own (gRPC's
//! `grpc-timeout`), so that it never waits for admission past the time
//! its caller gives up on it.

use std::time::Duration;

use http::HeaderMap;

/// `max_wait`, or the request's own `grpc-timeout` if that is shorter. A
/// `grpc-timeout` that is not one (of gRPC's form: up to eight digits and
/// a unit, `H`, `M`, `S`, `m`, `u` or `n`) is not a deadline, and leaves
/// `max_wait` as it is.
pub(super) fn max_wait(headers: &HeaderMap, max_wait: Duration) -> Duration {
    let timeout = headers
        .get("grpc-timeout")
        .and_then(|v| grpc_timeout(v.as_bytes()));
    timeout.map_or(max_wait, |timeout| timeout.min(max_wait))
}

/// The duration of a `grpc-timeout` value, per gRPC over HTTP/2:
/// `TimeoutValue TimeoutUnit`, one to eight ASCII digits then one unit.
fn grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // Eight digits at most: no overflow in u64, nor below.
    let count = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(count * 3_600),
        b'M' => Duration::from_secs(count * 60),
        b'S' => Duration::from_secs(count),
        b'm' => Duration::from_millis(count),
        b'u' => Duration::from_micros(count),
        b'n' => Duration::from_nanos(count),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_of_every_unit_and_none_that_is_malformed() {
        let parse = |text: &str| grpc_timeout(text.as_bytes());
        assert_eq!(parse("1H"), Some(Duration::from_secs(3_600)));
        assert_eq!(parse("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse("30S"), Some(Duration::from_secs(30)));
        assert_eq!(parse("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse("99999999n"), Some(Duration::from_nanos(99_999_999)));
        assert_eq!(
            parse("99999999H"),
            Some(Duration::from_secs(99_999_999 * 3_600))
        );
        for bad in [
            "",
            "S",
            "100",
            "123456789S",
            "1.5S",
            "-1S",
            "10s",
            "10 S",
            "+5m",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_shorter_of_the_two_waits() {
        let mut headers = HeaderMap::new();
        let max = Duration::from_secs(30);
        assert_eq!(max_wait(&headers, max), max);
        headers.insert("grpc-timeout", "100m".parse().unwrap());
        assert_eq!(max_wait(&headers, max), Duration::from_millis(100));
        headers.insert("grpc-timeout", "1H".parse().unwrap());
        assert_eq!(max_wait(&headers, max), max);
        headers.insert("grpc-timeout", "soon".parse().unwrap());
        assert_eq!(max_wait(&headers, max), max);
    }
}
