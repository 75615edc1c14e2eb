//! The inode-slot allocator: per lane, the next never-used slot (the high
//! water) plus the freed slots below it, as ranges. Inode numbers are
//! (lane, slot) pairs (`format::lane_slot_to_ino`), so a slot never moves
//! between lanes and there is no stealing. Its state reaches media with
//! the block free lists, in the same save areas (`save.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::range_set::RangeSet;
use super::{lock, AllocError};

#[derive(Default)]
pub(super) struct SlotLane {
    /// One past the highest slot in use since mkfs or the last rebuild:
    /// every slot at or above it is free and has never been handed out.
    pub(super) high_water: u64,
    /// Freed slots below `high_water`, as ranges (a rebuild can leave large gaps).
    pub(super) freed: RangeSet,
}

/// Inode-slot allocator: per lane, the next never-used slot plus the set of
/// freed slots below it. Inode numbers are (lane, slot) pairs
/// (`format::lane_slot_to_ino`).
pub struct InodeSlots {
    pub(super) lanes: Box<[Mutex<SlotLane>]>,
    /// Slots in use over all lanes.
    pub(super) used: AtomicU64,
}

impl InodeSlots {
    /// Every slot free. Slot 0 of lane 0 is the root: the caller marks it.
    pub fn new(lane_count: u32) -> Self {
        assert!(lane_count >= 1, "an allocator needs at least one lane");
        InodeSlots {
            lanes: (0..lane_count)
                .map(|_| Mutex::new(SlotLane::default()))
                .collect(),
            used: AtomicU64::new(0),
        }
    }

    pub fn lane_count(&self) -> u32 {
        self.lanes.len() as u32
    }

    /// The lowest free slot of `lane` (freed slots are reused before the
    /// high water grows, keeping the inode table short). `lane` must be a
    /// real lane: it is part of the inode number.
    pub fn alloc(&self, lane: u32) -> u64 {
        let mut l = lock(&self.lanes[lane as usize]);
        let slot = match l.freed.lowest() {
            Some((start, _)) => {
                l.freed
                    .remove(start, 1)
                    .expect("lowest freed slot is in the set");
                start
            }
            None => {
                let slot = l.high_water;
                l.high_water = slot.checked_add(1).expect("inode slots exhausted");
                slot
            }
        };
        self.used.fetch_add(1, Ordering::Relaxed);
        slot
    }

    /// Give `slot` back. Freeing a slot that is not in use is an engine bug:
    /// it panics in debug builds and returns `SlotNotUsed` in release.
    pub fn free(&self, lane: u32, slot: u64) -> Result<(), AllocError> {
        let result = self.try_free(lane, slot);
        debug_assert!(result.is_ok(), "{result:?}");
        result
    }

    pub(super) fn try_free(&self, lane: u32, slot: u64) -> Result<(), AllocError> {
        let mut l = lock(&self.lanes[lane as usize]);
        if slot >= l.high_water {
            return Err(AllocError::SlotNotUsed { lane, slot });
        }
        l.freed
            .insert(slot, 1)
            .map_err(|_| AllocError::SlotNotUsed { lane, slot })?;
        let before = self.used.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(before >= 1);
        Ok(())
    }

    /// Mark `slot` in use (rebuild after a crash, or the root at mkfs).
    /// Slots skipped over below it become free.
    pub fn mark_used(&self, lane: u32, slot: u64) -> Result<(), AllocError> {
        let mut l = lock(&self.lanes[lane as usize]);
        if slot >= l.high_water {
            let new_high_water = slot.checked_add(1).ok_or(AllocError::OutOfRange {
                start: slot,
                len: 1,
            })?;
            if slot > l.high_water {
                let gap_start = l.high_water;
                // Everything in `freed` is below the old high water: no overlap.
                l.freed
                    .insert(gap_start, slot - gap_start)
                    .expect("gap above every freed slot");
            }
            l.high_water = new_high_water;
        } else {
            l.freed
                .remove(slot, 1)
                .map_err(|_| AllocError::SlotAlreadyUsed { lane, slot })?;
        }
        self.used.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    pub fn is_used(&self, lane: u32, slot: u64) -> bool {
        let l = lock(&self.lanes[lane as usize]);
        slot < l.high_water && !l.freed.contains(slot)
    }

    /// Slots in use over all lanes.
    pub fn used_count(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// One past the highest slot of `lane` in use since mkfs or the last rebuild.
    pub fn slots_high_water(&self, lane: u32) -> u64 {
        lock(&self.lanes[lane as usize]).high_water
    }

    /// Freed slot ranges of `lane` below its high water, ascending.
    pub fn freed_ranges(&self, lane: u32) -> Vec<(u64, u64)> {
        lock(&self.lanes[lane as usize]).freed.iter().collect()
    }

    #[cfg(test)]
    pub(super) fn check(&self) {
        let mut used = 0;
        for l in self.lanes.iter() {
            let l = lock(l);
            l.freed.check();
            if let Some((s, len)) = l.freed.iter().last() {
                assert!(s + len <= l.high_water);
            }
            used += l.high_water - l.freed.total();
        }
        assert_eq!(used, self.used_count());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_slots_reuse_lowest_first() {
        let s = InodeSlots::new(2);
        s.mark_used(0, 0).unwrap(); // root
        assert_eq!(s.alloc(0), 1);
        assert_eq!(s.alloc(0), 2);
        assert_eq!(s.alloc(0), 3);
        assert_eq!(s.alloc(1), 0);
        s.free(0, 2).unwrap();
        s.free(0, 1).unwrap();
        assert_eq!(s.freed_ranges(0), vec![(1, 2)]);
        assert_eq!(s.used_count(), 3);
        assert_eq!(s.alloc(0), 1);
        assert_eq!(s.alloc(0), 2);
        assert_eq!(s.alloc(0), 4);
        assert_eq!(s.slots_high_water(0), 5);
        assert_eq!(
            s.try_free(0, 9),
            Err(AllocError::SlotNotUsed { lane: 0, slot: 9 })
        );
        s.free(0, 4).unwrap();
        assert_eq!(
            s.try_free(0, 4),
            Err(AllocError::SlotNotUsed { lane: 0, slot: 4 })
        );
        s.check();
    }

    #[test]
    fn inode_mark_used_leaves_gaps_free() {
        let s = InodeSlots::new(1);
        s.mark_used(0, 5).unwrap();
        s.mark_used(0, 2).unwrap();
        s.mark_used(0, 1_000_000_000).unwrap(); // huge gap stays one range
        assert_eq!(
            s.mark_used(0, 5),
            Err(AllocError::SlotAlreadyUsed { lane: 0, slot: 5 })
        );
        assert_eq!(s.freed_ranges(0), vec![(0, 2), (3, 2), (6, 999_999_994)]);
        assert_eq!(s.used_count(), 3);
        assert!(s.is_used(0, 2) && !s.is_used(0, 3) && !s.is_used(0, 1_000_000_001));
        assert_eq!(s.alloc(0), 0);
        s.check();
    }
}
