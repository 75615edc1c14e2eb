//! A set of block numbers kept as disjoint ranges: the server's books of
//! what each client may use or free (lease.rs), and the blocks an inode
//! referred to at a grant. Settling a lease removes every block a file
//! refers to from such a set, so `remove`, `insert` and `from_ranges`
//! allocate nothing per range and make one tree walk or two.

use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Included};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// start -> end (exclusive); disjoint and not adjacent.
    ranges: BTreeMap<u64, u64>,
}

impl RangeSet {
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    /// The set of `ranges` (in any order, overlapping or not): sorted and
    /// merged first, then built in one pass.
    pub fn from_ranges(ranges: &[(u64, u64)]) -> RangeSet {
        let mut sorted: Vec<(u64, u64)> = ranges
            .iter()
            .filter(|r| r.1 > 0)
            .map(|&(s, l)| (s, s.saturating_add(l)))
            .collect();
        sorted.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(sorted.len());
        for (s, e) in sorted {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        // Sorted keys: the tree is built in bulk.
        let set = RangeSet {
            ranges: merged.into_iter().collect(),
        };
        debug_assert!(set.check());
        set
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Blocks in the set.
    pub fn blocks(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }

    /// The ranges, as (start, len), in order.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        self.ranges.iter().map(|(&s, &e)| (s, e - s)).collect()
    }

    pub fn insert(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (mut lo, mut hi) = (start, start.saturating_add(len));
        // The one range starting at or before `lo` that may touch it.
        if let Some((&s, &e)) = self.ranges.range(..=lo).next_back() {
            if e >= hi {
                return; // already in
            }
            if e >= lo {
                lo = s; // merged: its entry is rewritten below
            }
        }
        // Ranges starting inside or right after: absorbed.
        while let Some((&s, &e)) = self.ranges.range((Excluded(lo), Included(hi))).next() {
            self.ranges.remove(&s);
            hi = hi.max(e);
        }
        self.ranges.insert(lo, hi);
        debug_assert!(self.check_near(lo));
    }

    pub fn remove(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (lo, hi) = (start, start.saturating_add(len));
        // The last range starting before `hi`: if it ends by `lo`, nothing
        // overlaps (a settling removes every block of a file from a set
        // most of them are not in: one walk).
        let Some((&s, &e)) = self.ranges.range(..hi).next_back() else {
            return;
        };
        if e <= lo {
            return;
        }
        if s == lo && e == hi {
            // Exactly one whole range (the other common case).
            self.ranges.remove(&s);
            return;
        }
        // A range starting before `lo` that reaches into it: cut at `lo`
        // (and its part past `hi` kept).
        if let Some((&s, &e)) = self.ranges.range(..lo).next_back() {
            if e > lo {
                self.ranges.insert(s, lo);
                if e > hi {
                    self.ranges.insert(hi, e);
                    return;
                }
            }
        }
        // Ranges starting inside: dropped, but for a part past `hi`.
        while let Some((&s, &e)) = self.ranges.range(lo..hi).next() {
            self.ranges.remove(&s);
            if e > hi {
                self.ranges.insert(hi, e);
                break;
            }
        }
        debug_assert!(self.check_near(lo));
    }

    /// Whether every block of `[start, start + len)` is in the set.
    pub fn contains(&self, start: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        self.ranges
            .range(..=start)
            .next_back()
            .is_some_and(|(_, &e)| e >= start.saturating_add(len))
    }

    /// The part of `[start, start + len)` in the set, as ranges.
    pub fn intersect(&self, start: u64, len: u64) -> Vec<(u64, u64)> {
        let (lo, hi) = (start, start.saturating_add(len));
        let mut out: Vec<(u64, u64)> = self
            .ranges
            .range(..hi)
            .rev()
            .take_while(|(_, &e)| e > lo)
            .map(|(&s, &e)| (s.max(lo), e.min(hi)))
            .map(|(s, e)| (s, e - s))
            .collect();
        out.reverse();
        out
    }

    /// Disjoint, not adjacent, none empty (tests, debug checks).
    pub fn check(&self) -> bool {
        let mut prev_end = None;
        for (&s, &e) in &self.ranges {
            if s >= e || prev_end.is_some_and(|p| s <= p) {
                return false;
            }
            prev_end = Some(e);
        }
        true
    }

    /// [`RangeSet::check`] around `at` only (a debug check after a change
    /// there, without walking the whole set).
    fn check_near(&self, at: u64) -> bool {
        let from = self.ranges.range(..at).next_back().map_or(at, |(&s, _)| s);
        let mut prev_end: Option<u64> = None;
        for (&s, &e) in self.ranges.range(from..).take(4) {
            if s >= e || prev_end.is_some_and(|p| s <= p) {
                return false;
            }
            prev_end = Some(e);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn range_sets_merge_split_and_intersect() {
        let mut s = RangeSet::from_ranges(&[(10, 5), (20, 5)]);
        assert_eq!(s.ranges(), vec![(10, 5), (20, 5)]);
        s.insert(15, 5); // fills the gap exactly: one range
        assert_eq!(s.ranges(), vec![(10, 15)]);
        s.remove(12, 3);
        assert_eq!(s.ranges(), vec![(10, 2), (15, 10)]);
        assert!(s.contains(15, 10));
        assert!(!s.contains(11, 5));
        assert_eq!(s.intersect(0, 100), vec![(10, 2), (15, 10)]);
        assert_eq!(s.intersect(11, 6), vec![(11, 1), (15, 2)]);
        s.remove(0, 100);
        assert!(s.is_empty());
        s.insert(5, 1);
        s.insert(3, 1);
        s.insert(4, 1);
        assert_eq!(s.ranges(), vec![(3, 3)]);
        assert_eq!(s.blocks(), 3);
        let s = RangeSet::from_ranges(&[(7, 3), (1, 2), (3, 1), (8, 5), (20, 0)]);
        assert_eq!(s.ranges(), vec![(1, 3), (7, 6)], "sorted, merged, empty dropped");
    }

    proptest! {
        /// Against a model (a set of block numbers), through any sequence
        /// of inserts and removes, starting from `from_ranges`.
        #[test]
        fn range_sets_behave_as_sets_of_blocks(
            init in proptest::collection::vec((0u64..200, 0u64..20), 0..20),
            ops in proptest::collection::vec((any::<bool>(), 0u64..200, 0u64..30), 0..60),
        ) {
            let mut model = std::collections::BTreeSet::new();
            for &(s, l) in &init {
                model.extend(s..s + l);
            }
            let mut set = RangeSet::from_ranges(&init);
            for &(add, s, l) in &ops {
                if add {
                    set.insert(s, l);
                    model.extend(s..s + l);
                } else {
                    set.remove(s, l);
                    for b in s..s + l {
                        model.remove(&b);
                    }
                }
                prop_assert!(set.check());
                let blocks: Vec<u64> = set.ranges().iter().flat_map(|&(s, l)| s..s + l).collect();
                let want: Vec<u64> = model.iter().copied().collect();
                prop_assert_eq!(blocks, want);
            }
            for s in (0u64..240).step_by(7) {
                prop_assert_eq!(set.contains(s, 3), (s..s + 3).all(|b| model.contains(&b)));
                let got: Vec<u64> = set.intersect(s, 9).iter().flat_map(|&(a, l)| a..a + l).collect();
                let want: Vec<u64> = (s..s + 9).filter(|b| model.contains(b)).collect();
                prop_assert_eq!(got, want);
            }
        }
    }
}
