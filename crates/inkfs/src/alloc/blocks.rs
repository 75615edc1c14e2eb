//! The block allocator: the data area split into one region per lane, each
//! lane's free blocks in DRAM behind its own mutex. This file holds the
//! structure, its constructors (mkfs, rebuild, the recovery scan's bitmap),
//! the queries, and the paths that return blocks or mark them used; where a
//! request is served from is in `policy.rs`, the save areas in `save.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::chunks::ChunkLane;
use super::lane::{BlockLane, LaneFree};
use super::used::UsedBlocks;
use super::{lock, AllocError};

/// Block allocator: the data area `[first_block, total_blocks)` is split into
/// `lane_count` contiguous regions, one per lane; each lane keeps its free
/// ranges in DRAM behind its own mutex.
pub struct BlockAllocator {
    pub(super) first_block: u64,
    pub(super) total_blocks: u64,
    pub(super) lanes: Box<[BlockLane]>,
    /// Per lane, the partly used blocks carved into log chunks (chunks.rs).
    pub(super) chunks: Box<[ChunkLane]>,
}

#[derive(Clone, Copy)]
enum Change {
    Free,
    Use,
}

impl BlockAllocator {
    fn with_lanes(lane_count: u32, first_block: u64, total_blocks: u64, all_free: bool) -> Self {
        assert!(lane_count >= 1, "an allocator needs at least one lane");
        assert!(
            first_block <= total_blocks,
            "data area starts past the pool's end"
        );
        let data_blocks = total_blocks - first_block;
        // Region i starts at first + data * i / lanes: sizes differ by at most
        // one block, and regions are empty only when blocks < lanes.
        let region_start =
            |i: u32| first_block + (data_blocks as u128 * i as u128 / lane_count as u128) as u64;
        let lanes: Box<[BlockLane]> = (0..lane_count)
            .map(|i| {
                let (start, end) = (region_start(i), region_start(i + 1));
                let mut free = LaneFree::new(start, end);
                if all_free && end > start {
                    free.add_range(start, end - start).expect("empty set");
                }
                let hint = free.ranges.largest_len();
                let count = free.total();
                BlockLane {
                    region_start: start,
                    region_end: end,
                    free: Mutex::new(free),
                    largest_hint: AtomicU64::new(hint),
                    free_count: AtomicU64::new(count),
                    recent_hint: AtomicU64::new(0),
                }
            })
            .collect();
        debug_assert_eq!(lanes[lanes.len() - 1].region_end, total_blocks);
        BlockAllocator {
            first_block,
            total_blocks,
            chunks: (0..lane_count).map(|_| ChunkLane::default()).collect(),
            lanes,
        }
    }

    /// The allocator for a data area whose used blocks are the set bits of
    /// `used` (crash recovery): free ranges are built in one sweep instead
    /// of one range split per used extent.
    pub fn from_used(
        lane_count: u32,
        first_block: u64,
        total_blocks: u64,
        used: &UsedBlocks,
    ) -> Self {
        debug_assert_eq!(
            (used.first_block, used.total_blocks),
            (first_block, total_blocks)
        );
        let a = Self::with_lanes(lane_count, first_block, total_blocks, false);
        for lane in a.lanes.iter() {
            let mut set = lock(&lane.free);
            let mut block = lane.region_start;
            while block < lane.region_end {
                if used.is_used(block) {
                    block += 1;
                    continue;
                }
                let start = block;
                while block < lane.region_end && !used.is_used(block) {
                    block += 1;
                }
                set.add_range(start, block - start)
                    .expect("ascending, disjoint runs");
                lane.count_freed(block - start);
            }
            lane.publish(&set);
        }
        a
    }

    /// Every block of the data area free (mkfs, or a rebuild that then calls
    /// [`mark_used`](Self::mark_used) for every extent the logs reference).
    pub fn new_all_free(lane_count: u32, first_block: u64, total_blocks: u64) -> Self {
        Self::with_lanes(lane_count, first_block, total_blocks, true)
    }

    /// Every block in use (a rebuild that then [`free`](Self::free)s what no
    /// log references).
    pub fn new_all_used(lane_count: u32, first_block: u64, total_blocks: u64) -> Self {
        Self::with_lanes(lane_count, first_block, total_blocks, false)
    }

    pub fn lane_count(&self) -> u32 {
        self.lanes.len() as u32
    }

    pub fn first_block(&self) -> u64 {
        self.first_block
    }

    pub fn total_blocks(&self) -> u64 {
        self.total_blocks
    }

