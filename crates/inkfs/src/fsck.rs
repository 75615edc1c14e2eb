//! fsck: check a pool against the invariants docs/FORMAT.md states, and
//! repair what can be repaired safely (docs/FSCK.md).
//!
//! The check only reads media. It looks at the pool as the next mount would
//! see it: a committed but unapplied journal transaction is applied in DRAM
//! (an overlay on the inode records), not on media. Every walk is bounded
//! (log walks by `log::walk`, table chains by a visited set, the namespace
//! by a visited set of directories).
//!
//! Repair (`FsckOptions::repair`) runs in two steps. Media-level fixes
//! first: a damaged superblock copy is rewritten from the good one, pending
//! journals are replayed or discarded. Then, if anything else needs fixing
//! and nothing unrepairable was found, the pool is mounted read-write with
//! its free-list save areas invalidated (so the mount rebuilds the
//! allocator by scanning, which also frees orphans), the namespace fixes go
//! through the engine's normal commit paths (log entries committed by a tail
//! store or the journal), and a clean unmount saves fresh free lists. A
//! second check then tells what is left. Last, the superblock's record of
//! errors met while mounted is cleared if that check found nothing else.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt;

use crate::alloc::{BlockAllocator, Refusal};
use crate::dir::Child;
use crate::error::{Error, Result};
use crate::filemap::FileMap;
use crate::format::*;
use crate::fs::{rec, Fs};
use crate::inode::{self, write};
use crate::journal;
use crate::log::{EntryBuf, NewPages};
use crate::pmem::{read_pod, write_pod, BackendInfo, Pmem};
use crate::superblock::{self, Geometry};
use crate::time::now_ns;
use crate::types::{ErrorRecord, Mode, MountOptions};

/// What fsck may do.
#[derive(Clone, Debug, Default)]
pub struct FsckOptions {
    /// Repair what is safely repairable (`inkfs fsck -y`).
    pub repair: bool,
}

/// Notes describe states that are normal after a crash or while mounted
/// (the next mount deals with them); errors are violated invariants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Severity {
    Note,
    Error,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProblemKind {
    /// A superblock copy is damaged or the two disagree.
    Superblock,
    /// A lane's journal holds a transaction (or a corrupt one).
    Journal,
    /// A free-list save area is damaged or disagrees with what is in use.
    SaveArea,
    /// An inode table chain is damaged.
    InodeTable,
    /// An inode record is damaged (state, number, kind).
    InodeRecord,
    /// An inode's log is damaged (bounds, cycle, footer, entry checksum or
    /// contents, first entry, mode).
    Log,
    /// The root directory is missing or damaged.
    Root,
    /// A directory entry names an inode that is not live.
    DanglingEntry,
    /// A directory entry's child kind disagrees with the inode.
    EntryKind,
    /// A directory has more than one name (or is its own ancestor).
    DirLinkedTwice,
    /// A directory's ".." disagrees with where it is found.
    DirParent,
    /// A directory entry's readdir position is another entry's, or out of
    /// range (the engine places it elsewhere; repair rewrites the entry).
    DirPosition,
    /// A live inode no directory entry reaches.
    Unreachable,
    /// A link count disagrees with the directory entries.
    LinkCount,
    /// A block outside the data area is referenced.
    BlockRange,
    /// A block is referenced twice.
    BlockTwice,
    /// Blocks neither in use nor on the saved free lists.
    BlockLeak,
    /// An inode unlinked while open.
    Orphan,
    /// A file's blocks hold non-zero bytes past its end of file (they
    /// would show if the file grew).
    PastEof,
    /// The superblock records corruption met while mounted (errors=); the
    /// mount refuses the pool read-write until a check finds it clean.
    ErrorsRecorded,
    /// A repair step failed.
    Repair,
}

impl ProblemKind {
    pub fn name(self) -> &'static str {
        match self {
            ProblemKind::Superblock => "superblock",
            ProblemKind::Journal => "journal",
            ProblemKind::SaveArea => "save-area",
            ProblemKind::InodeTable => "inode-table",
            ProblemKind::InodeRecord => "inode-record",
            ProblemKind::Log => "log",
            ProblemKind::Root => "root",
            ProblemKind::DanglingEntry => "dangling-entry",
            ProblemKind::EntryKind => "entry-kind",
            ProblemKind::DirLinkedTwice => "dir-linked-twice",
            ProblemKind::DirParent => "dir-parent",
            ProblemKind::DirPosition => "dir-position",
            ProblemKind::Unreachable => "unreachable",
            ProblemKind::LinkCount => "link-count",
            ProblemKind::BlockRange => "block-range",
            ProblemKind::BlockTwice => "block-twice",
            ProblemKind::BlockLeak => "block-leak",
            ProblemKind::Orphan => "orphan",
            ProblemKind::PastEof => "past-eof",
            ProblemKind::ErrorsRecorded => "errors-recorded",
            ProblemKind::Repair => "repair",
        }
    }

    /// Damage that keeps the repair mount from working (the mount's
    /// recovery scan would refuse it), when fsck has no fix for it.
    fn blocks_repair(self) -> bool {
        matches!(
            self,
            ProblemKind::InodeTable
                | ProblemKind::InodeRecord
                | ProblemKind::Log
                | ProblemKind::Root
                | ProblemKind::Journal
                | ProblemKind::BlockRange
                | ProblemKind::BlockTwice
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub kind: ProblemKind,
    pub severity: Severity,
    /// The inode concerned, if one is.
    pub ino: Option<u64>,
    pub message: String,
    /// fsck has a safe fix for it (applied with `repair`).
    pub repairable: bool,
    pub repaired: bool,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.severity == Severity::Note {
            write!(f, "note: ")?;
        }
        if let Some(ino) = self.ino {
            write!(f, "inode {ino}: ")?;
        }
        write!(f, "{}", self.message)
    }
}

/// Progress of a long check, for a progress bar.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// "check", or "verify" for the check after a repair.
    pub phase: &'static str,
    pub done: u64,
    pub total: u64,
}

