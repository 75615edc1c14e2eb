//! The free lists on media: at a clean unmount `BlockAllocator::save`
//! writes each lane's free block ranges and freed inode slots into the
//! lane's save area (three ordering points, below), and the next mount
//! restores both allocators from them instead of scanning every log. The
//! area's format is `SaveHeader` + `SavedRange` in docs/FORMAT.md; every
//! count and range read back is checked before it is trusted, and any
//! refusal makes the mount rebuild by scanning.

use std::mem::size_of;
use std::sync::atomic::Ordering;

use super::blocks::BlockAllocator;
use super::slots::InodeSlots;
use super::{lock, AllocError};
use crate::format::{
    lane_first_block, lane_slots_max, lanes_end_block, Pod, SaveHeader, SavedRange, BLOCK_SIZE,
    LANES_MAX, LANE_SAVE_BLOCKS, LANE_SAVE_FIRST_BLOCK, LOG_CHUNKS_FULL, SAVE_MAGIC,
    SAVE_MAX_RANGES,
};
use crate::pmem::{read_pod, write_pod, Pmem};

const SAVE_HEADER_BYTES: u64 = size_of::<SaveHeader>() as u64;
const SAVED_RANGE_BYTES: u64 = size_of::<SavedRange>() as u64;
const SAVE_AREA_BYTES: u64 = LANE_SAVE_BLOCKS * BLOCK_SIZE;
// The header plus the largest range table must fit the save area.
const _: () =
    assert!(SAVE_HEADER_BYTES + SAVE_MAX_RANGES as u64 * SAVED_RANGE_BYTES <= SAVE_AREA_BYTES);

impl BlockAllocator {
    /// Persist the free lists into each lane's save area (clean unmount),
    /// tagged with `epoch`; `inodes`' free slots go in the same areas.
    ///
    /// Call with no allocation in flight: each lane is snapshot separately.
    /// Returns Ok(false), leaving no valid header anywhere, when a lane's
    /// block and inode ranges together exceed `SAVE_MAX_RANGES`: the next
    /// mount must then rebuild by scanning.
    pub fn save<P: Pmem + ?Sized>(
        &self,
        pm: &P,
        epoch: u64,
        inodes: &InodeSlots,
    ) -> Result<bool, AllocError> {
        let lane_count = self.lane_count();
        if inodes.lane_count() != lane_count {
            return Err(AllocError::LaneCountMismatch {
                blocks: lane_count,
                inodes: inodes.lane_count(),
            });
        }
        let need_bytes = save_areas_end_bytes(lane_count);
        if pm.size_bytes() < need_bytes {
            return Err(AllocError::PoolTooSmall {
                need_bytes,
                size_bytes: pm.size_bytes(),
            });
        }
        // The save areas live in the lane areas, below the data area; an
        // overlap would overwrite data blocks.
        debug_assert!(self.first_block >= lanes_end_block(lane_count));

        // Ordering point 1: invalidate every header before any range is
        // rewritten. A crash (or an overflow) from here on leaves no header
        // vouching for half-rewritten ranges, even if an earlier save in this
        // same epoch had left valid ones.
        for lane in 0..lane_count {
            let off = save_area_offset(lane);
            write_pod(pm, off, &SaveHeader::zeroed());
            pm.flush(off, SAVE_HEADER_BYTES);
        }
        pm.fence();

        // Ordering point 2: every lane's ranges durable before any header is
        // written. A crash before the fence leaves all headers invalid.
        let mut headers = Vec::with_capacity(lane_count as usize);
        for lane in 0..lane_count {
            let Some((header, range_bytes)) = self.save_image(lane, epoch, inodes) else {
                return Ok(false);
            };
            if !range_bytes.is_empty() {
                let off = save_area_offset(lane) + SAVE_HEADER_BYTES;
                pm.write(off, &range_bytes);
                pm.flush(off, range_bytes.len() as u64);
            }
            headers.push(header);
        }
        pm.fence();

        // Ordering point 3: the headers. A crash before this fence leaves
        // some lanes valid and others not; restore needs all of them valid,
        // so the mount rebuilds.
        for (lane, header) in (0..lane_count).zip(&headers) {
            let off = save_area_offset(lane);
            write_pod(pm, off, header);
            pm.flush(off, SAVE_HEADER_BYTES);
            debug_assert_eq!(read_pod::<SaveHeader, P>(pm, off), *header);
        }
        pm.fence();
        Ok(true)
    }

