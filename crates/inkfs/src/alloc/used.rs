//! The bitmap of used blocks the recovery scan fills: its workers mark the
//! extents of every log they walk in parallel, with atomic bit sets and no
//! lock, and a bit already set is a block referenced twice. The scan then
//! builds the allocator from it in one sweep (`BlockAllocator::from_used`).
//! Separate from the allocator because it lives only during a rebuild.

use std::sync::atomic::{AtomicU64, Ordering};

use super::AllocError;

/// A bitmap of the data area's used blocks, filled by the recovery scan's
/// workers in parallel (atomic bit sets: no lock), which also catches a
/// block referenced twice.
pub struct UsedBlocks {
    pub(super) first_block: u64,
    pub(super) total_blocks: u64,
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