#[derive(Clone, Debug, Default)]
pub struct FsckReport {
    /// Everything the (first) check found, each marked repaired or not,
    /// then errors only the check after a repair found.
    pub problems: Vec<Problem>,
    /// Live and orphan inodes whose records were readable.
    pub inodes_checked: u64,
    pub directories: u64,
    pub files: u64,
    pub symlinks: u64,
    /// FIFOs, sockets and device nodes.
    pub other: u64,
    pub orphans: u64,
    /// Blocks of the data area (log pages, data, extra inode-table blocks).
    pub blocks_total: u64,
    pub blocks_used: u64,
    pub blocks_free: u64,
    /// The superblock said "cleanly unmounted" when the check started.
    pub was_clean: bool,
    /// A repair was asked for and something was written.
    pub modified: bool,
    /// Errors still present at the end (after a repair: found by the
    /// second check).
    pub errors_remaining: u64,
}

impl FsckReport {
    pub fn errors(&self) -> impl Iterator<Item = &Problem> {
        self.problems
            .iter()
            .filter(|p| p.severity == Severity::Error)
    }
    pub fn errors_found(&self) -> u64 {
        self.errors().count() as u64
    }
    pub fn errors_fixed(&self) -> u64 {
        self.errors().filter(|p| p.repaired).count() as u64
    }
    /// No error (notes allowed): what the crash tests require.
    pub fn is_clean(&self) -> bool {
        self.errors_found() == 0
    }
    /// e2fsck's convention: 0 clean, 1 errors corrected, 4 errors left.
    pub fn exit_code(&self) -> i32 {
        if self.errors_remaining > 0 {
            4
        } else if self.errors_fixed() > 0 {
            1
        } else {
            0
        }
    }
}

/// Check `pm` (and repair it if asked). `Err` only when there is nothing
/// to check: neither superblock copy is usable.
pub fn check<P: Pmem>(pm: &P, opts: &FsckOptions) -> Result<FsckReport> {
    check_with_progress(pm, opts, &mut |_| {})
}

