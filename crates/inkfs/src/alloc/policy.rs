//! Which free blocks a request gets. Data requests take the best fit of the
//! full length in the home lane, then steal it from the other lanes, then
//! take the largest free range anywhere; a file growing contiguously gets
//! the blocks right after its last extent (goal allocation); metadata comes
//! from the high end of a lane's highest range; one-block requests recycle
//! the singles freed recently, from any lane that has some. Kept apart from
//! `blocks.rs` because this is the part tuned for layout and contention,
//! while the structure and its invariants stay put.

use std::sync::atomic::Ordering;

use super::blocks::BlockAllocator;
use super::lock;

impl BlockAllocator {
    /// Up to `want` contiguous blocks, preferring lane `lane`'s region
    /// (`lane` may be any CPU number: it is taken modulo the lane count),
    /// then stealing from the other lanes. A range of the full length
    /// anywhere is preferred over a shorter one; when none exists the largest
    /// free range is returned. Returns (start, len) with 1 <= len <= want, or
    /// None when no block is free (the caller returns ENOSPC).
    pub fn alloc(&self, lane: u32, want: u64) -> Option<(u64, u64)> {
        debug_assert!(want >= 1, "allocating zero blocks");
        if want == 0 {
            return None;
        }
        let n = self.lanes.len();
        let home = lane as usize % n;
        let ring = || (0..n).map(move |i| (home + i) % n);

        if want == 1 {
            if let Some(b) = self.pop_recent_any(home) {
                return Some((b, 1));
            }
        }

        // Pass 1: best fit of the full length, home lane first. When it
        // fails, the recent singles may complete a range: merge them into
        // the ranges and look again. This only happens on a pool with no
        // free run of `want` blocks left, where recycling singles has
        // stopped paying anyway.
        if let Some(found) = self.best_fit_anywhere(home, want) {
            return Some(found);
        }
        if self.settle_all() {
            if let Some(found) = self.best_fit_anywhere(home, want) {
                return Some(found);
            }
        }

        // Pass 2: nobody has `want` contiguous blocks: hand out the largest
        // range anywhere, so a big request ends up in as few extents as
        // possible. Each failed attempt means another thread took blocks
        // (progress), so a bounded number of attempts is enough.
        for _ in 0..n {
            let mut best: Option<usize> = None;
            let mut best_len = 0;
            for idx in ring() {
                let h = self.lanes[idx].largest_hint.load(Ordering::Relaxed);
                if h > best_len {
                    (best, best_len) = (Some(idx), h);
                }
            }
            let Some(idx) = best else { break };
            let l = &self.lanes[idx];
            let mut set = lock(&l.free);
            if let Some((start, len)) = set.ranges.largest() {
                return Some(self.take(l, &mut set, start, len.min(want)));
            }
        }

        // Hints may lag a free that is finishing on another thread, and
        // recent singles are not in the hints; before reporting ENOSPC look
        // at every lane under its lock.
        if self.free_blocks() > 0 {
            for idx in ring() {
                let l = &self.lanes[idx];
                let mut set = lock(&l.free);
                if let Some((start, len)) = set.ranges.largest() {
                    return Some(self.take(l, &mut set, start, len.min(want)));
                }
                drop(set);
                if let Some(b) = self.pop_recent(idx) {
                    return Some((b, 1));
                }
            }
        }
        None
    }

    /// Best fit of exactly `want` blocks in any lane, `home` first.
    fn best_fit_anywhere(&self, home: usize, want: u64) -> Option<(u64, u64)> {
        let n = self.lanes.len();
        for idx in (0..n).map(|i| (home + i) % n) {
            let l = &self.lanes[idx];
            if l.largest_hint.load(Ordering::Relaxed) < want {
                continue;
            }
            let mut set = lock(&l.free);
            if let Some((start, _)) = set.ranges.best_fit(want) {
                return Some(self.take(l, &mut set, start, want));
            }
        }
        None
    }

    /// Merge every lane's recent singles into its ranges; true if any lane
    /// had some.
    fn settle_all(&self) -> bool {
        let mut any = false;
        for l in self.lanes.iter() {
            let mut set = lock(&l.free);
            if !set.recent.is_empty() {
                set.settle();
                l.publish(&set);
                any = true;
            }
        }
        any
    }

    /// The block lane `idx` freed last, if it keeps one aside.
    fn pop_recent(&self, idx: usize) -> Option<u64> {
        let lane = &self.lanes[idx];
        let mut set = lock(&lane.free);
        let b = set.pop_recent()?;
        lane.publish_recent(&set);
        // Under the lock: the count is a plain load and store, and a free
        // finishing on another thread would otherwise lose its update.
        lane.count_taken(1);
        drop(set);
        Some(b)
    }

    /// A recently freed single from lane `home`, or else from any lane
    /// that has one. Blocks are freed to the lane that holds them and
    /// taken from the taker's lane, so when FUSE threads on two CPUs
    /// overwrite one file, one lane's singles pile up (past `RECENT_MAX`
    /// into its range tree) while the other's run dry (and are cut from
    /// its ranges): four B-tree edits a write, 4% of a FUSE server's time.
    /// Taking the other lane's singles keeps both lists in balance.
    fn pop_recent_any(&self, home: usize) -> Option<u64> {
        let n = self.lanes.len();
        (0..n).map(|i| (home + i) % n).find_map(|idx| {
            let has = idx == home || self.lanes[idx].recent_hint.load(Ordering::Relaxed) > 0;
            has.then(|| self.pop_recent(idx)).flatten()
        })
    }

