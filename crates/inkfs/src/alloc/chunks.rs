//! Log chunks: the small first pages of logs (docs/FORMAT.md, "Logs"),
//! four to a block. A new inode's log starts in a chunk, so a file whose
//! log never outgrows 960 bytes costs a quarter of a block of PM, not a
//! whole one.
//!
//! Who owns what. A block carved into chunks is *used* for the block
//! allocator from the moment it is carved until its last chunk frees,
//! when it returns to the block allocator like any block. In between, the
//! lane whose region holds it keeps it in its chunk map (behind that
//! lane's own chunk mutex, never held while a block lane's mutex is taken:
//! no lock order to get wrong) only while some chunk of it is free. A
//! block whose four chunks are in use is in no map: freeing one of its
//! chunks puts it back. So the maps hold only partly used blocks, the few
//! the next creates fill (a request takes the lowest such block of its
//! lane, then of any lane, before carving a new one).
//!
//! On media the maps exist only in a clean unmount's save areas
//! (`save.rs`: one record per partly used block, its bitmap of chunks in
//! use); after a crash the recovery scan rebuilds them from the heads of
//! the live logs (`recovery.rs`): a block with a live chunk is used, its
//! other chunks free.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::blocks::BlockAllocator;
use super::{lock, AllocError};
use crate::format::{log_chunk_id, log_page_id, LOG_CHUNKS_FULL, LOG_CHUNKS_PER_BLOCK};

/// One lane's partly used chunk blocks.
#[derive(Default)]
pub(crate) struct ChunkLane {
    /// Block -> bitmap of its chunks in use (never 0 nor full).
    pub(super) partial: Mutex<BTreeMap<u64, u64>>,
    /// How many blocks `partial` holds, read without the lock by requests
    /// from other lanes.
    hint: AtomicU64,
}

impl ChunkLane {
    fn publish(&self, partial: &BTreeMap<u64, u64>) {
        self.hint.store(partial.len() as u64, Ordering::Relaxed);
    }
}

impl BlockAllocator {
    /// One log chunk, as a page id (`format::log_chunk_id`): a free chunk
    /// of a partly used block (lane `lane`'s first), or chunk 0 of a block
    /// newly taken for metadata. None when no block is free.
    pub fn alloc_chunk(&self, lane: u32) -> Option<u64> {
        let n = self.chunks.len();
        let home = lane as usize % n;
        for i in 0..n {
            let l = &self.chunks[(home + i) % n];
            if i > 0 && l.hint.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut partial = lock(&l.partial);
            if let Some((&block, mask)) = partial.iter_mut().next() {
                debug_assert!(*mask != 0 && *mask != LOG_CHUNKS_FULL);
                let chunk = (!*mask).trailing_zeros() as u64;
                debug_assert!(chunk < LOG_CHUNKS_PER_BLOCK);
                *mask |= 1 << chunk;
                if *mask == LOG_CHUNKS_FULL {
                    partial.remove(&block);
                }
                l.publish(&partial);
                return Some(log_chunk_id(block, chunk));
            }
        }
        let block = self.alloc_meta(lane)?;
        let l = &self.chunks[self.lane_of(block)];
        let mut partial = lock(&l.partial);
        debug_assert!(!partial.contains_key(&block));
        partial.insert(block, 1);
        l.publish(&partial);
        Some(log_chunk_id(block, 0))
    }

    /// Return one log page (a page id: a whole block, or a chunk) to the
    /// allocator. A chunk block whose last chunk this frees returns to the
    /// block lists.
    pub fn free_log_page(&self, id: u64) -> Result<(), AllocError> {
        match log_page_id(id) {
            Some((block, None)) => self.free(block, 1),
            Some((block, Some(chunk))) => {
                let r = self.free_chunk(block, chunk);
                debug_assert!(r.is_ok(), "free of log chunk {id:#x}: {r:?}");
                r
            }
            None => Err(AllocError::OutOfRange { start: id, len: 1 }),
        }
    }

