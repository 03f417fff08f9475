//! Traffic logs: a CSV of `timestamp,key[,cost]` lines, read into one
//! phase.

use std::collections::HashMap;
use std::io::Read;
use std::str::FromStr;

use tollgate_core::Timestamp;

use super::{Arrival, Phase, Start, Workload};

/// A malformed line of a traffic log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct LineError {
    /// The 1-based line number.
    pub line: u64,
    /// What is wrong with it.
    pub reason: String,
}

/// Why a traffic log could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// A malformed line, in `--strict` mode.
    #[error(transparent)]
    Line(#[from] LineError),
    /// Reading failed.
    #[error("cannot read the traffic log: {0}")]
    Io(#[from] std::io::Error),
    /// No line could be used.
    #[error("the traffic log holds no request")]
    Empty,
    /// Every line that could hold a request was malformed.
    #[error("none of the traffic log's {skipped} lines holds a request; the first: {first}")]
    NoValidLine {
        /// The first malformed line and why.
        first: LineError,
        /// How many lines were malformed.
        skipped: u64,
    },
}

/// How numeric timestamps of a log are read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EpochUnit {
    /// Seconds below 10^11 (until the year 5138), milliseconds below 10^14
    /// (the same year), microseconds from there.
    #[default]
    Auto,
    /// Seconds, possibly with a fraction.
    Seconds,
    /// Milliseconds.
    Millis,
    /// Microseconds.
    Micros,
}

impl FromStr for EpochUnit {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "s" | "seconds" => Ok(Self::Seconds),
            "ms" | "millis" | "milliseconds" => Ok(Self::Millis),
            "us" | "micros" | "microseconds" => Ok(Self::Micros),
            _ => Err(format!(
                "unknown epoch unit {s:?}: expected auto, s, ms or us"
            )),
        }
    }
}

/// A traffic log, as read.
#[derive(Debug)]
pub struct Log {
    /// The requests, as one phase from the first timestamp.
    pub workload: Workload,
    /// The lines that were skipped, with the reason (at most
    /// [`Log::MAX_ERRORS`] kept; [`Log::skipped`] counts all).
    pub errors: Vec<LineError>,
    /// How many lines were skipped.
    pub skipped: u64,
}

impl Log {
    /// How many line errors are kept for the report.
    pub const MAX_ERRORS: usize = 100;

