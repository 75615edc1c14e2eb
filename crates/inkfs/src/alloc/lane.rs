//! One lane of the block allocator: its free blocks (`LaneFree`: the
//! coalesced ranges, the recently freed singles kept outside them, and the
//! bitmap that makes the double-free check one bit test) and the lane
//! itself (`BlockLane`: its region, the mutex around its free blocks, and
//! the hints and counters other threads read without taking that mutex).
//! Everything here works on one lane under its lock; choosing among lanes
//! is `policy.rs`'s business.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::range_set::RangeSet;

/// Single blocks freed recently, handed out again first (LIFO), so that a
/// steady stream of one-block frees and allocations (copy-on-write
/// overwrites, small files created and removed) recycles a few hot blocks
/// instead of splitting and merging ranges in the B-trees. Fixed capacity:
/// no heap allocation on the write path.
#[derive(Debug)]
pub(super) struct Recent {
    blocks: [u64; RECENT_MAX],
    len: usize,
}

/// Blocks a lane keeps outside its range set. Small enough that the
/// duplicate scan on every push is a few vector compares.
pub(super) const RECENT_MAX: usize = 64;

impl Default for Recent {
    fn default() -> Self {
        Recent {
            blocks: [0; RECENT_MAX],
            len: 0,
        }
    }
}

impl Recent {
    pub(super) fn as_slice(&self) -> &[u64] {
        &self.blocks[..self.len]
    }

    pub(super) fn contains(&self, block: u64) -> bool {
        self.as_slice().contains(&block)
    }

    pub(super) fn is_full(&self) -> bool {
        self.len == RECENT_MAX
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
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
pub(super) struct LaneFree {
    pub(super) ranges: RangeSet,
    pub(super) recent: Recent,
    /// First block of the lane's region (bit 0).
    base: u64,
    bits: Vec<u64>,
}

impl LaneFree {
    pub(super) fn new(region_start: u64, region_end: u64) -> Self {
        LaneFree {
            ranges: RangeSet::default(),
            recent: Recent::default(),
            base: region_start,
            bits: vec![0; (region_end - region_start).div_ceil(64) as usize],
        }
    }

    pub(super) fn total(&self) -> u64 {
        self.ranges.total() + self.recent.len as u64
    }

    /// Whether `block` (inside the lane's region) is free.
    pub(super) fn contains(&self, block: u64) -> bool {
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
    pub(super) fn add_range(&mut self, start: u64, len: u64) -> Result<(), u64> {
        self.ranges.insert(start, len)?;
        self.set_bits(start, len, true);
        Ok(())
    }

    /// Take `[start, start + len)` out of the ranges (Err: the first block
    /// of it not in them; nothing changed).
    pub(super) fn take_range(&mut self, start: u64, len: u64) -> Result<(), u64> {
        self.ranges.remove(start, len)?;
        self.set_bits(start, len, false);
        Ok(())
    }

    pub(super) fn push_recent(&mut self, block: u64) {
        self.recent.push(block);
        self.set_bits(block, 1, true);
    }

    pub(super) fn pop_recent(&mut self) -> Option<u64> {
        let b = self.recent.pop()?;
        self.set_bits(b, 1, false);
        Some(b)
    }

    /// Move the recent singles into the ranges (merging them), for callers
    /// that need the ranges to be the whole truth: save, listing, marking
    /// blocks used. Every block stays free: no bit changes.
    pub(super) fn settle(&mut self) {
        while let Some(b) = self.recent.pop() {
            self.ranges
                .insert(b, 1)
                .expect("a recent block is never also in the ranges");
        }
    }
}

pub(super) struct BlockLane {
    /// This lane's region of the data area: `[region_start, region_end)`.
    /// Its free ranges never leave it (merging stops at the boundary).
    pub(super) region_start: u64,
    pub(super) region_end: u64,
    pub(super) free: Mutex<LaneFree>,
    /// Length of the lane's largest free range, stored under `free`'s lock
    /// and read without it so stealing can skip lanes without locking them.
    /// A stale value only costs a wasted lock or a skipped lane.
    pub(super) largest_hint: AtomicU64,
    /// Free blocks of this lane (ranges and recent singles), changed only
    /// under `free`'s lock and read without it. Per lane, not one shared
    /// counter: two threads allocating in their own lanes then share no
    /// cache line, and an update is a plain store, not a locked add.
    pub(super) free_count: AtomicU64,
    /// How many recently freed singles the lane keeps, stored under
    /// `free`'s lock and read without it (a stale value costs a wasted lock
    /// or a skipped lane).
    pub(super) recent_hint: AtomicU64,
}

impl BlockLane {
    /// Publish the hints; call with the lock held, after every change.
    pub(super) fn publish(&self, free: &LaneFree) {
        self.largest_hint
            .store(free.ranges.largest_len(), Ordering::Relaxed);
        self.publish_recent(free);
    }

    /// Publish the recent-singles hint alone (after a push or pop, which
    /// leave the ranges as they were).
    pub(super) fn publish_recent(&self, free: &LaneFree) {
        self.recent_hint
            .store(free.recent.len as u64, Ordering::Relaxed);
    }

    /// `free_count += n`; call with the lock held.
    pub(super) fn count_freed(&self, n: u64) {
        let c = self.free_count.load(Ordering::Relaxed);
        self.free_count.store(c + n, Ordering::Relaxed);
    }

    /// `free_count -= n`; call with the lock held.
    pub(super) fn count_taken(&self, n: u64) {
        let c = self.free_count.load(Ordering::Relaxed);
        debug_assert!(c >= n, "free counter below a lane's free blocks");
        self.free_count.store(c - n, Ordering::Relaxed);
    }
}
