//! Scrub: an online check of a mounted pool (`inkfs scrub MOUNTPOINT`).
//!
//! A clean mount reads no log, so damage to an inode nobody touches stays
//! unseen until a crash makes the next mount scan it (and refuse the pool).
//! A scrub reads everything that carries a checksum or a magic while the
//! mount keeps serving: both superblocks, every lane's journal header and
//! inode-table trailers, every inode record, and every live or orphan
//! inode's log (page footers, entry lengths, checksums and fields: the
//! replay a mount would do). What it finds goes through the errors= path
//! (`Fs::corruption`), as damage met by any other call does.
//!
//! Locking: never a global lock, one small lock at a time. A loaded inode
//! is checked under its read lock (its writers wait for that one inode);
//! under it the record's head and tail must equal the loaded ones, since
//! every commit changes both under the write lock. An inode nobody loaded
//! is checked with no lock at all: nothing changes it without loading it
//! first, so the check is kept only if, afterwards, its record is unchanged
//! and it is still not loaded (otherwise it is checked again, loaded).
//! Superblocks are read under the superblock mutex, a journal under its
//! lane's mutex, a table chain under its lane's table mutex.

use crate::error::Error;
use crate::format::*;
use crate::fs::Fs;
use crate::inode::{self, lock, read, Inode};
use crate::pmem::{read_pod, Pmem};
use crate::superblock;

/// How far a scrub is, in inode slots (for a progress bar).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrubProgress {
    pub done: u64,
    pub total: u64,
}

/// One damaged thing a scrub found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScrubProblem {
    pub reason: ErrorReason,
    pub ino: Option<u64>,
    pub message: String,
}

/// What a scrub checked and found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Superblock copies compared with the mounted one.
    pub superblocks: u32,
    /// Lane journals checked (read-write mounts only: a read-only mount
    /// may hold a journal a crash left, which is fsck's to judge).
    pub journals: u32,
    pub table_blocks: u64,
    /// Live and orphan inodes whose records and logs were checked.
    pub inodes: u64,
    pub log_pages: u64,
    pub log_entries: u64,
    pub problems: Vec<ScrubProblem>,
    /// The progress callback asked to stop before the end.
    pub cancelled: bool,
}

impl ScrubReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Attempts at checking an inode nobody loaded while others keep loading
/// and changing it; after that it is in use, and left to the next scrub.
const COLD_ATTEMPTS: u32 = 4;

impl<P: Pmem> Fs<P> {
    /// Check every checksum of the mounted pool while it keeps serving (see
    /// the module comment). `progress` is called after each inode-table
    /// block; returning false stops the scrub (`cancelled`). Damage found
    /// is counted, reported and recorded as any runtime corruption, and
    /// under `errors=remount-ro` turns the file system read-only (the scrub
    /// goes on: it only reads).
    pub fn scrub(&self, progress: &mut dyn FnMut(ScrubProgress) -> bool) -> ScrubReport {
        let mut s = Scrub {
            fs: self,
            report: ScrubReport::default(),
        };
        s.superblocks();
        if !self.read_only {
            s.journals();
        }
        let chains: Vec<Vec<u64>> = (0..self.geo.lane_count)
            .map(|lane| s.table_chain(lane))
            .collect();
        let total = chains.iter().map(|c| c.len() as u64).sum::<u64>() * INODES_PER_TABLE_BLOCK;
        let mut done = 0;
        if !progress(ScrubProgress { done, total }) {
            s.report.cancelled = true;
            return s.report;
        }
        for (lane, chain) in chains.iter().enumerate() {
            for (index, &block) in chain.iter().enumerate() {
                for i in 0..INODES_PER_TABLE_BLOCK {
                    let slot = index as u64 * INODES_PER_TABLE_BLOCK + i;
                    let rec_off = block * BLOCK_SIZE + i * INODE_RECORD_SIZE;
                    s.inode(lane as u32, slot, rec_off);
                }
                done += INODES_PER_TABLE_BLOCK;
                if !progress(ScrubProgress { done, total }) {
                    s.report.cancelled = true;
                    return s.report;
                }
            }
        }
        s.report
    }
}

