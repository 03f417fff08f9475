//! Space-saving (Metwally, Agrawal and El Abbadi, 2005): the heavy hitters
//! of a stream in `m` counters. A counted item adds 1 to its counter; an
//! item without one takes the smallest counter, adds 1 to it, and keeps
//! the smallest's old value as its error. So each count overestimates its
//! item's true count by at most its error, every error is at most the
//! smallest counter, and the smallest counter is at most `N / m` after `N`
//! items: every item seen more than `N / m` times holds a counter.
//!
//! The counters form a min-heap (slots addressed through `pos`), so the
//! smallest is found at once and a count that grows sinks in place.

use std::collections::HashMap;

use super::summary::TopKey;

/// One counter: the item's fingerprint, its label, count and error.
#[derive(Debug)]
struct Counter {
    id: u64,
    label: Box<str>,
    count: u64,
    error: u64,
}

/// A space-saving sketch of at most `capacity` counters.
#[derive(Debug)]
pub(super) struct SpaceSaving {
    capacity: usize,
    /// The counters, in no order.
    counters: Vec<Counter>,
    /// A min-heap of indexes into `counters`, by count.
    heap: Vec<u32>,
    /// Where each counter sits in `heap`.
    pos: Vec<u32>,
    /// Each counted item's counter.
    index: HashMap<u64, u32, foldhash::fast::FixedState>,
    /// Items seen.
    total: u64,
}

impl SpaceSaving {
    /// An empty sketch of `capacity` counters (at least 1, at most 2^31).
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            counters: Vec::new(),
            heap: Vec::new(),
            pos: Vec::new(),
            index: HashMap::with_hasher(foldhash::fast::FixedState::with_seed(0)),
            total: 0,
        }
    }

    /// Counts one occurrence of the item `id`; `label` names it if it
    /// takes a counter (and is asked only then).
    pub(super) fn add(&mut self, id: u64, label: impl FnOnce() -> Box<str>) {
        self.total += 1;
        if let Some(&slot) = self.index.get(&id) {
            self.counters[slot as usize].count += 1;
            self.sink(self.pos[slot as usize] as usize);
            return;
        }
        if self.counters.len() < self.capacity {
            // `capacity` is at most 2^31: the slot fits.
            let slot = self.counters.len() as u32;
            self.counters.push(Counter {
                id,
                label: label(),
                count: 1,
                error: 0,
            });
            self.pos.push(self.heap.len() as u32);
            self.heap.push(slot);
            self.index.insert(id, slot);
            self.rise(self.heap.len() - 1);
            return;
        }
        // Full: the item takes the smallest counter.
        let slot = self.heap[0];
        let counter = &mut self.counters[slot as usize];
        self.index.remove(&counter.id);
        counter.id = id;
        counter.label = label();
        counter.error = counter.count;
        counter.count += 1;
        self.index.insert(id, slot);
        self.sink(0);
    }

    /// Items seen.
    pub(super) fn total(&self) -> u64 {
        self.total
    }

    /// The most an item without a counter was seen: the smallest counter
    /// once every counter is taken, 0 before.
    pub(super) fn floor(&self) -> u64 {
        if self.counters.len() < self.capacity {
            0
        } else {
            self.heap
                .first()
                .map_or(0, |&slot| self.counters[slot as usize].count)
        }
    }

    /// Every counter, as a [`TopKey`].
    pub(super) fn entries(&self) -> impl Iterator<Item = TopKey> + '_ {
        self.counters
            .iter()
            .map(|c| TopKey::new(c.label.to_string(), c.count, c.error))
    }

    fn count_at(&self, i: usize) -> u64 {
        self.counters[self.heap[i] as usize].count
    }

    fn swap(&mut self, i: usize, j: usize) {
        self.heap.swap(i, j);
        self.pos[self.heap[i] as usize] = i as u32;
        self.pos[self.heap[j] as usize] = j as u32;
    }

    fn rise(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.count_at(parent) <= self.count_at(i) {
                return;
            }
            self.swap(i, parent);
            i = parent;
        }
    }

    fn sink(&mut self, mut i: usize) {
        let n = self.heap.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut least = i;
            if l < n && self.count_at(l) < self.count_at(least) {
                least = l;
            }
            if r < n && self.count_at(r) < self.count_at(least) {
                least = r;
            }
            if least == i {
                return;
            }
            self.swap(i, least);
            i = least;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::HashMap;

    use super::SpaceSaving;

    fn add(s: &mut SpaceSaving, id: u64) {
        s.add(id, || format!("k{id}").into());
    }

    fn table(s: &SpaceSaving) -> Vec<(String, u64, u64)> {
        let mut rows: Vec<_> = s
            .entries()
            .map(|e| (e.label().to_owned(), e.count(), e.error()))
            .collect();
        rows.sort();
        rows
    }

    #[test]
    fn under_capacity_every_count_is_exact() {
        let mut s = SpaceSaving::new(3);
        for id in [1, 2, 1, 3, 1, 2] {
            add(&mut s, id);
        }
        assert_eq!(
            table(&s),
            [
                ("k1".into(), 3, 0),
                ("k2".into(), 2, 0),
                ("k3".into(), 1, 0)
            ]
        );
        assert_eq!((s.total(), s.floor()), (6, 1));
    }

    #[test]
    fn a_new_item_takes_the_smallest_counter_and_its_count_as_error() {
        let mut s = SpaceSaving::new(2);
        for id in [1, 1, 1, 2, 2, 3] {
            add(&mut s, id);
        }
        // 3 replaced 2 (count 2): count 3, error 2.
        assert_eq!(table(&s), [("k1".into(), 3, 0), ("k3".into(), 3, 2)]);
        add(&mut s, 4);
        // 4 replaced one of the two counters of 3; ties go to either.
        let rows = table(&s);
        assert!(rows.contains(&("k4".into(), 4, 3)), "{rows:?}");
        assert_eq!((s.total(), s.floor()), (7, 3));
    }

    #[test]
    fn a_label_is_asked_only_when_an_item_takes_a_counter() {
        let mut s = SpaceSaving::new(1);
        let mut asked = 0;
        for id in [7, 7, 7, 8] {
            s.add(id, || {
                asked += 1;
                "x".into()
            });
        }
        assert_eq!(asked, 2);
    }

    /// The guarantees, on a skewed stream against exact counts: each count
    /// within its error above the truth, each error at most the floor, the
    /// floor at most N / m, and every item seen more than N / m times held.
    #[test]
    fn counts_are_within_their_stated_error() {
        let m = 20;
        let mut s = SpaceSaving::new(m);
        let mut exact: HashMap<u64, u64> = HashMap::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Skewed: id = floor(500 / (1 + x mod 500)), heavy at small ids.
            let id = 500 / (1 + x % 500);
            add(&mut s, id);
            *exact.entry(id).or_default() += 1;
        }
        let n = s.total();
        assert_eq!(n, 20_000);
        assert!(s.floor() <= n / m as u64);
        for e in s.entries() {
            let id: u64 = e.label()[1..].parse().unwrap();
            let truth = exact[&id];
            assert!(
                e.count() >= truth && e.count() - e.error() <= truth,
                "{e:?} {truth}"
            );
            assert!(e.error() <= s.floor());
        }
        for (id, count) in exact {
            if count > n / m as u64 {
                assert!(s.entries().any(|e| e.label() == format!("k{id}")), "{id}");
            }
        }
    }
}
