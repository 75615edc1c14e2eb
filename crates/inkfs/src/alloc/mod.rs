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
//!
//! The pieces, one file each, so that each can be read on its own:
//! - `range_set.rs`: coalesced ranges indexed by start and by length, the
//!   structure every free list here is built from;
//! - `lane.rs`: one lane's free blocks (ranges, recent singles, the bitmap
//!   behind the double-free check) and the hints and counters other threads
//!   read without its lock;
//! - `blocks.rs`: the block allocator itself: lanes and their regions,
//!   construction (including from the recovery scan's bitmap), freeing and
//!   marking used, the consistency check the tests run;
//! - `policy.rs`: which free blocks a request gets: best fit, goal
//!   allocation, metadata from the high end, recent singles, stealing from
//!   other lanes;
//! - `save.rs`: the on-media side: the free lists written into the lanes'
//!   save areas at a clean unmount and read back at mount (docs/FORMAT.md);
//! - `grant.rs`: how many blocks the server may grant a client's
//!   reservation (the server's keep, and half of the rest at most);
//! - `chunks.rs`: log chunks, the small first pages of logs carved four
//!   to a block, and which lane keeps a partly used chunk block;
//! - `slots.rs`: the inode-slot allocator;
//! - `used.rs`: the bitmap of used blocks the recovery scan fills in parallel.
//!
//! The split follows what changes together: the save-area code changes with
//! the on-media format, the placement policy with performance work, and the
//! range set is a self-contained structure with its own invariants. Only
//! `AllocError` and the lock helper are shared by all of them, and live here.

mod blocks;
mod chunks;
pub mod grant;
mod lane;
mod policy;
mod range_set;
mod save;
mod slots;
mod used;

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::{Mutex, MutexGuard};

pub use blocks::BlockAllocator;
pub(crate) use save::Refusal;
pub use slots::InodeSlots;
pub use used::UsedBlocks;

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