struct Scrub<'a, P: Pmem> {
    fs: &'a Fs<P>,
    report: ScrubReport,
}

/// What checking one inode's record and log found.
type InodeOutcome = Result<(u64, u64), (ErrorReason, String)>;

impl<P: Pmem> Scrub<'_, P> {
    fn problem(&mut self, reason: ErrorReason, ino: Option<u64>, message: String) {
        self.fs.note_corruption(reason, ino, &message);
        self.report.problems.push(ScrubProblem {
            reason,
            ino,
            message,
        });
    }

    /// Both copies, under the superblock mutex (every superblock write of a
    /// mounted pool holds it). A read-write mount wrote both copies from
    /// the one it holds: each must equal it. A read-only mount wrote
    /// nothing, and its copies may differ the way an interrupted update
    /// leaves them (fsck's to judge): each must only be valid.
    fn superblocks(&mut self) {
        let fs = self.fs;
        let pool_bytes = fs.pm.size_bytes();
        let mut found = Vec::new();
        let mounted = lock(&fs.sb);
        for (name, block) in [
            ("primary", SUPER_PRIMARY_BLOCK),
            ("backup", SUPER_BACKUP_BLOCK),
        ] {
            let copy: Superblock = read_pod(&fs.pm, block * BLOCK_SIZE);
            self.report.superblocks += 1;
            if let Err(why) = superblock::check_one(&copy, pool_bytes) {
                found.push(format!("the {name} superblock is damaged: {why}"));
            } else if !fs.read_only && copy != *mounted {
                found.push(format!(
                    "the {name} superblock differs from the one this mount wrote"
                ));
            }
        }
        // Released before the errors= path, which writes the superblock.
        drop(mounted);
        for m in found {
            self.problem(ErrorReason::Superblock, None, m);
        }
    }

    /// Under each lane's journal mutex no transaction runs, and the last
    /// one cleared its commit word before releasing it: a commit word now
    /// would be replayed (or discarded) by the next crash recovery.
    fn journals(&mut self) {
        let fs = self.fs;
        for lane in 0..fs.geo.lane_count {
            let off = (lane_first_block(lane) + LANE_JOURNAL_BLOCK) * BLOCK_SIZE;
            let header: JournalHeader = {
                let _idle = lock(&fs.journals[lane as usize]);
                read_pod(&fs.pm, off)
            };
            self.report.journals += 1;
            if header.commit != 0 {
                self.problem(
                    ErrorReason::Journal,
                    None,
                    format!(
                        "the journal of lane {lane} holds commit word {:#x} while no \
                         transaction runs",
                        header.commit
                    ),
                );
            }
        }
    }

    fn table_chain(&mut self, lane: u32) -> Vec<u64> {
        let (chain, problem) = self.fs.tables.verify_chain(&self.fs.pm, lane);
        self.report.table_blocks += chain.len() as u64;
        if let Some(m) = problem {
            self.problem(ErrorReason::InodeTable, None, m);
        }
        chain
    }

    fn inode(&mut self, lane: u32, slot: u64, rec_off: u64) {
        let fs = self.fs;
        let ino = lane_slot_to_ino(lane, slot, fs.geo.lane_count);
        for _ in 0..COLD_ATTEMPTS {
            let rec: InodeRecord = read_pod(&fs.pm, rec_off);
            if rec.state == INODE_FREE {
                return;
            }
            // A client holding the inode's lease commits to its log
            // without this engine's lock: the loaded state is behind (it
            // catches up at the recall), so such an inode is checked as a
            // cold one, from its record.
            if let Some(inode) = fs.cache.get(ino).filter(|_| !fs.leased(ino)) {
                let outcome = loaded(fs, &inode, rec_off);
                if matches!(outcome, Some(Err(_))) && fs.leased(ino) {
                    // Leased meanwhile: the mismatch is the holder's commit.
                    continue;
                }
                return self.finish(ino, outcome);
            }
            let outcome = cold(fs, ino, &rec);
            // Valid only if nobody loaded it meanwhile (loading is the only
            // way this process changes it), or, leased, if the record did
            // not change (the holder commits by the record's tail).
            let again: InodeRecord = read_pod(&fs.pm, rec_off);
            if again == rec && (fs.cache.get(ino).is_none() || fs.leased(ino)) {
                return self.finish(ino, Some(outcome));
            }
        }
    }

    fn finish(&mut self, ino: u64, outcome: Option<InodeOutcome>) {
        match outcome {
            // Freed or not yet created: nothing to check.
            None => {}
            Some(Ok((pages, entries))) => {
                self.report.inodes += 1;
                self.report.log_pages += pages;
                self.report.log_entries += entries;
            }
            Some(Err((reason, m))) => {
                self.report.inodes += 1;
                self.problem(reason, Some(ino), m);
            }
        }
    }
}

