//! Per-lane block and inode-slot allocators, kept in DRAM.
//!
//! As in NOVA (`balloc.c`), free space is never tracked on media while the
//! pool is mounted: each lane (a per-CPU partition) keeps its free block
//! ranges in DRAM behind its own mutex, so threads on different lanes never
//! contend. The lists reach media only at a clean unmount ([`BlockAllocator::save`]
//! writes them into each lane's save area); after a crash the mount rebuilds
//! them by scanning the logs ([`BlockAllocator::new_all_free`] +
//! [`BlockAllocator::mark_used`] for every referenced extent, which also
//! catches a block referenced twice).
//!
//! Each lane also keeps up to `RECENT_MAX` single blocks freed recently
//! outside its ranges and hands them out first for one-block requests:
//! a copy-on-write overwrite frees one block and allocates one, and without
//! this each such pair split and merged ranges in two B-trees (on a
//! fragmented pool, more than the rest of the write). Anything that needs
//! the ranges to be complete (save, listing, best fit that failed) first
//! merges the singles back.
//!
//! Locking rule: a lane's mutex is never held while another lane's is taken
//! (stealing visits the other lanes one at a time), so there is no lock
//! order to get wrong and no deadlock.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::mem::size_of;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::format::{
    lane_first_block, lane_slots_max, lanes_end_block, Pod, SaveHeader, SavedRange, BLOCK_SIZE,
    LANES_MAX, LANE_SAVE_BLOCKS, LANE_SAVE_FIRST_BLOCK, SAVE_MAGIC, SAVE_MAX_RANGES,
};
use crate::pmem::{read_pod, write_pod, Pmem};

const SAVE_HEADER_BYTES: u64 = size_of::<SaveHeader>() as u64;
const SAVED_RANGE_BYTES: u64 = size_of::<SavedRange>() as u64;
const SAVE_AREA_BYTES: u64 = LANE_SAVE_BLOCKS * BLOCK_SIZE;
// The header plus the largest range table must fit the save area.
const _: () =
    assert!(SAVE_HEADER_BYTES + SAVE_MAX_RANGES as u64 * SAVED_RANGE_BYTES <= SAVE_AREA_BYTES);

/// Allocator errors. `DoubleFree`, `SlotNotUsed` and `LaneCountMismatch` are
/// engine bugs; `AlreadyUsed` and `OutOfRange` are what a rebuild or fsck
/// sees when media references a block twice or outside the data area.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocError {
    /// `block` was already free.
    DoubleFree { block: u64 },
    /// `block` was already in use (mark_used during a rebuild: referenced twice).
    AlreadyUsed { block: u64 },
    /// The range is empty or not inside the data area.
    OutOfRange { start: u64, len: u64 },
    /// Freeing an inode slot that is not in use.
    SlotNotUsed { lane: u32, slot: u64 },
    /// Marking an inode slot used that already is.
    SlotAlreadyUsed { lane: u32, slot: u64 },
    /// `save` got an `InodeSlots` built for another lane count.
    LaneCountMismatch { blocks: u32, inodes: u32 },
    /// The pool is too small to hold every lane's save area.
    PoolTooSmall { need_bytes: u64, size_bytes: u64 },
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::DoubleFree { block } => write!(f, "block {block} freed while already free"),
            AllocError::AlreadyUsed { block } => write!(f, "block {block} is already in use"),
            AllocError::OutOfRange { start, len } => {
                write!(
                    f,
                    "block range {start}+{len} is empty or outside the data area"
                )
            }
            AllocError::SlotNotUsed { lane, slot } => {
                write!(f, "inode slot {slot} of lane {lane} freed while not in use")
            }
            AllocError::SlotAlreadyUsed { lane, slot } => {
                write!(f, "inode slot {slot} of lane {lane} is already in use")
            }
            AllocError::LaneCountMismatch { blocks, inodes } => {
                write!(
                    f,
                    "block allocator has {blocks} lanes, inode slots {inodes}"
                )
            }
            AllocError::PoolTooSmall {
                need_bytes,
                size_bytes,
            } => {
                write!(
                    f,
                    "save areas need {need_bytes} bytes, pool has {size_bytes}"
                )
            }
        }
    }
}

