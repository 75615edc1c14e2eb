//! The repair: the fixes the check attaches to what it finds, and their
//! application. Media-level fixes (a superblock copy, a journal replay,
//! bytes past a file's end, unknown inode flags) are stores to the pool;
//! the others run through a read-write repair mount of the engine, whose
//! normal commit paths keep every step crash-consistent, with the save
//! areas invalidated first so the mount rebuilds the allocator (freeing
//! orphans and leaks) and the unmount saves it fresh. Last, the record of
//! errors met while mounted is cleared if the verifying check allows it.

use std::collections::HashSet;

use super::check::is_record_field;
use super::report::{FsckReport, Problem, ProblemKind, Severity};
use crate::dir::Child;
use crate::error::{Error, Result};
use crate::format::*;
use crate::fs::{rec, Fs};
use crate::inode::write;
use crate::journal;
use crate::log::{EntryBuf, NewPages};
use crate::pmem::{read_pod, write_pod, BackendInfo, Pmem};
use crate::superblock::{self, Geometry};
use crate::time::now_ns;
use crate::types::{Mode, MountOptions};

#[derive(Clone, Debug)]
pub(super) enum Fix {
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
    /// Zero the data device's pages `(block, from)` (`DEV_BLOCK_BASE` +
    /// device block, first byte to zero) a file maps past its end of
    /// file; flushed once at the end. No reader sees them either.
    ZeroDevPastEof { pages: Vec<(u64, u64)> },
    /// Clear the superblock's record of errors met while mounted: done last,
    /// and only when the check after every other repair finds nothing else.
    ClearErrorRecord,
    /// Store `value` (the known flags) in the inode flags field at `off`,
    /// clearing bits that mean nothing: one persisted 8-byte store.
    MaskFlags { off: u64, value: u64 },
}

impl Fix {
    pub(super) fn needs_mount(&self) -> bool {
        !matches!(
            self,
            Fix::CopySuperblock { .. }
                | Fix::ReplayJournal { .. }
                | Fix::ZeroPastEof { .. }
                | Fix::ZeroDevPastEof { .. }
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

/// Media-level fixes: superblocks, then journals (a replay after a log
/// fix could roll a tail back), then bytes past files' ends (found with
/// the journals applied, as the mount will see the files). Those are
/// zeroed only on a pool without unrepairable damage (`blocked`): a block
/// used twice may hold another file's data.
pub(super) fn apply_media_fixes<P: Pmem>(
    pm: &P,
    geo: &Geometry,
    table_blocks: &HashSet<u64>,
    fixes: &[(usize, Fix)],
    blocked: bool,
    report: &mut FsckReport,
) {
    for (i, fix) in fixes {
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
            Fix::ReplayJournal { lane } => journal::recover(pm, geo, *lane, false, |off| {
                is_record_field(table_blocks, off)
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
}

/// Bytes past files' ends on a hybrid pool's data device, zeroed through
/// the device opened for writing (as the mount finds it: `data`, else the
/// path recorded at mkfs) and flushed once. No reader sees these bytes
/// and nothing names them anew, so a crash part-way leaves pages zeroed
/// or not, each still past its file's end, and the next check finds the
/// rest. Skipped, as on PM, when the pool has damage fsck cannot repair.
pub(super) fn apply_device_fixes<P: Pmem>(
    pm: &P,
    sb: &Superblock,
    data: Option<&crate::types::DataDevice>,
    fixes: &[(usize, Fix)],
    blocked: bool,
    report: &mut FsckReport,
) {
    let todo: Vec<(usize, &Vec<(u64, u64)>)> = fixes
        .iter()
        .filter_map(|(i, f)| match f {
            Fix::ZeroDevPastEof { pages } => Some((*i, pages)),
            _ => None,
        })
        .collect();
    if todo.is_empty() || blocked {
        return;
    }
    let opts = MountOptions {
        data: data.cloned(),
        ..Default::default()
    };
    let done = crate::blockdev::attach::open_device(pm, sb, &opts).and_then(|dev| {
        let dev = dev.ok_or_else(|| Error::BadPool("the pool has no data device".into()))?;
        let mut page = crate::blockdev::dev::pages(1);
        for &(block, from) in todo.iter().flat_map(|(_, pages)| pages.iter()) {
            debug_assert!(block >= DEV_BLOCK_BASE && from < BLOCK_SIZE);
            let off = (block - DEV_BLOCK_BASE) * BLOCK_SIZE;
            dev.read_at(off, &mut page)?;
            page[0].0[from as usize..].fill(0);
            dev.write_at(off, &page)?;
        }
        dev.flush()?;
        Ok(())
    });
    match done {
        Ok(()) => {
            report.modified = true;
            for (i, _) in todo {
                report.problems[i].repaired = true;
            }
        }
        Err(e) => report.problems.push(Problem {
            kind: ProblemKind::Repair,
            severity: Severity::Note,
            ino: None,
            message: format!("zeroing bytes past the end of files on the data device failed: {e}"),
            repairable: false,
            repaired: false,
        }),
    }
}

/// The fixes that need the engine (`Fix::needs_mount`), applied through a
/// repair mount unless the pool has damage fsck cannot repair (`blocked`);
/// each problem is marked repaired, or a note says why not.
pub(super) fn apply_mounted_fixes<P: Pmem>(
    pm: &P,
    data: Option<crate::types::DataDevice>,
    fs_fixes: &[(usize, Fix)],
    blocked: bool,
    report: &mut FsckReport,
) {
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
        match repair_mounted(pm, data, fs_fixes) {
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

/// The record of errors met while mounted is cleared (the mount then takes
/// the pool again) only by a repair whose final check found nothing else
/// wrong: that check is the full check e2fsck makes of a file system with
/// ERROR_FS set. Otherwise it stays, and a note says why.
pub(super) fn settle_error_record<P: Pmem>(
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
fn repair_mounted<P: Pmem>(
    pm: &P,
    data: Option<crate::types::DataDevice>,
    fixes: &[(usize, Fix)],
) -> Result<FixResults> {
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
            // A hybrid pool's rebuild scans both sides (the device's save
            // area is only read when the PM ones are valid).
            data,
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
                | Fix::ZeroDevPastEof { .. }
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
