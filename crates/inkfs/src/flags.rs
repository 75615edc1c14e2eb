//! Inode flags (`chattr`/`lsattr`, FS_IOC_GETFLAGS/FS_IOC_SETFLAGS):
//! reading and changing them, and the rules by which immutable and
//! append-only inodes refuse changes.
//!
//! The engine enforces these itself: the kernel does not for a FUSE file
//! system (it never learns the flags), and the C ABI and preload front ends
//! have no kernel in the way at all. The rules are Linux's (fs/namei.c
//! `may_delete`/`may_create`/`may_open`/`vfs_link`, fs/attr.c
//! `notify_change`, fs/open.c `vfs_fallocate`, fs/xattr.c
//! `xattr_permission`, ext4's `ext4_setattr`, write checks and
//! `ext4_fileattr_set`); root is refused like anyone else.
//!
//! Storage and crash ordering: the flags live in the inode record
//! (`InodeRecord::flags`, FORMAT.md). A change appends a SET_ATTR entry with
//! the new ctime past the log tail, then stores the new tail and the new
//! flags in one journal transaction: a crash shows both or neither.

use std::sync::Arc;

use crate::error::{errno, Result};
use crate::format::inode_flags::*;
use crate::format::*;
use crate::fs::{live, rec, FileHandle, Fs};
use crate::inode::{read, write, Inode, InodeState};
use crate::log::{EntryBuf, NewPages};
use crate::pmem::Pmem;
use crate::time::now_ns;
use crate::types::{FallocFlags, SetAttr, TimeSet};

fn eperm() -> Result<()> {
    errno(libc::EPERM)
}

/// Refuse any change to an immutable inode: its data, attributes, xattrs,
/// links, and (a directory) its entries.
pub(crate) fn deny_if_immutable(st: &InodeState) -> Result<()> {
    if st.flags & IMMUTABLE != 0 {
        return eperm();
    }
    Ok(())
}

/// Refuse what neither an immutable nor an append-only inode allows: losing
/// a name (unlink, rename, rmdir of it, replacing it), gaining one (link),
/// xattr changes; for a directory, losing an entry.
pub(crate) fn deny_if_immutable_or_append(st: &InodeState) -> Result<()> {
    if st.flags & (IMMUTABLE | APPEND) != 0 {
        return eperm();
    }
    Ok(())
}

/// A write of file bytes at `off`: nothing may change an immutable file
/// (ext4 checks at every write, not only at open), and an append-only file
/// grows only at its end.
pub(crate) fn deny_write(st: &InodeState, off: u64) -> Result<()> {
    deny_if_immutable(st)?;
    if st.flags & APPEND != 0 && off != st.attr.size {
        return eperm();
    }
    Ok(())
}

/// setattr: nothing on an immutable inode (ext4_setattr); on an append-only
/// one no mode, owner, size or explicit time (notify_change, do_truncate);
/// setting the times to "now" (touch) is allowed.
pub(crate) fn deny_setattr(st: &InodeState, set: &SetAttr) -> Result<()> {
    deny_if_immutable(st)?;
    let explicit = |t: Option<TimeSet>| matches!(t, Some(TimeSet::At(_)));
    let changes_pinned = set.mode.is_some()
        || set.uid.is_some()
        || set.gid.is_some()
        || set.size.is_some()
        || explicit(set.atime)
        || explicit(set.mtime);
    if st.flags & APPEND != 0 && changes_pinned {
        return eperm();
    }
    Ok(())
}

/// fallocate: only plain allocation (with or without KEEP_SIZE) on an
/// append-only file, nothing on an immutable one (vfs_fallocate). Any
/// mode beyond KEEP_SIZE (punch, zero, and whatever modes come later)
/// changes existing bytes.
pub(crate) fn deny_fallocate(st: &InodeState, mode: &FallocFlags) -> Result<()> {
    let plain = FallocFlags {
        keep_size: mode.keep_size,
        ..FallocFlags::default()
    };
    if st.flags & APPEND != 0 && *mode != plain {
        return eperm();
    }
    deny_if_immutable(st)
}