/// `check`, reporting progress of the inode scan.
pub fn check_with_progress<P: Pmem>(
    pm: &P,
    opts: &FsckOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<FsckReport> {
    let first = Checker::run(pm, "check", progress)?;
    let mut report = first.report();
    if !opts.repair {
        report.errors_remaining = report.errors_found();
        return Ok(report);
    }
    let fixes: Vec<(usize, Fix)> = first
        .found
        .iter()
        .enumerate()
        .filter_map(|(i, f)| f.fix.clone().map(|x| (i, x)))
        .collect();
    if fixes.is_empty() {
        report.errors_remaining = report.errors_found();
        return Ok(report);
    }
    let blocked = first.found.iter().any(|f| f.blocking());

    // Media-level fixes: superblocks, then journals (a replay after a log
    // fix could roll a tail back), then bytes past files' ends (found with
    // the journals applied, as the mount will see the files). Those are
    // zeroed only on a pool without unrepairable damage: a block used
    // twice may hold another file's data.
    for (i, fix) in &fixes {
        let done = match fix {
            Fix::ZeroPastEof { .. } if blocked => continue,
            Fix::ZeroPastEof { ranges } => {
                for &(off, len) in ranges {
                    pm.zero_nt(off, len);
                }
                pm.fence();
                true
            }
            Fix::CopySuperblock { from, to } => {
                let sb: Superblock = read_pod(pm, from * BLOCK_SIZE);
                write_pod(pm, to * BLOCK_SIZE, &sb);
                pm.persist(to * BLOCK_SIZE, std::mem::size_of::<Superblock>() as u64);
                true
            }
            Fix::ReplayJournal { lane } => journal::recover(pm, &first.geo, *lane, false, |off| {
                is_record_field(&first.table_blocks, off)
            })
            .is_ok(),
            // After the journals (found first, so earlier here): a replay
            // must not bring the bad value back.
            Fix::MaskFlags { off, value } => {
                pm.write_u64(*off, *value);
                pm.persist(*off, 8);
                true
            }
            _ => continue,
        };
        report.modified = true;
        report.problems[*i].repaired = done;
    }

    let fs_fixes: Vec<(usize, Fix)> = fixes.into_iter().filter(|(_, f)| f.needs_mount()).collect();
    if !fs_fixes.is_empty() {
        if blocked {
            report.problems.push(Problem {
                kind: ProblemKind::Repair,
                severity: Severity::Note,
                ino: None,
                message: "namespace and allocator repairs not attempted: the pool has damage \
                          fsck cannot repair"
                    .into(),
                repairable: false,
                repaired: false,
            });
        } else {
            report.modified = true;
            match repair_mounted(pm, &fs_fixes) {
                Ok(results) => {
                    for (i, r) in results {
                        match r {
                            Ok(()) => report.problems[i].repaired = true,
                            Err(e) => report.problems.push(Problem {
                                kind: ProblemKind::Repair,
                                severity: Severity::Note,
                                ino: report.problems[i].ino,
                                message: format!(
                                    "repairing \"{}\" failed: {e}",
                                    report.problems[i].message
                                ),
                                repairable: false,
                                repaired: false,
                            }),
                        }
                    }
                }
                Err(e) => report.problems.push(Problem {
                    kind: ProblemKind::Repair,
                    severity: Severity::Note,
                    ino: None,
                    message: format!("the repair mount failed: {e}"),
                    repairable: false,
                    repaired: false,
                }),
            }
        }
    }

    // What is left.
    let second = Checker::run(pm, "verify", progress)?;
    let mut after = second.report();
    settle_error_record(pm, &mut report, &mut after)?;
    let same = |a: &Problem, b: &Problem| a.kind == b.kind && a.ino == b.ino;
    for p in report.problems.iter_mut() {
        if p.repaired && after.errors().any(|q| same(p, q) && q.message == p.message) {
            p.repaired = false;
        }
    }
    let before = report.problems.clone();
    for q in after.errors() {
        if !before.iter().any(|p| same(p, q) && !p.repaired) {
            let mut q = q.clone();
            q.message = format!("after repair: {}", q.message);
            report.problems.push(q);
        }
    }
    report.errors_remaining = after.errors_found();
    Ok(report)
}

/// The record of errors met while mounted is cleared (the mount then takes
/// the pool again) only by a repair whose final check found nothing else
/// wrong: that check is the full check e2fsck makes of a file system with
/// ERROR_FS set. Otherwise it stays, and a note says why.
fn settle_error_record<P: Pmem>(
    pm: &P,
    report: &mut FsckReport,
    after: &mut FsckReport,
) -> Result<()> {
    let is_record = |p: &Problem| p.kind == ProblemKind::ErrorsRecorded;
    if !after.problems.iter().any(is_record) {
        return Ok(());
    }
    if after.errors().any(|p| !is_record(p)) {
        report.problems.push(Problem {
            kind: ProblemKind::Repair,
            severity: Severity::Note,
            ino: None,
            message: "the record of errors met while mounted is kept: other errors remain, \
                      and the mount refuses the pool read-write until a check finds none"
                .into(),
            repairable: false,
            repaired: false,
        });
        return Ok(());
    }
    // Primary then backup, each persisted: a crash leaves one intact copy,
    // cleared or not (a torn primary falls back to the uncleared backup,
    // and the next fsck clears it again).
    let (mut sb, _) = superblock::read_superblock(pm)?;
    clear_error_fields(&mut sb);
    sb.seal();
    superblock::write_superblocks(pm, &sb);
    after.problems.retain(|p| !is_record(p));
    report.modified = true;
    for p in report.problems.iter_mut().filter(|p| is_record(p)) {
        p.repaired = true;
    }
    Ok(())
}

/// The superblock without an error record.
fn clear_error_fields(sb: &mut Superblock) {
    sb.errors_count = 0;
    sb.first_error_unix_ns = 0;
    sb.first_error_ino = 0;
    sb.first_error_reason = 0;
    sb.last_error_unix_ns = 0;
    sb.last_error_ino = 0;
    sb.last_error_reason = 0;
}

// ---------------------------------------------------------------------------
// Fixes
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Fix {
    /// Overwrite the superblock copy in block `to` with the one in `from`.
    CopySuperblock { from: u64, to: u64 },
    /// Replay (or discard) a lane's journal.
    ReplayJournal { lane: u32 },
    /// Invalidate the save areas so the repair mount rebuilds the
    /// allocator (frees orphans, fixes leaks); the unmount saves it again.
    RebuildAllocator,
    /// Drop the name `name` of directory `dir`.
    RemoveEntry { dir: u64, name: Vec<u8> },
    /// Rewrite the name `name` of `dir` with the child's real kind.
    RetargetEntry {
        dir: u64,
        name: Vec<u8>,
        ino: u64,
        kind: FileKind,
    },
    /// Give `ino` a name in /lost+found.
    Reconnect { ino: u64 },
    /// Set a directory's "..".
    SetParent { dir: u64, parent: u64 },
    /// Set a link count (LINK_CHANGE entry).
    SetNlink { ino: u64, nlink: u32 },
    /// Zero pool bytes `(offset, len)` a file maps past its end of file.
    /// No reader sees them, so the stores need no ordering beyond a fence.
    ZeroPastEof { ranges: Vec<(u64, u64)> },
    /// Clear the superblock's record of errors met while mounted: done last,
    /// and only when the check after every other repair finds nothing else.
    ClearErrorRecord,
    /// Store `value` (the known flags) in the inode flags field at `off`,
    /// clearing bits that mean nothing: one persisted 8-byte store.
    MaskFlags { off: u64, value: u64 },
}

impl Fix {
    fn needs_mount(&self) -> bool {
        !matches!(
            self,
            Fix::CopySuperblock { .. }
                | Fix::ReplayJournal { .. }
                | Fix::ZeroPastEof { .. }
                | Fix::ClearErrorRecord
                | Fix::MaskFlags { .. }
        )
    }
    /// Order of the mounted repairs: names first, then reconnects, then
    /// attributes computed assuming both.
    fn pass(&self) -> u32 {
        match self {
            Fix::RemoveEntry { .. } | Fix::RetargetEntry { .. } => 0,
            Fix::Reconnect { .. } => 1,
            Fix::SetParent { .. } => 2,
            Fix::SetNlink { .. } => 3,
            _ => 4,
        }
    }
}

/// A borrowed pool presented as an owned one, so that an `Fs` can run the
/// repairs on the caller's pool within one call of [`repair_mounted`].
struct Borrowed<P: Pmem>(*const P);

// SAFETY: `P: Pmem` is Send + Sync, and a `Borrowed` only exists inside
// `repair_mounted`, while the `&P` it was made from is live.
unsafe impl<P: Pmem> Send for Borrowed<P> {}
// SAFETY: as above.
unsafe impl<P: Pmem> Sync for Borrowed<P> {}

impl<P: Pmem> Borrowed<P> {
    fn pm(&self) -> &P {
        // SAFETY: see the Send impl: the pointee outlives every Borrowed.
        unsafe { &*self.0 }
    }
}

impl<P: Pmem> Pmem for Borrowed<P> {
    fn size_bytes(&self) -> u64 {
        self.pm().size_bytes()
    }
    fn info(&self) -> BackendInfo {
        self.pm().info()
    }
    fn read(&self, off: u64, buf: &mut [u8]) {
        self.pm().read(off, buf)
    }
    fn read_u64(&self, off: u64) -> u64 {
        self.pm().read_u64(off)
    }
    fn write(&self, off: u64, data: &[u8]) {
        self.pm().write(off, data)
    }
    fn write_u64(&self, off: u64, value: u64) {
        self.pm().write_u64(off, value)
    }
    fn copy_nt(&self, off: u64, data: &[u8]) {
        self.pm().copy_nt(off, data)
    }
    fn zero_nt(&self, off: u64, len: u64) {
        self.pm().zero_nt(off, len)
    }
    fn flush(&self, off: u64, len: u64) {
        self.pm().flush(off, len)
    }
    fn fence(&self) {
        self.pm().fence()
    }
    fn persist(&self, off: u64, len: u64) {
        self.pm().persist(off, len)
    }
    fn sync_all(&self) -> std::io::Result<()> {
        self.pm().sync_all()
    }
}

type FixResults = Vec<(usize, Result<()>)>;

/// Mount read-write (allocator rebuilt by scanning), apply the namespace
/// fixes through the engine's commit paths, unmount cleanly.
fn repair_mounted<P: Pmem>(pm: &P, fixes: &[(usize, Fix)]) -> Result<FixResults> {
    let sb = superblock::read_superblock(pm)?.0;
    // A zeroed header is what a save that did not fit leaves: the mount
    // then rebuilds the allocator from the logs.
    for lane in 0..sb.lane_count {
        let off = (lane_first_block(lane) + LANE_SAVE_FIRST_BLOCK) * BLOCK_SIZE;
        write_pod(pm, off, &SaveHeader::zeroed());
        pm.persist(off, std::mem::size_of::<SaveHeader>() as u64);
    }
    // The error record, if set, stays until the check after these repairs.
    let fs = Fs::mount_for_repair(
        Borrowed(pm as *const P),
        MountOptions {
            mode: Mode::Strict,
            read_only: false,
            ..Default::default()
        },
    )?;
    let mut results = Vec::new();
    let mut lost_found = None;
    for pass in 0..5 {
        for (i, fix) in fixes.iter().filter(|(_, f)| f.pass() == pass) {
            let r = match fix {
                Fix::RemoveEntry { dir, name } => fs.fsck_put_entry(*dir, name, None),
                Fix::RetargetEntry {
                    dir,
                    name,
                    ino,
                    kind,
                } => fs.fsck_put_entry(*dir, name, Some((*ino, *kind))),
                Fix::Reconnect { ino } => fs.fsck_reconnect(*ino, &mut lost_found),
                Fix::SetParent { dir, parent } => {
                    fs.fsck_put_attr(*dir, false, |a| a.rdev_or_parent = *parent)
                }
                Fix::SetNlink { ino, nlink } => fs.fsck_put_attr(*ino, true, |a| a.nlink = *nlink),
                // Done by the mount's rebuild and the unmount's save.
                Fix::RebuildAllocator => Ok(()),
                Fix::CopySuperblock { .. }
                | Fix::ReplayJournal { .. }
                | Fix::ZeroPastEof { .. }
                | Fix::ClearErrorRecord
                | Fix::MaskFlags { .. } => continue,
            };
            results.push((*i, r));
        }
    }
    fs.unmount()?;
    Ok(results)
}

/// Repair helpers: small single-purpose commits through the engine's
/// normal paths (entries appended past the tail, then the tail store or a
/// journal transaction).
impl<P: Pmem> Fs<P> {
    /// Remove the name `name` of directory `dir` (`target` None), or make it
    /// point at `target` (same readdir cookie).
    fn fsck_put_entry(&self, dir: u64, name: &[u8], target: Option<(u64, FileKind)>) -> Result<()> {
        let d = self.iget(dir)?;
        let mut st = write(&d.state);
        let old = st
            .dir()
            .and_then(|x| x.get(name))
            .ok_or(Error::Errno(libc::ENOENT))?;
        let now = now_ns();
        let entry = match target {
            None => EntryBuf::dir(false, old.ino, old.seq, now, old.kind, name),
            Some((ino, kind)) => EntryBuf::dir(true, ino, old.seq, now, kind, name),
        };
        let mut cur = st.log;
        let mut pages = NewPages::default();
        if let Err(e) = self.log_append(dir, &mut cur, &entry, &mut pages) {
            pages.release(&self.blocks);
            return Err(e);
        }
        self.commit_tail(d.rec_off, &cur, true);
        st.log = cur;
        st.log_entries += 1;
        st.attr.mtime_ns = now;
        st.attr.ctime_ns = now;
        if let Some(x) = st.dir_mut() {
            match target {
                None => {
                    x.remove(name);
                }
                Some((ino, kind)) => {
                    x.add(
                        name,
                        Child {
                            ino,
                            kind,
                            seq: old.seq,
                        },
                    );
                }
            }
        }
        Ok(())
    }

    /// Append an attribute snapshot (`f` applied to the current one).
    fn fsck_put_attr(
        &self,
        ino: u64,
        link_change: bool,
        f: impl FnOnce(&mut AttrEntry),
    ) -> Result<()> {
        let i = self.iget(ino)?;
        let mut st = write(&i.state);
        let mut a = st.attr;
        f(&mut a);
        a.ctime_ns = now_ns();
        let mut cur = st.log;
        let mut pages = NewPages::default();
        if let Err(e) = self.log_append(ino, &mut cur, &EntryBuf::attr(link_change, a), &mut pages)
        {
            pages.release(&self.blocks);
            return Err(e);
        }
        self.commit_tail(i.rec_off, &cur, true);
        st.log = cur;
        st.log_entries += 1;
        st.attr = a;
        Ok(())
    }

    /// Name `ino` "#ino" in /lost+found (created on first use); a directory
    /// gets its ".." changed in the same journal transaction.
    fn fsck_reconnect(&self, ino: u64, lost_found: &mut Option<u64>) -> Result<()> {
        let dir = match *lost_found {
            Some(d) => d,
            None => {
                let d = match self.lookup_ino(ROOT_INO, b"lost+found") {
                    Ok(d) => {
                        if self.getattr(d)?.kind != FileKind::Dir {
                            return Err(Error::Corrupt(
                                "/lost+found exists and is not a directory".into(),
                            ));
                        }
                        d
                    }
                    Err(Error::Errno(libc::ENOENT)) => {
                        self.mkdir(ROOT_INO, b"lost+found", 0o700, 0, 0)?.ino
                    }
                    Err(e) => return Err(e),
                };
                *lost_found = Some(d);
                d
            }
        };
        if dir == ino {
            return Err(Error::Errno(libc::EINVAL));
        }
        let d = self.iget(dir)?;
        let c = self.iget(ino)?;
        // Repairs run on one thread: no lock-order concern.
        let mut dst = write(&d.state);
        let mut cst = write(&c.state);
        let mut name = format!("#{ino}").into_bytes();
        let mut n = 0;
        while dst.dir().is_some_and(|x| x.get(&name).is_some()) {
            n += 1;
            name = format!("#{ino}.{n}").into_bytes();
        }
        let now = now_ns();
        let seq = dst.dir().map_or(0, |x| x.place(&name, &self.names));
        let mut pages = NewPages::default();
        let mut dcur = dst.log;
        let mut ccur = cst.log;
        let mut ca = cst.attr;
        ca.rdev_or_parent = dir;
        ca.ctime_ns = now;
        let is_dir = c.kind == FileKind::Dir;
        let r = (|| -> Result<()> {
            if is_dir {
                self.log_append(ino, &mut ccur, &EntryBuf::attr(false, ca), &mut pages)?;
            }
            self.log_append(
                dir,
                &mut dcur,
                &EntryBuf::dir(true, ino, seq, now, c.kind, &name),
                &mut pages,
            )?;
            Ok(())
        })();
        if let Err(e) = r {
            pages.release(&self.blocks);
            return Err(e);
        }
        if is_dir {
            self.commit_journal(&[
                rec(c.rec_off, INODE_TAIL_FIELD, ccur.tail),
                rec(d.rec_off, INODE_TAIL_FIELD, dcur.tail),
            ]);
            cst.log = ccur;
            cst.log_entries += 1;
            cst.attr = ca;
        } else {
            self.commit_tail(d.rec_off, &dcur, true);
        }
        dst.log = dcur;
        dst.log_entries += 1;
        dst.attr.mtime_ns = now;
        dst.attr.ctime_ns = now;
        if let Some(x) = dst.dir_mut() {
            x.add(
                &name,
                Child {
                    ino,
                    kind: c.kind,
                    seq,
                },
            );
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The check
// ---------------------------------------------------------------------------

struct Found {
    problem: Problem,
    fix: Option<Fix>,
}

impl Found {
    fn blocking(&self) -> bool {
        self.problem.severity == Severity::Error
            && self.fix.is_none()
            && self.problem.kind.blocks_repair()
    }
}

/// Who uses a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Use {
    Table(u32),
    Log(u64),
    Data(u64),
    Symlink(u64),
}

impl Use {
    fn ino(self) -> Option<u64> {
        match self {
            Use::Table(_) => None,
            Use::Log(i) | Use::Data(i) | Use::Symlink(i) => Some(i),
        }
    }
}

impl fmt::Display for Use {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Use::Table(l) => write!(f, "the inode table of lane {l}"),
            Use::Log(i) => write!(f, "the log of inode {i}"),
            Use::Data(i) => write!(f, "the data of inode {i}"),
            Use::Symlink(i) => write!(f, "the symlink target of inode {i}"),
        }
    }
}

/// Used blocks as disjoint ranges: start → (end, user).
#[derive(Default)]
struct BlockMap {
    map: BTreeMap<u64, (u64, Use)>,
    used: u64,
}

impl BlockMap {
    /// Record `[start, start + len)` (inside the data area) as used by `u`;
    /// on overlap, the first shared block and its other user.
    fn add(&mut self, start: u64, len: u64, u: Use) -> std::result::Result<(), (u64, Use)> {
        let end = start + len;
        let mut merge_with = None;
        if let Some((&s, &(e, o))) = self.map.range(..=start).next_back() {
            if e > start {
                return Err((start, o));
            }
            if e == start && o == u {
                merge_with = Some(s);
            }
        }
        if let Some((&s, &(_, o))) = self.map.range(start..end).next() {
            return Err((s, o));
        }
        match merge_with {
            Some(s) => {
                if let Some(v) = self.map.get_mut(&s) {
                    v.0 = end;
                }
            }
            None => {
                self.map.insert(start, (end, u));
            }
        }
        self.used += len;
        Ok(())
    }
}

/// What the check keeps of one live or orphan inode.
struct InoInfo {
    lane: u32,
    slot: u64,
    state: u64,
    kind: FileKind,
    /// None when its log could not be read.
    body: Option<Loaded>,
}

struct Loaded {
    nlink: u32,
    /// Directories: the ".." in the last attribute snapshot.
    parent: u64,
    /// Directories: (name, child, child kind).
    children: Vec<(Vec<u8>, u64, FileKind)>,
}

struct Checker<'a, P: Pmem + ?Sized> {
    pm: &'a P,
    geo: Geometry,
    sb: Superblock,
    found: Vec<Found>,
    /// Committed journal records not applied yet: offset → value.
    overlay: HashMap<u64, u64>,
    journal_pending: bool,
    /// Per lane, its table chain.
    tables: Vec<Vec<u64>>,
    table_blocks: HashSet<u64>,
    inodes: BTreeMap<u64, InoInfo>,
    blocks: BlockMap,
    counts: [u64; 6],
}