/// An inode nobody loaded: its record and its log, replayed as a load
/// would (lock-free; the caller validates).
fn cold<P: Pmem>(fs: &Fs<P>, ino: u64, rec: &InodeRecord) -> InodeOutcome {
    if rec.state != INODE_LIVE && rec.state != INODE_ORPHAN {
        return Err((
            ErrorReason::InodeRecord,
            format!("unknown record state {}", rec.state),
        ));
    }
    if rec.ino != ino {
        return Err((
            ErrorReason::InodeRecord,
            format!("the record names inode {}", rec.ino),
        ));
    }
    if FileKind::from_u32(rec.kind).is_none() {
        return Err((
            ErrorReason::InodeRecord,
            format!("unknown kind {}", rec.kind),
        ));
    }
    replay(fs, ino, rec)
}

/// A loaded inode, under its read lock: the record must match it, and its
/// log (from the loaded head to the loaded tail) must replay. None when it
/// is not (or no longer, or not yet) live.
fn loaded<P: Pmem>(fs: &Fs<P>, inode: &Inode, rec_off: u64) -> Option<InodeOutcome> {
    let st = read(&inode.state);
    if st.gone {
        return None;
    }
    // A deferred tail (blockdev/deferred.rs) is stored first, so that the
    // record's tail is the loaded one (no append runs under this lock); a
    // failed flush leaves the inode to the next scrub.
    fs.settle_tail(inode.ino).ok()?;
    // Under the read lock no commit changes this inode's record.
    let rec: InodeRecord = read_pod(&fs.pm, rec_off);
    if rec.state == INODE_FREE {
        // Being created: cached before its record turns LIVE.
        return None;
    }
    let bad = |m: String| Some(Err((ErrorReason::InodeRecord, m)));
    let want_state = if st.orphan { INODE_ORPHAN } else { INODE_LIVE };
    if rec.state != want_state {
        return bad(format!(
            "record state {} disagrees with the loaded inode ({want_state})",
            rec.state
        ));
    }
    if rec.ino != inode.ino || rec.kind != inode.kind as u32 {
        return bad(format!(
            "the record names inode {} of kind {}, loaded as inode {} of kind {}",
            rec.ino, rec.kind, inode.ino, inode.kind as u32
        ));
    }
    if (rec.log_head, rec.log_tail) != (st.log.head, st.log.tail) {
        return bad(format!(
            "the record's log head/tail {}/{} disagree with the loaded inode's {}/{}",
            rec.log_head, rec.log_tail, st.log.head, st.log.tail
        ));
    }
    Some(replay(fs, inode.ino, &rec))
}

/// Replay `rec`'s log into a throwaway state: every page footer, entry
/// length, checksum and field, as a mount would check them.
fn replay<P: Pmem>(fs: &Fs<P>, ino: u64, rec: &InodeRecord) -> InodeOutcome {
    match inode::load_with_pages(&fs.pm, &fs.geo, ino, rec) {
        Ok((st, pages)) => Ok((pages.len() as u64, st.log_entries)),
        Err(Error::Corrupt(m)) => Err((ErrorReason::Log, m)),
        Err(e) => Err((ErrorReason::Log, e.to_string())),
    }
}
