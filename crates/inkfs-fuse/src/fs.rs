//! The FUSE request handlers: each FUSE operation → one engine call.
//!
//! # Caching (why these settings)
//! - No writeback cache: with it the kernel acknowledges `write(2)` from
//!   its page cache and sends the data later, so a write that returned is not
//!   yet in the pool — that breaks the promise of `strict` and `sync` modes
//!   (durable on return). Without it every write is sent synchronously and
//!   returns only after the engine persisted it.
//! - Page cache kept across opens (`FOPEN_KEEP_CACHE`), no `direct_io`:
//!   this server is the only way into the pool while it is mounted (the pool
//!   lock refuses a second server) and every change goes through this kernel,
//!   which keeps its cached pages coherent (writes are written through,
//!   truncate and fallocate drop the affected pages). So cached reads are
//!   never stale, repeated reads cost no round trip, and `mmap` works,
//!   including shared writable mappings (which `direct_io` would forbid);
//!   dirty mmap pages reach the engine at `msync`/`fsync`/unmap, as POSIX
//!   allows.
//! - Two worker threads blocking on the device (`threads=2`, no polling)
//!   by default. On this 2-vCPU VM a single thread sleeping between
//!   requests costs ~30 µs of wake-up per request; polling (`-o poll`,
//!   `crate::poll`) hides that for one thread (1.4–1.7× on fio 4 KiB I/O),
//!   but two blocking threads are faster still: 1.3–1.6× the polling thread
//!   with one client, ~2× with two (bench/fuse-floor). Four are slower.
//! - Attribute and entry TTL of 1 s: the kernel updates or invalidates its
//!   copy on every change it sends us, so the TTL only bounds staleness in
//!   cases we did not foresee; 1 s is libfuse's default and keeps
//!   `stat`-heavy tools (git, make) from paying a round trip per call.
//!   Negative lookups are cached for the same TTL (see `lookup`).
//! - FLUSH is answered ENOSYS: nothing is buffered here, and the kernel
//!   then stops sending it, so a close costs one request (RELEASE) instead
//!   of two; dirty mmap pages are still written back at close.
//! - FSYNC and FSYNCDIR are answered ENOSYS in strict and sync modes (and on
//!   a read-only mount), where every call is durable when it is answered:
//!   `fsync(2)` then costs no round trip. The kernel still writes dirty mmap
//!   pages back first. In posix mode FSYNC does the work of making in-place
//!   writes durable, and is served.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::clock::{self, Tick};

use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use inkfs::types::{
    Attr, DirEntry, FallocFlags, FileKind, RenameFlags, SetAttr, TimeSet, Whence, XattrFlags,
};

/// The FUSE protocol settings of an inkfs mount: capabilities asked at
/// INIT (`configure_kernel`) and the flags every open gets (`OPEN_FLAGS`).
pub fn configure_kernel(config: &mut KernelConfig) {
    // Ask for each capability on its own: an old kernel lacking one
    // should not cost us the others.
    for cap in [
        InitFlags::FUSE_ASYNC_READ,
        InitFlags::FUSE_BIG_WRITES,
        InitFlags::FUSE_ATOMIC_O_TRUNC,
        InitFlags::FUSE_DO_READDIRPLUS,
        InitFlags::FUSE_READDIRPLUS_AUTO,
        InitFlags::FUSE_PARALLEL_DIROPS,
        InitFlags::FUSE_MAX_PAGES,
        InitFlags::FUSE_CACHE_SYMLINKS,
        // The server clears set-id bits itself (see `kill_suidgid`):
        // without this the kernel asks for security.capability before
        // every write, a second round trip per write(2).
        InitFlags::FUSE_HANDLE_KILLPRIV_V2,
    ] {
        let _ = config.add_capabilities(cap);
    }
    // Deliberately not FUSE_WRITEBACK_CACHE (see the module comment).
    let _ = config.set_max_write(MAX_WRITE_BYTES);
}

/// See `configure_kernel`.
pub const OPEN_FLAGS: FopenFlags = FopenFlags::FOPEN_KEEP_CACHE;

use crate::engine::Engine;
use crate::handles::HandleTable;
use crate::stats::{Op, Stats};

