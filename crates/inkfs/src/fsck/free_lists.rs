//! On a clean pool the next mount trusts the free lists saved at unmount
//! instead of scanning, so they must be exactly the blocks and inode slots
//! not in use: a block both in use and on a list would be handed out
//! twice, one on neither is leaked. Checked by restoring the allocators
//! the way the mount does and comparing with what the inode scan found.

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