    fn free_chunk(&self, block: u64, chunk: u64) -> Result<(), AllocError> {
        if block < self.first_block || block >= self.total_blocks || chunk >= LOG_CHUNKS_PER_BLOCK
        {
            return Err(AllocError::OutOfRange {
                start: block,
                len: 1,
            });
        }
        // A block in no map has every chunk in use, unless it is free:
        // freeing a chunk of a free block is a double free.
        if self.is_free(block) {
            return Err(AllocError::DoubleFree { block });
        }
        let l = &self.chunks[self.lane_of(block)];
        let partial = lock(&l.partial);
        let mask = partial.get(&block).copied().unwrap_or(LOG_CHUNKS_FULL);
        if mask & (1 << chunk) == 0 {
            return Err(AllocError::DoubleFree { block });
        }
        self.set_chunk_mask(l, partial, block, mask & !(1 << chunk))
    }

    /// Store `block`'s bitmap of chunks in use in its lane's map, freeing
    /// the block when no chunk is left in use.
    fn set_chunk_mask(
        &self,
        l: &ChunkLane,
        mut partial: MutexGuard<'_, BTreeMap<u64, u64>>,
        block: u64,
        mask: u64,
    ) -> Result<(), AllocError> {
        if mask == 0 {
            partial.remove(&block);
            l.publish(&partial);
            // Released before the block lane's lock (locking rule); the
            // block is in no map, so no one else touches it meanwhile.
            drop(partial);
            return self.free(block, 1);
        }
        partial.insert(block, mask);
        l.publish(&partial);
        Ok(())
    }

    /// Record that `block` (in use for the block lists) is carved into
    /// chunks, those of bitmap `mask` in use (restore and the recovery
    /// scan). A full block needs no record.
    pub(crate) fn add_chunk_block(&self, block: u64, mask: u64) -> Result<(), AllocError> {
        if block < self.first_block
            || block >= self.total_blocks
            || mask == 0
            || mask > LOG_CHUNKS_FULL
            || self.is_free(block)
        {
            return Err(AllocError::OutOfRange {
                start: block,
                len: 1,
            });
        }
        if mask == LOG_CHUNKS_FULL {
            return Ok(());
        }
        let l = &self.chunks[self.lane_of(block)];
        let mut partial = lock(&l.partial);
        if partial.contains_key(&block) {
            return Err(AllocError::AlreadyUsed { block });
        }
        partial.insert(block, mask);
        l.publish(&partial);
        Ok(())
    }

    /// [`BlockAllocator::add_chunk_block`], or, if the maps hold `block`
    /// already (some of its chunks were freed here meanwhile), keep in use
    /// only the chunks both say are (a client's chunk block coming back
    /// after its removals' head chunks went through the limbo). A block
    /// with no chunk left in use is freed.
    pub(crate) fn merge_chunk_block(&self, block: u64, mask: u64) -> Result<(), AllocError> {
        if block < self.first_block || block >= self.total_blocks {
            return self.add_chunk_block(block, mask);
        }
        let l = &self.chunks[self.lane_of(block)];
        let partial = lock(&l.partial);
        let Some(&have) = partial.get(&block) else {
            drop(partial);
            return self.add_chunk_block(block, mask);
        };
        self.set_chunk_mask(l, partial, block, have & mask)
    }

    /// Lane `lane`'s partly used chunk blocks and their bitmaps of chunks
    /// in use, ascending.
    pub fn chunk_blocks(&self, lane: u32) -> Vec<(u64, u64)> {
        lock(&self.chunks[lane as usize].partial)
            .iter()
            .map(|(&b, &m)| (b, m))
            .collect()
    }

    /// Take every partly used chunk block out of the maps, with its bitmap
    /// of chunks in use (a client giving its lane lease back: its free
    /// chunks go to the owner's maps, `add_chunk_block`). The blocks stay
    /// used for the block lists: their chunks in use belong to live logs.
    pub fn take_chunk_blocks(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for l in self.chunks.iter() {
            let mut partial = lock(&l.partial);
            out.extend(partial.iter().map(|(&b, &m)| (b, m)));
            partial.clear();
            l.publish(&partial);
        }
        out
    }