impl std::error::Error for AllocError {}

impl From<AllocError> for crate::error::Error {
    fn from(e: AllocError) -> Self {
        // Every allocator error means the engine's view of the pool is
        // inconsistent (a bug or damaged media): EIO, never a user errno.
        crate::error::Error::Corrupt(e.to_string())
    }
}

/// Take a lane lock. A panic while a free list was being edited may have left
/// it half updated; carrying on could hand a block out twice, so poison is fatal.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock()
        .expect("allocator lane lock poisoned by a panic mid-update")
}

// ---------------------------------------------------------------------------
// RangeSet: a set of u64s stored as coalesced [start, start + len) ranges
// ---------------------------------------------------------------------------

/// Disjoint, coalesced ranges (no two ranges overlap or touch), indexed by
/// start for merging and lookup and by (len, start) for best-fit.
#[derive(Default, Debug)]
struct RangeSet {
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
    fn at_or_before(&self, at: u64) -> Option<(u64, u64)> {
        self.by_start
            .range(..=at)
            .next_back()
            .map(|(&s, &l)| (s, l))
    }

    /// Add `[start, start + len)`, merging with neighbours. On overlap the
    /// set is left unchanged and the first overlapping value is returned.
    fn insert(&mut self, start: u64, len: u64) -> Result<(), u64> {
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
    fn remove(&mut self, start: u64, len: u64) -> Result<(), u64> {
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

    fn contains(&self, value: u64) -> bool {
        self.at_or_before(value).is_some_and(|(s, l)| s + l > value)
    }

    /// Smallest range with at least `want` values (ties: lowest start).
    fn best_fit(&self, want: u64) -> Option<(u64, u64)> {
        self.by_len.range((want, 0)..).next().map(|&(l, s)| (s, l))
    }

    fn largest(&self) -> Option<(u64, u64)> {
        self.by_len.last().map(|&(l, s)| (s, l))
    }

    fn largest_len(&self) -> u64 {
        self.by_len.last().map_or(0, |&(l, _)| l)
    }

    fn lowest(&self) -> Option<(u64, u64)> {
        self.by_start.first_key_value().map(|(&s, &l)| (s, l))
    }

    fn count(&self) -> usize {
        self.by_start.len()
    }

    fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_start.iter().map(|(&s, &l)| (s, l))
    }

    /// Full consistency check (O(n)); tests call it after every operation.
    #[cfg(test)]
    fn check(&self) {
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

/// Single blocks freed recently, handed out again first (LIFO), so that a
/// steady stream of one-block frees and allocations (copy-on-write
/// overwrites, small files created and removed) recycles a few hot blocks
/// instead of splitting and merging ranges in the B-trees. Fixed capacity:
/// no heap allocation on the write path.
#[derive(Debug)]
struct Recent {
    blocks: [u64; RECENT_MAX],
    len: usize,
}

/// Blocks a lane keeps outside its range set. Small enough that the
/// duplicate scan on every push is a few vector compares.
const RECENT_MAX: usize = 64;

impl Default for Recent {
    fn default() -> Self {
        Recent {
            blocks: [0; RECENT_MAX],
            len: 0,
        }
    }
}

impl Recent {
    fn as_slice(&self) -> &[u64] {
        &self.blocks[..self.len]
    }

    fn contains(&self, block: u64) -> bool {
        self.as_slice().contains(&block)
    }

    fn is_full(&self) -> bool {
        self.len == RECENT_MAX
    }

    fn push(&mut self, block: u64) {
        debug_assert!(!self.is_full() && !self.contains(block));
        self.blocks[self.len] = block;
        self.len += 1;
    }

    fn pop(&mut self) -> Option<u64> {
        self.len = self.len.checked_sub(1)?;
        Some(self.blocks[self.len])
    }
}

/// A lane's free blocks: coalesced ranges plus the recently freed singles.
/// A block is in at most one of the two, and its bit in `bits` is set
/// exactly when it is in one: the double-free check on every free is then
/// one bit test, not a walk of a range tree that random copy-on-write has
/// grown to thousands of entries (it was 5% of a FUSE server's time).
#[derive(Debug)]
struct LaneFree {
    ranges: RangeSet,
    recent: Recent,
    /// First block of the lane's region (bit 0).
    base: u64,
    bits: Vec<u64>,
}

impl LaneFree {
    fn new(region_start: u64, region_end: u64) -> Self {
        LaneFree {
            ranges: RangeSet::default(),
            recent: Recent::default(),
            base: region_start,
            bits: vec![0; (region_end - region_start).div_ceil(64) as usize],
        }
    }

    fn total(&self) -> u64 {
        self.ranges.total + self.recent.len as u64
    }

    /// Whether `block` (inside the lane's region) is free.
    fn contains(&self, block: u64) -> bool {
        let i = block - self.base;
        self.bits[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    /// Mark `[start, start + len)` free or in use, a word at a time (a
    /// fresh lane is one range of up to billions of blocks).
    fn set_bits(&mut self, start: u64, len: u64, free: bool) {
        let (mut at, end) = (start - self.base, start - self.base + len);
        while at < end {
            let (word, shift) = ((at / 64) as usize, at % 64);
            let n = (64 - shift).min(end - at);
            let mask = if n == 64 {
                !0
            } else {
                ((1u64 << n) - 1) << shift
            };
            debug_assert!(
                self.bits[word] & mask == if free { 0 } else { mask },
                "blocks {}+{n} were not all {}",
                at + self.base,
                if free { "in use" } else { "free" }
            );
            if free {
                self.bits[word] |= mask;
            } else {
                self.bits[word] &= !mask;
            }
            at += n;
        }
    }

    /// Add `[start, start + len)` to the ranges (Err: the first block of it
    /// already free; nothing changed).
    fn add_range(&mut self, start: u64, len: u64) -> Result<(), u64> {
        self.ranges.insert(start, len)?;
        self.set_bits(start, len, true);
        Ok(())
    }

    /// Take `[start, start + len)` out of the ranges (Err: the first block
    /// of it not in them; nothing changed).
    fn take_range(&mut self, start: u64, len: u64) -> Result<(), u64> {
        self.ranges.remove(start, len)?;
        self.set_bits(start, len, false);
        Ok(())
    }

    fn push_recent(&mut self, block: u64) {
        self.recent.push(block);
        self.set_bits(block, 1, true);
    }

    fn pop_recent(&mut self) -> Option<u64> {
        let b = self.recent.pop()?;
        self.set_bits(b, 1, false);
        Some(b)
    }

    /// Move the recent singles into the ranges (merging them), for callers
    /// that need the ranges to be the whole truth: save, listing, marking
    /// blocks used. Every block stays free: no bit changes.
    fn settle(&mut self) {
        while let Some(b) = self.recent.pop() {
            self.ranges
                .insert(b, 1)
                .expect("a recent block is never also in the ranges");
        }
    }
}

// ---------------------------------------------------------------------------
// Block allocator
// ---------------------------------------------------------------------------

struct BlockLane {
    /// This lane's region of the data area: `[region_start, region_end)`.
    /// Its free ranges never leave it (merging stops at the boundary).
    region_start: u64,
    region_end: u64,
    free: Mutex<LaneFree>,
    /// Length of the lane's largest free range, stored under `free`'s lock
    /// and read without it so stealing can skip lanes without locking them.
    /// A stale value only costs a wasted lock or a skipped lane.
    largest_hint: AtomicU64,
    /// Free blocks of this lane (ranges and recent singles), changed only
    /// under `free`'s lock and read without it. Per lane, not one shared
    /// counter: two threads allocating in their own lanes then share no
    /// cache line, and an update is a plain store, not a locked add.
    free_count: AtomicU64,
    /// How many recently freed singles the lane keeps, stored under
    /// `free`'s lock and read without it (a stale value costs a wasted lock
    /// or a skipped lane).
    recent_hint: AtomicU64,
}

impl BlockLane {
    /// Publish the hints; call with the lock held, after every change.
    fn publish(&self, free: &LaneFree) {
        self.largest_hint
            .store(free.ranges.largest_len(), Ordering::Relaxed);
        self.publish_recent(free);
    }

    /// Publish the recent-singles hint alone (after a push or pop, which
    /// leave the ranges as they were).
    fn publish_recent(&self, free: &LaneFree) {
        self.recent_hint
            .store(free.recent.len as u64, Ordering::Relaxed);
    }

    /// `free_count += n`; call with the lock held.
    fn count_freed(&self, n: u64) {
        let c = self.free_count.load(Ordering::Relaxed);
        self.free_count.store(c + n, Ordering::Relaxed);
    }

    /// `free_count -= n`; call with the lock held.
    fn count_taken(&self, n: u64) {
        let c = self.free_count.load(Ordering::Relaxed);
        debug_assert!(c >= n, "free counter below a lane's free blocks");
        self.free_count.store(c - n, Ordering::Relaxed);
    }
}

/// Block allocator: the data area `[first_block, total_blocks)` is split into
/// `lane_count` contiguous regions, one per lane; each lane keeps its free
/// ranges in DRAM behind its own mutex.
pub struct BlockAllocator {
    first_block: u64,
    total_blocks: u64,
    lanes: Box<[BlockLane]>,
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
    fn lane_of(&self, block: u64) -> usize {
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
    fn take(&self, lane: &BlockLane, set: &mut LaneFree, start: u64, len: u64) -> (u64, u64) {
        set.take_range(start, len)
            .expect("range chosen from this very set under its lock");
        lane.publish(set);
        lane.count_taken(len);
        debug_assert!(start >= lane.region_start && start + len <= lane.region_end);
        (start, len)
    }

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
            if set.recent.len > 0 {
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
            let highest = set.ranges.by_start.last_key_value();
            if let Some((s, len)) = highest.map(|(&s, &l)| (s, l)) {
                return Some(self.take(l, &mut set, s + len - 1, 1).0);
            }
        }
        (0..n).find_map(|i| self.pop_recent((home + i) % n))
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
    fn try_free(&self, start: u64, len: u64) -> Result<(), AllocError> {
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
        let mut header = SaveHeader {
            magic: SAVE_MAGIC,
            epoch,
            block_ranges: block_ranges as u32,
            inode_ranges: inode_ranges as u32,
            inode_slots_used: slots_high_water,
            reserved: [0; 28],
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
            let range_count = block_ranges + header.inode_ranges as usize;
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
            for r in ranges {
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
                .fetch_add(slots.high_water - slots.freed.total, Ordering::Relaxed);
        }
        Ok((blocks, inodes))
    }

    /// Full consistency check of every lane and the counter (tests).
    #[cfg(test)]
    fn check(&self) {
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

// ---------------------------------------------------------------------------
// Inode-slot allocator
// ---------------------------------------------------------------------------

#[derive(Default)]
struct SlotLane {
    /// One past the highest slot in use since mkfs or the last rebuild:
    /// every slot at or above it is free and has never been handed out.
    high_water: u64,
    /// Freed slots below `high_water`, as ranges (a rebuild can leave large gaps).
    freed: RangeSet,
}

/// Inode-slot allocator: per lane, the next never-used slot plus the set of
/// freed slots below it. Inode numbers are (lane, slot) pairs
/// (`format::lane_slot_to_ino`).
pub struct InodeSlots {
    lanes: Box<[Mutex<SlotLane>]>,
    /// Slots in use over all lanes.
    used: AtomicU64,
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

    fn try_free(&self, lane: u32, slot: u64) -> Result<(), AllocError> {
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
    fn check(&self) {
        let mut used = 0;
        for l in self.lanes.iter() {
            let l = lock(l);
            l.freed.check();
            if let Some((s, len)) = l.freed.iter().last() {
                assert!(s + len <= l.high_water);
            }
            used += l.high_water - l.freed.total;
        }
        assert_eq!(used, self.used_count());
    }
}

/// A bitmap of the data area's used blocks, filled by the recovery scan's
/// workers in parallel (atomic bit sets: no lock), which also catches a
/// block referenced twice.
pub struct UsedBlocks {
    first_block: u64,
    total_blocks: u64,
    words: Vec<AtomicU64>,
}

impl UsedBlocks {
    pub fn new(first_block: u64, total_blocks: u64) -> Self {
        let n = (total_blocks - first_block).div_ceil(64) as usize;
        UsedBlocks {
            first_block,
            total_blocks,
            words: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Mark `[start, start + len)` used; Err(block) names the first block
    /// that was already used, or lies outside the data area.
    pub fn mark(&self, start: u64, len: u64) -> Result<(), AllocError> {
        let end = start
            .checked_add(len)
            .filter(|&e| len > 0 && start >= self.first_block && e <= self.total_blocks);
        let Some(end) = end else {
            return Err(AllocError::OutOfRange { start, len });
        };
        for block in start..end {
            let i = block - self.first_block;
            let bit = 1u64 << (i % 64);
            if self.words[(i / 64) as usize].fetch_or(bit, Ordering::Relaxed) & bit != 0 {
                return Err(AllocError::AlreadyUsed { block });
            }
        }
        Ok(())
    }

    pub fn is_used(&self, block: u64) -> bool {
        let i = block - self.first_block;
        self.words[(i / 64) as usize].load(Ordering::Relaxed) & (1u64 << (i % 64)) != 0
    }
}

#[cfg(test)]
mod tests {
    /// The one-sweep constructor recovery uses gives the same free lists as
    /// marking every used extent one by one, and catches double use.
    #[test]
    fn from_used_matches_mark_used() {
        let (lanes, first, total) = (3u32, 40u64, 1000u64);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20 {
            let used = UsedBlocks::new(first, total);
            let slow = BlockAllocator::new_all_free(lanes, first, total);
            let mut block = first;
            while block < total {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
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

    use super::*;
    use crate::pmem::{BackendInfo, BackendKind, FlushMethod};
    use proptest::prelude::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    /// In-memory pool: the real backends are not needed to test what the
    /// allocator writes and reads back.
    struct MemPool {
        bytes: Mutex<Vec<u8>>,
    }

    impl MemPool {
        fn new(size_bytes: u64) -> Self {
            MemPool {
                bytes: Mutex::new(vec![0; size_bytes as usize]),
            }
        }
        /// A pool holding the lane areas of `lane_count` lanes (data blocks
        /// are never touched by the allocator, so they need no backing).
        fn for_lanes(lane_count: u32) -> Self {
            Self::new(lanes_end_block(lane_count) * BLOCK_SIZE)
        }
    }

    impl Pmem for MemPool {
        fn size_bytes(&self) -> u64 {
            self.bytes.lock().unwrap().len() as u64
        }
        fn info(&self) -> BackendInfo {
            BackendInfo {
                kind: BackendKind::Simulated,
                flush: FlushMethod::None,
                size_bytes: self.size_bytes(),
            }
        }
        fn read(&self, off: u64, buf: &mut [u8]) {
            let b = self.bytes.lock().unwrap();
            buf.copy_from_slice(&b[off as usize..off as usize + buf.len()]);
        }
        fn read_u64(&self, off: u64) -> u64 {
            let mut v = [0; 8];
            self.read(off, &mut v);
            u64::from_le_bytes(v)
        }
        fn write(&self, off: u64, data: &[u8]) {
            let mut b = self.bytes.lock().unwrap();
            b[off as usize..off as usize + data.len()].copy_from_slice(data);
        }
        fn write_u64(&self, off: u64, value: u64) {
            self.write(off, &value.to_le_bytes());
        }
        fn copy_nt(&self, off: u64, data: &[u8]) {
            self.write(off, data);
        }
        fn zero_nt(&self, off: u64, len: u64) {
            let mut b = self.bytes.lock().unwrap();
            b[off as usize..(off + len) as usize].fill(0);
        }
        fn flush(&self, _off: u64, _len: u64) {}
        fn fence(&self) {}
        fn sync_all(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn all_ranges(a: &BlockAllocator) -> Vec<Vec<(u64, u64)>> {
        (0..a.lane_count()).map(|l| a.free_ranges(l)).collect()
    }

    fn all_slots(s: &InodeSlots) -> Vec<(u64, Vec<(u64, u64)>)> {
        (0..s.lane_count())
            .map(|l| (s.slots_high_water(l), s.freed_ranges(l)))
            .collect()
    }

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
            reserved: [0; 28],
            checksum: 0,
        };
        h.checksum = save_checksum(&h, &bytes);
        let off = save_area_offset(lane);
        write_pod(pm, off, &h);
        pm.write(off + SAVE_HEADER_BYTES, &bytes);
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
        assert_eq!(a.save(&pm, 42, &s), Ok(true));
        let (b, t) = BlockAllocator::restore(&pm, lanes, first, first + 300, 42).unwrap();
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

    /// xorshift64*: deterministic randomness without another dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn concurrent_alloc_free_never_duplicates() {
        let lanes = 2;
        let (first, total) = (8, 8 + 512);
        let a = Arc::new(BlockAllocator::new_all_free(lanes, first, total));
        let s = Arc::new(InodeSlots::new(lanes));
        // Owner map: a block is set here while some thread holds it.
        let owned = Arc::new(Mutex::new(vec![false; total as usize]));
        let slots_owned = Arc::new(Mutex::new(HashSet::new()));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (a, s, owned, slots_owned) =
                    (a.clone(), s.clone(), owned.clone(), slots_owned.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t + 1));
                    let mut held: Vec<(u64, u64)> = Vec::new();
                    let mut held_slots: Vec<(u32, u64)> = Vec::new();
                    for _ in 0..3000 {
                        // Threads 0,1 on lane 0, 2,3 on lane 1, plus random lanes.
                        let lane = if rng.below(4) == 0 {
                            rng.next() as u32
                        } else {
                            (t / 2) as u32
                        };
                        if rng.below(2) == 0 || held.is_empty() {
                            if let Some((start, len)) = a.alloc(lane, 1 + rng.next() % 16) {
                                let mut o = owned.lock().unwrap();
                                for b in start..start + len {
                                    assert!(!o[b as usize], "block {b} handed out twice");
                                    o[b as usize] = true;
                                }
                                held.push((start, len));
                            }
                        } else {
                            let (start, len) = held.swap_remove(rng.next() as usize % held.len());
                            // Give up ownership before the blocks can be reallocated.
                            owned.lock().unwrap()[start as usize..(start + len) as usize]
                                .fill(false);
                            a.free(start, len).unwrap();
                        }
                        let slot_lane = lane % lanes;
                        if rng.below(2) == 0 || held_slots.is_empty() {
                            let slot = s.alloc(slot_lane);
                            assert!(
                                slots_owned.lock().unwrap().insert((slot_lane, slot)),
                                "slot handed out twice"
                            );
                            held_slots.push((slot_lane, slot));
                        } else {
                            let (l, slot) =
                                held_slots.swap_remove(rng.next() as usize % held_slots.len());
                            slots_owned.lock().unwrap().remove(&(l, slot));
                            s.free(l, slot).unwrap();
                        }
                    }
                    for (start, len) in held {
                        owned.lock().unwrap()[start as usize..(start + len) as usize].fill(false);
                        a.free(start, len).unwrap();
                    }
                    for (l, slot) in held_slots {
                        slots_owned.lock().unwrap().remove(&(l, slot));
                        s.free(l, slot).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        a.check();
        s.check();
        assert_eq!(a.free_blocks(), a.capacity_blocks());
        assert_eq!(s.used_count(), 0);
        for l in 0..lanes {
            let (rs, re) = a.lane_region(l);
            assert_eq!(a.free_ranges(l), vec![(rs, re - rs)]);
        }
    }

    // -----------------------------------------------------------------------
    // Model-based property tests
    // -----------------------------------------------------------------------

    #[derive(Debug, Clone)]
    enum Op {
        Alloc {
            lane: u32,
            want: u64,
        },
        /// Free part of the used run at or after `at` (never a double free).
        FreeUsed {
            at: u64,
            len: u64,
        },
        /// Free an arbitrary range: a double free unless it is all in use.
        FreeAny {
            at: u64,
            len: u64,
        },
        MarkUsed {
            at: u64,
            len: u64,
        },
        SlotAlloc {
            lane: u32,
        },
        SlotFree {
            lane: u32,
            pick: usize,
        },
        SlotMark {
            lane: u32,
            slot: u64,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..8u32, 1..40u64).prop_map(|(lane, want)| Op::Alloc { lane, want }),
            4 => (0..400u64, 1..40u64).prop_map(|(at, len)| Op::FreeUsed { at, len }),
            1 => (0..400u64, 1..10u64).prop_map(|(at, len)| Op::FreeAny { at, len }),
            1 => (0..400u64, 1..10u64).prop_map(|(at, len)| Op::MarkUsed { at, len }),
            2 => (0..8u32).prop_map(|lane| Op::SlotAlloc { lane }),
            2 => (0..8u32, any::<usize>()).prop_map(|(lane, pick)| Op::SlotFree { lane, pick }),
            1 => (0..8u32, 0..30u64).prop_map(|(lane, slot)| Op::SlotMark { lane, slot }),
        ]
    }

    /// The allocators beside a trivially correct model of them.
    struct Harness {
        a: BlockAllocator,
        s: InodeSlots,
        /// used[b - first]: block b is in use.
        used: Vec<bool>,
        /// Per lane, the slots in use.
        slots: Vec<BTreeSet<u64>>,
        /// Per lane, one past the highest slot ever in use (it never shrinks).
        high_water: Vec<u64>,
    }

    impl Harness {
        fn new(lanes: u32, first: u64, capacity: u64) -> Self {
            Harness {
                a: BlockAllocator::new_all_free(lanes, first, first + capacity),
                s: InodeSlots::new(lanes),
                used: vec![false; capacity as usize],
                slots: vec![BTreeSet::new(); lanes as usize],
                high_water: vec![0; lanes as usize],
            }
        }

        fn first(&self) -> u64 {
            self.a.first_block()
        }

        /// Longest run of free blocks inside one lane region (model).
        fn max_free_run(&self) -> u64 {
            let mut best = 0;
            for l in 0..self.a.lane_count() {
                let (rs, re) = self.a.lane_region(l);
                let mut run = 0;
                for b in rs..re {
                    run = if self.used[(b - self.first()) as usize] {
                        0
                    } else {
                        run + 1
                    };
                    best = best.max(run);
                }
            }
            best
        }

        fn clamp(&self, at: u64, len: u64) -> (u64, u64) {
            let cap = self.used.len() as u64;
            let at = at % cap;
            (self.first() + at, len.min(cap - at))
        }

        fn apply(&mut self, op: &Op) {
            let first = self.first();
            let lanes = self.a.lane_count();
            match *op {
                Op::Alloc { lane, want } => {
                    let expect_len = want.min(self.max_free_run());
                    match self.a.alloc(lane, want) {
                        None => assert_eq!(expect_len, 0, "ENOSPC with free blocks"),
                        Some((start, len)) => {
                            assert!(len >= 1 && len <= want);
                            assert!(start >= first && start + len <= self.a.total_blocks());
                            assert_eq!(len, expect_len, "not the full length / largest range");
                            for b in start..start + len {
                                let u = &mut self.used[(b - first) as usize];
                                assert!(!*u, "block {b} handed out twice");
                                *u = true;
                            }
                        }
                    }
                }
                Op::FreeUsed { at, len } => {
                    let (start, _) = self.clamp(at, 0);
                    let Some(run_start) =
                        (start..self.a.total_blocks()).find(|&b| self.used[(b - first) as usize])
                    else {
                        return;
                    };
                    let run_len = (run_start..self.a.total_blocks())
                        .take_while(|&b| self.used[(b - first) as usize])
                        .count() as u64;
                    let len = len.min(run_len);
                    self.a.free(run_start, len).unwrap();
                    self.used[(run_start - first) as usize..(run_start - first + len) as usize]
                        .fill(false);
                }
                Op::FreeAny { at, len } => {
                    let (start, len) = self.clamp(at, len);
                    let range = (start - first) as usize..(start - first + len) as usize;
                    let expect = match self.used[range.clone()].iter().position(|u| !u) {
                        Some(i) => Err(AllocError::DoubleFree {
                            block: start + i as u64,
                        }),
                        None => Ok(()),
                    };
                    assert_eq!(self.a.try_free(start, len), expect);
                    if expect.is_ok() {
                        self.used[range].fill(false);
                    }
                }
                Op::MarkUsed { at, len } => {
                    let (start, len) = self.clamp(at, len);
                    let range = (start - first) as usize..(start - first + len) as usize;
                    let expect = match self.used[range.clone()].iter().position(|&u| u) {
                        Some(i) => Err(AllocError::AlreadyUsed {
                            block: start + i as u64,
                        }),
                        None => Ok(()),
                    };
                    assert_eq!(self.a.mark_used(start, len), expect);
                    if expect.is_ok() {
                        self.used[range].fill(true);
                    }
                }
                Op::SlotAlloc { lane } => {
                    let lane = lane % lanes;
                    let set = &mut self.slots[lane as usize];
                    let lowest = (0..).find(|x| !set.contains(x)).unwrap();
                    assert_eq!(self.s.alloc(lane), lowest);
                    set.insert(lowest);
                    let hw = &mut self.high_water[lane as usize];
                    *hw = (*hw).max(lowest + 1);
                }
                Op::SlotFree { lane, pick } => {
                    let lane = lane % lanes;
                    let set = &mut self.slots[lane as usize];
                    if set.is_empty() {
                        assert!(self.s.try_free(lane, 0).is_err());
                        return;
                    }
                    let slot = *set.iter().nth(pick % set.len()).unwrap();
                    self.s.free(lane, slot).unwrap();
                    set.remove(&slot);
                    assert!(self.s.try_free(lane, slot).is_err());
                }
                Op::SlotMark { lane, slot } => {
                    let lane = lane % lanes;
                    let set = &mut self.slots[lane as usize];
                    let r = self.s.mark_used(lane, slot);
                    if set.insert(slot) {
                        r.unwrap();
                        let hw = &mut self.high_water[lane as usize];
                        *hw = (*hw).max(slot + 1);
                    } else {
                        assert_eq!(r, Err(AllocError::SlotAlreadyUsed { lane, slot }));
                    }
                }
            }
        }

        /// Allocators and model agree on every block and slot.
        fn check(&self) {
            self.a.check();
            self.s.check();
            let used = self.used.iter().filter(|u| **u).count() as u64;
            assert_eq!(self.a.free_blocks() + used, self.a.capacity_blocks());
            for (i, &u) in self.used.iter().enumerate() {
                assert_eq!(
                    self.a.is_free(self.first() + i as u64),
                    !u,
                    "block {}",
                    self.first() + i as u64
                );
            }
            for (lane, set) in self.slots.iter().enumerate() {
                let hw = self.s.slots_high_water(lane as u32);
                assert_eq!(hw, self.high_water[lane]);
                for slot in 0..hw + 2 {
                    assert_eq!(self.s.is_used(lane as u32, slot), set.contains(&slot));
                }
            }
            let used_slots: usize = self.slots.iter().map(|s| s.len()).sum();
            assert_eq!(self.s.used_count(), used_slots as u64);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn prop_allocator_matches_model(
            lanes in 1..5u32,
            capacity in 1..300u64,
            ops in proptest::collection::vec(op(), 1..120),
        ) {
            let first = lanes_end_block(lanes);
            let mut h = Harness::new(lanes, first, capacity);
            for op in &ops {
                h.apply(op);
                h.check();
            }

            // Save -> restore reproduces both allocators exactly.
            let pm = MemPool::for_lanes(lanes);
            prop_assert_eq!(h.a.save(&pm, 77, &h.s), Ok(true));
            let (b, t) = BlockAllocator::restore(&pm, lanes, first, first + capacity, 77).unwrap();
            prop_assert_eq!(all_ranges(&h.a), all_ranges(&b));
            prop_assert_eq!(all_slots(&h.s), all_slots(&t));
            prop_assert_eq!(h.a.free_blocks(), b.free_blocks());
            prop_assert_eq!(h.s.used_count(), t.used_count());
            b.check();
            t.check();
            prop_assert!(BlockAllocator::restore(&pm, lanes, first, first + capacity, 78).is_none());

            // Freeing everything leaves one range per non-empty lane: its region.
            for i in 0..capacity {
                if h.used[i as usize] {
                    h.a.free(first + i, 1).unwrap();
                }
            }
            for l in 0..lanes {
                let (rs, re) = h.a.lane_region(l);
                let expect = if re > rs { vec![(rs, re - rs)] } else { vec![] };
                prop_assert_eq!(h.a.free_ranges(l), expect);
            }
            prop_assert_eq!(h.a.free_blocks(), capacity);
        }
    }
}