    /// Reads a CSV of `timestamp,key[,cost]` lines. Timestamps are RFC 3339
    /// (`2026-11-22T10:00:00.250Z`) or epoch seconds or milliseconds (see
    /// [`EpochUnit`]); a header line naming the columns is skipped, as are
    /// blank lines. Lines need not be in time order.
    ///
    /// A malformed line is skipped and reported with its line number, or,
    /// when `strict`, ends the read with [`LogError::Line`]. `progress` is
    /// called with the bytes read so far, every few thousand lines.
    ///
    /// ```
    /// use tollgate_sim::{EpochUnit, Log};
    ///
    /// let csv = "timestamp,key,cost\n1700000000,alice\n1700000000.5,bob,3\noops,carol\n";
    /// let log = Log::read(csv.as_bytes(), EpochUnit::Auto, false, |_| {})?;
    /// assert_eq!(log.workload.len(), 2);
    /// assert_eq!(log.errors[0].to_string(), "line 4: invalid timestamp \"oops\"");
    /// # Ok::<(), tollgate_sim::LogError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`LogError`] when reading fails, a line is malformed in strict mode,
    /// or no line holds a request.
    pub fn read(
        input: impl Read,
        unit: EpochUnit,
        strict: bool,
        mut progress: impl FnMut(u64),
    ) -> Result<Self, LogError> {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .trim(csv::Trim::All)
            .comment(Some(b'#'))
            .from_reader(input);
        let mut keys: Vec<String> = Vec::new();
        let mut ids: HashMap<String, u32> = HashMap::new();
        let mut rows: Vec<(u64, u32, u64)> = Vec::new();
        let mut errors = Vec::new();
        let mut skipped = 0;
        let mut record = csv::ByteRecord::new();
        let mut first = true;
        loop {
            let line = reader.position().line();
            let more = match reader.read_byte_record(&mut record) {
                Ok(more) => more,
                Err(e) => match e.kind() {
                    csv::ErrorKind::Io(_) => {
                        return Err(LogError::Io(std::io::Error::other(e.to_string())));
                    }
                    _ => {
                        let error = LineError {
                            line,
                            reason: e.to_string(),
                        };
                        if strict {
                            return Err(error.into());
                        }
                        skipped += 1;
                        if errors.len() < Log::MAX_ERRORS {
                            errors.push(error);
                        }
                        continue;
                    }
                },
            };
            if !more {
                break;
            }
            let line = record.position().map_or(line, csv::Position::line);
            if line.is_multiple_of(16_384) {
                progress(record.position().map_or(0, csv::Position::byte));
            }
            let is_header = first
                && record
                    .get(0)
                    .is_some_and(|f| f.eq_ignore_ascii_case(b"timestamp"));
            first = false;
            if is_header || (record.len() == 1 && record.get(0).is_some_and(<[u8]>::is_empty)) {
                continue;
            }
            match parse_row(&record, unit) {
                Ok((at, key, cost)) => {
                    let id = match ids.get(key) {
                        Some(&id) => id,
                        None => {
                            let id = u32::try_from(keys.len()).unwrap_or(u32::MAX);
                            keys.push(key.to_owned());
                            ids.insert(key.to_owned(), id);
                            id
                        }
                    };
                    rows.push((at, id, cost));
                }
                Err(reason) => {
                    let error = LineError { line, reason };
                    if strict {
                        return Err(error.into());
                    }
                    skipped += 1;
                    if errors.len() < Log::MAX_ERRORS {
                        errors.push(error);
                    }
                }
            }
        }
        if rows.is_empty() {
            return Err(match errors.into_iter().next() {
                Some(first) => LogError::NoValidLine { first, skipped },
                None => LogError::Empty,
            });
        }
        rows.sort_by_key(|&(at, ..)| at);
        let start = rows[0].0;
        let arrivals = rows
            .into_iter()
            .map(|(at, key, cost)| Arrival {
                offset_us: at - start,
                key,
                cost,
            })
            .collect();
        let origin = Timestamp::from_micros(start);
        Ok(Log {
            workload: Workload {
                origin,
                keys,
                phases: vec![Phase {
                    start: Start::At(origin),
                    arrivals,
                }],
                retry: false,
            },
            errors,
            skipped,
        })
    }
}

/// One CSV row: (µs since the epoch, key, cost).
fn parse_row(record: &csv::ByteRecord, unit: EpochUnit) -> Result<(u64, &str, u64), String> {
    if record.len() < 2 || record.len() > 3 {
        return Err(format!(
            "expected timestamp,key[,cost], got {} fields",
            record.len()
        ));
    }
    let field = |i: usize| -> Result<&str, String> {
        std::str::from_utf8(record.get(i).unwrap_or_default())
            .map_err(|_| format!("field {} is not UTF-8", i + 1))
    };
    let time = field(0)?;
    let at = parse_timestamp(time, unit).ok_or_else(|| format!("invalid timestamp {time:?}"))?;
    let key = field(1)?;
    if key.is_empty() {
        return Err("empty key".to_owned());
    }
    let cost = match record.get(2) {
        None => 1,
        Some(_) => {
            let cost = field(2)?;
            cost.parse()
                .map_err(|_| format!("invalid cost {cost:?}: expected a whole number"))?
        }
    };
    Ok((at, key, cost))
}

/// The last µs of the year 9999: a later time is no log's.
const LATEST_US: u64 = 253_402_300_799_999_999;

/// µs since the epoch of an RFC 3339 or epoch timestamp, up to the end of
/// the year 9999.
fn parse_timestamp(text: &str, unit: EpochUnit) -> Option<u64> {
    let us =
        if text.bytes().next().is_some_and(|b| b.is_ascii_digit()) && !text.contains(['-', ':']) {
            parse_epoch(text, unit)?
        } else {
            let ts: jiff::Timestamp = text.parse().ok()?;
            u64::try_from(ts.as_microsecond()).ok()?
        };
    (us <= LATEST_US).then_some(us)
}

