//! The read-only check: the `Checker` holds what the passes learn (the
//! superblock the mount would use, the journal overlay, table chains, the
//! inodes and the blocks they use) and the problems found, each with its
//! fix if fsck has one. `run` makes the passes in order; this file has the
//! first ones (superblocks, the error record, inode tables, journals) and
//! the helpers every pass shares. The check looks at the pool as the next
//! mount would: a committed journal transaction is applied in DRAM only.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::inodes::{BlockMap, InoInfo};
use super::repair::Fix;
use super::report::{FsckReport, Problem, ProblemKind, Progress, Severity};
use crate::error::{Error, Result};
use crate::format::*;
use crate::journal;
use crate::pmem::{read_pod, Pmem};
use crate::superblock::{self, Geometry};
use crate::types::ErrorRecord;

/// A problem found, with the fix fsck would apply for it, if any.
pub(super) struct Found {
    pub(super) problem: Problem,
    pub(super) fix: Option<Fix>,
}

impl Found {
    pub(super) fn blocking(&self) -> bool {
        self.problem.severity == Severity::Error
            && self.fix.is_none()
            && self.problem.kind.blocks_repair()
    }
}

/// The state of one check: what the passes learned so far and what they
/// found.
pub(super) struct Checker<'a, P: Pmem + ?Sized> {
    pub(super) pm: &'a P,
    pub(super) geo: Geometry,
    pub(super) sb: Superblock,
    pub(super) found: Vec<Found>,
    /// Committed journal records not applied yet: offset → value.
    pub(super) overlay: HashMap<u64, u64>,
    pub(super) journal_pending: bool,
    /// Per lane, its table chain.
    pub(super) tables: Vec<Vec<u64>>,
    pub(super) table_blocks: HashSet<u64>,
    pub(super) inodes: BTreeMap<u64, InoInfo>,
    pub(super) blocks: BlockMap,
    pub(super) counts: [u64; 6],
    /// Hybrid pools: the data device, when it was found and is the one
    /// the superblock names (`check_data_device`).
    pub(super) dev: Option<std::sync::Arc<dyn crate::blockdev::BlockDev>>,
}

// Indexes of `Checker::counts`, the totals of `FsckReport`.
pub(super) const C_DIRS: usize = 0;
pub(super) const C_FILES: usize = 1;
pub(super) const C_SYMLINKS: usize = 2;
pub(super) const C_OTHER: usize = 3;
pub(super) const C_ORPHANS: usize = 4;
pub(super) const C_INODES: usize = 5;

pub(super) fn is_record_field(table_blocks: &HashSet<u64>, off: u64) -> bool {
    let in_block = off % BLOCK_SIZE;
    in_block < TABLE_TRAILER_OFFSET
        && matches!(
            in_block % INODE_RECORD_SIZE,
            INODE_STATE_FIELD | INODE_HEAD_FIELD | INODE_TAIL_FIELD | INODE_FLAGS_FIELD
        )
        && table_blocks.contains(&(off / BLOCK_SIZE))
}

pub(super) fn show_name(name: &[u8]) -> String {
    String::from_utf8_lossy(name).escape_debug().to_string()
}