    /// The header and range table of lane `lane`'s save area, or None if its
    /// ranges do not fit.
    fn save_image(
        &self,
        lane: u32,
        epoch: u64,
        inodes: &InodeSlots,
    ) -> Option<(SaveHeader, Vec<u8>)> {
        let mut bytes = Vec::new();
        let push = |bytes: &mut Vec<u8>, start: u64, len: u64| {
            bytes.extend_from_slice(SavedRange { start, len }.as_bytes());
        };
        let block_lane = &self.lanes[lane as usize];
        let block_ranges = {
            let mut set = lock(&block_lane.free);
            set.settle();
            block_lane.publish(&set);
            let set = &set.ranges;
            if set.count() > SAVE_MAX_RANGES {
                return None;
            }
            for (start, len) in set.iter() {
                debug_assert!(
                    start >= block_lane.region_start && start + len <= block_lane.region_end
                );
                push(&mut bytes, start, len);
            }
            set.count()
        };
        let (slots_high_water, inode_ranges) = {
            let slots = lock(&inodes.lanes[lane as usize]);
            if block_ranges + slots.freed.count() > SAVE_MAX_RANGES {
                return None;
            }
            for (start, len) in slots.freed.iter() {
                debug_assert!(start + len <= slots.high_water);
                push(&mut bytes, start, len);
            }
            (slots.high_water, slots.freed.count())
        };
        // Partly used chunk blocks: {block, bitmap of chunks in use}.
        let chunk_blocks = self.chunk_blocks(lane);
        if block_ranges + inode_ranges + chunk_blocks.len() > SAVE_MAX_RANGES {
            return None;
        }
        for &(block, mask) in &chunk_blocks {
            push(&mut bytes, block, mask);
        }
        let mut header = SaveHeader {
            magic: SAVE_MAGIC,
            epoch,
            block_ranges: block_ranges as u32,
            inode_ranges: inode_ranges as u32,
            inode_slots_used: slots_high_water,
            chunk_blocks: chunk_blocks.len() as u32,
            reserved: [0; 24],
            checksum: 0,
        };
        header.checksum = save_checksum(&header, &bytes);
        Some((header, bytes))
    }

    /// Restore both allocators from the save areas written by [`save`](Self::save)
    /// at the clean unmount of `epoch`. None unless every lane's header is
    /// valid (magic, epoch, checksum) and its ranges lie inside the lane's
    /// region (slots: below the high water) without overlapping; the caller
    /// then rebuilds by scanning.
    pub fn restore<P: Pmem + ?Sized>(
        pm: &P,
        lane_count: u32,
        first_block: u64,
        total_blocks: u64,
        epoch: u64,
    ) -> Option<(BlockAllocator, InodeSlots)> {
        Self::try_restore(pm, lane_count, first_block, total_blocks, epoch).ok()
    }