/// open(2) flags: an immutable inode opens for reading only (O_TRUNC counts
/// as writing); an append-only one for writing only with O_APPEND and never
/// with O_TRUNC (may_open).
pub(crate) fn deny_open(st: &InodeState, open_flags: i32) -> Result<()> {
    let writes = open_flags & libc::O_ACCMODE != libc::O_RDONLY;
    let truncates = open_flags & libc::O_TRUNC != 0;
    if (writes || truncates) && st.flags & IMMUTABLE != 0 {
        return eperm();
    }
    if st.flags & APPEND != 0 && (writes && open_flags & libc::O_APPEND == 0 || truncates) {
        return eperm();
    }
    Ok(())
}

/// The flags a new inode of `kind` takes from its directory's.
pub(crate) fn inherited(dir_flags: u32, kind: FileKind) -> u32 {
    dir_flags & INHERITED & settable(kind)
}

/// Flags an inode of `kind` may carry: as ext4 (`ext4_mask_flags`), only
/// files and directories may be immutable or append-only.
fn settable(kind: FileKind) -> u32 {
    match kind {
        FileKind::File | FileKind::Dir => KNOWN,
        _ => NODUMP | NOATIME,
    }
}

impl<P: Pmem> Fs<P> {
    /// FS_IOC_GETFLAGS: the inode's `inode_flags` bits.
    pub fn get_flags(&self, ino: u64) -> Result<u32> {
        let inode = self.iget(ino)?;
        let st = read(&inode.state);
        live(&st)?;
        Ok(st.flags)
    }

    /// FS_IOC_SETFLAGS: make the inode's flags `flags`. `privileged` says
    /// the caller may change IMMUTABLE and APPEND (CAP_LINUX_IMMUTABLE);
    /// otherwise changing either is EPERM. Bits inkfs does not store, or
    /// that the inode's kind cannot carry, are EOPNOTSUPP; an immutable
    /// inode that stays immutable may not change its other flags (EPERM, as
    /// ext4). Sets ctime; atomic and durable on return in every mode.
    pub fn set_flags(&self, ino: u64, flags: u32, privileged: bool) -> Result<()> {
        self.check_writable()?;
        let inode = self.iget(ino)?;
        let mut st = write(&inode.state);
        live(&st)?;
        let old = st.flags;
        if (old ^ flags) & PRIVILEGED != 0 && !privileged {
            return eperm();
        }
        if flags & !settable(inode.kind) != 0 {
            return errno(libc::EOPNOTSUPP);
        }
        if old & flags & IMMUTABLE != 0 && old != flags {
            return eperm();
        }
        self.commit_flags(&inode, &mut st, flags)
    }

    /// Log the new ctime past the tail, then switch tail and flags in one
    /// journal transaction. A crash before the commit word is durable
    /// leaves the old tail and flags (the entry past the tail, and any page
    /// it took, are unreachable and free to recovery); after it, the
    /// replayed records give the new ones.
    fn commit_flags(&self, inode: &Arc<Inode>, st: &mut InodeState, flags: u32) -> Result<()> {
        debug_assert_eq!(flags & !KNOWN, 0, "only known flags reach the media");
        let mut a = st.attr;
        a.ctime_ns = now_ns();
        let mut cur = st.log;
        let mut pages = NewPages::default();
        if let Err(e) = self.log_append(inode.ino, &mut cur, &EntryBuf::attr(false, a), &mut pages)
        {
            pages.release(&self.blocks);
            return Err(e);
        }
        self.commit_journal(&[
            rec(inode.rec_off, INODE_TAIL_FIELD, cur.tail),
            rec(inode.rec_off, INODE_FLAGS_FIELD, flags as u64),
        ]);
        st.log = cur;
        st.log_entries += 1;
        st.attr = a;
        st.flags = flags;
        // The journal fenced every earlier entry: a posix-mode extension
        // is durable now.
        st.unfenced_size = None;
        self.maybe_compact(inode, st);
        Ok(())
    }

    /// open(2): `open` with the access checks immutable and append-only
    /// inodes impose on `open_flags` (O_ACCMODE, O_APPEND, O_TRUNC; other
    /// bits are ignored). Truncation itself is the caller's (setattr).
    pub fn open_with(&self, ino: u64, open_flags: i32) -> Result<FileHandle> {
        let inode = self.iget(ino)?;
        let mut st = write(&inode.state);
        live(&st)?;
        deny_open(&st, open_flags)?;
        st.open_count += 1;
        drop(st);
        Ok(FileHandle::new(inode))
    }
}