impl<'a, P: Pmem + ?Sized> Checker<'a, P> {
    pub(super) fn run(
        pm: &'a P,
        data: Option<&crate::types::DataDevice>,
        phase: &'static str,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Checker<'a, P>> {
        let mut found = Vec::new();
        let sb = check_superblocks(pm, &mut found)?;
        let mut c = Checker {
            pm,
            geo: Geometry::of(&sb),
            sb,
            found,
            overlay: HashMap::new(),
            journal_pending: false,
            tables: Vec::new(),
            table_blocks: HashSet::new(),
            inodes: BTreeMap::new(),
            blocks: BlockMap::default(),
            counts: [0; 6],
            dev: None,
        };
        c.check_data_device(data);
        c.check_error_record();
        c.load_tables();
        c.check_journals();
        c.scan_inodes(phase, progress);
        c.check_namespace();
        c.check_save_areas();
        c.check_device_save_area();
        Ok(c)
    }

    fn push(
        &mut self,
        severity: Severity,
        kind: ProblemKind,
        ino: Option<u64>,
        message: String,
        fix: Option<Fix>,
    ) {
        self.found.push(Found {
            problem: Problem {
                kind,
                severity,
                ino,
                message,
                repairable: fix.is_some(),
                repaired: false,
            },
            fix,
        });
    }
    pub(super) fn error(
        &mut self,
        kind: ProblemKind,
        ino: Option<u64>,
        message: String,
        fix: Option<Fix>,
    ) {
        self.push(Severity::Error, kind, ino, message, fix);
    }
    pub(super) fn note(
        &mut self,
        kind: ProblemKind,
        ino: Option<u64>,
        message: String,
        fix: Option<Fix>,
    ) {
        self.push(Severity::Note, kind, ino, message, fix);
    }

    pub(super) fn report(&self) -> FsckReport {
        let blocks_total = self.geo.total_blocks - self.geo.first_data_block;
        // A hybrid pool's device blocks in use are counted apart.
        let dev_used: u64 = self
            .blocks
            .map
            .range(DEV_BLOCK_BASE..)
            .map(|(&s, &(e, _))| e - s)
            .sum();
        let pm_used = self.blocks.used - dev_used;
        FsckReport {
            problems: self.found.iter().map(|f| f.problem.clone()).collect(),
            inodes_checked: self.counts[C_INODES],
            directories: self.counts[C_DIRS],
            files: self.counts[C_FILES],
            symlinks: self.counts[C_SYMLINKS],
            other: self.counts[C_OTHER],
            orphans: self.counts[C_ORPHANS],
            blocks_total,
            blocks_used: pm_used,
            blocks_free: blocks_total.saturating_sub(pm_used),
            data_blocks_total: self.geo.dev_end - self.geo.dev_first,
            data_blocks_used: dev_used,
            was_clean: self.sb.state == STATE_CLEAN,
            modified: false,
            errors_remaining: 0,
        }
    }

    /// Corruption met while mounted, recorded by the errors= path: an error
    /// until a repair's final check finds nothing else and clears it.
    fn check_error_record(&mut self) {
        let record = ErrorRecord::of(&self.sb);
        if record.is_clear() {
            return;
        }
        self.error(
            ProblemKind::ErrorsRecorded,
            None,
            format!(
                "the superblock records {}; a read-write mount refuses the pool until a \
                 check finds nothing else wrong (-y then clears the record)",
                record.describe()
            ),
            Some(Fix::ClearErrorRecord),
        );
    }

    /// Every lane's table chain: trailer magic, bounds, cycles.
    fn load_tables(&mut self) {
        for lane in 0..self.geo.lane_count {
            let mut chain = Vec::new();
            let mut block = lane_first_block(lane) + LANE_INODE_TABLE_BLOCK;
            // Bounded: every block is visited at most once.
            loop {
                let trailer: TableTrailer =
                    read_pod(self.pm, block * BLOCK_SIZE + TABLE_TRAILER_OFFSET);
                if trailer.magic != TABLE_MAGIC {
                    self.error(
                        ProblemKind::InodeTable,
                        None,
                        format!(
                            "lane {lane}: inode table block {block} has a bad trailer; \
                             the inodes from there on are not checked"
                        ),
                        None,
                    );
                    break;
                }
                chain.push(block);
                self.table_blocks.insert(block);
                let next = trailer.next_block;
                if next == 0 {
                    break;
                }
                if !self.geo.is_data_range(next, 1) || self.table_blocks.contains(&next) {
                    self.error(
                        ProblemKind::InodeTable,
                        None,
                        format!(
                            "lane {lane}: inode table block {block} links to {} block {next}",
                            if self.table_blocks.contains(&next) {
                                "already used"
                            } else {
                                "out-of-range"
                            }
                        ),
                        None,
                    );
                    break;
                }
                block = next;
            }
            self.tables.push(chain);
        }
    }

    fn check_journals(&mut self) {
        for lane in 0..self.geo.lane_count {
            let records = match journal::pending(self.pm, lane) {
                journal::Pending::Empty => continue,
                journal::Pending::Torn => {
                    self.note(
                        ProblemKind::Journal,
                        None,
                        format!(
                            "journal of lane {lane} holds an uncommitted (torn) transaction; \
                             it will be discarded at mount"
                        ),
                        Some(Fix::ReplayJournal { lane }),
                    );
                    continue;
                }
                journal::Pending::Committed(records) => records,
            };
            // The mount refuses the pool rather than apply any of these.
            let bad = records.iter().find_map(|r| {
                journal::check_record(r, &self.geo, |off| is_record_field(&self.table_blocks, off))
                    .err()
            });
            if let Some(why) = bad {
                self.error(
                    ProblemKind::Journal,
                    None,
                    format!("journal of lane {lane}: a committed {why}"),
                    None,
                );
                continue;
            }
            self.note(
                ProblemKind::Journal,
                None,
                format!(
                    "journal of lane {lane} holds a committed transaction; \
                     it will be replayed at mount"
                ),
                Some(Fix::ReplayJournal { lane }),
            );
            self.journal_pending = true;
            for r in records {
                self.overlay.insert(r.offset, r.value);
            }
        }
    }

    /// An inode record as the next mount sees it (journal applied).
    pub(super) fn read_record(&self, off: u64) -> InodeRecord {
        let mut r: InodeRecord = read_pod(self.pm, off);
        if !self.overlay.is_empty() {
            if let Some(&v) = self.overlay.get(&(off + INODE_STATE_FIELD)) {
                r.state = v;
            }
            if let Some(&v) = self.overlay.get(&(off + INODE_HEAD_FIELD)) {
                r.log_head = v;
            }
            if let Some(&v) = self.overlay.get(&(off + INODE_TAIL_FIELD)) {
                r.log_tail = v;
            }
            if let Some(&v) = self.overlay.get(&(off + INODE_FLAGS_FIELD)) {
                r.flags = v;
            }
        }
        r
    }
}

/// Both superblock copies: pick the one the mount would use, report the
/// other. Err when neither is usable.
fn check_superblocks<P: Pmem + ?Sized>(pm: &P, found: &mut Vec<Found>) -> Result<Superblock> {
    let pool_bytes = pm.size_bytes();
    if pool_bytes < 2 * BLOCK_SIZE {
        return Err(Error::BadPool(format!(
            "pool of {pool_bytes} bytes is too small to hold a superblock"
        )));
    }
    let primary: Superblock = read_pod(pm, SUPER_PRIMARY_BLOCK * BLOCK_SIZE);
    let backup: Superblock = read_pod(pm, SUPER_BACKUP_BLOCK * BLOCK_SIZE);
    let mut push = |severity, message: String, from, to| {
        found.push(Found {
            problem: Problem {
                kind: ProblemKind::Superblock,
                severity,
                ino: None,
                message,
                repairable: true,
                repaired: false,
            },
            fix: Some(Fix::CopySuperblock { from, to }),
        })
    };
    let (p, b) = (SUPER_PRIMARY_BLOCK, SUPER_BACKUP_BLOCK);
    match (
        superblock::check_one(&primary, pool_bytes),
        superblock::check_one(&backup, pool_bytes),
    ) {
        (Ok(()), Ok(())) => {
            if primary != backup {
                // The mount updates state, epoch and unmount time, the
                // errors= path and fsck the error record, primary first: a
                // crash in between leaves exactly this.
                let mut b2 = backup;
                b2.state = primary.state;
                b2.mount_epoch = primary.mount_epoch;
                b2.unmounted_unix_ns = primary.unmounted_unix_ns;
                b2.errors_count = primary.errors_count;
                b2.first_error_unix_ns = primary.first_error_unix_ns;
                b2.first_error_ino = primary.first_error_ino;
                b2.first_error_reason = primary.first_error_reason;
                b2.last_error_unix_ns = primary.last_error_unix_ns;
                b2.last_error_ino = primary.last_error_ino;
                b2.last_error_reason = primary.last_error_reason;
                b2.checksum = primary.checksum;
                if b2 == primary {
                    push(
                        Severity::Note,
                        "the backup superblock is behind the primary (interrupted update); \
                         the next mount rewrites it"
                            .into(),
                        p,
                        b,
                    );
                } else {
                    push(
                        Severity::Error,
                        "the primary and backup superblocks disagree; the primary is used".into(),
                        p,
                        b,
                    );
                }
            }
            Ok(primary)
        }
        (Ok(()), Err(e)) => {
            push(
                Severity::Error,
                format!("the backup superblock is damaged: {e}"),
                p,
                b,
            );
            Ok(primary)
        }
        (Err(e), Ok(())) => {
            push(
                Severity::Error,
                format!("the primary superblock is damaged: {e}; the backup is used"),
                b,
                p,
            );
            Ok(backup)
        }
        (Err(e), Err(_)) => Err(Error::BadPool(e)),
    }
}
