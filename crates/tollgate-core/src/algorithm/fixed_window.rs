//! The fixed window: a count per window, windows aligned to multiples of
//! the period since the Unix epoch, or to a calendar's days, weeks or
//! months ([`LimitParams::window`]). Also the window-word compact form
//! ([`decide_window_word`]) a single fixed-window limit is kept in. Lua:
//! `fixed_window.lua`, and `window_word.lua` for the compact form.

use std::time::Duration;

use crate::algorithm::rule::{Rule, Seen, saved_count, saved_time, window_start};
use crate::decision::{Decision, LimitStatus, Outcome};
use crate::policy::{LimitParams, MAX_SPAN_US, Policy};
use crate::time::Timestamp;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FixedWindow {
    /// Start of the window, a multiple of the period (or a calendar
    /// period's start).
    pub(crate) start: u64,
    /// Cost admitted in the window.
    pub(crate) count: u64,
}

impl FixedWindow {
    /// The state a window word holds: the word rounded down to a multiple
    /// of the period is the window's start, the rest its count.
    pub(crate) fn from_word(word: u64, p: &LimitParams) -> Self {
        let start = window_start(word, p.period_us.max(1));
        FixedWindow {
            start,
            count: word - start,
        }
    }

    /// The window word of this state (a count at most the period less
    /// 1 µs, which denies as any count above the limit does).
    pub(crate) fn word(&self, p: &LimitParams) -> u64 {
        self.start + self.count.min(p.period_us.saturating_sub(1))
    }
}

impl FixedWindow {
    /// When the window ends: the end of the window that holds its start.
    fn end(&self, p: &LimitParams) -> u64 {
        p.window(self.start).1
    }

    /// Whether advancing to `now` would move the window's start to
    /// another calendar's window (see [`realigned`]), as
    /// `fixed_window.lua` then stores the state whatever the decision.
    pub(crate) fn realigns(&self, p: &LimitParams, now: u64) -> bool {
        p.window(now).0 != self.start
            && (beyond_bounds(self.start, p, now) || realigned(self.start, p, now) != self.start)
    }
}

/// Whether a calendar window starting at `start` begins after the periods
/// around `now` that the Redis store sends its scripts (two periods or
/// more ahead: the clock stepped back since it was written), which they
/// cannot place.
fn beyond_bounds(start: u64, p: &LimitParams, now: u64) -> bool {
    p.calendar_bounds(now)
        .is_some_and(|[.., last]| start >= last)
}

impl Rule for FixedWindow {
    fn fresh(p: &LimitParams, now: u64) -> Self {
        FixedWindow {
            start: p.window(now).0,
            count: 0,
        }
    }

    fn advance(&mut self, p: &LimitParams, now: u64) {
        let ws = p.window(now).0;
        if ws == self.start {
            return;
        }
        // A calendar window two periods or more ahead (the clock stepped
        // back): moved to now's window, its count kept, as
        // `fixed_window.lua` does, which cannot place it.
        if beyond_bounds(self.start, p, now) {
            self.start = ws;
            return;
        }
        // A store that does not tell calendars apart (a saved state keeps
        // no calendar) carries nothing over: realigned here too.
        self.start = realigned(self.start, p, now);
        if ws > self.start {
            self.start = ws;
            self.count = 0;
        }
    }

    fn status(&self, p: &LimitParams, now: u64, _queue_free: u64) -> (u64, u64) {
        (
            p.limit.count().saturating_sub(self.count),
            self.end(p).saturating_sub(now),
        )
    }

    fn admits(&self, p: &LimitParams, now: u64, cost: u64, _queue_free: u64) -> Result<(), u64> {
        if self.count + cost <= p.limit.count() {
            Ok(())
        } else {
            Err(self.end(p).saturating_sub(now))
        }
    }

    fn commit(&mut self, _p: &LimitParams, _now: u64, cost: u64, _queue_free: u64) {
        self.count += cost;
    }

    fn charge(&mut self, _p: &LimitParams, _now: u64, n: u64, _queue_free: u64) {
        self.count = (self.count + n).min(MAX_SPAN_US);
    }

    fn refund(&mut self, p: &LimitParams, _now: u64, n: u64, since: u64) {
        if p.window(since).0 == self.start {
            self.count -= n.min(self.count);
        }
    }

    fn expires_at(&self, p: &LimitParams) -> u64 {
        if self.count == 0 { 0 } else { self.end(p) }
    }

    /// As `realigned` takes a window begun under another calendar.
    fn carried(self, _old: &LimitParams, new: &LimitParams, now: u64) -> Self {
        FixedWindow {
            start: realigned(self.start, new, now),
            count: self.count,
        }
    }

    fn seeded(self, _p: &LimitParams, seen: Seen, _now: u64) -> Self {
        FixedWindow {
            start: self.start,
            count: seen.used,
        }
    }