    /// `restore`, saying why it refused (tests and fsck check the reason).
    pub(crate) fn try_restore<P: Pmem + ?Sized>(
        pm: &P,
        lane_count: u32,
        first_block: u64,
        total_blocks: u64,
        epoch: u64,
    ) -> Result<(BlockAllocator, InodeSlots), Refusal> {
        // The geometry comes from the superblock: refuse rather than panic.
        if lane_count == 0
            || lane_count > LANES_MAX
            || first_block > total_blocks
            || first_block < lanes_end_block(lane_count)
            || pm.size_bytes() < save_areas_end_bytes(lane_count)
        {
            return Err(Refusal::Geometry);
        }
        let blocks = BlockAllocator::new_all_used(lane_count, first_block, total_blocks);
        let inodes = InodeSlots::new(lane_count);
        for lane in 0..lane_count {
            let off = save_area_offset(lane);
            let header: SaveHeader = read_pod(pm, off);
            if header.magic != SAVE_MAGIC {
                return Err(Refusal::Magic { lane });
            }
            if header.epoch != epoch {
                return Err(Refusal::Epoch { lane });
            }
            let block_ranges = header.block_ranges as usize;
            let inode_ranges = header.inode_ranges as usize;
            let range_count = block_ranges + inode_ranges + header.chunk_blocks as usize;
            // Bound the read before trusting the counts.
            if range_count > SAVE_MAX_RANGES {
                return Err(Refusal::TooManyRanges { lane });
            }
            let mut bytes = vec![0u8; range_count * SAVED_RANGE_BYTES as usize];
            pm.read(off + SAVE_HEADER_BYTES, &mut bytes);
            if save_checksum(&header, &bytes) != header.checksum {
                return Err(Refusal::Checksum { lane });
            }
            let mut ranges = bytes
                .chunks_exact(SAVED_RANGE_BYTES as usize)
                .map(SavedRange::from_bytes);

            let block_lane = &blocks.lanes[lane as usize];
            let mut set = lock(&block_lane.free);
            for r in ranges.by_ref().take(block_ranges) {
                let inside = r.len > 0
                    && r.start >= block_lane.region_start
                    && r.start
                        .checked_add(r.len)
                        .is_some_and(|e| e <= block_lane.region_end);
                if !inside {
                    return Err(Refusal::BlockRange { lane });
                }
                set.add_range(r.start, r.len)
                    .map_err(|_| Refusal::BlockRange { lane })?;
            }
            block_lane.count_freed(set.total());
            block_lane.publish(&set);
            drop(set);

            // The high water is bounded by what the lane's table can hold
            // (a larger one would hand out slots no table block can take).
            if header.inode_slots_used > lane_slots_max(total_blocks - first_block) {
                return Err(Refusal::SlotRange { lane });
            }
            let mut slots = lock(&inodes.lanes[lane as usize]);
            slots.high_water = header.inode_slots_used;
            for r in ranges.by_ref().take(inode_ranges) {
                let inside = r.len > 0
                    && r.start
                        .checked_add(r.len)
                        .is_some_and(|e| e <= slots.high_water);
                if !inside {
                    return Err(Refusal::SlotRange { lane });
                }
                slots
                    .freed
                    .insert(r.start, r.len)
                    .map_err(|_| Refusal::SlotRange { lane })?;
            }
            inodes
                .used
                .fetch_add(slots.high_water - slots.freed.total(), Ordering::Relaxed);
            drop(slots);

            // Chunk blocks: in the lane's region, ascending, in use for the
            // block lists, a bitmap with a chunk used and one free.
            let mut last = None;
            for r in ranges {
                let inside = r.start >= block_lane.region_start
                    && r.start < block_lane.region_end
                    && last.is_none_or(|l| l < r.start)
                    && r.len != 0
                    && r.len < LOG_CHUNKS_FULL;
                if !inside {
                    return Err(Refusal::ChunkBlock { lane });
                }
                blocks
                    .add_chunk_block(r.start, r.len)
                    .map_err(|_| Refusal::ChunkBlock { lane })?;
                last = Some(r.start);
            }
        }
        Ok((blocks, inodes))
    }
}

/// Why `restore` refused the save areas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    Geometry,
    Magic { lane: u32 },
    Epoch { lane: u32 },
    TooManyRanges { lane: u32 },
    Checksum { lane: u32 },
    BlockRange { lane: u32 },
    SlotRange { lane: u32 },
    ChunkBlock { lane: u32 },
}

/// Byte offset of lane `lane`'s save area.
fn save_area_offset(lane: u32) -> u64 {
    (lane_first_block(lane) + LANE_SAVE_FIRST_BLOCK) * BLOCK_SIZE
}

/// First byte past the last lane's save area.
fn save_areas_end_bytes(lane_count: u32) -> u64 {
    debug_assert!(lane_count >= 1);
    save_area_offset(lane_count - 1) + SAVE_AREA_BYTES
}

