//! Recovery after a crash: rebuild the allocators by scanning every lane's
//! inode table and every live log, one worker per lane (bounded by the core
//! count), and reclaim orphans (inodes unlinked while open at the crash).
//!
//! Runs after the journals were replayed, so every log tail on media is
//! committed. Blocks that no live log references — data displaced by
//! copy-on-write, pages of uncommitted appends, freed inodes' logs — are
//! free by construction.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::alloc::{BlockAllocator, InodeSlots, UsedBlocks};
use crate::error::{Error, Result};
use crate::format::*;
use crate::inode::{self, Body, InodeTables};
use crate::pmem::{read_pod, Pmem};
use crate::superblock::Geometry;

pub struct Rebuilt {
    pub blocks: BlockAllocator,
    /// Hybrid pools: the data device's allocator, rebuilt from the same
    /// scan (FILE_WRITE entries name device blocks by number).
    pub dev_blocks: Option<BlockAllocator>,
    pub slots: InodeSlots,
    pub orphans_reclaimed: u64,
    pub inodes_scanned: u64,
}

pub fn rebuild<P: Pmem + ?Sized>(
    pm: &P,
    geo: &Geometry,
    tables: &InodeTables,
    read_only: bool,
) -> Result<Rebuilt> {
    let used = Used {
        pm: UsedBlocks::new(geo.first_data_block, geo.total_blocks),
        dev: geo
            .has_device()
            .then(|| UsedBlocks::new(geo.dev_first, geo.dev_end)),
        chunks: Mutex::new(Vec::new()),
    };
    let slots = InodeSlots::new(geo.lane_count);
    let orphans = AtomicU64::new(0);
    let scanned = AtomicU64::new(0);
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(geo.lane_count as usize)
        .max(1);
    let next_lane = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let lane = next_lane.fetch_add(1, Ordering::Relaxed);
                if lane >= geo.lane_count as u64 || inode::lock(&first_error).is_some() {
                    break;
                }
                let r = scan_lane(
                    pm,
                    geo,
                    tables,
                    lane as u32,
                    read_only,
                    &used,
                    &slots,
                    &orphans,
                    &scanned,
                );
                if let Err(e) = r {
                    inode::lock(&first_error).get_or_insert(e);
                    break;
                }
            });
        }
    });
    if let Some(e) = first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let chunk_blocks = chunk_blocks(&used)?;
    let blocks = BlockAllocator::from_used(
        geo.lane_count,
        geo.first_data_block,
        geo.total_blocks,
        &used.pm,
    );
    for &(block, mask) in &chunk_blocks {
        blocks
            .add_chunk_block(block, mask)
            .map_err(|e| Error::Corrupt(format!("log chunk block {block}: {e:?}")))?;
    }
    let dev_blocks = used
        .dev
        .as_ref()
        .map(|d| BlockAllocator::from_used(geo.lane_count, geo.dev_first, geo.dev_end, d));
    Ok(Rebuilt {
        blocks,
        dev_blocks,
        slots,
        orphans_reclaimed: orphans.into_inner(),
        inodes_scanned: scanned.into_inner(),
    })
}

/// The used-block bitmaps the scan fills: PM's data area, and the data
/// device's in a hybrid pool.
struct Used {
    pm: UsedBlocks,
    dev: Option<UsedBlocks>,
    /// Log heads that are chunks (page ids), from every lane's scan: a
    /// chunk block is marked in `pm` once, after the scan, when two logs
    /// naming chunks of one block are no double use.
    chunks: Mutex<Vec<u64>>,
}