fn parse_epoch(text: &str, unit: EpochUnit) -> Option<u64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let whole: u64 = whole.parse().ok()?;
    if !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (scale, digits) = match unit {
        EpochUnit::Seconds => (1_000_000, 6),
        EpochUnit::Millis => (1_000, 3),
        EpochUnit::Micros => (1, 0),
        EpochUnit::Auto => match whole {
            ..100_000_000_000 => (1_000_000, 6),
            100_000_000_000..100_000_000_000_000 => (1_000, 3),
            _ => (1, 0),
        },
    };
    // Up to µs precision; further digits are dropped.
    let mut frac: u64 = 0;
    for i in 0..digits {
        let digit = fraction
            .as_bytes()
            .get(i)
            .map_or(0, |b| u64::from(b - b'0'));
        frac = frac * 10 + digit;
    }
    whole.checked_mul(scale)?.checked_add(frac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_in_every_accepted_form() {
        let t = 1_795_341_600_000_000; // 2026-11-22T10:00:00Z
        let auto = EpochUnit::Auto;
        assert_eq!(parse_timestamp("2026-11-22T10:00:00Z", auto), Some(t));
        assert_eq!(
            parse_timestamp("2026-11-22T11:00:00.25+01:00", auto),
            Some(t + 250_000)
        );
        assert_eq!(parse_timestamp("1795341600", auto), Some(t));
        assert_eq!(parse_timestamp("1795341600.000123", auto), Some(t + 123));
        assert_eq!(parse_timestamp("1795341600123", auto), Some(t + 123_000));
        assert_eq!(parse_timestamp("1795341600123.5", auto), Some(t + 123_500));
        assert_eq!(
            parse_timestamp("1795341600", EpochUnit::Millis),
            Some(t / 1_000)
        );
        assert_eq!(
            parse_timestamp("99999999999", EpochUnit::Seconds),
            Some(99_999_999_999_000_000)
        );
        for bad in [
            "",
            "yesterday",
            "1795341600.x",
            "2026-13-01T00:00:00Z",
            "-5",
            "1.2.3",
        ] {
            assert_eq!(parse_timestamp(bad, auto), None, "{bad}");
        }
        assert_eq!(
            parse_timestamp("18446744073709551615", EpochUnit::Seconds),
            None
        );
    }

    /// Epoch microseconds are read as such (they were read as ms: dates
    /// around the year 55,800, half a second apart read as 500 s), and a
    /// time past the year 9999 is no log's (it overflowed the arithmetic
    /// of windows).
    #[test]
    fn microseconds_are_microseconds_and_times_end_with_9999() {
        let t = 1_795_341_600_000_000; // 2026-11-22T10:00:00Z
        let auto = EpochUnit::Auto;
        assert_eq!(parse_timestamp("1795341600000000", auto), Some(t));
        assert_eq!(parse_timestamp("1795341600500000", auto), Some(t + 500_000));
        assert_eq!(
            parse_timestamp("1795341600", EpochUnit::Micros),
            Some(1_795_341_600)
        );
        assert_eq!("us".parse(), Ok(EpochUnit::Micros));
        let last_second = parse_timestamp("253402300799", EpochUnit::Seconds);
        assert_eq!(last_second, Some(LATEST_US - 999_999));
        assert_eq!(parse_timestamp("253402300800", EpochUnit::Seconds), None);
        assert_eq!(
            parse_timestamp("18446744073709551", EpochUnit::Millis),
            None
        );
        assert_eq!(parse_timestamp("10000-01-01T00:00:00Z", auto), None);
    }

    #[test]
    fn unsorted_lines_are_replayed_in_time_order() {
        let csv = "1700000002,b\n1700000000,a,4\n\n1700000001,c\n";
        let log = Log::read(csv.as_bytes(), EpochUnit::Auto, true, |_| {}).unwrap();
        let w = &log.workload;
        assert_eq!(w.keys, ["b", "a", "c"]);
        let arrivals: Vec<(u64, u32, u64)> = w.phases[0]
            .arrivals
            .iter()
            .map(|a| (a.offset_us, a.key, a.cost))
            .collect();
        assert_eq!(arrivals, [(0, 1, 4), (1_000_000, 2, 1), (2_000_000, 0, 1)]);
        assert_eq!(w.origin, Timestamp::from_secs(1_700_000_000));
        assert!(matches!(
            Log::read("".as_bytes(), EpochUnit::Auto, false, |_| {}),
            Err(LogError::Empty)
        ));
    }
}