    pub fn capacity_blocks(&self) -> u64 {
        self.total_blocks - self.first_block
    }

    /// Free blocks of all lanes: exact whenever no call is in flight.
    pub fn free_blocks(&self) -> u64 {
        self.lanes
            .iter()
            .map(|l| l.free_count.load(Ordering::Relaxed))
            .sum()
    }

    /// Lane `lane`'s region `[start, end)` of the data area.
    pub fn lane_region(&self, lane: u32) -> (u64, u64) {
        let l = &self.lanes[lane as usize];
        (l.region_start, l.region_end)
    }

    /// Lane `lane`'s free ranges as (start, len), ascending (stat, fsck, tests).
    pub fn free_ranges(&self, lane: u32) -> Vec<(u64, u64)> {
        let mut free = lock(&self.lanes[lane as usize].free);
        free.settle();
        self.lanes[lane as usize].publish(&free);
        free.ranges.iter().collect()
    }

    /// Index of the lane whose region holds `block` (inside the data area).
    pub(super) fn lane_of(&self, block: u64) -> usize {
        debug_assert!(block >= self.first_block && block < self.total_blocks);
        // With empty regions several lanes share a start; the last of them
        // is the non-empty one that holds `block`.
        let idx = self.lanes.partition_point(|l| l.region_start <= block) - 1;
        debug_assert!(block < self.lanes[idx].region_end);
        idx
    }

    fn check_range(&self, start: u64, len: u64) -> Result<(), AllocError> {
        // An empty range is a caller bug, not a no-op, so it surfaces.
        let inside = len > 0
            && start >= self.first_block
            && start
                .checked_add(len)
                .is_some_and(|end| end <= self.total_blocks);
        if inside {
            Ok(())
        } else {
            Err(AllocError::OutOfRange { start, len })
        }
    }

    pub fn is_free(&self, block: u64) -> bool {
        if block < self.first_block || block >= self.total_blocks {
            return false;
        }
        lock(&self.lanes[self.lane_of(block)].free).contains(block)
    }

    /// Hand out `[start, start + len)` from `lane`'s locked set.
    pub(super) fn take(
        &self,
        lane: &BlockLane,
        set: &mut LaneFree,
        start: u64,
        len: u64,
    ) -> (u64, u64) {
        set.take_range(start, len)
            .expect("range chosen from this very set under its lock");
        lane.publish(set);
        lane.count_taken(len);
        debug_assert!(start >= lane.region_start && start + len <= lane.region_end);
        (start, len)
    }

    /// Apply `change` to each lane piece of `[start, start + len)` in block
    /// order, one lane lock at a time, stopping at the first piece that fails.
    /// Err((first offending block, end of the prefix already applied)).
    fn change(&self, start: u64, len: u64, change: Change) -> Result<(), (u64, u64)> {
        let end = start + len;
        let mut at = start;
        while at < end {
            let lane = &self.lanes[self.lane_of(at)];
            let piece_end = end.min(lane.region_end);
            let piece = piece_end - at;
            let mut set = lock(&lane.free);
            match change {
                Change::Free if piece == 1 && !set.recent.is_full() => {
                    if set.contains(at) {
                        return Err((at, at));
                    }
                    set.push_recent(at);
                    lane.count_freed(1);
                }
                Change::Free => {
                    if set
                        .recent
                        .as_slice()
                        .iter()
                        .any(|&b| b >= at && b < piece_end)
                    {
                        // A double free: let the ranges name the first block.
                        set.settle();
                        lane.publish(&set);
                    }
                    set.add_range(at, piece).map_err(|b| (b, at))?;
                    lane.count_freed(piece);
                }
                Change::Use => {
                    // Rebuild and fsck paths: the ranges must hold every
                    // free block for the removal to find them.
                    set.settle();
                    lane.publish(&set);
                    set.take_range(at, piece).map_err(|b| (b, at))?;
                    lane.count_taken(piece);
                }
            }
            lane.publish(&set);
            // Released before the next lane's lock is taken (locking rule).
            drop(set);
            at = piece_end;
        }
        Ok(())
    }

    /// Return `[start, start + len)` (inside the data area; it may span lane
    /// regions) to the free lists, merging with free neighbours. Freeing a
    /// block that is already free is an engine bug: it panics in debug
    /// builds and returns `DoubleFree` in release, leaving the lists intact.
    pub fn free(&self, start: u64, len: u64) -> Result<(), AllocError> {
        let result = self.try_free(start, len);
        debug_assert!(
            !matches!(result, Err(AllocError::DoubleFree { .. })),
            "double free of blocks {start}+{len}: {result:?}"
        );
        result
    }

