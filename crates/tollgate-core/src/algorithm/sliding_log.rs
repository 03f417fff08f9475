//! The sliding log: every admitted request of the last period, so exactly
//! the limit in any period-long interval. Lua: `sliding_log.lua`.

use std::collections::VecDeque;

use crate::algorithm::rule::{MAX_SAVED_COUNT, Rule, Seen, saved_count, saved_time};
use crate::policy::{LimitParams, MAX_SPAN_US};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlidingLog {
    /// `(time, cost)` of admitted requests, oldest first.
    pub(crate) entries: VecDeque<(u64, u64)>,
    /// The sum of the entries' costs.
    pub(crate) used: u64,
}

impl Rule for SlidingLog {
    fn fresh(_p: &LimitParams, _now: u64) -> Self {
        SlidingLog {
            entries: VecDeque::new(),
            used: 0,
        }
    }

    fn advance(&mut self, p: &LimitParams, now: u64) {
        while let Some(&(t, c)) = self.entries.front() {
            if t.saturating_add(p.period_us) > now {
                break;
            }
            self.used -= c;
            self.entries.pop_front();
        }
    }

    fn status(&self, p: &LimitParams, now: u64, _queue_free: u64) -> (u64, u64) {
        (
            p.limit.count().saturating_sub(self.used),
            self.entries
                .back()
                .map_or(0, |&(last, _)| (last + p.period_us).saturating_sub(now)),
        )
    }

    fn admits(&self, p: &LimitParams, now: u64, cost: u64, _queue_free: u64) -> Result<(), u64> {
        let n = p.limit.count();
        if self.used + cost <= n {
            return Ok(());
        }
        let need = self.used + cost - n;
        let mut freed = 0;
        for &(at, c) in &self.entries {
            freed += c;
            if freed >= need {
                return Err((at + p.period_us).saturating_sub(now));
            }
        }
        Err(0) // unreachable while `cost <= n`
    }

    fn commit(&mut self, _p: &LimitParams, now: u64, cost: u64, _queue_free: u64) {
        let at = self.entries.back().map_or(now, |&(last, _)| last.max(now));
        match self.entries.back_mut() {
            Some((last, c)) if *last == at => *c += cost,
            _ => self.entries.push_back((at, cost)),
        }
        self.used += cost;
    }

    fn charge(&mut self, p: &LimitParams, now: u64, n: u64, queue_free: u64) {
        let n = n.min(MAX_SPAN_US.saturating_sub(self.used));
        if n > 0 {
            self.commit(p, now, n, queue_free);
        }
    }

    /// From the entries recorded at `since`, the reserved request's own
    /// time. Once they have aged out its units are gone, and the entries
    /// after them are later requests', which a refund must not take: their
    /// units would be admitted a second time within the period.
    fn refund(&mut self, _p: &LimitParams, _now: u64, mut n: u64, since: u64) {
        let mut i = self.entries.len();
        while n > 0 && i > 0 {
            i -= 1;
            let (at, c) = &mut self.entries[i];
            if *at > since {
                continue;
            }
            if *at < since {
                break;
            }
            let taken = n.min(*c);
            *c -= taken;
            n -= taken;
            self.used -= taken;
            if *c == 0 {
                self.entries.remove(i);
            }
        }
    }

    fn expires_at(&self, p: &LimitParams) -> u64 {
        self.entries.back().map_or(0, |&(at, _)| at + p.period_us)
    }

    /// As one entry made when the log's last entry was, a period before it
    /// is whole again: no entry of the log seen leaves later. (Made at
    /// `now`, it held the use for a whole period, past the wait told.)
    fn seeded(self, p: &LimitParams, seen: Seen, now: u64) -> Self {
        let early = p.period_us.saturating_sub(seen.backlog_us);
        SlidingLog {
            entries: std::iter::once((now.saturating_sub(early), seen.used)).collect(),
            used: seen.used,
        }
    }

    /// The number of entries, then each entry's time and cost.
    fn save(&self, out: &mut Vec<u64>) {
        out.push(self.entries.len() as u64);
        out.extend(self.entries.iter().flat_map(|&(at, cost)| [at, cost]));
    }

    /// The used total is the entries' sum, not read: it cannot disagree.
    /// The entries are oldest first, as the log keeps them.
    fn load(_p: &LimitParams, words: &mut std::slice::Iter<'_, u64>) -> Option<Self> {
        let len = usize::try_from(*words.next()?).ok()?;
        if len > words.len() / 2 {
            return None;
        }
        let mut entries = VecDeque::with_capacity(len);
        let mut used = 0u64;
        let mut last = 0;
        for _ in 0..len {
            let (at, cost) = (saved_time(words)?, saved_count(words)?);
            used = used.checked_add(cost).filter(|u| *u <= MAX_SAVED_COUNT)?;
            if at < last {
                return None;
            }
            last = at;
            entries.push_back((at, cost));
        }
        Some(Self { entries, used })
    }
}
