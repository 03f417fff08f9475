//! Reading a log line by line, in bounded memory.

use std::io::{self, BufRead};

use super::{AccessFormat, AccessRecord, MalformedLine, clf, json};

/// The longest line read, in bytes: a longer one is malformed, and the
/// rest of it is skipped without being held.
pub const MAX_LINE: usize = 16 * 1024;

/// How many malformed lines are kept as examples.
const SAMPLES: usize = 5;

/// A streaming reader of an access log: an iterator of its requests.
///
/// Malformed lines (not the format, not UTF-8, longer than [`MAX_LINE`],
/// a time or address that does not parse) are counted and skipped; the
/// iterator yields an error only when reading fails.
#[derive(Debug)]
pub struct AccessLog<R> {
    input: R,
    format: AccessFormat,
    buf: Vec<u8>,
    lines: u64,
    bytes: u64,
    malformed: u64,
    samples: Vec<MalformedLine>,
    times: clf::TimeCache,
}

impl<R: BufRead> AccessLog<R> {
    /// Reads `input` as a log of `format`.
    pub fn new(input: R, format: AccessFormat) -> Self {
        AccessLog {
            input,
            format,
            buf: Vec::with_capacity(512),
            lines: 0,
            bytes: 0,
            malformed: 0,
            samples: Vec::new(),
            times: clf::TimeCache::default(),
        }
    }

    /// The lines read so far, blank and malformed ones included.
    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// The bytes read so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The malformed lines skipped so far.
    pub fn malformed(&self) -> u64 {
        self.malformed
    }

    /// The first few malformed lines: their numbers and what is wrong.
    pub fn samples(&self) -> &[MalformedLine] {
        &self.samples
    }

    /// Reads one line into `buf`, at most [`MAX_LINE`] bytes of it;
    /// `Ok(None)` at the end, `Ok(Some(false))` for a line too long.
    fn read_line(&mut self) -> io::Result<Option<bool>> {
        self.buf.clear();
        let mut fits = true;
        let mut any = false;
        loop {
            let chunk = self.input.fill_buf()?;
            if chunk.is_empty() {
                return Ok(any.then_some(fits));
            }
            any = true;
            let (used, done) = match chunk.iter().position(|&b| b == b'\n') {
                Some(end) => (end + 1, true),
                None => (chunk.len(), false),
            };
            if fits {
                if self.buf.len() + used > MAX_LINE + 1 {
                    fits = false;
                    self.buf.clear();
                } else {
                    self.buf.extend_from_slice(&chunk[..used]);
                }
            }
            self.input.consume(used);
            self.bytes += used as u64;
            if done {
                return Ok(Some(fits));
            }
        }
    }

    fn skip(&mut self, reason: &'static str) {
        self.malformed += 1;
        if self.samples.len() < SAMPLES {
            self.samples.push(MalformedLine {
                line: self.lines,
                reason,
            });
        }
    }
}

impl<R: BufRead> Iterator for AccessLog<R> {
    type Item = io::Result<AccessRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let fits = match self.read_line() {
                Ok(Some(fits)) => fits,
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            };
            self.lines += 1;
            if !fits {
                self.skip("longer than the longest line read");
                continue;
            }
            let Ok(line) = std::str::from_utf8(&self.buf) else {
                self.skip("not UTF-8");
                continue;
            };
            let line = line.trim_end_matches(['\n', '\r']);
            if line.trim().is_empty() {
                continue;
            }
            let parsed = match self.format {
                AccessFormat::Common => clf::parse(line, false, &mut self.times),
                AccessFormat::Combined => clf::parse(line, true, &mut self.times),
                AccessFormat::JsonLines => json::parse(line),
            };
            match parsed {
                Ok(record) => return Some(Ok(record)),
                Err(reason) => self.skip(reason),
            }
        }
    }
}