    /// `free` without the debug assertion (tests exercise the error path).
    pub(super) fn try_free(&self, start: u64, len: u64) -> Result<(), AllocError> {
        self.check_range(start, len)?;
        match self.change(start, len, Change::Free) {
            Ok(()) => Ok(()),
            Err((block, done_end)) => {
                if done_end > start {
                    // Undo the pieces already freed so the failed call has no
                    // effect. Best effort: another thread may have allocated
                    // them in between, which leaves them in use — the state
                    // this failed free should leave anyway.
                    let _ = self.change(start, done_end - start, Change::Use);
                }
                Err(AllocError::DoubleFree { block })
            }
        }
    }

    /// Mark `[start, start + len)`, currently free, as in use (crash rebuild).
    /// If any block of it is already in use, nothing changes and
    /// `AlreadyUsed` names the first such block (fsck: a block used twice).
    pub fn mark_used(&self, start: u64, len: u64) -> Result<(), AllocError> {
        self.check_range(start, len)?;
        match self.change(start, len, Change::Use) {
            Ok(()) => Ok(()),
            Err((block, done_end)) => {
                if done_end > start {
                    // We hold the prefix we just took, so nobody else can
                    // have freed it: giving it back cannot fail.
                    let undo = self.change(start, done_end - start, Change::Free);
                    debug_assert!(undo.is_ok(), "undo of mark_used failed: {undo:?}");
                }
                Err(AllocError::AlreadyUsed { block })
            }
        }
    }