/// See the module comment.
const TTL: Duration = Duration::from_secs(1);
/// Largest write the kernel may send in one request.
pub const MAX_WRITE_BYTES: u32 = 1 << 20;
/// Entries fetched per readdirplus request (each costs a getattr).
const READDIRPLUS_BATCH: usize = 256;

pub struct InkFuse<E: Engine> {
    fs: Arc<E>,
    handles: HandleTable<E::Handle>,
    stats: Arc<Stats>,
    read_only: bool,
}

/// The attributes a readdirplus entry carries when its inode cannot be read:
/// its number and the type from the directory entry, nothing else.
fn unreadable_attr(ino: u64, kind: FileKind) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        kind: file_type(kind),
        nlink: 1,
        ..negative_attr()
    }
}

/// The attributes of a negative lookup reply: only node 0 matters.
fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

fn errno(e: inkfs::Error) -> Errno {
    Errno::from_i32(e.errno())
}

fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

fn system_time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn time_ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos().min(i64::MAX as u128) as i64,
        Err(e) => -(e.duration().as_nanos().min(i64::MAX as u128) as i64),
    }
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(time_ns(t)),
    }
}

pub fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: system_time(a.atime_ns),
        mtime: system_time(a.mtime_ns),
        ctime: system_time(a.ctime_ns),
        crtime: system_time(a.ctime_ns),
        kind: file_type(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        // FUSE carries the kernel's 32-bit device encoding, which is what
        // mknod handed us and what the engine stored.
        rdev: a.rdev as u32,
        blksize: 4096,
        flags: 0,
    }
}

impl<E: Engine> InkFuse<E> {
    pub fn new(fs: Arc<E>, stats: Arc<Stats>, read_only: bool) -> InkFuse<E> {
        InkFuse {
            fs,
            handles: HandleTable::default(),
            stats,
            read_only,
        }
    }

    #[inline]
    fn done(&self, op: Op, t: Tick, ok: bool) {
        self.stats.record(op, t, ok);
    }

    fn rofs(&self) -> Result<(), inkfs::Error> {
        if self.read_only {
            return Err(inkfs::Error::Errno(libc::EROFS));
        }
        Ok(())
    }

    /// Owner and mode of a new inode: BSD group semantics under a set-group-ID
    /// directory (the new inode takes the directory's group; a new directory
    /// also inherits the bit), which the kernel leaves to the file system.
    fn new_owner(&self, parent: u64, req: &Request, mode: u32, is_dir: bool) -> (u32, u32, u32) {
        match self.fs.getattr(parent) {
            Ok(p) if p.mode & libc::S_ISGID != 0 => {
                let mode = if is_dir { mode | libc::S_ISGID } else { mode };
                (req.uid(), p.gid, mode)
            }
            _ => (req.uid(), req.gid(), mode),
        }
    }

    fn reply_entry(&self, op: Op, t: Tick, r: inkfs::Result<Attr>, reply: ReplyEntry) {
        match r {
            Ok(a) => {
                reply.entry(&TTL, &file_attr(&a), Generation(a.generation));
                self.done(op, t, true);
            }
            Err(e) => {
                reply.error(errno(e));
                self.done(op, t, false);
            }
        }
    }

    fn reply_empty(&self, op: Op, t: Tick, r: inkfs::Result<()>, reply: ReplyEmpty) {
        match r {
            Ok(()) => {
                reply.ok();
                self.done(op, t, true);
            }
            Err(e) => {
                reply.error(errno(e));
                self.done(op, t, false);
            }
        }
    }

    fn open_handle(&self, ino: u64, flags: i32) -> inkfs::Result<u64> {
        if flags & libc::O_TRUNC != 0 && flags & libc::O_ACCMODE != libc::O_RDONLY {
            // FUSE_ATOMIC_O_TRUNC: the kernel leaves the truncation to us.
            self.rofs()?;
            let h = self.fs.open_with(ino, flags)?;
            if let Err(e) = self.fs.setattr(
                ino,
                &SetAttr {
                    size: Some(0),
                    ..SetAttr::default()
                },
            ) {
                self.fs.release(h);
                return Err(e);
            }
            return Ok(self.handles.insert(h, flags));
        }
        let h = self.fs.open_with(ino, flags)?;
        Ok(self.handles.insert(h, flags))
    }