    fn save(&self, out: &mut Vec<u64>) {
        out.extend([self.start, self.count]);
    }

    fn load(_p: &LimitParams, words: &mut std::slice::Iter<'_, u64>) -> Option<Self> {
        Some(Self {
            start: saved_time(words)?,
            count: saved_count(words)?,
        })
    }
}

/// `start`, a window's start, as the start of a window of `p`: as it is on
/// one of `p`'s boundaries. A window begun under another calendar (a zone
/// or offset changed, or a calendar added or removed) is taken for the
/// window of `p` that starts nearest its start, if that has begun by
/// `now` (Berlin's March, begun on Feb 28 at 23:00 UTC, for UTC's March),
/// and else for the one that holds its start: its count holds there, and
/// the key starts afresh after it. So a change made before the nearest
/// window began (within the hours between the two calendars of the old
/// window's start) starts the key afresh at that window; and a start is
/// moved at each change, so calendars changed in turn, each within hours,
/// can move it on by those hours each time. A start off the calendar bounds the Redis store sends (the
/// period before `now`'s to the one after the next) is left as it is, as
/// the scripts leave it (`fixed_window.lua`, `carry.lua`).
fn realigned(start: u64, p: &LimitParams, now: u64) -> u64 {
    let (from, to) = p.window(start);
    if from == start {
        return start;
    }
    if let Some([previous, .., last]) = p.calendar_bounds(now)
        && (start < previous || start >= last)
    {
        return start;
    }
    let nearest = match start - from <= to - start {
        true => from,
        false => to,
    };
    if nearest <= now { nearest } else { from }
}

/// When the window of a window word ends, or 0 if it counts nothing (it
/// may be forgotten at once).
pub(crate) fn window_word_end(word: u64, period: u64) -> u64 {
    let count = word % period;
    if count == 0 { 0 } else { word - count + period }
}

/// [`PolicyState::decide`](crate::state::PolicyState::decide) for a policy
/// of [`Shape::WindowWord`](crate::Shape::WindowWord), whose state is a
/// window word: the window's start plus the cost counted in it (0 for a
/// new key, and a word of an earlier window means the same). The same
/// arithmetic, without building a
/// [`PolicyState`](crate::state::PolicyState); a property test holds the
/// two equal. An admitted request adds its cost to `word`, or starts it
/// afresh at the current window; nothing else changes it.
///
/// ```
/// use tollgate_core::{Algorithm, Policy, Timestamp};
/// use tollgate_core::state::decide_window_word;
///
/// let policy = Policy::new("api", Algorithm::FixedWindow, "2/min")?;
/// let now = Timestamp::from_secs(1_700_000_010); // 30 s before a minute ends
/// let mut word = 0;
/// assert!(decide_window_word(&policy, &mut word, now, 1).is_allowed());
/// // The minute's start, plus one request.
/// assert_eq!(word, Timestamp::from_secs(1_699_999_980).as_micros() + 1);
/// assert!(decide_window_word(&policy, &mut word, now, 1).is_allowed());
/// let third = decide_window_word(&policy, &mut word, now, 1);
/// assert_eq!(third.retry_after().unwrap().as_secs(), 30);
/// # Ok::<(), tollgate_core::ConfigError>(())
/// ```
#[inline(always)]
pub fn decide_window_word(policy: &Policy, word: &mut u64, now: Timestamp, cost: u64) -> Decision {
    let Some(p) = policy.params().first() else {
        return Decision::new(policy, Outcome::Allowed, now, Duration::ZERO, []);
    };
    let (n, period, now_us) = (p.limit.count(), p.period_us.max(1), now.as_micros());
    // The word's window and count, rolled on to now's window if that is
    // later (as `advance` does).
    let (mut start, mut count) = (window_start(*word, period), *word % period);
    let current = window_start(now_us, period);
    if current > start {
        (start, count) = (current, 0);
    }
    let reset = (start + period).saturating_sub(now_us);
    let status = |count: u64, retry: Option<u64>| {
        LimitStatus::from_micros(
            0,
            p.limit,
            p.capacity,
            n.saturating_sub(count),
            reset,
            retry,
        )
    };
    if cost > p.capacity {
        let outcome = Outcome::CostExceedsCapacity {
            cost,
            capacity: p.capacity,
        };
        return Decision::single(outcome, now, Duration::ZERO, status(count, None), cost);
    }
    if cost > 0 && count + cost > n {
        let outcome = Outcome::Limited {
            retry_after: Duration::from_micros(reset),
        };
        return Decision::single(
            outcome,
            now,
            Duration::ZERO,
            status(count, Some(reset)),
            cost,
        );
    }
    if cost > 0 {
        count += cost;
        *word = start + count;
    }
    Decision::single(
        Outcome::Allowed,
        now,
        Duration::ZERO,
        status(count, None),
        cost,
    )
}
