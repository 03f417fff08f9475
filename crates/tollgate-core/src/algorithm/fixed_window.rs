//! The fixed window: a count per window, windows aligned to multiples of
//! the period since the Unix epoch, or to a calendar's days, weeks or
//! months ([`LimitParams::window`]). Also the window-word compact form
//! ([`decide_window_word`]) a single fixed-window limit is kept in. Lua:
//! `fixed_window.lua`, and `window_word.lua` for the compact form.

use std::time::Duration;

use crate::algorithm::rule::{Rule, saved_count, saved_time, window_start};
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
    /// 1 µs, which denies as any count above the limit does). A window
    /// begun off the period's multiples (under a calendar since removed)
    /// is counted in the window starting at the multiple nearest its start,
    /// as [`end`](Self::end) takes it: its count is never read as time, nor
    /// its time as count.
    pub(crate) fn word(&self, p: &LimitParams) -> u64 {
        let period = p.period_us.max(1);
        let down = window_start(self.start, period);
        let start = match self.start - down <= down + period - self.start {
            true => down,
            false => down + period,
        };
        start + self.count.min(p.period_us.saturating_sub(1))
    }
}

impl FixedWindow {
    /// When the window ends: at the end of the window of `p` that starts
    /// nearest its start. For a window begun on one of `p`'s boundaries,
    /// the end of the window it began; for one begun under another calendar
    /// (its zone or offset changed since, say Berlin's months now counted in
    /// UTC), the end of the window of this one that stands for it (UTC's
    /// March for Berlin's, begun an hour apart), so that what it counted
    /// holds as long as either calendar's would, give or take the hours
    /// between them, and the key then starts afresh.
    fn end(&self, p: &LimitParams) -> u64 {
        self.stands_for(p).1
    }

    /// The window of `p` this one stands for: the one starting nearest its
    /// start (see [`end`](Self::end)).
    fn stands_for(&self, p: &LimitParams) -> (u64, u64) {
        let (start, end) = p.window(self.start);
        match self.start - start <= end - self.start {
            true => (start, end),
            false => p.window(end),
        }
    }

    /// Whether this window is over at `now`, and the window of `p` that
    /// holds `now`, starting at `ws`, begins afresh. A window begun before
    /// the period before `ws`'s (under another calendar) is over too: the
    /// Redis store sends its scripts the calendar bounds from that period
    /// on, and judges alike.
    fn over(&self, p: &LimitParams, now: u64, ws: u64) -> bool {
        if ws <= self.start {
            return false;
        }
        if let Some([previous, ..]) = p.calendar_bounds(ws)
            && self.start < previous
        {
            return true;
        }
        now >= self.end(p)
    }
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
        // An empty window is as good as a fresh one (a store forgets it).
        if self.count == 0 || self.over(p, now, ws) {
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
        // Only a request reserved in the window this one stands for.
        let (from, to) = self.stands_for(p);
        if since >= from && since < to {
            self.count -= n.min(self.count);
        }
    }

    fn expires_at(&self, p: &LimitParams) -> u64 {
        if self.count == 0 { 0 } else { self.end(p) }
    }

    fn seeded(self, _p: &LimitParams, used: u64, _now: u64) -> Self {
        FixedWindow {
            start: self.start,
            count: used,
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
