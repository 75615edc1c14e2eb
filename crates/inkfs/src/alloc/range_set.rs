//! A set of u64s stored as coalesced `[start, start + len)` ranges: the
//! structure behind every free list of the allocators (a lane's free blocks,
//! a lane's freed inode slots). Kept apart from the allocators because it
//! has invariants of its own (disjoint, coalesced, two indexes that agree),
//! checked by `check` after every operation in the tests.

use std::collections::{BTreeMap, BTreeSet};

/// Disjoint, coalesced ranges (no two ranges overlap or touch), indexed by
/// start for merging and lookup and by (len, start) for best-fit.
#[derive(Default, Debug)]
pub(super) struct RangeSet {
    by_start: BTreeMap<u64, u64>,
    by_len: BTreeSet<(u64, u64)>,
    /// Sum of all lengths.
    total: u64,
}

impl RangeSet {
    fn add_entry(&mut self, start: u64, len: u64) {
        debug_assert!(len > 0);
        let old = self.by_start.insert(start, len);
        debug_assert!(old.is_none(), "range set entry {start} added twice");
        let fresh = self.by_len.insert((len, start));
        debug_assert!(fresh);
    }

    fn remove_entry(&mut self, start: u64, len: u64) {
        let old = self.by_start.remove(&start);
        debug_assert_eq!(old, Some(len));
        let had = self.by_len.remove(&(len, start));
        debug_assert!(had);
    }

    /// The range that starts at or before `at`, if any.
    pub(super) fn at_or_before(&self, at: u64) -> Option<(u64, u64)> {
        self.by_start
            .range(..=at)
            .next_back()
            .map(|(&s, &l)| (s, l))
    }

    /// Add `[start, start + len)`, merging with neighbours. On overlap the
    /// set is left unchanged and the first overlapping value is returned.
    pub(super) fn insert(&mut self, start: u64, len: u64) -> Result<(), u64> {
        debug_assert!(len > 0 && start.checked_add(len).is_some());
        let end = start + len;
        let pred = self.at_or_before(start);
        if let Some((s, l)) = pred {
            if s + l > start {
                return Err(start);
            }
        }
        // A range starting exactly at `start` was caught above (len > 0).
        let succ = self.by_start.range(start..).next().map(|(&s, &l)| (s, l));
        if let Some((s, _)) = succ {
            if s < end {
                return Err(s);
            }
        }
        let (mut merged_start, mut merged_len) = (start, len);
        if let Some((s, l)) = pred.filter(|&(s, l)| s + l == start) {
            self.remove_entry(s, l);
            merged_start = s;
            merged_len += l;
        }
        if let Some((s, l)) = succ.filter(|&(s, _)| s == end) {
            self.remove_entry(s, l);
            merged_len += l;
        }
        self.add_entry(merged_start, merged_len);
        self.total += len;
        Ok(())
    }

    /// Remove `[start, start + len)`, which must lie inside the set. If it
    /// does not, the set is left unchanged and the first value not in the set
    /// is returned.
    pub(super) fn remove(&mut self, start: u64, len: u64) -> Result<(), u64> {
        debug_assert!(len > 0 && start.checked_add(len).is_some());
        let end = start + len;
        let Some((s, l)) = self.at_or_before(start) else {
            return Err(start);
        };
        if s + l <= start {
            return Err(start);
        }
        if s + l < end {
            // Ranges are coalesced, so the value right after a range is not
            // in the set: it is the first missing one.
            return Err(s + l);
        }
        self.remove_entry(s, l);
        if start > s {
            self.add_entry(s, start - s);
        }
        if s + l > end {
            self.add_entry(end, s + l - end);
        }
        debug_assert!(self.total >= len);
        self.total -= len;
        Ok(())
    }

    pub(super) fn contains(&self, value: u64) -> bool {
        self.at_or_before(value).is_some_and(|(s, l)| s + l > value)
    }

    /// Smallest range with at least `want` values (ties: lowest start).
    pub(super) fn best_fit(&self, want: u64) -> Option<(u64, u64)> {
        self.by_len.range((want, 0)..).next().map(|&(l, s)| (s, l))
    }

    pub(super) fn largest(&self) -> Option<(u64, u64)> {
        self.by_len.last().map(|&(l, s)| (s, l))
    }

    pub(super) fn largest_len(&self) -> u64 {
        self.by_len.last().map_or(0, |&(l, _)| l)
    }

    pub(super) fn lowest(&self) -> Option<(u64, u64)> {
        self.by_start.first_key_value().map(|(&s, &l)| (s, l))
    }

    /// The range with the highest start.
    pub(super) fn highest(&self) -> Option<(u64, u64)> {
        self.by_start.last_key_value().map(|(&s, &l)| (s, l))
    }

    /// Sum of all lengths.
    pub(super) fn total(&self) -> u64 {
        self.total
    }

    pub(super) fn count(&self) -> usize {
        self.by_start.len()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_start.iter().map(|(&s, &l)| (s, l))
    }

    /// Full consistency check (O(n)); tests call it after every operation.
    #[cfg(test)]
    pub(super) fn check(&self) {
        assert_eq!(self.by_start.len(), self.by_len.len());
        let mut total = 0;
        let mut prev_end: Option<u64> = None;
        for (s, l) in self.iter() {
            assert!(l > 0);
            assert!(self.by_len.contains(&(l, s)));
            if let Some(pe) = prev_end {
                assert!(pe < s, "ranges overlap or touch at {s}");
            }
            prev_end = Some(s + l);
            total += l;
        }
        assert_eq!(total, self.total);
    }
}
