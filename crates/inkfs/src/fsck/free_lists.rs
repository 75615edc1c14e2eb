//! On a clean pool the next mount trusts the free lists saved at unmount
//! instead of scanning, so they must be exactly the blocks and inode slots
//! not in use: a block both in use and on a list would be handed out
//! twice, one on neither is leaked. Checked by restoring the allocators
//! the way the mount does and comparing with what the inode scan found.

use std::collections::BTreeMap;

use crate::alloc::{BlockAllocator, Refusal};
use crate::format::*;
use crate::pmem::{read_pod, Pmem};

use super::check::Checker;
use super::repair::Fix;
use super::report::ProblemKind;

impl<P: Pmem + ?Sized> Checker<'_, P> {
    /// On a clean pool, the saved free lists must be exactly the blocks and
    /// inode slots not in use.
    pub(super) fn check_save_areas(&mut self) {
        if self.sb.state != STATE_CLEAN || self.journal_pending {
            return;
        }
        let geo = self.geo;
        let restored = BlockAllocator::try_restore(
            self.pm,
            geo.lane_count,
            geo.first_data_block,
            geo.total_blocks,
            self.sb.mount_epoch,
        );
        let (blocks, slots) = match restored {
            Ok(pair) => pair,
            Err(Refusal::Magic { .. }) if self.save_headers_blank() => {
                self.note(
                    ProblemKind::SaveArea,
                    None,
                    "the free lists were not saved at unmount; the next mount rebuilds them".into(),
                    None,
                );
                return;
            }
            Err(r) => {
                let why = match r {
                    Refusal::Geometry => "geometry".to_string(),
                    Refusal::Magic { lane } => format!("lane {lane}: bad magic"),
                    Refusal::Epoch { lane } => format!("lane {lane}: stale epoch"),
                    Refusal::TooManyRanges { lane } => format!("lane {lane}: too many ranges"),
                    Refusal::Checksum { lane } => format!("lane {lane}: checksum mismatch"),
                    Refusal::BlockRange { lane } => format!("lane {lane}: bad block range"),
                    Refusal::SlotRange { lane } => format!("lane {lane}: bad inode-slot range"),
                    Refusal::ChunkBlock { lane } => format!("lane {lane}: bad log chunk block"),
                };
                self.error(
                    ProblemKind::SaveArea,
                    None,
                    format!("the free-list save areas of a clean pool are invalid ({why})"),
                    Some(Fix::RebuildAllocator),
                );
                return;
            }
        };
        let mut free: Vec<(u64, u64)> = (0..geo.lane_count)
            .flat_map(|l| blocks.free_ranges(l))
            .map(|(s, n)| (s, s + n))
            .collect();
        free.sort_unstable();
        // PM's blocks only: a hybrid pool's device blocks are checked
        // against the device's own save area (`device.rs`).
        let used: Vec<(u64, u64)> = self
            .blocks
            .map
            .range(..DEV_BLOCK_BASE)
            .map(|(&s, &(e, _))| (s, e))
            .collect();

        let (overlap, gap) = compare(&used, &free, geo.first_data_block, geo.total_blocks);
        if let Some((b, both)) = overlap {
            self.error(
                ProblemKind::SaveArea,
                None,
                format!(
                    "{both} block(s) in use are on the saved free lists (first: block {b}); \
                     they would be handed out again"
                ),
                Some(Fix::RebuildAllocator),
            );
        }
        if let Some(((s, n), leaked)) = gap {
            self.error(
                ProblemKind::BlockLeak,
                None,
                format!(
                    "{leaked} block(s) are neither in use nor on the saved free lists \
                     (first: blocks {s}+{n})"
                ),
                Some(Fix::RebuildAllocator),
            );
        }
        self.check_saved_chunks(&blocks);
        let bad_slots: Vec<u64> = self
            .inodes
            .iter()
            .filter(|(_, i)| !slots.is_used(i.lane, i.slot))
            .map(|(&ino, _)| ino)
            .collect();
        if let Some(&first) = bad_slots.first() {
            self.error(
                ProblemKind::SaveArea,
                Some(first),
                format!(
                    "{} inode(s) in use have their slots on the saved free lists",
                    bad_slots.len()
                ),
                Some(Fix::RebuildAllocator),
            );
        }
    }

    /// The saved partly used chunk blocks must be exactly those the logs'
    /// heads leave partly used, with the same chunks in use: a chunk in use
    /// listed free would be handed out again, one free and not listed is
    /// leaked.
    fn check_saved_chunks(&mut self, blocks: &BlockAllocator) {
        let saved: BTreeMap<u64, u64> = (0..self.geo.lane_count)
            .flat_map(|l| blocks.chunk_blocks(l))
            .collect();
        let used: BTreeMap<u64, u64> = self
            .blocks
            .chunks
            .iter()
            .map(|(&b, owners)| {
                let mask = (0..owners.len())
                    .filter(|&c| owners[c] != 0)
                    .fold(0u64, |m, c| m | 1 << c);
                (b, mask)
            })
            .filter(|&(_, m)| m != LOG_CHUNKS_FULL)
            .collect();
        for (&b, &m) in &saved {
            if !self.blocks.chunks.contains_key(&b) {
                self.error(
                    ProblemKind::SaveArea,
                    None,
                    format!(
                        "block {b} is on the saved free lists as a log chunk block, but no \
                         log's head is in it; its chunks would be handed out"
                    ),
                    Some(Fix::RebuildAllocator),
                );
                return;
            }
            let in_use = used.get(&b).copied().unwrap_or(LOG_CHUNKS_FULL);
            if in_use & !m != 0 {
                self.error(
                    ProblemKind::SaveArea,
                    None,
                    format!(
                        "log chunks of block {b} in use ({in_use:#b}) are on the saved \
                         free lists ({m:#b} saved in use); they would be handed out again"
                    ),
                    Some(Fix::RebuildAllocator),
                );
                return;
            }
            if m & !in_use != 0 {
                self.error(
                    ProblemKind::BlockLeak,
                    None,
                    format!("saved log chunks of block {b} ({m:#b}) are in no log ({in_use:#b})"),
                    Some(Fix::RebuildAllocator),
                );
                return;
            }
        }
        if let Some((&b, &m)) = used.iter().find(|(b, _)| !saved.contains_key(b)) {
            self.error(
                ProblemKind::BlockLeak,
                None,
                format!(
                    "block {b} has free log chunks ({m:#b} in use) that are not on the saved \
                     free lists"
                ),
                Some(Fix::RebuildAllocator),
            );
        }
    }

    fn save_headers_blank(&self) -> bool {
        (0..self.geo.lane_count).all(|lane| {
            let off = (lane_first_block(lane) + LANE_SAVE_FIRST_BLOCK) * BLOCK_SIZE;
            let h: SaveHeader = read_pod(self.pm, off);
            h == SaveHeader::zeroed()
        })
    }
}

