//! [`Summary`]: the heavy hitters of one ranking of one policy, with their
//! error, and the merge of several instances' summaries.

use std::collections::HashMap;

/// One key of a [`Summary`]: its label, its count and how much the count
/// may exceed the truth. The key was counted at least `count - error`
/// times and at most `count` times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopKey {
    label: String,
    count: u64,
    error: u64,
}

impl TopKey {
    /// The key labelled `label`, counted `count` times at most and
    /// `count - error` at least (an `error` over `count` is taken as
    /// `count`).
    pub fn new(label: impl Into<String>, count: u64, error: u64) -> Self {
        Self {
            label: label.into(),
            count,
            error: error.min(count),
        }
    }

    /// The key's label (see [`KeyLabel`](super::KeyLabel)).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The most times it can have been counted: what it is ranked by.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// How far [`count`](Self::count) may exceed the truth.
    pub fn error(&self) -> u64 {
        self.error
    }

    /// The fewest times it was counted: `count - error`.
    pub fn guaranteed(&self) -> u64 {
        self.count - self.error
    }
}

/// The keys most counted under one policy and [`Ranking`](super::Ranking),
/// highest count first (ties by label), with the bounds that hold them:
///
/// - each key's true count is between [`TopKey::guaranteed`] and
///   [`TopKey::count`];
/// - a key not listed was counted at most [`floor`](Self::floor) times.
///
/// One instance's summary has a floor of at most `N / m` for `N` counted
/// decisions and `m` counters a shard; [`merge`](Self::merge) adds the
/// floors of the summaries it merges.
///
/// ```
/// use tollgate_core::topkeys::{Summary, TopKey};
///
/// let a = Summary::new(100, 4, vec![TopKey::new("ada", 60, 4), TopKey::new("bob", 30, 0)]);
/// let b = Summary::new(50, 2, vec![TopKey::new("ada", 20, 0), TopKey::new("cy", 25, 2)]);
/// let merged = Summary::merge([a, b]);
/// assert_eq!(merged.total(), 150);
/// assert_eq!(merged.floor(), 6);
/// // ada: 60 + 20, at least 56 + 20. bob: 30, and at most b's floor of 2 in b.
/// assert_eq!(merged.keys()[0], TopKey::new("ada", 80, 4));
/// assert_eq!(merged.keys()[1], TopKey::new("bob", 32, 2));
/// assert_eq!(merged.keys()[2], TopKey::new("cy", 29, 6));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    keys: Vec<TopKey>,
    total: u64,
    floor: u64,
}

impl Summary {
    /// A summary of `total` counted decisions, whose unlisted keys were
    /// counted at most `floor` times each. Keys sharing a label are
    /// summed; the keys are sorted.
    pub fn new(total: u64, floor: u64, keys: Vec<TopKey>) -> Self {
        let mut by_label: HashMap<String, TopKey> = HashMap::with_capacity(keys.len());
        for key in keys {
            match by_label.get_mut(&key.label) {
                Some(held) => {
                    held.count = held.count.saturating_add(key.count);
                    held.error = held.error.saturating_add(key.error);
                }
                None => {
                    by_label.insert(key.label.clone(), key);
                }
            }
        }
        let mut keys: Vec<TopKey> = by_label.into_values().collect();
        sort(&mut keys);
        Self { keys, total, floor }
    }

    /// The keys, highest count first.
    pub fn keys(&self) -> &[TopKey] {
        &self.keys
    }

    /// The decisions counted.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The most times a key not listed was counted.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// Keeps the first `n` keys; the floor rises to the highest count
    /// left out, so that it still bounds every key not listed.
    ///
    /// ```
    /// use tollgate_core::topkeys::{Summary, TopKey};
    ///
    /// let s = Summary::new(9, 0, vec![TopKey::new("a", 5, 0), TopKey::new("b", 3, 0), TopKey::new("c", 1, 0)]);
    /// let top = s.truncated(1);
    /// assert_eq!(top.keys(), [TopKey::new("a", 5, 0)]);
    /// assert_eq!(top.floor(), 3);
    /// ```
    #[must_use]
    pub fn truncated(mut self, n: usize) -> Self {
        if let Some(first_out) = self.keys.get(n) {
            self.floor = self.floor.max(first_out.count);
            self.keys.truncate(n);
        }
        self
    }