    fn with_handle<T>(
        &self,
        fh: FileHandle,
        f: impl FnOnce(&E::Handle, i32) -> inkfs::Result<T>,
    ) -> inkfs::Result<T> {
        self.handles
            .with(fh.0, |open| f(&open.handle, open.flags))
            .unwrap_or(Err(inkfs::Error::Errno(libc::EBADF)))
    }

    fn release_handle(&self, fh: FileHandle) {
        if let Some(h) = self.handles.remove(fh.0) {
            self.fs.release(h);
        }
    }
}

fn name_bytes(name: &OsStr) -> &[u8] {
    name.as_bytes()
}

impl<E: Engine> Filesystem for InkFuse<E> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        configure_kernel(config);
        Ok(())
    }

    fn destroy(&mut self) {
        // The kernel is gone: release what it never closed so that unlinked
        // inodes are reclaimed before the engine unmounts.
        for h in self.handles.drain() {
            self.fs.release(h);
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let t = clock::now();
        match self.fs.lookup(parent.0, name_bytes(name)) {
            Err(e) if e.errno() == libc::ENOENT => {
                // A negative entry (node 0) with the entry TTL: the kernel
                // caches "no such name" as it caches names. Every creation
                // goes through this kernel, which replaces the negative
                // dentry, so the cache cannot hide a file; tools that probe
                // for absent files (SQLite's journal and WAL, git, PATH and
                // include searches) stop paying a round trip per probe.
                reply.entry(&TTL, &negative_attr(), Generation(0));
                self.done(Op::lookup, t, false);
            }
            r => self.reply_entry(Op::lookup, t, r, reply),
        }
    }

    fn forget(&self, _req: &Request, _ino: INodeNo, _nlookup: u64) {
        // The engine keeps no lookup counts: open handles keep unlinked
        // inodes alive, and the kernel holds a handle for every open file.
        self.stats.record(Op::forget, clock::now(), true);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let t = clock::now();
        match self.fs.getattr(ino.0) {
            Ok(a) => {
                reply.attr(&TTL, &file_attr(&a));
                self.done(Op::getattr, t, true);
            }
            Err(e) => {
                reply.error(errno(e));
                self.done(Op::getattr, t, false);
            }
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let t = clock::now();
        let mut set = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
        };
        // With FUSE_HANDLE_KILLPRIV_V2 the kernel leaves clearing set-id bits
        // to us: as Linux does, a chown of a non-directory clears them, and
        // so does a truncate by an unprivileged caller.
        if set.mode.is_none()
            && (uid.is_some() || gid.is_some() || size.is_some() && _req.uid() != 0)
        {
            if let Ok(a) = self.fs.getattr(ino.0) {
                if a.kind != FileKind::Dir {
                    set.mode = killed_mode(a.mode);
                }
            }
        }
        let r = self.rofs().and_then(|()| self.fs.setattr(ino.0, &set));
        match r {
            Ok(a) => {
                reply.attr(&TTL, &file_attr(&a));
                self.done(Op::setattr, t, true);
            }
            Err(e) => {
                reply.error(errno(e));
                self.done(Op::setattr, t, false);
            }
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let t = clock::now();
        match self.fs.readlink(ino.0) {
            Ok(target) => {
                reply.data(&target);
                self.done(Op::readlink, t, true);
            }
            Err(e) => {
                reply.error(errno(e));
                self.done(Op::readlink, t, false);
            }
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let t = clock::now();
        let mode = mode & !(umask & 0o777);
        let (uid, gid, mode) = self.new_owner(parent.0, req, mode, false);
        let r = self.rofs().and_then(|()| {
            self.fs
                .mknod(parent.0, name_bytes(name), mode, rdev as u64, uid, gid)
        });
        self.reply_entry(Op::mknod, t, r, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let t = clock::now();
        let mode = mode & !(umask & 0o777) & 0o7777;
        let (uid, gid, mode) = self.new_owner(parent.0, req, mode, true);
        let r = self
            .rofs()
            .and_then(|()| self.fs.mkdir(parent.0, name_bytes(name), mode, uid, gid));
        self.reply_entry(Op::mkdir, t, r, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let t = clock::now();
        let r = self
            .rofs()
            .and_then(|()| self.fs.unlink(parent.0, name_bytes(name)));
        self.reply_empty(Op::unlink, t, r, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let t = clock::now();
        let r = self
            .rofs()
            .and_then(|()| self.fs.rmdir(parent.0, name_bytes(name)));
        self.reply_empty(Op::rmdir, t, r, reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let t = clock::now();
        let (uid, gid, _) = self.new_owner(parent.0, req, 0o777, false);
        let r = self.rofs().and_then(|()| {
            self.fs.symlink(
                parent.0,
                name_bytes(link_name),
                target.as_os_str().as_bytes(),
                uid,
                gid,
            )
        });
        self.reply_entry(Op::symlink, t, r, reply);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let t = clock::now();
        let r = self
            .rofs()
            .and_then(|()| RenameFlags::from_bits(flags.bits()))
            .and_then(|f| {
                // A whiteout (RENAME_WHITEOUT, overlayfs) is a new inode in
                // the old directory, owned as a mknod there would be.
                let (uid, gid, _) = if f.whiteout {
                    self.new_owner(parent.0, req, 0, false)
                } else {
                    (req.uid(), req.gid(), 0)
                };
                self.fs.rename(
                    parent.0,
                    name_bytes(name),
                    newparent.0,
                    name_bytes(newname),
                    f,
                    uid,
                    gid,
                )
            });
        self.reply_empty(Op::rename, t, r, reply);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let t = clock::now();
        let r = self
            .rofs()
            .and_then(|()| self.fs.link(ino.0, newparent.0, name_bytes(newname)));
        self.reply_entry(Op::link, t, r, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let t = clock::now();
        match self.open_handle(ino.0, flags.0) {
            Ok(fh) => {
                reply.opened(FileHandle(fh), OPEN_FLAGS);
                self.done(Op::open, t, true);
            }
            Err(e) => {
                reply.error(errno(e));
                self.done(Op::open, t, false);
            }
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        thread_local! {
            static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let t = clock::now();
        let size = (size as usize).min(MAX_WRITE_BYTES as usize * 16);
        // Zero-copy first: the reply is written to the device straight from
        // the pool (one copy fewer, and no cold buffer).
        let mut reply = Some(reply);
        let direct = self.with_handle(fh, |h, _| {
            self.fs.read_in_place(h, offset, size, &mut |bytes| {
                if let Some(r) = reply.take() {
                    // Counted before the reply (see `write`).
                    self.stats.bytes_read.add(bytes.len() as u64);
                    r.data(bytes);
                }
            })
        });
        let Some(reply) = reply else {
            self.done(Op::read, t, true);
            return;
        };
        if let Err(e) = direct {
            reply.error(errno(e));
            self.done(Op::read, t, false);
            return;
        }
        BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            if buf.len() < size {
                buf.resize(size, 0);
            }
            let r = self.with_handle(fh, |h, _| self.fs.read(h, offset, &mut buf[..size]));
            match r {
                Ok(n) => {
                    self.stats.bytes_read.add(n as u64);
                    reply.data(&buf[..n]);
                    self.done(Op::read, t, true);
                }
                Err(e) => {
                    reply.error(errno(e));
                    self.done(Op::read, t, false);
                }
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let t = clock::now();
        let r = self.rofs().and_then(|()| {
            self.with_handle(fh, |h, flags| {
                // O_APPEND from write(2) (not page-cache write-back of an
                // mmap): let the engine place the data at the end atomically.
                if flags & libc::O_APPEND != 0
                    && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE)
                {
                    let (at, n) = self.fs.append(h, data)?;
                    if at != offset {
                        self.stats.append_moved.add(1);
                    }
                    Ok(n)
                } else {
                    self.fs.write(h, offset, data)
                }
            })
        });
        if r.is_ok() && write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            self.kill_suidgid(_ino.0);
        }
        match r {
            Ok(n) => {
                // Counted before the reply, so a client that reads the
                // statistics after its write returned sees the write.
                self.stats.bytes_written.add(n as u64);
                reply.written(n as u32);
                self.done(Op::write, t, true);
            }
            Err(e) => {
                reply.error(errno(e));
                self.done(Op::write, t, false);
            }
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing is buffered here: every write already reached the engine.
        // ENOSYS tells the kernel so once and for all: it stops sending
        // FLUSH at close (one round trip fewer per close) but still writes
        // a file's dirty mmap pages back at close first, as before. Not
        // counted as an error: it is the answer.
        let t = clock::now();
        reply.error(Errno::ENOSYS);
        self.done(Op::flush, t, true);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let t = clock::now();
        self.release_handle(fh);
        self.reply_empty(Op::release, t, Ok(()), reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let t = clock::now();
        if self.fs.fsync_is_noop() {
            // Every write was durable when it was answered. ENOSYS makes the
            // kernel stop sending FSYNC for this connection: fsync(2) then
            // costs no round trip. The kernel still writes dirty mmap pages
            // back (as WRITEs, durable on return) before it would have sent
            // FSYNC, and reports their errors, so msync and fsync of a
            // mapped file keep their meaning.
            reply.error(Errno::ENOSYS);
            self.done(Op::fsync, t, true);
            return;
        }
        let r = self.with_handle(fh, |h, _| self.fs.fsync(h, datasync));
        self.reply_empty(Op::fsync, t, r, reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let t = clock::now();
        match self.fs.open(ino.0) {
            Ok(h) => {
                let fh = self.handles.insert(h, flags.0);
                reply.opened(FileHandle(fh), FopenFlags::empty());
                self.done(Op::opendir, t, true);
            }
            Err(e) => {
                reply.error(errno(e));
                self.done(Op::opendir, t, false);
            }
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let t = clock::now();
        let r = self.fs.readdir(ino.0, offset, &mut |e: DirEntry| {
            !reply.add(
                INodeNo(e.ino),
                e.cookie,
                file_type(e.kind),
                OsStr::from_bytes(&e.name),
            )
        });
        match r {
            Ok(()) => {
                reply.ok();
                self.done(Op::readdir, t, true);
            }
            Err(e) => {
                reply.error(errno(e));
                self.done(Op::readdir, t, false);
            }
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let t = clock::now();
        // Collect first, then getattr outside the engine's readdir callback
        // (no engine call re-enters another).
        let mut batch = Vec::new();
        let r = self.fs.readdir(ino.0, offset, &mut |e: DirEntry| {
            batch.push(e);
            batch.len() < READDIRPLUS_BATCH
        });
        if let Err(e) = r {
            reply.error(errno(e));
            self.done(Op::readdirplus, t, false);
            return;
        }
        for e in batch {
            let (attr, generation, ttl) = match self.fs.getattr(e.ino) {
                Ok(a) => (file_attr(&a), a.generation, TTL),
                // Removed since readdir saw it: skip the entry.
                Err(err) if err.errno() == libc::ENOENT => continue,
                // Unreadable (a damaged inode: the engine counted and
                // reported it). Listed as ext4 lists a name whose inode it
                // cannot read: the name shows, and with nothing cached
                // (zero timeouts) a stat or open of it asks again and gets
                // the error. Skipping it would hide the damage.
                Err(_) => (unreadable_attr(e.ino, e.kind), 0, Duration::ZERO),
            };
            if reply.add(
                INodeNo(e.ino),
                e.cookie,
                OsStr::from_bytes(&e.name),
                &ttl,
                &attr,
                Generation(generation),
            ) {
                break;
            }
        }
        reply.ok();
        self.done(Op::readdirplus, t, true);
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let t = clock::now();
        self.release_handle(fh);
        self.reply_empty(Op::releasedir, t, Ok(()), reply);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let t = clock::now();
        if self.fs.fsync_is_noop() {
            // Directory changes are durable on return in every mode; in
            // these modes nothing else is pending either (see `fsync`).
            reply.error(Errno::ENOSYS);
            self.done(Op::fsyncdir, t, true);
            return;
        }
        let r = match self.handles.get(fh.0) {
            Some(open) => self.fs.fsync(&open.handle, datasync),
            None => self.fs.sync(),
        };
        self.reply_empty(Op::fsyncdir, t, r, reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let t = clock::now();
        let s = self.fs.statfs();
        reply.statfs(
            s.blocks,
            s.blocks_free,
            s.blocks_free,
            s.files,
            s.files_free,
            s.block_size,
            s.name_max,
            s.block_size,
        );
        self.done(Op::statfs, t, true);
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let t = clock::now();
        let r = self.rofs().and_then(|()| {
            if name_bytes(name).starts_with(b"system.posix_acl_") {
                // We do not enforce ACLs (no FUSE_POSIX_ACL): storing one
                // would suggest a protection that is not there.
                return Err(inkfs::Error::Errno(libc::EOPNOTSUPP));
            }
            let f = XattrFlags::from_bits(flags)?;
            self.fs.setxattr(ino.0, name_bytes(name), value, f)
        });
        self.reply_empty(Op::setxattr, t, r, reply);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let t = clock::now();
        match self.fs.getxattr(ino.0, name_bytes(name)) {
            Ok(v) => {
                if size == 0 {
                    reply.size(v.len() as u32);
                } else if v.len() > size as usize {
                    reply.error(Errno::ERANGE);
                } else {
                    reply.data(&v);
                }
                self.done(Op::getxattr, t, true);
            }
            Err(e) => {
                reply.error(errno(e));
                self.done(Op::getxattr, t, false);
            }
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let t = clock::now();
        match self.fs.listxattr(ino.0) {
            Ok(names) => {
                let mut buf = Vec::new();
                for n in names {
                    buf.extend_from_slice(&n);
                    buf.push(0);
                }
                if size == 0 {
                    reply.size(buf.len() as u32);
                } else if buf.len() > size as usize {
                    reply.error(Errno::ERANGE);
                } else {
                    reply.data(&buf);
                }
                self.done(Op::listxattr, t, true);
            }
            Err(e) => {
                reply.error(errno(e));
                self.done(Op::listxattr, t, false);
            }
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let t = clock::now();
        let r = self
            .rofs()
            .and_then(|()| self.fs.removexattr(ino.0, name_bytes(name)));
        self.reply_empty(Op::removexattr, t, r, reply);
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        // With default_permissions the kernel decides and never asks; this
        // answers only when a mount was made without it.
        let t = clock::now();
        let r = self.fs.getattr(ino.0).and_then(|a| {
            let mask = mask.bits() & 7;
            if mask == 0 {
                return Ok(());
            }
            if mask & libc::W_OK != 0 && (self.read_only || self.fs.is_read_only()) {
                return Err(inkfs::Error::Errno(libc::EROFS));
            }
            let granted = if req.uid() == 0 {
                // Root may do anything but execute a file nobody may execute.
                if a.kind != FileKind::Dir && a.mode & 0o111 == 0 {
                    6
                } else {
                    7
                }
            } else if req.uid() == a.uid {
                (a.mode >> 6) & 7
            } else if req.gid() == a.gid {
                (a.mode >> 3) & 7
            } else {
                a.mode & 7
            } as i32;
            if mask & !granted != 0 {
                return Err(inkfs::Error::Errno(libc::EACCES));
            }
            Ok(())
        });
        self.reply_empty(Op::access, t, r, reply);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let t = clock::now();
        let perm = mode & !(umask & 0o777) & 0o7777;
        let (uid, gid, perm) = self.new_owner(parent.0, req, perm, false);
        let name = name_bytes(name);
        let r = self
            .rofs()
            .and_then(|()| match self.fs.create(parent.0, name, perm, uid, gid) {
                Ok((attr, h)) => Ok((attr, self.handles.insert(h, flags))),
                // Created by someone else since the kernel's lookup: open it,
                // as open(O_CREAT) without O_EXCL must.
                Err(inkfs::Error::Errno(libc::EEXIST)) if flags & libc::O_EXCL == 0 => {
                    let attr = self.fs.lookup(parent.0, name)?;
                    if attr.kind == FileKind::Dir {
                        return Err(inkfs::Error::Errno(libc::EISDIR));
                    }
                    let fh = self.open_handle(attr.ino, flags)?;
                    Ok((self.fs.getattr(attr.ino)?, fh))
                }
                Err(e) => Err(e),
            });
        match r {
            Ok((a, fh)) => {
                reply.created(
                    &TTL,
                    &file_attr(&a),
                    Generation(a.generation),
                    FileHandle(fh),
                    OPEN_FLAGS,
                );
                self.done(Op::create, t, true);
            }
            Err(e) => {
                reply.error(errno(e));
                self.done(Op::create, t, false);
            }
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let t = clock::now();
        let r = self
            .rofs()
            .and_then(|()| FallocFlags::from_bits(mode))
            .and_then(|f| self.with_handle(fh, |h, _| self.fs.fallocate(h, offset, length, f)));
        self.reply_empty(Op::fallocate, t, r, reply);
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let t = clock::now();
        let r = match whence {
            libc::SEEK_DATA | libc::SEEK_HOLE if offset >= 0 => {
                let w = if whence == libc::SEEK_DATA {
                    Whence::Data
                } else {
                    Whence::Hole
                };
                self.with_handle(fh, |h, _| self.fs.seek(h, offset as u64, w))
            }
            libc::SEEK_DATA | libc::SEEK_HOLE => Err(inkfs::Error::Errno(libc::ENXIO)),
            _ => Err(inkfs::Error::Errno(libc::EINVAL)),
        };
        match r {
            Ok(off) => {
                reply.offset(off.min(i64::MAX as u64) as i64);
                self.done(Op::lseek, t, true);
            }
            Err(e) => {
                reply.error(errno(e));
                self.done(Op::lseek, t, false);
            }
        }
    }

    /// Served by the engine from pool to pool: one request for up to
    /// `inkfs::file::COPY_MAX` bytes, where the kernel's own fallback sends
    /// the data through READ and WRITE requests. The kernel has written
    /// back both files' dirty mmap pages before asking, and drops its
    /// cached pages of the destination range after the reply.
    #[allow(clippy::too_many_arguments)]
    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let t = clock::now();
        // Two handles: each taken out of the table on its own (`with`
        // would nest two shard locks).
        let r = self.rofs().and_then(|()| {
            if !flags.is_empty() {
                return Err(inkfs::Error::Errno(libc::EINVAL));
            }
            let ebadf = || inkfs::Error::Errno(libc::EBADF);
            let src = self.handles.get(fh_in.0).ok_or_else(ebadf)?;
            let dst = self.handles.get(fh_out.0).ok_or_else(ebadf)?;
            self.fs
                .copy_range(&src.handle, offset_in, &dst.handle, offset_out, len)
        });
        match r {
            Ok(n) => {
                self.stats.bytes_written.add(n);
                // COPY_MAX keeps every count within the reply's 32 bits.
                reply.written(n.min(u32::MAX as u64) as u32);
                self.done(Op::copy_file_range, t, true);
            }
            Err(e) => {
                reply.error(errno(e));
                self.done(Op::copy_file_range, t, false);
            }
        }
    }

    /// The inode-flag ioctls (`crate::fileattr`); any other command is
    /// ENOTTY ("not a typewriter": no such ioctl here), as Linux answers.
    /// The caller's uid decides privilege (root may change immutable and
    /// append-only; the kernel checked CAP_LINUX_IMMUTABLE already).
    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        let t = clock::now();
        let privileged = req.uid() == 0;
        // A read-only mount: the engine refuses a change with EROFS.
        let r = crate::fileattr::serve(&*self.fs, ino.0, cmd, in_data, out_size, privileged)
            .unwrap_or(Err(inkfs::Error::Errno(libc::ENOTTY)));
        match r {
            Ok(data) => {
                reply.ioctl(0, &data);
                self.done(Op::ioctl, t, true);
            }
            Err(e) => {
                reply.error(errno(e));
                self.done(Op::ioctl, t, false);
            }
        }
    }
}

/// The mode after clearing set-user-ID, and set-group-ID when it means
/// "set group on exec" (group-executable), or None if nothing changes.
fn killed_mode(mode: u32) -> Option<u32> {
    let mut kill = libc::S_ISUID;
    if mode & libc::S_IXGRP != 0 {
        kill |= libc::S_ISGID;
    }
    (mode & kill != 0).then_some(mode & 0o7777 & !kill)
}

impl<E: Engine> InkFuse<E> {
    /// A write by an unprivileged process (the kernel says so with
    /// FUSE_WRITE_KILL_SUIDGID) drops set-id bits and file capabilities.
    fn kill_suidgid(&self, ino: u64) {
        if let Ok(a) = self.fs.getattr(ino) {
            if let Some(mode) = killed_mode(a.mode) {
                let _ = self.fs.setattr(
                    ino,
                    &SetAttr {
                        mode: Some(mode),
                        ..Default::default()
                    },
                );
            }
        }
        let _ = self.fs.removexattr(ino, b"security.capability");
    }
}
