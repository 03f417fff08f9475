//! Header values made once for good: the texts a policy's responses repeat
//! (its name, its limits, and the numbers just below each limit), kept for
//! the life of the process, within a budget. A value over static bytes is
//! cloned and dropped without touching a reference count, which every
//! value over shared bytes does twice per response, with an atomic
//! instruction each time.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use http::header::HeaderValue;

use super::numbers::SMALL;

/// The most bytes the prebuilt texts of a process may hold: the windows of
/// a hundred-odd large limits, or thousands of names. Beyond it, values
/// are made as any other (over shared bytes, or in the thread's arena).
const BUDGET: usize = 1 << 20;

/// How far below a limit's capacity its numbers are prebuilt: the
/// `x-ratelimit-remaining` of a key that has used less than this of it
/// (what a rate-based algorithm shows for a key well within its rate).
const WINDOW: u64 = 256;

/// The texts, windows and other values kept so far, each once, and their
/// bytes.
struct Kept {
    texts: BTreeSet<&'static str>,
    windows: BTreeMap<u64, &'static [HeaderValue]>,
    values: BTreeMap<Box<str>, &'static (dyn Any + Send + Sync)>,
    bytes: usize,
}

static KEPT: Mutex<Kept> = Mutex::new(Kept {
    texts: BTreeSet::new(),
    windows: BTreeMap::new(),
    values: BTreeMap::new(),
    bytes: 0,
});

impl Kept {
    /// Counts `bytes` against the budget, if it allows them.
    fn spend(&mut self, bytes: usize) -> Option<()> {
        self.bytes = self.bytes.checked_add(bytes).filter(|b| *b <= BUDGET)?;
        Some(())
    }

    /// `text`, kept for good: the same static text for the same text.
    fn text(&mut self, text: &str) -> Option<&'static str> {
        if let Some(known) = self.texts.get(text) {
            return Some(known);
        }
        self.spend(text.len())?;
        let text: &'static str = Box::leak(Box::from(text));
        self.texts.insert(text);
        Some(text)
    }
}

fn kept() -> MutexGuard<'static, Kept> {
    KEPT.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The value `make` makes, kept for good as the value of `key`: the same
/// one for the same key, or `None` once the budget is spent. `held` is
/// what the value holds beyond its own size.
pub(crate) fn keep<T: Send + Sync + 'static>(
    key: &str,
    held: usize,
    make: impl FnOnce() -> T,
) -> Option<&'static T> {
    if let Some(known) = kept().values.get(key) {
        return known.downcast_ref();
    }
    // Made without the lock: making it may keep texts and windows.
    let value = make();
    let mut kept = kept();
    if let Some(known) = kept.values.get(key) {
        return known.downcast_ref();
    }
    kept.spend(std::mem::size_of::<T>() + held + key.len())?;
    let value: &'static T = Box::leak(Box::new(value));
    kept.values.insert(Box::from(key), value);
    Some(value)
}

/// `text` as a header value over static bytes, when it is a valid one and
/// the budget allows.
pub(crate) fn value(text: &str) -> Option<HeaderValue> {
    // What `HeaderValue` takes: visible ASCII, spaces and tabs, and
    // bytes above ASCII.
    let valid = |b: u8| b == b'\t' || (b >= 0x20 && b != 0x7f);
    if !text.bytes().all(valid) {
        return None;
    }
    let text = kept().text(text)?;
    HeaderValue::from_maybe_shared(Bytes::from_static(text.as_bytes())).ok()
}

/// The numbers from a little below a limit's capacity up to it, made once
/// as header values over static bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    lowest: u64,
    values: &'static [HeaderValue],
}

impl Window {
    /// The numbers up to `capacity`, down to [`WINDOW`] below it but not
    /// below [`SMALL`] (smaller ones are static anyway), or `None` when
    /// the budget is spent.
    pub(crate) fn below(capacity: u64) -> Option<Self> {
        let lowest = capacity.saturating_sub(WINDOW).max(SMALL);
        if lowest > capacity {
            return None;
        }
        let mut kept = kept();
        if let Some(values) = kept.windows.get(&capacity) {
            return Some(Self { lowest, values });
        }
        // One text of all the digits; each value is a slice of it.
        let mut digits = String::new();
        let mut ends = Vec::new();
        let mut buffer = itoa::Buffer::new();
        for n in lowest..=capacity {
            digits.push_str(buffer.format(n));
            ends.push(digits.len());
        }
        let count = ends.len();
        kept.spend(count * std::mem::size_of::<HeaderValue>())?;
        let digits = kept.text(&digits)?;
        let mut start = 0;
        let mut values = Vec::with_capacity(count);
        for end in ends {
            values.push(HeaderValue::from_static(digits.get(start..end)?));
            start = end;
        }
        let values: &'static [HeaderValue] = Box::leak(values.into_boxed_slice());
        kept.windows.insert(capacity, values);
        Some(Self { lowest, values })
    }

    /// `n` as a header value, if it is in the window.
    pub(crate) fn get(&self, n: u64) -> Option<HeaderValue> {
        let at = usize::try_from(n.checked_sub(self.lowest)?).ok()?;
        self.values.get(at).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text of `window`'s value of `n`, if it has one.
    fn text(window: &Window, n: u64) -> Option<String> {
        window
            .get(n)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    }

    #[test]
    fn a_window_holds_the_numbers_below_its_capacity() {
        // Across a power of ten: 999,999 is narrower than 1,000,000.
        let window = Window::below(1_000_000).expect("within the budget");
        for n in (1_000_000 - WINDOW)..=1_000_000 {
            assert_eq!(text(&window, n), Some(n.to_string()), "{n}");
        }
        assert_eq!(text(&window, 1_000_000 - WINDOW - 1), None);
        assert_eq!(text(&window, 1_000_001), None);
        // Not below the static numbers.
        let small = Window::below(10_100).expect("within the budget");
        assert_eq!(text(&small, 9_999), None);
        assert_eq!(text(&small, 10_000).as_deref(), Some("10000"));
        assert_eq!(text(&small, 10_100).as_deref(), Some("10100"));
        // Made once.
        let again = Window::below(1_000_000).expect("within the budget");
        assert!(std::ptr::eq(window.values, again.values));
    }

    #[test]
    fn values_are_kept_once_per_key() {
        let first = keep("test:a", 0, || 1_u32).expect("within the budget");
        let second = keep("test:a", 0, || 2_u32).expect("within the budget");
        assert!(std::ptr::eq(first, second));
        assert_eq!(*second, 1);
        // Another type under the same key is not mistaken for it.
        assert_eq!(keep("test:a", 0, || 3_u64), None);
    }

    #[test]
    fn texts_are_kept_once() {
        let first = kept().text("kept-once").expect("within the budget");
        let second = kept().text("kept-once").expect("within the budget");
        assert!(std::ptr::eq(first, second));
        assert!(value("not\na value").is_none());
    }
}