const C_DIRS: usize = 0;
const C_FILES: usize = 1;
const C_SYMLINKS: usize = 2;
const C_OTHER: usize = 3;
const C_ORPHANS: usize = 4;
const C_INODES: usize = 5;

fn is_record_field(table_blocks: &HashSet<u64>, off: u64) -> bool {
    let in_block = off % BLOCK_SIZE;
    in_block < TABLE_TRAILER_OFFSET
        && matches!(
            in_block % INODE_RECORD_SIZE,
            INODE_STATE_FIELD | INODE_HEAD_FIELD | INODE_TAIL_FIELD | INODE_FLAGS_FIELD
        )
        && table_blocks.contains(&(off / BLOCK_SIZE))
}

fn show_name(name: &[u8]) -> String {
    String::from_utf8_lossy(name).escape_debug().to_string()
}

fn corrupt_message(e: Error) -> String {
    match e {
        Error::Corrupt(m) => m,
        other => other.to_string(),
    }
}

impl<'a, P: Pmem + ?Sized> Checker<'a, P> {
    fn run(
        pm: &'a P,
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
        };
        c.check_error_record();
        c.load_tables();
        c.check_journals();
        c.scan_inodes(phase, progress);
        c.check_namespace();
        c.check_save_areas();
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
    fn error(&mut self, kind: ProblemKind, ino: Option<u64>, message: String, fix: Option<Fix>) {
        self.push(Severity::Error, kind, ino, message, fix);
    }
    fn note(&mut self, kind: ProblemKind, ino: Option<u64>, message: String, fix: Option<Fix>) {
        self.push(Severity::Note, kind, ino, message, fix);
    }