    /// Free chunks in partly used blocks, all lanes (statistics).
    pub fn free_chunks(&self) -> u64 {
        self.chunks
            .iter()
            .map(|l| {
                lock(&l.partial)
                    .values()
                    .map(|m| LOG_CHUNKS_PER_BLOCK - m.count_ones() as u64)
                    .sum::<u64>()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_fill_a_block_then_free_it_with_the_last() {
        let a = BlockAllocator::new_all_free(2, 10, 30);
        let free0 = a.free_blocks();
        let ids: Vec<u64> = (0..5).map(|_| a.alloc_chunk(0).unwrap()).collect();
        let parts: Vec<_> = ids.iter().map(|&i| log_page_id(i).unwrap()).collect();
        // Four chunks of one block, then a second block.
        let b0 = parts[0].0;
        for (c, p) in parts[..4].iter().enumerate() {
            assert_eq!(*p, (b0, Some(c as u64)));
        }
        assert_ne!(parts[4].0, b0);
        assert_eq!(a.free_blocks(), free0 - 2);
        // The full block is in no map; freeing a chunk puts it back.
        assert_eq!(a.chunk_blocks(0), vec![(parts[4].0, 1)]);
        a.free_log_page(ids[2]).unwrap();
        assert_eq!(a.try_free_chunk_again(ids[2]), Err(AllocError::DoubleFree { block: b0 }));
        // The lowest partly used block first (the second one, carved
        // below the first: metadata comes from a lane's high end).
        let again = a.alloc_chunk(0).unwrap();
        assert_eq!(again, log_chunk_id(parts[4].0, 1));
        a.free_log_page(again).unwrap();
        for (n, &i) in ids.iter().enumerate() {
            if n != 2 {
                a.free_log_page(i).unwrap();
            }
        }
        assert_eq!(a.free_blocks(), free0, "both blocks back with their last chunks");
        assert!(a.chunk_blocks(0).is_empty() && a.chunk_blocks(1).is_empty());
        assert_eq!(a.try_free_chunk_again(ids[0]), Err(AllocError::DoubleFree { block: b0 }));
        a.check();
    }

    #[test]
    fn other_lanes_partly_used_blocks_before_a_new_block() {
        let a = BlockAllocator::new_all_free(2, 10, 30);
        let first = a.alloc_chunk(1).unwrap();
        let free = a.free_blocks();
        let second = a.alloc_chunk(0).unwrap();
        assert_eq!(a.free_blocks(), free, "no new block");
        assert_eq!(log_page_id(second).unwrap().0, log_page_id(first).unwrap().0);
        assert_eq!(a.free_chunks(), 2);
    }

    #[test]
    fn add_chunk_block_checks_its_input() {
        let a = BlockAllocator::new_all_used(1, 10, 30);
        assert!(a.add_chunk_block(12, 0).is_err());
        assert!(a.add_chunk_block(12, 1 << LOG_CHUNKS_PER_BLOCK).is_err());
        assert!(a.add_chunk_block(9, 1).is_err());
        a.add_chunk_block(12, 0b101).unwrap();
        assert_eq!(a.add_chunk_block(12, 0b1), Err(AllocError::AlreadyUsed { block: 12 }));
        a.add_chunk_block(13, LOG_CHUNKS_FULL).unwrap();
        assert_eq!(a.chunk_blocks(0), vec![(12, 0b101)]);
        a.free(20, 1).unwrap();
        assert!(a.add_chunk_block(20, 1).is_err(), "a free block holds no chunk");
        // The free chunks of 12 are handed out, then 13's freed one.
        assert_eq!(a.alloc_chunk(0), Some(log_chunk_id(12, 1)));
        a.free_log_page(log_chunk_id(13, 2)).unwrap();
        assert_eq!(a.alloc_chunk(0), Some(log_chunk_id(12, 3)));
        assert_eq!(a.alloc_chunk(0), Some(log_chunk_id(13, 2)));
    }

    /// A chunk block coming back from a client after the owner freed some
    /// of its chunks (a removed inode's head chunk through the limbo):
    /// only the chunks both say are in use stay so; none left frees it.
    #[test]
    fn merge_chunk_block_keeps_what_both_use() {
        let a = BlockAllocator::new_all_used(1, 10, 30);
        a.free_log_page(log_chunk_id(12, 1)).unwrap();
        assert_eq!(a.chunk_blocks(0), vec![(12, LOG_CHUNKS_FULL & !0b10)]);
        a.merge_chunk_block(12, 0b111).unwrap();
        assert_eq!(a.chunk_blocks(0), vec![(12, 0b101)]);
        // Not in the maps yet: as add_chunk_block.
        a.merge_chunk_block(13, 0b1).unwrap();
        assert_eq!(a.chunk_blocks(0), vec![(12, 0b101), (13, 0b1)]);
        a.free_log_page(log_chunk_id(13, 0)).unwrap();
        a.free_log_page(log_chunk_id(14, 3)).unwrap();
        a.merge_chunk_block(14, 0b1000).unwrap();
        assert!(a.is_free(13) && a.is_free(14), "no chunk left in use");
    }

    /// Random chunk and block traffic from several lanes against a model:
    /// no page id is handed out twice, a chunk block never overlaps a
    /// block handed out whole, the saved form of the maps restores them,
    /// and freeing everything gives every block back.
    #[test]
    fn random_chunks_and_blocks_against_a_model() {
        use std::collections::{BTreeMap, HashSet};
        let mut rng = crate::testkit::Rng::new(0x5ca1_ab1e);
        let a = BlockAllocator::new_all_free(3, 40, 400);
        let free0 = a.free_blocks();
        let mut chunks: HashSet<u64> = HashSet::new();
        let mut blocks: HashSet<u64> = HashSet::new();
        for _ in 0..4000 {
            let lane = rng.below(5) as u32;
            match rng.below(4) {
                0 | 1 => {
                    if let Some(id) = a.alloc_chunk(lane) {
                        assert!(chunks.insert(id), "chunk {id:#x} handed out twice");
                    }
                }
                2 => {
                    if let Some(b) = a.alloc_meta(lane) {
                        assert!(blocks.insert(b), "block {b} handed out twice");
                    }
                }
                _ => {
                    if rng.chance(70) && !chunks.is_empty() {
                        let id = *chunks.iter().nth(rng.below(chunks.len() as u64) as usize).unwrap();
                        chunks.remove(&id);
                        a.free_log_page(id).unwrap();
                    } else if let Some(&b) = blocks.iter().next() {
                        blocks.remove(&b);
                        a.free_log_page(b).unwrap();
                    }
                }
            }
            // The model's chunk blocks: never a whole block's, never free.
            let mut model: BTreeMap<u64, u64> = BTreeMap::new();
            for &id in &chunks {
                let (b, c) = log_page_id(id).unwrap();
                *model.entry(b).or_default() |= 1 << c.unwrap();
            }
            for (&b, &mask) in &model {
                assert!(!blocks.contains(&b) && !a.is_free(b), "block {b}");
                if mask != LOG_CHUNKS_FULL {
                    let lane = a.lane_of(b) as u32;
                    assert!(a.chunk_blocks(lane).contains(&(b, mask)), "block {b} {mask:#b}");
                }
            }
            let partial: usize = (0..3).map(|l| a.chunk_blocks(l).len()).sum();
            assert_eq!(partial, model.values().filter(|&&m| m != LOG_CHUNKS_FULL).count());
        }
        for id in chunks.drain().chain(blocks.drain()) {
            a.free_log_page(id).unwrap();
        }
        assert_eq!(a.free_blocks(), free0);
        assert_eq!(a.free_chunks(), 0);
        a.check();
    }

    impl BlockAllocator {
        fn try_free_chunk_again(&self, id: u64) -> Result<(), AllocError> {
            let (b, c) = log_page_id(id).unwrap();
            self.free_chunk(b, c.unwrap())
        }
    }
}