/// crc32c over the header with its checksum field zero, then the ranges.
fn save_checksum(header: &SaveHeader, range_bytes: &[u8]) -> u32 {
    let mut h = *header;
    h.checksum = 0;
    crc32c::crc32c_append(crc32c::crc32c(h.as_bytes()), range_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::tests::{all_ranges, all_slots, MemPool};

    /// Write a save area by hand (with a correct checksum) to build inputs
    /// `save` itself would never produce.
    fn write_save_area(
        pm: &MemPool,
        lane: u32,
        epoch: u64,
        high_water: u64,
        blocks: &[(u64, u64)],
        slots: &[(u64, u64)],
    ) {
        let mut bytes = Vec::new();
        for &(start, len) in blocks.iter().chain(slots) {
            bytes.extend_from_slice(SavedRange { start, len }.as_bytes());
        }
        let mut h = SaveHeader {
            magic: SAVE_MAGIC,
            epoch,
            block_ranges: blocks.len() as u32,
            inode_ranges: slots.len() as u32,
            inode_slots_used: high_water,
            chunk_blocks: 0,
            reserved: [0; 24],
            checksum: 0,
        };
        h.checksum = save_checksum(&h, &bytes);
        let off = save_area_offset(lane);
        write_pod(pm, off, &h);
        pm.write(off + SAVE_HEADER_BYTES, &bytes);
    }

    #[test]
    fn save_restore_round_trip() {
        let lanes = 3;
        let first = lanes_end_block(lanes);
        let pm = MemPool::for_lanes(lanes);
        let a = BlockAllocator::new_all_free(lanes, first, first + 300);
        let s = InodeSlots::new(lanes);
        s.mark_used(0, 0).unwrap();
        for i in 0..40 {
            let (start, len) = a.alloc(i % lanes, 1 + i as u64 % 7).unwrap();
            if i % 3 == 0 {
                a.free(start, len).unwrap();
            }
            let slot = s.alloc(i % lanes);
            if i % 4 == 1 {
                s.free(i % lanes, slot).unwrap();
            }
        }
        // Partly used chunk blocks in two lanes (and a full one, in none).
        let chunks: Vec<u64> = (0..6).map(|i| a.alloc_chunk(i % 2).unwrap()).collect();
        a.free_log_page(chunks[1]).unwrap();
        assert_eq!(a.save(&pm, 42, &s), Ok(true));
        let (b, t) = BlockAllocator::restore(&pm, lanes, first, first + 300, 42).unwrap();
        for lane in 0..lanes {
            assert_eq!(a.chunk_blocks(lane), b.chunk_blocks(lane));
        }
        assert!(b.free_chunks() > 0);
        assert_eq!(a.free_chunks(), b.free_chunks());
        assert_eq!(all_ranges(&a), all_ranges(&b));
        assert_eq!(all_slots(&s), all_slots(&t));
        assert_eq!(a.free_blocks(), b.free_blocks());
        assert_eq!(s.used_count(), t.used_count());
        b.check();
        t.check();
        // The restored allocators keep working.
        assert!(b.alloc(0, 1).is_some());
        assert_eq!(t.alloc(0), s.alloc(0));
    }

    #[test]
    fn restore_refuses_bad_save_areas() {
        let lanes = 2;
        let first = lanes_end_block(lanes);
        let total = first + 100;
        let fresh = || {
            let pm = MemPool::for_lanes(lanes);
            let a = BlockAllocator::new_all_free(lanes, first, total);
            let s = InodeSlots::new(lanes);
            a.alloc(0, 3).unwrap();
            s.alloc(1);
            assert_eq!(a.save(&pm, 7, &s), Ok(true));
            pm
        };
        let refusal =
            |pm: &MemPool, epoch| BlockAllocator::try_restore(pm, lanes, first, total, epoch).err();
        let pm = fresh();
        assert_eq!(refusal(&pm, 7), None);
        assert_eq!(refusal(&pm, 8), Some(Refusal::Epoch { lane: 0 }));
        assert!(BlockAllocator::restore(&pm, lanes, first, total, 6).is_none());
        // Geometry that does not match the pool.
        assert!(BlockAllocator::try_restore(&pm, 0, first, total, 7).is_err());
        assert_eq!(
            BlockAllocator::try_restore(&pm, lanes, 1, total, 7).err(),
            Some(Refusal::Geometry)
        );
        assert_eq!(
            BlockAllocator::try_restore(&pm, 3, first, total, 7).err(),
            Some(Refusal::Geometry)
        );
        // Saved with another geometry: ranges fall outside the new regions.
        assert_eq!(
            BlockAllocator::try_restore(&pm, lanes, first, total + 50, 7).err(),
            Some(Refusal::BlockRange { lane: 1 })
        );

        // A flipped bit in a range (lane 1's first range).
        let pm = fresh();
        let off = save_area_offset(1) + SAVE_HEADER_BYTES + 3;
        let mut byte = [0u8];
        pm.read(off, &mut byte);
        pm.write(off, &[byte[0] ^ 0x10]);
        assert_eq!(refusal(&pm, 7), Some(Refusal::Checksum { lane: 1 }));
        // A corrupted checksum field.
        let pm = fresh();
        let mut h: SaveHeader = read_pod(&pm, save_area_offset(0));
        h.checksum ^= 1;
        write_pod(&pm, save_area_offset(0), &h);
        assert_eq!(refusal(&pm, 7), Some(Refusal::Checksum { lane: 0 }));
        // Bad magic.
        let pm = fresh();
        pm.write(save_area_offset(1), &[0; 8]);
        assert_eq!(refusal(&pm, 7), Some(Refusal::Magic { lane: 1 }));
        // Range count beyond the area (checksum "valid" by construction is
        // impossible here; the bound is checked before the read).
        let pm = fresh();
        let mut h: SaveHeader = read_pod(&pm, save_area_offset(0));
        h.block_ranges = SAVE_MAX_RANGES as u32;
        h.inode_ranges = 1;
        write_pod(&pm, save_area_offset(0), &h);
        assert_eq!(refusal(&pm, 7), Some(Refusal::TooManyRanges { lane: 0 }));

        // Well-checksummed but inconsistent contents.
        let (r0, r1) = ((first, 50), (first + 50, 50));
        // (lane 0's block ranges, its slot high water, its slot ranges, expected refusal)
        type Case = (Vec<(u64, u64)>, u64, Vec<(u64, u64)>, Refusal);
        let cases: Vec<Case> = vec![
            (
                vec![(first, 10), (first + 5, 10)],
                0,
                vec![],
                Refusal::BlockRange { lane: 0 },
            ),
            (
                vec![(first + 5, 10), (first, 10)],
                0,
                vec![],
                Refusal::BlockRange { lane: 0 },
            ),
            (
                vec![(first, 10), (first, 10)],
                0,
                vec![],
                Refusal::BlockRange { lane: 0 },
            ),
            (
                vec![(first - 1, 2)],
                0,
                vec![],
                Refusal::BlockRange { lane: 0 },
            ),
            (
                vec![(first + 45, 10)],
                0,
                vec![],
                Refusal::BlockRange { lane: 0 },
            ), // into lane 1
            (vec![(first, 0)], 0, vec![], Refusal::BlockRange { lane: 0 }),
            (
                vec![(u64::MAX - 1, 5)],
                0,
                vec![],
                Refusal::BlockRange { lane: 0 },
            ),
            (vec![], 4, vec![(2, 3)], Refusal::SlotRange { lane: 0 }),
            (
                vec![],
                4,
                vec![(0, 2), (1, 2)],
                Refusal::SlotRange { lane: 0 },
            ),
            (vec![], 4, vec![(1, 0)], Refusal::SlotRange { lane: 0 }),
        ];
        for (blocks, high_water, slots, why) in cases {
            let pm = MemPool::for_lanes(lanes);
            write_save_area(&pm, 0, 7, high_water, &blocks, &slots);
            write_save_area(&pm, 1, 7, 0, &[r1], &[]);
            assert_eq!(refusal(&pm, 7), Some(why), "{blocks:?} {slots:?}");
        }
        // The hand-written format is the one restore reads: a valid pair works.
        let pm = MemPool::for_lanes(lanes);
        write_save_area(&pm, 0, 7, 4, &[r0], &[(1, 2)]);
        write_save_area(&pm, 1, 7, 0, &[r1], &[]);
        let (b, t) = BlockAllocator::restore(&pm, lanes, first, total, 7).unwrap();
        assert_eq!(b.free_blocks(), 100);
        assert_eq!(t.used_count(), 2);
    }

    #[test]
    fn save_overflow_invalidates_and_forces_rebuild() {
        let lanes = 2;
        let first = lanes_end_block(lanes);
        let per_lane = 2 * SAVE_MAX_RANGES as u64 + 10;
        let total = first + 2 * per_lane;
        let pm = MemPool::for_lanes(lanes);
        let a = BlockAllocator::new_all_free(lanes, first, total);
        let s = InodeSlots::new(lanes);
        // A valid save in this epoch first: the failed one must void it.
        assert_eq!(a.save(&pm, 9, &s), Ok(true));
        assert!(BlockAllocator::restore(&pm, lanes, first, total, 9).is_some());
        // Fragment lane 1 into more ranges than its area holds.
        let (start, len) = a.alloc(1, per_lane).unwrap();
        assert_eq!(len, per_lane);
        for b in (start..start + len).step_by(2) {
            a.free(b, 1).unwrap();
        }
        assert!(a.free_ranges(1).len() > SAVE_MAX_RANGES);
        assert_eq!(a.save(&pm, 9, &s), Ok(false));
        assert_eq!(
            BlockAllocator::try_restore(&pm, lanes, first, total, 9).err(),
            Some(Refusal::Magic { lane: 0 })
        );
        // Exactly at the limit (block + inode ranges) still fits; one more does not.
        let a = BlockAllocator::new_all_free(1, lanes_end_block(1), lanes_end_block(1) + per_lane);
        let (start, _) = a.alloc(0, per_lane).unwrap();
        for i in 0..SAVE_MAX_RANGES as u64 - 1 {
            a.free(start + 2 * i, 1).unwrap();
        }
        let s = InodeSlots::new(1);
        for _ in 0..3 {
            s.alloc(0);
        }
        s.free(0, 1).unwrap();
        let pm = MemPool::for_lanes(1);
        assert_eq!(a.save(&pm, 3, &s), Ok(true));
        let (b, t) =
            BlockAllocator::restore(&pm, 1, lanes_end_block(1), lanes_end_block(1) + per_lane, 3)
                .unwrap();
        assert_eq!(all_ranges(&a), all_ranges(&b));
        assert_eq!(all_slots(&s), all_slots(&t));
        s.free(0, 2).unwrap(); // merges with slot 1: still one range
        s.free(0, 0).unwrap(); // still one range
        assert_eq!(a.save(&pm, 3, &s), Ok(true));
        let extra = InodeSlots::new(1);
        for _ in 0..3 {
            extra.alloc(0);
        }
        extra.free(0, 0).unwrap();
        extra.free(0, 2).unwrap(); // two slot ranges: one too many
        assert_eq!(a.save(&pm, 3, &extra), Ok(false));
        assert!(BlockAllocator::restore(
            &pm,
            1,
            lanes_end_block(1),
            lanes_end_block(1) + per_lane,
            3
        )
        .is_none());
    }

    #[test]
    fn save_rejects_mismatched_inputs() {
        let pm = MemPool::for_lanes(2);
        let a = BlockAllocator::new_all_free(2, lanes_end_block(2), lanes_end_block(2) + 10);
        assert_eq!(
            a.save(&pm, 1, &InodeSlots::new(3)),
            Err(AllocError::LaneCountMismatch {
                blocks: 2,
                inodes: 3
            })
        );
        let small = MemPool::for_lanes(1);
        assert!(matches!(
            a.save(&small, 1, &InodeSlots::new(2)),
            Err(AllocError::PoolTooSmall { .. })
        ));
    }
}