    fn report(&self) -> FsckReport {
        let blocks_total = self.geo.total_blocks - self.geo.first_data_block;
        FsckReport {
            problems: self.found.iter().map(|f| f.problem.clone()).collect(),
            inodes_checked: self.counts[C_INODES],
            directories: self.counts[C_DIRS],
            files: self.counts[C_FILES],
            symlinks: self.counts[C_SYMLINKS],
            other: self.counts[C_OTHER],
            orphans: self.counts[C_ORPHANS],
            blocks_total,
            blocks_used: self.blocks.used,
            blocks_free: blocks_total.saturating_sub(self.blocks.used),
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
    fn read_record(&self, off: u64) -> InodeRecord {
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

    fn use_blocks(&mut self, start: u64, len: u64, u: Use) {
        if !self.geo.is_data_range(start, len) {
            self.error(
                ProblemKind::BlockRange,
                u.ino(),
                format!("blocks {start}+{len} of {u} lie outside the data area"),
                None,
            );
            return;
        }
        if let Err((b, other)) = self.blocks.add(start, len, u) {
            self.error(
                ProblemKind::BlockTwice,
                u.ino(),
                format!("block {b} is used by {u} and by {other}"),
                None,
            );
        }
    }

    /// Bytes a file maps past its end of file must be zero: growing the
    /// file (truncate, fallocate, a write past the end) shows them as the
    /// file's contents (FORMAT.md, "Copy-on-write data"). Reads the tail of
    /// the last page and every page mapped beyond it.
    fn check_past_eof(&mut self, ino: u64, size: u64, map: &FileMap) {
        let first = size / BLOCK_SIZE;
        let mut dirty: Vec<(u64, u64)> = Vec::new();
        let mut buf = [0u8; BLOCK_SIZE as usize];
        for e in map.iter().filter(|e| e.end() > first) {
            for page in e.page.max(first)..e.end() {
                let block = e.block + (page - e.page);
                if !self.geo.is_data_range(block, 1) {
                    continue; // reported by `use_blocks`
                }
                let from = if page == first { size % BLOCK_SIZE } else { 0 };
                let part = &mut buf[from as usize..];
                self.pm.read(block * BLOCK_SIZE + from, part);
                if part.iter().any(|&b| b != 0) {
                    dirty.push((block * BLOCK_SIZE + from, BLOCK_SIZE - from));
                }
            }
        }
        if let Some(&(off, _)) = dirty.first() {
            self.error(
                ProblemKind::PastEof,
                Some(ino),
                format!(
                    "{} page(s) hold non-zero bytes past the end of file (size {size}; first at pool \
                     offset {off}); zeroed at repair",
                    dirty.len()
                ),
                Some(Fix::ZeroPastEof { ranges: dirty }),
            );
        }
    }

    fn scan_inodes(&mut self, phase: &'static str, progress: &mut dyn FnMut(Progress)) {
        let total: u64 = self
            .tables
            .iter()
            .map(|c| c.len() as u64 * INODES_PER_TABLE_BLOCK)
            .sum();
        let mut done = 0;
        progress(Progress { phase, done, total });
        for lane in 0..self.geo.lane_count {
            let chain = self.tables[lane as usize].clone();
            for (index, &block) in chain.iter().enumerate() {
                if block >= self.geo.first_data_block {
                    self.use_blocks(block, 1, Use::Table(lane));
                }
                for i in 0..INODES_PER_TABLE_BLOCK {
                    let slot = index as u64 * INODES_PER_TABLE_BLOCK + i;
                    let rec_off = block * BLOCK_SIZE + i * INODE_RECORD_SIZE;
                    self.check_inode(lane, slot, rec_off);
                }
                done += INODES_PER_TABLE_BLOCK;
                progress(Progress { phase, done, total });
            }
        }
    }

    fn check_inode(&mut self, lane: u32, slot: u64, rec_off: u64) {
        let rec = self.read_record(rec_off);
        let ino = lane_slot_to_ino(lane, slot, self.geo.lane_count);
        match rec.state {
            INODE_FREE => return,
            INODE_LIVE | INODE_ORPHAN => {}
            other => {
                self.error(
                    ProblemKind::InodeRecord,
                    Some(ino),
                    format!("unknown record state {other}"),
                    None,
                );
                return;
            }
        }
        let orphan = rec.state == INODE_ORPHAN;
        // An orphan's damage goes with it: the mount frees orphans unread.
        let orphan_fix = orphan.then_some(Fix::RebuildAllocator);
        if rec.ino != ino {
            self.error(
                ProblemKind::InodeRecord,
                Some(ino),
                format!(
                    "the record of lane {lane} slot {slot} names inode {}",
                    rec.ino
                ),
                orphan_fix,
            );
            return;
        }
        let Some(kind) = FileKind::from_u32(rec.kind) else {
            self.error(
                ProblemKind::InodeRecord,
                Some(ino),
                format!("unknown kind {}", rec.kind),
                orphan_fix,
            );
            return;
        };
        let rec = self.check_flags(ino, rec_off, rec);
        self.counts[C_INODES] += 1;
        self.counts[match kind {
            FileKind::Dir => C_DIRS,
            FileKind::File => C_FILES,
            FileKind::Symlink => C_SYMLINKS,
            _ => C_OTHER,
        }] += 1;
        if orphan {
            self.counts[C_ORPHANS] += 1;
            if self.sb.state == STATE_CLEAN {
                self.error(
                    ProblemKind::Orphan,
                    Some(ino),
                    "orphan (unlinked while open) left by a clean unmount; freed at repair".into(),
                    Some(Fix::RebuildAllocator),
                );
            } else {
                self.note(
                    ProblemKind::Orphan,
                    Some(ino),
                    "orphan (unlinked while open); it will be freed at mount".into(),
                    Some(Fix::RebuildAllocator),
                );
            }
        }
        let body = match inode::load_with_pages(self.pm, &self.geo, ino, &rec) {
            Err(e) => {
                self.error(ProblemKind::Log, Some(ino), corrupt_message(e), orphan_fix);
                None
            }
            Ok((st, pages)) => {
                for p in pages {
                    self.use_blocks(p, 1, Use::Log(ino));
                }
                let mut children = Vec::new();
                match &st.body {
                    inode::Body::File(map) => {
                        for e in map.iter() {
                            self.use_blocks(e.block, e.pages, Use::Data(ino));
                        }
                        self.check_past_eof(ino, st.attr.size, map);
                    }
                    inode::Body::Symlink { block, .. } if *block != 0 => {
                        self.use_blocks(*block, 1, Use::Symlink(ino))
                    }
                    inode::Body::Dir(d) => {
                        children = d.iter().map(|(n, c)| (n.to_vec(), c.ino, c.kind)).collect();
                        self.check_positions(ino, d);
                    }
                    _ => {}
                }
                Some(Loaded {
                    nlink: st.attr.nlink,
                    parent: st.attr.rdev_or_parent,
                    children,
                })
            }
        };
        self.inodes.insert(
            ino,
            InoInfo {
                lane,
                slot,
                state: rec.state,
                kind,
                body,
            },
        );
    }

    /// Inode flags must be bits inkfs knows (the mount refuses the inode
    /// otherwise). Returns the record with them masked, so that the rest
    /// of the inode is still checked.
    fn check_flags(&mut self, ino: u64, rec_off: u64, rec: InodeRecord) -> InodeRecord {
        let Err(m) = inode::record_flags(&rec) else {
            return rec;
        };
        let value = rec.flags & inode_flags::KNOWN as u64;
        self.error(
            ProblemKind::InodeRecord,
            Some(ino),
            format!("{m}; the unknown bits are cleared at repair"),
            Some(Fix::MaskFlags {
                off: rec_off + INODE_FLAGS_FIELD,
                value,
            }),
        );
        InodeRecord {
            flags: value,
            ..rec
        }
    }

    /// Readdir positions must be unique within a directory (a name seen
    /// twice in one pass otherwise) and their cookies must fit an i64. The
    /// replay placed each offending name at a free position; the repair
    /// rewrites its entry there (before any other fix of the name: the
    /// inode scan's findings precede the namespace walk's).
    fn check_positions(&mut self, ino: u64, d: &crate::dir::DirIndex) {
        for (name, c) in d.displaced() {
            self.error(
                ProblemKind::DirPosition,
                Some(ino),
                format!(
                    "entry \"{}\": its readdir position is another entry's or out of range \
                     (moved to {})",
                    show_name(name),
                    c.seq
                ),
                Some(Fix::RetargetEntry {
                    dir: ino,
                    name: name.to_vec(),
                    ino: c.ino,
                    kind: c.kind,
                }),
            );
        }
    }

    fn check_namespace(&mut self) {
        let inodes = std::mem::take(&mut self.inodes);
        let mut ns = Namespace {
            inodes: &inodes,
            found: Vec::new(),
            visited: HashSet::new(),
            links: HashMap::new(),
            refs: HashMap::new(),
        };
        let root_ok = match inodes.get(&ROOT_INO) {
            None => Some("the root directory (inode 1) is not live"),
            Some(i) if i.kind != FileKind::Dir || i.state != INODE_LIVE => {
                Some("the root inode is not a live directory")
            }
            Some(i) if i.body.is_none() => Some("the root directory's log is damaged"),
            Some(_) => None,
        };
        if let Some(m) = root_ok {
            self.error(ProblemKind::Root, Some(ROOT_INO), m.into(), None);
            self.inodes = inodes;
            return;
        }
        ns.walk(ROOT_INO);

        // Unreachable directories: the tops of unreachable trees first (no
        // unreachable directory names them), each reconnected with its tree.
        let unreached: Vec<u64> = inodes
            .iter()
            .filter(|(ino, i)| {
                i.kind == FileKind::Dir
                    && i.state == INODE_LIVE
                    && i.body.is_some()
                    && !ns.visited.contains(*ino)
            })
            .map(|(ino, _)| *ino)
            .collect();
        let named: HashSet<u64> = unreached
            .iter()
            .filter_map(|d| inodes.get(d)?.body.as_ref())
            .flat_map(|b| b.children.iter().map(|c| c.1))
            .collect();
        let (tops, rest): (Vec<u64>, Vec<u64>) =
            unreached.into_iter().partition(|d| !named.contains(d));
        let mut reconnected = HashSet::new();
        for d in tops.into_iter().chain(rest) {
            if ns.visited.contains(&d) {
                continue;
            }
            ns.found.push(Found {
                problem: Problem {
                    kind: ProblemKind::Unreachable,
                    severity: Severity::Error,
                    ino: Some(d),
                    message: "directory not reachable from the root; reconnect to /lost+found"
                        .into(),
                    repairable: true,
                    repaired: false,
                },
                fix: Some(Fix::Reconnect { ino: d }),
            });
            reconnected.insert(d);
            ns.walk(d);
        }

        // Files and other non-directories: reachability and link counts.
        for (&ino, i) in inodes.iter() {
            if i.kind == FileKind::Dir || i.state != INODE_LIVE {
                continue;
            }
            let Some(b) = &i.body else { continue };
            let mut refs = ns.refs.get(&ino).copied().unwrap_or(0);
            if refs == 0 {
                ns.found.push(Found {
                    problem: Problem {
                        kind: ProblemKind::Unreachable,
                        severity: Severity::Error,
                        ino: Some(ino),
                        message: "no directory entry names this inode; reconnect to /lost+found"
                            .into(),
                        repairable: true,
                        repaired: false,
                    },
                    fix: Some(Fix::Reconnect { ino }),
                });
                refs = 1;
            }
            if b.nlink != refs {
                ns.found.push(Found {
                    problem: Problem {
                        kind: ProblemKind::LinkCount,
                        severity: Severity::Error,
                        ino: Some(ino),
                        message: format!(
                            "link count is {}, but {refs} directory entr{} name{} it",
                            b.nlink,
                            if refs == 1 { "y" } else { "ies" },
                            if refs == 1 { "s" } else { "" }
                        ),
                        repairable: true,
                        repaired: false,
                    },
                    fix: Some(Fix::SetNlink { ino, nlink: refs }),
                });
            }
        }

        // "..": the root's is itself; every other reached directory's is
        // the directory that names it.
        let mut parents: Vec<(u64, u64)> = ns.links.iter().map(|(&c, &(p, _))| (c, p)).collect();
        parents.push((ROOT_INO, ROOT_INO));
        parents.sort_unstable();
        for (dir, parent) in parents {
            if reconnected.contains(&dir) {
                continue;
            }
            let Some(b) = inodes.get(&dir).and_then(|i| i.body.as_ref()) else {
                continue;
            };
            if b.parent != parent {
                ns.found.push(Found {
                    problem: Problem {
                        kind: ProblemKind::DirParent,
                        severity: Severity::Error,
                        ino: Some(dir),
                        message: format!(
                            "\"..\" is inode {}, but the directory is found in inode {parent}",
                            b.parent
                        ),
                        repairable: true,
                        repaired: false,
                    },
                    fix: Some(Fix::SetParent { dir, parent }),
                });
            }
        }
        let found = ns.found;
        self.found.extend(found);
        self.inodes = inodes;
    }

    /// On a clean pool, the saved free lists must be exactly the blocks and
    /// inode slots not in use.
    fn check_save_areas(&mut self) {
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
        let used: Vec<(u64, u64)> = self.blocks.map.iter().map(|(&s, &(e, _))| (s, e)).collect();

        // In use and on a free list.
        let (mut both, mut first_both) = (0u64, None);
        let (mut i, mut j) = (0, 0);
        while i < used.len() && j < free.len() {
            let lo = used[i].0.max(free[j].0);
            let hi = used[i].1.min(free[j].1);
            if lo < hi {
                both += hi - lo;
                first_both.get_or_insert(lo);
            }
            if used[i].1 < free[j].1 {
                i += 1;
            } else {
                j += 1;
            }
        }
        // Neither: gaps in the union.
        let (mut leaked, mut first_leak) = (0u64, None);
        let mut all: Vec<(u64, u64)> = used.iter().chain(free.iter()).copied().collect();
        all.sort_unstable();
        let mut covered = geo.first_data_block;
        for (s, e) in all
            .into_iter()
            .chain([(geo.total_blocks, geo.total_blocks)])
        {
            if s > covered {
                leaked += s - covered;
                first_leak.get_or_insert((covered, s - covered));
            }
            covered = covered.max(e);
        }
        if let Some(b) = first_both {
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
        if let Some((s, n)) = first_leak {
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

/// The namespace walk: directories reached, the entry by which each was
/// reached, and how many entries name each non-directory.
struct Namespace<'i> {
    inodes: &'i BTreeMap<u64, InoInfo>,
    found: Vec<Found>,
    visited: HashSet<u64>,
    /// Directory → (parent, name) of the entry it is reached by.
    links: HashMap<u64, (u64, Vec<u8>)>,
    refs: HashMap<u64, u32>,
}

impl Namespace<'_> {
    fn error(&mut self, kind: ProblemKind, ino: u64, message: String, fix: Option<Fix>) {
        self.found.push(Found {
            problem: Problem {
                kind,
                severity: Severity::Error,
                ino: Some(ino),
                message,
                repairable: fix.is_some(),
                repaired: false,
            },
            fix,
        });
    }

    /// True if `d` is `anc` or lies below it (following reached links).
    fn is_under(&self, mut d: u64, anc: u64) -> bool {
        // Bounded: links form a forest, and at most one step per directory.
        for _ in 0..=self.links.len() {
            if d == anc {
                return true;
            }
            match self.links.get(&d) {
                Some(&(p, _)) => d = p,
                None => return false,
            }
        }
        false
    }

    /// Breadth-first from directory `start` (bounded: each directory is
    /// expanded once).
    fn walk(&mut self, start: u64) {
        let inodes = self.inodes;
        self.visited.insert(start);
        let mut queue = VecDeque::from([start]);
        while let Some(d) = queue.pop_front() {
            let Some(body) = inodes.get(&d).and_then(|i| i.body.as_ref()) else {
                continue;
            };
            for (name, cino, ckind) in &body.children {
                let (name, cino, ckind) = (name.clone(), *cino, *ckind);
                // Names were checked by the log decoder (`dir_name_valid`).
                debug_assert!(dir_name_valid(&name));
                let shown = show_name(&name);
                let child = inodes.get(&cino).filter(|i| i.state == INODE_LIVE);
                let Some(child) = child else {
                    let what = match inodes.get(&cino) {
                        Some(_) => "an orphan",
                        None => "free or nonexistent",
                    };
                    self.error(
                        ProblemKind::DanglingEntry,
                        d,
                        format!("entry \"{shown}\" names inode {cino}, which is {what}"),
                        Some(Fix::RemoveEntry { dir: d, name }),
                    );
                    continue;
                };
                if child.kind != ckind {
                    self.error(
                        ProblemKind::EntryKind,
                        d,
                        format!(
                            "entry \"{shown}\" says inode {cino} is a {ckind:?}, it is a {:?}",
                            child.kind
                        ),
                        Some(Fix::RetargetEntry {
                            dir: d,
                            name: name.clone(),
                            ino: cino,
                            kind: child.kind,
                        }),
                    );
                }
                if child.kind != FileKind::Dir {
                    *self.refs.entry(cino).or_insert(0) += 1;
                    continue;
                }
                if !self.visited.contains(&cino) {
                    self.visited.insert(cino);
                    self.links.insert(cino, (d, name));
                    queue.push_back(cino);
                    continue;
                }
                // A second name for a directory. Keep the one its ".."
                // agrees with, unless that would cut the tree off.
                let recorded = child.body.as_ref().map(|b| b.parent);
                let keep_new = cino != ROOT_INO
                    && recorded == Some(d)
                    && self.links.get(&cino).is_some_and(|(p, _)| *p != d)
                    && !self.is_under(d, cino);
                let (extra_dir, extra_name) = if keep_new {
                    match self.links.insert(cino, (d, name)) {
                        Some(old) => old,
                        None => continue,
                    }
                } else {
                    (d, name)
                };
                self.error(
                    ProblemKind::DirLinkedTwice,
                    extra_dir,
                    format!(
                        "entry \"{}\" names directory {cino}, which already has a name \
                         (or is an ancestor)",
                        show_name(&extra_name)
                    ),
                    Some(Fix::RemoveEntry {
                        dir: extra_dir,
                        name: extra_name,
                    }),
                );
            }
        }
    }
}