/// The blocks holding live log chunks, with their bitmaps of chunks in
/// use, each marked used once; a chunk two logs name is corruption, and so
/// is a chunk block something else uses (the mark fails).
fn chunk_blocks(used: &Used) -> Result<Vec<(u64, u64)>> {
    let ids = std::mem::take(&mut *inode::lock(&used.chunks));
    // (block, chunk), sorted: a block's chunks are neighbours.
    let mut chunks: Vec<(u64, u64)> = ids
        .iter()
        .filter_map(|&id| match log_page_id(id) {
            Some((block, Some(chunk))) => Some((block, chunk)),
            _ => None,
        })
        .collect();
    chunks.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (i, &(block, chunk)) in chunks.iter().enumerate() {
        if i > 0 && chunks[i - 1] == (block, chunk) {
            return Err(Error::Corrupt(format!(
                "log chunk {chunk} of block {block} is the head of two logs"
            )));
        }
        match out.last_mut() {
            Some((b, mask)) if *b == block => *mask |= 1 << chunk,
            _ => out.push((block, 1 << chunk)),
        }
    }
    for &(block, _) in &out {
        used.pm.mark(block, 1).map_err(|e| {
            Error::Corrupt(format!(
                "log chunk block {block} also used otherwise ({e:?})"
            ))
        })?;
    }
    Ok(out)
}

impl Used {
    /// Mark `[start, start + len)` in the bitmap of its side.
    fn mark(&self, start: u64, len: u64) -> std::result::Result<(), crate::alloc::AllocError> {
        match &self.dev {
            Some(dev) if start >= DEV_BLOCK_BASE => dev.mark(start, len),
            _ => self.pm.mark(start, len),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn scan_lane<P: Pmem + ?Sized>(
    pm: &P,
    geo: &Geometry,
    tables: &InodeTables,
    lane: u32,
    read_only: bool,
    blocks: &Used,
    slots: &InodeSlots,
    orphans: &AtomicU64,
    scanned: &AtomicU64,
) -> Result<()> {
    let used = |start: u64, len: u64, what: &str| -> Result<()> {
        blocks.mark(start, len).map_err(|e| {
            Error::Corrupt(format!(
                "{what}: blocks {start}+{len} used twice or out of range ({e:?})"
            ))
        })
    };
    // This lane's chunk heads, handed to the shared list once at the end
    // (one lock per lane, not per inode).
    let mut chunks = Vec::new();
    for (index, table_block) in tables.blocks(pm, lane)?.into_iter().enumerate() {
        if table_block >= geo.first_data_block {
            used(table_block, 1, &format!("lane {lane} inode table"))?;
        }
        for i in 0..INODES_PER_TABLE_BLOCK {
            let slot = index as u64 * INODES_PER_TABLE_BLOCK + i;
            let rec_off = table_block * BLOCK_SIZE + i * INODE_RECORD_SIZE;
            let rec: InodeRecord = read_pod(pm, rec_off);
            let ino = lane_slot_to_ino(lane, slot, geo.lane_count);
            match rec.state {
                INODE_FREE => continue,
                INODE_ORPHAN => {
                    if !read_only {
                        pm.write_u64(rec_off + INODE_STATE_FIELD, INODE_FREE);
                        pm.persist(rec_off + INODE_STATE_FIELD, 8);
                    }
                    orphans.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                INODE_LIVE => {}
                other => {
                    return Err(Error::Corrupt(format!(
                        "inode {ino}: unknown state {other}"
                    )))
                }
            }
            if rec.ino != ino {
                return Err(Error::Corrupt(format!(
                    "inode record of slot {slot} in lane {lane} names inode {}",
                    rec.ino
                )));
            }
            let (st, pages) = inode::load_with_pages(pm, geo, ino, &rec)?;
            for p in pages {
                if p >= LOG_CHUNK_ID_MIN {
                    chunks.push(p);
                } else {
                    used(p, 1, &format!("inode {ino} log"))?;
                }
            }
            match &st.body {
                Body::File(map) => {
                    for e in map.iter() {
                        used(e.block, e.pages, &format!("inode {ino} data"))?;
                    }
                }
                Body::Symlink { block, .. } if *block != 0 => {
                    used(*block, 1, &format!("inode {ino} symlink"))?
                }
                _ => {}
            }
            slots
                .mark_used(lane, slot)
                .map_err(|e| Error::Corrupt(format!("inode {ino}: slot in use twice ({e:?})")))?;
            scanned.fetch_add(1, Ordering::Relaxed);
        }
    }
    inode::lock(&blocks.chunks).extend(chunks);
    Ok(())
}