/// Used ranges against free ranges (both `[start, end)`, sorted, inside
/// `[lo, hi)`): the first block on both and how many are, the first gap
/// on neither (start, length) and how many blocks are in gaps.
pub(super) type Overlap = Option<(u64, u64)>;
pub(super) type Gap = Option<((u64, u64), u64)>;

pub(super) fn compare(
    used: &[(u64, u64)],
    free: &[(u64, u64)],
    lo: u64,
    hi: u64,
) -> (Overlap, Gap) {
    let (mut both, mut first_both) = (0u64, None);
    let (mut i, mut j) = (0, 0);
    while i < used.len() && j < free.len() {
        let a = used[i].0.max(free[j].0);
        let b = used[i].1.min(free[j].1);
        if a < b {
            both += b - a;
            first_both.get_or_insert(a);
        }
        if used[i].1 < free[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    let (mut leaked, mut first_leak) = (0u64, None);
    let mut all: Vec<(u64, u64)> = used.iter().chain(free.iter()).copied().collect();
    all.sort_unstable();
    let mut covered = lo;
    for (s, e) in all.into_iter().chain([(hi, hi)]) {
        if s > covered {
            leaked += s - covered;
            first_leak.get_or_insert((covered, s - covered));
        }
        covered = covered.max(e);
    }
    (
        first_both.map(|b| (b, both)),
        first_leak.map(|g| (g, leaked)),
    )
}