    /// One summary of several instances' summaries of the same policy and
    /// ranking (over disjoint decisions). A key listed by some summaries
    /// is counted, in each that does not list it, as that summary's floor
    /// at most and 0 at least; so its count is the sum of its counts (or
    /// floors), its error the sum of its errors (and floors), and the
    /// merged floor the sum of the floors: every bound still holds.
    pub fn merge(summaries: impl IntoIterator<Item = Summary>) -> Summary {
        let summaries: Vec<Summary> = summaries.into_iter().collect();
        let floors: u64 = summaries.iter().map(|s| s.floor).sum();
        let total = summaries.iter().map(|s| s.total).sum();
        // Per label: (counts of the summaries that list it, their floors).
        let mut merged: HashMap<&str, (u64, u64, u64)> = HashMap::new();
        for s in &summaries {
            for key in &s.keys {
                let m = merged.entry(&key.label).or_default();
                m.0 = m.0.saturating_add(key.count);
                m.1 = m.1.saturating_add(key.error);
                m.2 += s.floor;
            }
        }
        let mut keys: Vec<TopKey> = merged
            .into_iter()
            .map(|(label, (count, error, listed_floors))| {
                // The summaries that do not list it may each hide up to
                // their floor of it.
                let hidden = floors - listed_floors;
                TopKey {
                    label: label.to_owned(),
                    count: count.saturating_add(hidden),
                    error: error.saturating_add(hidden),
                }
            })
            .collect();
        sort(&mut keys);
        Summary {
            keys,
            total,
            floor: floors,
        }
    }
}

fn sort(keys: &mut [TopKey]) {
    keys.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.label.cmp(&b.label)));
}

#[cfg(test)]
mod tests {
    use super::{Summary, TopKey};

    #[test]
    fn a_merge_adds_counts_errors_and_floors_exactly() {
        let a = Summary::new(
            40,
            3,
            vec![TopKey::new("x", 20, 3), TopKey::new("y", 10, 0)],
        );
        let b = Summary::new(30, 5, vec![TopKey::new("y", 12, 5), TopKey::new("z", 9, 1)]);
        let c = Summary::new(2, 0, vec![TopKey::new("z", 2, 0)]);
        let merged = Summary::merge([a, b, c]);
        assert_eq!((merged.total(), merged.floor()), (72, 8));
        assert_eq!(
            merged.keys(),
            [
                // x: 20, + b's floor 5, + c's 0; errors 3 + 5.
                TopKey::new("x", 25, 8),
                // y: 10 + 12, errors 0 + 5; c's floor is 0.
                TopKey::new("y", 22, 5),
                // z: a's floor 3 + 9 + 2; errors 3 + 1 + 0.
                TopKey::new("z", 14, 4),
            ]
        );
    }

    #[test]
    fn keys_sharing_a_label_are_summed_and_ties_go_by_label() {
        let s = Summary::new(
            9,
            0,
            vec![
                TopKey::new("b", 2, 1),
                TopKey::new("a", 3, 0),
                TopKey::new("b", 1, 0),
            ],
        );
        assert_eq!(s.keys(), [TopKey::new("a", 3, 0), TopKey::new("b", 3, 1)]);
    }

    #[test]
    fn merging_nothing_is_empty_and_one_summary_is_itself() {
        assert_eq!(Summary::merge([]), Summary::default());
        let one = Summary::new(5, 1, vec![TopKey::new("a", 4, 1)]);
        assert_eq!(Summary::merge([one.clone()]), one);
    }
}