    /// Up to `want` blocks starting exactly at `goal` when that block is free
    /// (a file growing contiguously keeps one extent, as ext4's goal
    /// allocation); otherwise the same as [`alloc`](Self::alloc).
    ///
    /// When the goal is taken, the file is growing: it moves to the start of
    /// the home lane's largest free range, where it can keep growing in one
    /// extent, rather than into the best-fitting hole.
    pub fn alloc_near(&self, lane: u32, goal: u64, want: u64) -> Option<(u64, u64)> {
        if want == 0 || goal < self.first_block || goal >= self.total_blocks {
            return self.alloc(lane, want);
        }
        {
            let l = &self.lanes[self.lane_of(goal)];
            let mut set = lock(&l.free);
            if let Some((s, len)) = set.ranges.at_or_before(goal) {
                if s + len > goal {
                    let n = want.min(s + len - goal);
                    return Some(self.take(l, &mut set, goal, n));
                }
            }
        }
        let home = lane as usize % self.lanes.len();
        if want == 1 {
            // One block away from its neighbours (a copy-on-write overwrite
            // inside a file): contiguity is lost anyway, so recycle.
            if let Some(b) = self.pop_recent_any(home) {
                return Some((b, 1));
            }
        }
        let l = &self.lanes[home];
        let mut set = lock(&l.free);
        if let Some((s, len)) = set.ranges.largest() {
            return Some(self.take(l, &mut set, s, len.min(want)));
        }
        drop(set);
        self.alloc(lane, want)
    }

    /// One block for metadata (log pages, table blocks), taken from the high
    /// end of a lane's highest free range, so metadata does not interleave
    /// with the data blocks files grow into from the low end.
    pub fn alloc_meta(&self, lane: u32) -> Option<u64> {
        let n = self.lanes.len();
        let home = lane as usize % n;
        for i in 0..n {
            let l = &self.lanes[(home + i) % n];
            let mut set = lock(&l.free);
            if let Some((s, len)) = set.ranges.highest() {
                return Some(self.take(l, &mut set, s + len - 1, 1).0);
            }
        }
        (0..n).find_map(|i| self.pop_recent((home + i) % n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::lane::RECENT_MAX;
    use crate::alloc::AllocError;

    #[test]
    fn alloc_prefers_home_then_steals_full_length_then_largest() {
        let a = BlockAllocator::new_all_free(2, 0, 20); // lanes [0,10) [10,20)
        assert_eq!(a.alloc(1, 4), Some((10, 4)));
        assert_eq!(a.alloc(0, 4), Some((0, 4)));
        // Lane 1 has 6 left; a request for 8 is served from... nobody has 8:
        // the largest range (lane 0: [4,10), lane 1: [14,20), tie -> home).
        assert_eq!(a.alloc(1, 8), Some((14, 6)));
        // Lane 1 empty now: steal the full length from lane 0.
        assert_eq!(a.alloc(1, 3), Some((4, 3)));
        // Best fit: free a 2-block hole and a 1-block hole; want 1 takes the 1.
        a.free(15, 2).unwrap();
        a.free(18, 1).unwrap();
        assert_eq!(a.alloc(1, 1), Some((18, 1)));
        assert_eq!(a.free_blocks(), 3 + 2);
        a.check();
        // Lane numbers beyond lane_count wrap (they are CPU numbers).
        assert_eq!(a.alloc(3, 2), Some((15, 2)));
        assert_eq!(a.alloc(0, 100), Some((7, 3)));
        assert_eq!(a.alloc(0, 1), None);
        assert_eq!(a.free_blocks(), 0);
        a.check();
    }

    /// One-block frees are kept aside and handed out again first, last
    /// freed first; they count as free everywhere, a double free of one is
    /// refused, and a request they could complete still finds its range.
    #[test]
    fn single_block_frees_are_recycled_first() {
        let a = BlockAllocator::new_all_used(1, 0, 400);
        for b in [7, 3, 9] {
            a.try_free(b, 1).unwrap();
        }
        assert_eq!(a.free_blocks(), 3);
        assert!(a.is_free(3) && a.is_free(7) && a.is_free(9) && !a.is_free(8));
        assert_eq!(a.try_free(3, 1), Err(AllocError::DoubleFree { block: 3 }));
        a.check();
        assert_eq!(a.alloc(0, 1), Some((9, 1)));
        // The goal is taken: a lone block is recycled rather than cut from
        // a range.
        assert_eq!(a.alloc_near(0, 50, 1), Some((3, 1)));
        a.try_free(8, 1).unwrap();
        // A double free inside a multi-block free names the first block.
        assert_eq!(a.try_free(6, 3), Err(AllocError::DoubleFree { block: 7 }));
        // 7..9 is free only as two singles: a 2-block request finds it.
        assert_eq!(a.alloc(0, 2), Some((7, 2)));
        assert_eq!(a.free_blocks(), 0);
        assert_eq!(a.alloc(0, 1), None);
        // More frees than the recent list holds: the rest go to the ranges.
        a.try_free(100, 50).unwrap();
        for b in 0..RECENT_MAX as u64 + 10 {
            a.try_free(200 + 2 * b, 1).unwrap();
        }
        assert_eq!(a.free_blocks(), 50 + RECENT_MAX as u64 + 10);
        a.check();
        // Listing sees every free block.
        let listed: u64 = a.free_ranges(0).iter().map(|r| r.1).sum();
        assert_eq!(listed, a.free_blocks());
        a.check();
    }
}