    /// Full consistency check of every lane and the counter (tests).
    #[cfg(test)]
    pub(super) fn check(&self) {
        let mut total = 0;
        for l in self.lanes.iter() {
            let set = lock(&l.free);
            set.ranges.check();
            for (s, len) in set.ranges.iter() {
                assert!(s >= l.region_start && s + len <= l.region_end);
            }
            let mut free_bits = 0;
            for b in l.region_start..l.region_end {
                let listed = set.recent.contains(b) || set.ranges.contains(b);
                assert_eq!(set.contains(b), listed, "block {b}: bit and lists disagree");
                free_bits += listed as u64;
            }
            assert_eq!(free_bits, set.total());
            for &b in set.recent.as_slice() {
                assert!(b >= l.region_start && b < l.region_end);
                assert!(
                    !set.ranges.contains(b),
                    "block {b} both recent and in a range"
                );
            }
            assert_eq!(
                l.largest_hint.load(Ordering::Relaxed),
                set.ranges.largest_len()
            );
            total += set.total();
        }
        assert_eq!(total, self.free_blocks());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::tests::all_ranges;
    use crate::testkit::Rng;

    /// The one-sweep constructor recovery uses gives the same free lists as
    /// marking every used extent one by one, and catches double use.
    #[test]
    fn from_used_matches_mark_used() {
        let (lanes, first, total) = (3u32, 40u64, 1000u64);
        let mut rng = Rng::new(1);
        for _ in 0..20 {
            let used = UsedBlocks::new(first, total);
            let slow = BlockAllocator::new_all_free(lanes, first, total);
            let mut block = first;
            while block < total {
                let x = rng.next_u64();
                let len = (x % 9).min(total - block);
                if x.is_multiple_of(3) && len > 0 {
                    used.mark(block, len).unwrap();
                    slow.mark_used(block, len).unwrap();
                }
                block += len.max(1);
            }
            let fast = BlockAllocator::from_used(lanes, first, total, &used);
            assert_eq!(fast.free_blocks(), slow.free_blocks());
            for l in 0..lanes {
                assert_eq!(fast.free_ranges(l), slow.free_ranges(l));
            }
        }
        let used = UsedBlocks::new(first, total);
        used.mark(100, 10).unwrap();
        assert_eq!(
            used.mark(105, 1),
            Err(AllocError::AlreadyUsed { block: 105 })
        );
        assert!(matches!(
            used.mark(995, 10),
            Err(AllocError::OutOfRange { .. })
        ));
        assert!(matches!(
            used.mark(10, 1),
            Err(AllocError::OutOfRange { .. })
        ));
    }

    #[test]
    fn regions_split_the_data_area() {
        let a = BlockAllocator::new_all_free(3, 10, 110);
        assert_eq!(a.capacity_blocks(), 100);
        assert_eq!(a.free_blocks(), 100);
        let regions: Vec<_> = (0..3).map(|l| a.lane_region(l)).collect();
        assert_eq!(regions, vec![(10, 43), (43, 76), (76, 110)]);
        for l in 0..3 {
            assert_eq!(
                a.free_ranges(l),
                vec![(
                    regions[l as usize].0,
                    regions[l as usize].1 - regions[l as usize].0
                )]
            );
        }
        a.check();
        // Fewer blocks than lanes: some regions are empty, lane_of still works.
        let b = BlockAllocator::new_all_free(4, 10, 12);
        for block in 10..12 {
            assert!(b.is_free(block));
        }
        assert!(!b.is_free(9) && !b.is_free(12));
        assert_eq!(b.alloc(0, 5), Some((10, 1)));
        assert_eq!(b.alloc(0, 5), Some((11, 1)));
        assert_eq!(b.alloc(0, 1), None);
        b.check();
    }

    #[test]
    fn free_merges_and_spans_lanes() {
        let a = BlockAllocator::new_all_used(2, 100, 120);
        assert_eq!(a.free_blocks(), 0);
        assert_eq!(a.alloc(0, 1), None);
        a.free(105, 3).unwrap();
        a.free(101, 2).unwrap();
        a.free(103, 2).unwrap(); // bridges both neighbours
        assert_eq!(a.free_ranges(0), vec![(101, 7)]);
        a.free(108, 5).unwrap(); // spans lanes 0 and 1 at block 110
        assert_eq!(a.free_ranges(0), vec![(101, 9)]);
        assert_eq!(a.free_ranges(1), vec![(110, 3)]);
        a.free(100, 1).unwrap();
        a.free(113, 7).unwrap();
        assert_eq!(all_ranges(&a), vec![vec![(100, 10)], vec![(110, 10)]]);
        assert_eq!(a.free_blocks(), 20);
        a.check();
    }

    #[test]
    fn double_free_is_detected_and_changes_nothing() {
        let a = BlockAllocator::new_all_used(2, 0, 20);
        a.try_free(2, 4).unwrap();
        let before = all_ranges(&a);
        assert_eq!(a.try_free(5, 2), Err(AllocError::DoubleFree { block: 5 }));
        assert_eq!(a.try_free(0, 3), Err(AllocError::DoubleFree { block: 2 }));
        // Spanning two lanes, the double free in the second piece: the first
        // piece is rolled back.
        a.try_free(12, 1).unwrap();
        let before2 = all_ranges(&a);
        assert_eq!(a.try_free(8, 6), Err(AllocError::DoubleFree { block: 12 }));
        assert_eq!(all_ranges(&a), before2);
        assert_ne!(before, before2);
        assert_eq!(a.free_blocks(), 5);
        a.check();
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_panics_in_debug() {
        let a = BlockAllocator::new_all_free(1, 0, 8);
        let _ = a.free(3, 1);
    }

    #[test]
    fn out_of_range_is_rejected() {
        let a = BlockAllocator::new_all_used(2, 10, 20);
        for (s, l) in [(9, 1), (19, 2), (10, 0), (u64::MAX, 2), (0, u64::MAX)] {
            assert_eq!(
                a.try_free(s, l),
                Err(AllocError::OutOfRange { start: s, len: l })
            );
            assert_eq!(
                a.mark_used(s, l),
                Err(AllocError::OutOfRange { start: s, len: l })
            );
        }
        assert_eq!(a.free_blocks(), 0);
    }

    #[test]
    fn mark_used_detects_blocks_used_twice() {
        let a = BlockAllocator::new_all_free(2, 0, 20);
        a.mark_used(3, 4).unwrap();
        assert_eq!(a.free_ranges(0), vec![(0, 3), (7, 3)]);
        assert_eq!(a.mark_used(6, 2), Err(AllocError::AlreadyUsed { block: 6 }));
        assert_eq!(a.mark_used(1, 3), Err(AllocError::AlreadyUsed { block: 3 }));
        // Spanning lanes, conflict in the second piece: first piece undone.
        a.mark_used(15, 1).unwrap();
        assert_eq!(
            a.mark_used(8, 10),
            Err(AllocError::AlreadyUsed { block: 15 })
        );
        assert_eq!(a.free_ranges(0), vec![(0, 3), (7, 3)]);
        assert_eq!(a.free_ranges(1), vec![(10, 5), (16, 4)]);
        assert!(!a.is_free(3) && a.is_free(7) && !a.is_free(15));
        assert_eq!(a.free_blocks(), 15);
        a.check();
    }
}
