//! The FUSE request handlers: each FUSE request → one call of the engine's
//! API (`inkfs::api`), with the caller's credentials. The POSIX rules
//! (permissions, set-ID bits, O_TRUNC, O_APPEND, xattr namespaces) are the
//! engine's; this file only translates requests and replies.
//!
//! # Caching (why these settings)
//! - Writeback cache in posix mode (`Caching::writeback`, on unless
//!   `nowriteback_cache`): `write(2)` lands in the kernel's page cache and
//!   returns; the kernel writes back later (its flusher, fsync, fdatasync,
//!   msync, sync, syncfs, an O_SYNC/O_DSYNC write, and every close), which
//!   posix mode allows. Each write-back (and copy_file_range) is made durable
//!   before it is answered (`write_for_cache`), so every one of those points
//!   is durable once the kernel has written back, including sync(2) and
//!   syncfs(2), which FUSE never forwards; FSYNC then has nothing left to do
//!   and is answered ENOSYS, as in strict and sync modes. The kernel owns a
//!   regular file's size, mtime and ctime between write-backs: it places
//!   O_APPEND writes at its own end of file (several writers on this mount
//!   stay correct), stamps the times and sends them with SETATTR
//!   (`setattr_kernel_times`), and fills partial pages by reading through
//!   the writer's handle, a write-only one included (`File::allow_cache_fill`).
//!   An append-only file is opened `FOPEN_DIRECT_IO` (a write-back rewrites
//!   whole pages). The kernel answers SEEK_DATA/SEEK_HOLE itself (LSEEK:
//!   ENOSYS), since the pool cannot see its dirty pages. A file whose last
//!   name goes is pinned until the kernel forgets it (`removing`, below);
//!   the times the kernel writes back to it meanwhile are answered without
//!   being written (`held_file_times`).
//! - Directories opened by the kernel alone, with `default_permissions`,
//!   in every mode (`Caching::kernel_opendir`): OPENDIR is answered
//!   ENOSYS, after which the kernel sends neither OPENDIR nor RELEASEDIR
//!   (two round trips fewer per listing: `rm -rf` and `git status` open
//!   every directory) and keeps listings in its page cache (its default
//!   for such a server: FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR), reset when it
//!   changes the directory itself and pushed out by `crate::inval` when
//!   something else does. READDIR comes with fh 0 and opens the directory
//!   for the one request (`with_dir`); a directory removed while a process
//!   holds it open is pinned until the kernel forgets it (`removing`,
//!   below), as our handle used to keep it. Regular files keep OPEN and
//!   RELEASE by default: the server's open refuses writers of immutable
//!   and append-only files and chooses `direct_io` per open, which a
//!   kernel-side open cannot. `kernel_open` (posix mode with the cache,
//!   `Caching::kernel_open`) gives that up for two round trips fewer per
//!   open and close: OPEN and CREATE answered ENOSYS, fh 0 served through
//!   one handle per inode until the kernel forgets it (`crate::open`).
//! - No writeback cache in strict and sync modes: a write acknowledged from
//!   the page cache is not yet in the pool, which breaks their promise
//!   (durable on return). Every write is sent synchronously and returns only
//!   after the engine persisted it.
//! - Page cache kept across opens (`FOPEN_KEEP_CACHE`), no `direct_io`:
//!   this server is the only way into the pool while it is mounted (the pool
//!   lock refuses a second server) and every change goes through this kernel,
//!   which keeps its cached pages coherent (writes are written through or
//!   are its own, truncate and fallocate drop the affected pages). So cached
//!   reads are never stale, repeated reads cost no round trip, and `mmap`
//!   works, including shared writable mappings (which `direct_io` would
//!   forbid); dirty mmap pages reach the engine at `msync`/`fsync`/unmap, as
//!   POSIX allows. Except O_APPEND opens in these modes: `direct_io`, so
//!   that each append reaches the engine as one request (`prepare_open`).
//! - Two worker threads blocking on the device (`threads=2`, no polling)
//!   by default. On this 2-vCPU VM a single thread sleeping between
//!   requests costs ~30 µs of wake-up per request; polling (`-o poll`,
//!   `crate::poll`) hides that for one thread (1.4–1.7× on fio 4 KiB I/O),
//!   but two blocking threads are faster still: 1.3–1.6× the polling thread
//!   with one client, ~2× with two (bench/fuse-floor). Four are slower.
//! - Attribute, entry and negative-entry TTL of an hour (`CACHE_TTL`): this
//!   server is the only writer of the pool while it is mounted, and the
//!   kernel updates or invalidates its copy on every change it sends us; the
//!   changes it did not make (a chattr's ctime, a write-back the engine
//!   refused) are pushed to it through `crate::inval`, the one place future
//!   writers (the kernel-free path) must go through too. `stat`-heavy tools
//!   (git, make) then pay no round trip per call.
//! - Largest request: 1 MiB (`MAX_WRITE_BYTES`, 256 pages, what the kernel
//!   allows by default); readahead is the kernel's (128 KiB by default: INIT
//!   may only lower it). No splice and no FUSE over io_uring: fuser 0.18
//!   offers neither. FOPEN_PARALLEL_DIRECT_WRITES would only concern the
//!   `direct_io` opens of append-only files and O_APPEND opens.
//! - FLUSH is answered ENOSYS: nothing is buffered here, and the kernel
//!   then stops sending it, so a close costs one request (RELEASE) instead
//!   of two; the kernel still writes a file's dirty pages back at close
//!   (with the writeback cache: every close), and dirty mmap pages too.
//! - The kernel's lookup counts are kept (`crate::kernel_refs`: each
//!   entry a reply hands it, less each FORGET), and an inode whose last
//!   name goes stays pinned while the count is above zero (`removing`,
//!   and an attached client's removals in `crate::ns`): the kernel reaches
//!   inodes by number, and a directory held open, a working directory, an
//!   O_PATH descriptor, a FIFO or, under the writeback cache, a file's
//!   pending times need no handle of ours. The FORGET that ends the count
//!   lets the inode go; the unmount lets every pin go.
//! - FSYNC and FSYNCDIR are answered ENOSYS where every answered request is
//!   durable (strict and sync modes, posix mode with the writeback cache, a
//!   read-only mount): `fsync(2)` then costs no round trip. The kernel still
//!   writes dirty pages back first. Posix mode without the writeback cache
//!   serves FSYNC: that is where its in-place writes become durable.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use inkfs::api::{
    self, Attr, Credentials, DirEntry, FallocFlags, File, FileKind, RenameFlags, SetAttr, TimeSet,
    Whence,
};

use crate::clock::{self, Tick};
use crate::creds::CredCache;
use crate::handles::HandleTable;
use crate::inval::{Change, Invalidator};
use crate::kernel_refs::{KernelRefs, Remover};
use crate::stats::{Op, Stats};
use crate::Engine;

/// How the kernel may cache an inkfs mount, chosen when it is mounted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caching {
    /// FUSE's writeback cache (posix mode only; see the module comment):
    /// `write(2)` lands in the page cache, the kernel writes back later.
    pub writeback: bool,
    /// Directories opened by the kernel alone (see the module comment):
    /// OPENDIR is answered ENOSYS, so the kernel stops sending OPENDIR and
    /// RELEASEDIR and keeps each directory's listing in its page cache.
    /// Only where the kernel checks permissions (`default_permissions`):
    /// the read permission of opendir(3) is then checked at open(2).
    pub kernel_opendir: bool,
    /// Regular files opened by the kernel alone (`no_open`; posix mode
    /// with the writeback cache only): OPEN is answered ENOSYS, so the
    /// kernel sends no OPEN or RELEASE; fh 0 is served through one handle
    /// per inode (`crate::open`).
    pub kernel_open: bool,
    /// No extended attributes through the mount (`noxattr`, every mode):
    /// each xattr request is answered ENOSYS, after which the kernel
    /// answers them EOPNOTSUPP itself and stops asking for
    /// `security.capability` before writes and chowns (`fs::xattr`).
    pub no_xattr: bool,
}

/// The FUSE protocol settings of an inkfs mount: capabilities asked at
/// INIT (`configure_kernel`) and the flags every open gets (`OPEN_FLAGS`).
pub fn configure_kernel(config: &mut KernelConfig, caching: Caching) {
    // Ask for each capability on its own: an old kernel lacking one
    // should not cost us the others.
    for cap in [
        InitFlags::FUSE_ASYNC_READ,
        InitFlags::FUSE_BIG_WRITES,
        InitFlags::FUSE_DO_READDIRPLUS,
        InitFlags::FUSE_READDIRPLUS_AUTO,
        InitFlags::FUSE_PARALLEL_DIROPS,
        InitFlags::FUSE_MAX_PAGES,
        InitFlags::FUSE_CACHE_SYMLINKS,
        // The engine clears set-id bits itself (a write by an unprivileged
        // opener, a chown, an unprivileged truncate): without this the
        // kernel asks for security.capability before every write, a second
        // round trip per write(2). With it, still before the first write
        // after each attribute reply and at every chown (`noxattr` ends
        // those: fs/xattr.rs).
        InitFlags::FUSE_HANDLE_KILLPRIV_V2,
    ] {
        let _ = config.add_capabilities(cap);
    }
    if caching.writeback {
        let _ = config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE);
    }
    if !caching.kernel_open {
        // O_TRUNC done by OPEN; with no OPEN (`crate::open`) the kernel
        // must send its SETATTR of the size, which it skips with this on.
        let _ = config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
    }
    let _ = config.set_max_write(MAX_WRITE_BYTES);
}

/// See `configure_kernel`.
pub const OPEN_FLAGS: FopenFlags = FopenFlags::FOPEN_KEEP_CACHE;

/// How long the kernel may keep attributes, names and negative lookups
/// without asking again (see the module comment).
pub const CACHE_TTL: Duration = Duration::from_secs(3600);
const TTL: Duration = CACHE_TTL;
/// The root's node id.
const ROOT: u64 = 1;
/// Largest write the kernel may send in one request.
pub const MAX_WRITE_BYTES: u32 = 1 << 20;
/// Entries fetched per readdirplus request (each costs a getattr).
const READDIRPLUS_BATCH: usize = 256;

pub struct InkFuse {
    fs: Arc<Engine>,
    handles: HandleTable<File>,
    /// fh 0 of a regular file where the kernel opens files itself.
    opens: Arc<crate::open::KernelOpens>,
    creds: CredCache,
    stats: Arc<Stats>,
    caching: Caching,
    inval: Arc<Invalidator>,
    /// The kernel's lookup counts, and the pins of removed inodes it still
    /// refers to (`removing`; a client's removals: `crate::ns`), kept
    /// until it forgets them.
    refs: Arc<KernelRefs>,
    /// A hybrid posix mount's write-backs that left device data to flush
    /// are answered by this thread after one shared flush (writeback.rs);
    /// None elsewhere (every write-back is answered by its own thread).
    writeback: Option<crate::writeback::Flusher>,
    /// Attached clients' write leases (lease.rs): each request holds the
    /// inodes it uses until it has answered.
    leases: Option<Arc<crate::lease::Leases>>,
}

mod reply;
mod xattr;
pub use reply::file_attr;
use reply::*;

impl InkFuse {
    pub fn new(
        fs: Arc<Engine>,
        stats: Arc<Stats>,
        caching: Caching,
        inval: Arc<Invalidator>,
    ) -> InkFuse {
        debug_assert!(
            !caching.writeback || fs.mode() == inkfs::api::Mode::Posix,
            "the writeback cache is for posix mode only"
        );
        let writeback = Self::start_writeback(&fs, &stats, caching);
        InkFuse {
            fs,
            handles: HandleTable::default(),
            opens: Default::default(),
            creds: CredCache::default(),
            stats,
            caching,
            inval,
            refs: Arc::default(),
            leases: None,
            writeback,
        }
    }

    /// The thread that answers write-backs after a shared flush, for a
    /// hybrid pool's writeback-cache (posix) mount.
    fn start_writeback(
        fs: &Arc<Engine>,
        stats: &Arc<Stats>,
        caching: Caching,
    ) -> Option<crate::writeback::Flusher> {
        if !caching.writeback || fs.data_stats().is_none() {
            return None;
        }
        match crate::writeback::Flusher::start(fs.clone(), stats.clone()) {
            Ok(f) => Some(f),
            Err(e) => {
                // Every write-back then flushes for itself, as before.
                eprintln!("inkfs: write-back thread: {e} (each write-back flushes on its own)");
                None
            }
        }
    }

    /// The regular files the kernel opened itself (`crate::open`), for
    /// the statistics.
    pub fn kernel_opens(&self) -> Arc<crate::open::KernelOpens> {
        self.opens.clone()
    }

    /// The kernel's references to inodes, for the attach service's
    /// removals (`crate::kernel_refs`).
    pub fn kernel_refs(&self) -> Arc<KernelRefs> {
        self.refs.clone()
    }

    /// Serve requests under `leases` (recalls before an inode is used).
    pub fn set_leases(&mut self, leases: Arc<crate::lease::Leases>) {
        self.leases = Some(leases);
    }

    /// The hold of the request being served on the inodes it uses (see
    /// `crate::lease`); nothing when no client is attached.
    #[inline]
    fn hold(&self) -> Option<crate::lease::Scope> {
        self.leases.as_ref().map(|l| l.scope())
    }

    /// The entry TTL of a negative lookup of `name` under the root: zero
    /// while clients are attached and the root's list of negative names
    /// is (or just got) full, so that the kernel makes no dentry a lease
    /// of the root could not drop; else `TTL`, the name recorded
    /// (crate::dirlease: a mount no client uses caches as before).
    fn root_negative_ttl(&self, name: &[u8]) -> Duration {
        let clients = self.leases.as_ref().is_some_and(|l| l.attached() > 0);
        let negatives = self.refs.negatives();
        if clients && negatives.zero_ttl() {
            // Not recorded: the kernel keeps nothing of it.
            return Duration::ZERO;
        }
        if negatives.record(name) || !clients {
            TTL
        } else {
            Duration::ZERO
        }
    }

    /// The kernel removed `name` from `dir` through this server: it may
    /// keep a negative dentry of it. Recorded under the root only (the
    /// other directories' are dropped by their entry's invalidation at a
    /// lease's grant: crate::dirlease); past the record's bound the root's
    /// lease is refused for `CACHE_TTL`.
    fn removed_name(&self, dir: u64, name: &[u8]) {
        if dir == ROOT {
            self.refs.negatives().record(name);
        }
    }

    /// A call that may remove the last name of `name` in `dir` (unlink,
    /// rmdir, rename over it): the inode it names stays, pinned, while the
    /// kernel refers to it (`KernelRefs::removing`), which it does here
    /// (it looked the name up), until it forgets it. Meanwhile it may use
    /// the inode with no handle of ours keeping it:
    /// - a regular file under the writeback cache: the kernel stamps a
    ///   ctime on the file it unlinked and writes it back right after the
    ///   call (fuse_update_ctime), and may write back pages or times until
    ///   it forgets the inode; freed at once, that inode would answer
    ///   ENOENT (which the kernel keeps for the next syncfs(2) of the
    ///   mount), and its number, given to a new file, would take the old
    ///   file's times;
    /// - a directory a process holds open (the kernel opens directories
    ///   itself: `Caching::kernel_opendir`) or works in, a file it holds
    ///   by an O_PATH descriptor, a FIFO or device it has open (none of
    ///   these sends OPEN): fchmod, fchown, fstat, chmod of
    ///   `/proc/self/fd/N` after the removal, as on any Linux file system,
    ///   reach the inode by number, which could already name another.
    ///
    /// The kernel's own locks on `dir` keep the name from changing before
    /// the call.
    fn removing(
        &self,
        cred: &Credentials,
        dir: u64,
        name: &[u8],
        remove: impl FnOnce() -> api::Result<()>,
    ) -> api::Result<()> {
        let victim = self.fs.lookup(cred, dir, name).ok().map(|a| a.ino);
        self.refs
            .removing(&self.fs, victim, Remover::Kernel, remove)
    }

    /// Run `f`, whose reply hands the kernel the entry it makes, and count
    /// that entry (`KernelRefs::hand`).
    fn entry(&self, f: impl FnOnce() -> api::Result<Attr>) -> api::Result<Attr> {
        let mark = self.refs.mark();
        let mut a = f()?;
        self.refs.hand(&self.fs, &mut a, mark)?;
        Ok(a)
    }

    /// The SETATTR by which the kernel writes back the times it keeps of a
    /// regular file this server holds with no name left (`removing`):
    /// the ctime it stamps at the unlink, the mtime of later writes.
    /// Answered with the attributes those times give, nothing written: no
    /// name reaches the file, the kernel keeps its own mtime and ctime of
    /// it (the writeback cache), the file is freed once the kernel forgets
    /// it, and after a crash recovery frees it as an orphan. Anything else
    /// in the call (mode, owner, size, atime) takes the ordinary path.
    /// None: not such a call.
    fn held_file_times(
        &self,
        ino: u64,
        set: &SetAttr,
        ctime: Option<i64>,
    ) -> Option<api::Result<Attr>> {
        let ctime = ctime?;
        let only_times = set.mode.is_none()
            && set.uid.is_none()
            && set.gid.is_none()
            && set.size.is_none()
            && set.atime.is_none();
        if !only_times || !self.refs.is_pinned(ino) {
            return None;
        }
        let mut a = match self.fs.getattr(ino) {
            Ok(a) if a.kind == FileKind::File && a.nlink == 0 => a,
            // Linked again or not a file: not this case (a pinned file
            // cannot be linked again, but the ordinary path is always right).
            Ok(_) => return None,
            Err(e) => return Some(Err(e)),
        };
        a.ctime_ns = ctime;
        match set.mtime {
            Some(TimeSet::At(ns)) => a.mtime_ns = ns,
            Some(TimeSet::Now) => a.mtime_ns = time_ns(SystemTime::now()),
            None => {}
        }
        self.stats.held_times_skipped.add(1);
        Some(Ok(a))
    }

    /// Whether FSYNC has nothing to do: every answered request is durable
    /// (strict and sync modes; posix mode with the writeback cache, where
    /// each write-back is made durable before it is answered; a read-only
    /// mount).
    fn fsync_is_noop(&self) -> bool {
        self.fs.fsync_is_noop() || self.caching.writeback
    }

    /// The open flags for `file`, opened with `flags` (`crate::open::flags`).
    fn prepare_open(&self, file: &File, flags: i32) -> api::Result<FopenFlags> {
        crate::open::flags(&self.fs, self.caching, file, flags)
    }

    /// The shape of every handler: time the request, run it, answer the
    /// kernel, count it (as an error if it failed).
    fn answer<T, R: Answer<T>>(&self, op: Op, reply: R, f: impl FnOnce() -> api::Result<T>) {
        let _hold = self.hold();
        let t = clock::now();
        match f() {
            Ok(v) => {
                self.done(op, t, true);
                reply.ok(v);
            }
            Err(e) => {
                self.done(op, t, false);
                reply.fail(errno(e));
            }
        }
    }

    /// Count a request, before its reply goes out: a caller that reads
    /// the statistics once its call returned finds it counted (the tests
    /// do, at once; counted after the reply, the woken caller could run
    /// before this thread did). Its time excludes the reply's write.
    #[inline]
    fn done(&self, op: Op, t: Tick, ok: bool) {
        self.stats.record(op, t, ok);
    }

    fn cred(&self, req: &Request) -> Arc<Credentials> {
        self.creds.get(req.pid(), req.uid(), req.gid())
    }

    /// The caller's credentials with the umask of a creation request
    /// applied (FUSE passes it with the request; the kernel leaves the
    /// masking to us).
    fn cred_with_umask(&self, req: &Request, umask: u32) -> Credentials {
        let mut c = (*self.cred(req)).clone();
        c.umask = umask & 0o777;
        c
    }

    /// Run `f` on the open file `fh` of `ino` (EBADF if there is none;
    /// fh 0 where the kernel opens files itself: `crate::open`).
    fn with_file<T>(
        &self,
        fh: FileHandle,
        ino: INodeNo,
        f: impl FnOnce(&File) -> api::Result<T>,
    ) -> api::Result<T> {
        if fh.0 == 0 && self.caching.kernel_open {
            return self.opens.with(&self.fs, ino.0, f);
        }
        self.handles.with(fh.0, f).unwrap_or(fail(libc::EBADF))
    }

    /// A WRITE under the writeback cache: the kernel decided the offset
    /// (it owns the file's size, so an O_APPEND write's end of file is its
    /// own) and whether set-id bits go (`FUSE_WRITE_KILL_SUIDGID`, on the
    /// writes it sends through for a writer without CAP_FSETID; never on a
    /// write-back). Durable before it is answered (`fsync_is_noop`).
    fn write_for_cache(
        &self,
        f: &File,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
    ) -> api::Result<api::Written> {
        let write_back = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) && !write_back;
        let w = match self.fs.write_placed(f, offset, data, kill) {
            Ok(w) => w,
            Err(e) => {
                if write_back {
                    // Refused (a chattr +i or +a set since the file was
                    // opened, errors=remount-ro, no space): the kernel
                    // reports it at fsync and close, but would keep showing
                    // the pages it could not write. Queued, so it runs once
                    // this reply has ended their write-back.
                    self.inval.changed(Change::Data {
                        ino: f.ino(),
                        off: offset,
                        len: data.len() as u64,
                    });
                }
                return Err(e);
            }
        };
        self.fs.fsync(f, true)?;
        Ok(w)
    }

    /// A write-back of a hybrid posix mount (writeback.rs): one that left
    /// device data to flush is answered by the flusher after its round;
    /// one that wrote no device block is made durable and answered here,
    /// as `write_for_cache` does.
    fn write_back_late(
        &self,
        flusher: &crate::writeback::Flusher,
        fh: FileHandle,
        ino: INodeNo,
        offset: u64,
        data: &[u8],
        reply: ReplyWrite,
    ) {
        let _hold = self.hold();
        let t = clock::now();
        let r = self.with_file(fh, ino, |f| match self.fs.write_back(f, offset, data) {
            Ok((w, true)) => Ok((w, true)),
            Ok((w, false)) => self.fs.fsync(f, true).map(|()| (w, false)),
            Err(e) => {
                // As `write_for_cache`: the kernel would keep showing the
                // pages it could not write.
                self.inval.changed(Change::Data {
                    ino: f.ino(),
                    off: offset,
                    len: data.len() as u64,
                });
                Err(e)
            }
        });
        match r {
            Ok((w, late)) => {
                self.stats.bytes_written.add(w.len as u64);
                if late {
                    flusher.write_after_round(reply, w.len as u32, t);
                } else {
                    self.done(Op::write, t, true);
                    reply.written(w.len as u32);
                }
            }
            Err(e) => {
                self.done(Op::write, t, false);
                reply.error(errno(e));
            }
        }
    }

    /// Run `f` on the open directory `fh`; where the kernel opens
    /// directories itself (`Caching::kernel_opendir`, every request then
    /// carries fh 0), on directory `ino` opened for this request. The
    /// kernel checked the read permission at open(2) and lists no
    /// directory that was removed (IS_DEADDIR), so it is opened with
    /// root's credentials, as the handle of that open(2) would have been
    /// opened with the check already made.
    fn with_dir<T>(
        &self,
        fh: FileHandle,
        ino: INodeNo,
        f: impl FnOnce(&File) -> api::Result<T>,
    ) -> api::Result<T> {
        if fh.0 != 0 || !self.caching.kernel_opendir {
            return self.with_file(fh, ino, f);
        }
        let dir = self.fs.opendir(&Credentials::root(), ino.0)?;
        let r = f(&dir);
        self.fs.release(dir);
        r
    }

    fn release_handle(&self, fh: FileHandle) {
        if let Some(file) = self.handles.remove(fh.0) {
            self.fs.release(file);
        }
    }
}

impl Filesystem for InkFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        configure_kernel(config, self.caching);
        Ok(())
    }

    fn destroy(&mut self) {
        // The kernel is gone: release what it never closed or forgot so
        // that unlinked inodes are reclaimed before the engine unmounts.
        for file in self.handles.drain() {
            self.fs.release(file);
        }
        self.opens.drain(&self.fs);
        self.refs.close(&self.fs);
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _hold = self.hold();
        let t = clock::now();
        let mark = self.refs.mark();
        let r = self.fs.lookup(&self.cred(req), parent.0, name_bytes(name));
        // Counted before the reply: the kernel's FORGET can only follow it.
        let r = r.and_then(|mut a| self.refs.hand(&self.fs, &mut a, mark).map(|()| a));
        match r {
            Err(e) if e.errno() == libc::ENOENT => {
                // A negative entry (node 0) with the entry TTL: the kernel
                // caches "no such name" as it caches names. Every creation
                // goes through this kernel, which replaces the negative
                // dentry, so the cache cannot hide a file; tools that probe
                // for absent files (SQLite's journal and WAL, git, PATH and
                // include searches) stop paying a round trip per probe.
                // Under the root, each such name is recorded, for a
                // client's lease of the root to drop (crate::dirlease).
                let ttl = if parent.0 == ROOT {
                    self.root_negative_ttl(name_bytes(name))
                } else {
                    TTL
                };
                self.done(Op::lookup, t, false);
                reply.entry(&ttl, &negative_attr(), Generation(0));
            }
            Ok(a) => {
                self.done(Op::lookup, t, true);
                reply.entry(&TTL, &file_attr(&a), Generation(a.generation));
            }
            Err(e) => {
                self.done(Op::lookup, t, false);
                reply.error(errno(e));
            }
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        // Open handles keep unlinked inodes alive (the kernel holds one for
        // every open file); the pins of removed inodes it refers to
        // otherwise go when its count ends (freeing an orphan: timed).
        let t = clock::now();
        self.refs.forget(&self.fs, ino.0, nlookup);
        if self.caching.kernel_open && !self.refs.counted(ino.0) {
            // The kernel holds a file while any descriptor of it is open:
            // its handle goes with the kernel's last reference.
            self.opens.forgotten(&self.fs, ino.0);
        }
        self.done(Op::forget, t, true);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.answer(Op::getattr, reply, || self.fs.getattr(ino.0));
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
        };
        let cred = self.cred(req);
        // With the writeback cache the kernel owns a regular file's mtime
        // and ctime and sends them, with a ctime, as explicit values.
        let kernel_times = ctime.filter(|_| self.caching.writeback).map(time_ns);
        if let Some(r) = self.held_file_times(ino.0, &set, kernel_times) {
            self.answer(Op::setattr, reply, || r);
            return;
        }
        let times_only =
            set.mode.is_none() && set.uid.is_none() && set.gid.is_none() && set.size.is_none();
        if let (Some(flusher), Some(ctime), true) = (&self.writeback, kernel_times, times_only) {
            // The times written back between write-backs: on a file with
            // deferred ones, answered after their round (writeback.rs).
            let _hold = self.hold();
            let t = clock::now();
            match self
                .fs
                .setattr_kernel_times_deferring(&cred, ino.0, &set, Some(ctime))
            {
                Ok((a, true)) => flusher.attr_after_round(reply, file_attr(&a), TTL, t),
                Ok((a, false)) => {
                    self.done(Op::setattr, t, true);
                    reply.attr(&TTL, &file_attr(&a));
                }
                Err(e) => {
                    self.done(Op::setattr, t, false);
                    reply.error(errno(e));
                }
            }
            return;
        }
        let setattr = |f: Option<&File>| match kernel_times {
            Some(ctime) => self
                .fs
                .setattr_kernel_times(&cred, ino.0, &set, Some(ctime), f),
            None => self.fs.setattr(&cred, ino.0, &set, f),
        };
        self.answer(Op::setattr, reply, || match fh {
            // ftruncate and friends: through the open file.
            Some(fh) => self.with_file(fh, ino, |f| setattr(Some(f))),
            None => setattr(None),
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.answer(Op::readlink, reply, || self.fs.readlink(ino.0));
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
        let cred = self.cred_with_umask(req, umask);
        self.answer(Op::mknod, reply, || {
            self.entry(|| {
                self.fs
                    .mknod(&cred, parent.0, name_bytes(name), mode, rdev as u64)
            })
        });
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
        let cred = self.cred_with_umask(req, umask);
        self.answer(Op::mkdir, reply, || {
            self.entry(|| self.fs.mkdir(&cred, parent.0, name_bytes(name), mode))
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let cred = self.cred(req);
        let name = name_bytes(name);
        self.answer(Op::unlink, reply, || {
            self.removing(&cred, parent.0, name, || {
                self.fs.unlink(&cred, parent.0, name)
            })?;
            self.removed_name(parent.0, name);
            Ok(())
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let cred = self.cred(req);
        let name = name_bytes(name);
        self.answer(Op::rmdir, reply, || {
            self.removing(&cred, parent.0, name, || {
                self.fs.rmdir(&cred, parent.0, name)
            })?;
            self.removed_name(parent.0, name);
            Ok(())
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let cred = self.cred(req);
        self.answer(Op::symlink, reply, || {
            self.entry(|| {
                self.fs.symlink(
                    &cred,
                    parent.0,
                    name_bytes(link_name),
                    target.as_os_str().as_bytes(),
                )
            })
        });
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
        let cred = self.cred(req);
        self.answer(Op::rename, reply, || {
            let r = api::Rename {
                from_dir: parent.0,
                from: name_bytes(name),
                to_dir: newparent.0,
                to: name_bytes(newname),
                flags: RenameFlags::from_bits(flags.bits())?,
            };
            self.removing(&cred, newparent.0, r.to, || self.fs.rename(&cred, &r))?;
            self.removed_name(parent.0, r.from);
            Ok(())
        });
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let cred = self.cred(req);
        self.answer(Op::link, reply, || {
            self.entry(|| self.fs.link(&cred, ino.0, newparent.0, name_bytes(newname)))
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if self.caching.kernel_open {
            // ENOSYS: the kernel opens regular files itself from now on
            // (no OPEN, no RELEASE), with fh 0 (`crate::open`). The answer,
            // not an error.
            let t = clock::now();
            self.done(Op::open, t, true);
            reply.error(Errno::ENOSYS);
            return;
        }
        let cred = self.cred(req);
        self.answer(Op::open, reply, || {
            // With FUSE_ATOMIC_O_TRUNC the engine truncates for O_TRUNC.
            let file = self.fs.open(&cred, ino.0, api::OpenFlags::new(flags.0))?;
            let fopen = match self.prepare_open(&file, flags.0) {
                Ok(f) => f,
                Err(e) => {
                    self.fs.release(file);
                    return Err(e);
                }
            };
            Ok((self.handles.insert(file), fopen))
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
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
        let _hold = self.hold();
        let t = clock::now();
        let size = (size as usize).min(MAX_WRITE_BYTES as usize * 16);
        // Zero-copy first: the reply is written to the device straight from
        // the pool (one copy fewer, and no cold buffer).
        let mut reply = Some(reply);
        let direct = self.with_file(fh, ino, |f| {
            self.fs.read_in_place(f, offset, size, |bytes| {
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
            self.done(Op::read, t, false);
            reply.error(errno(e));
            return;
        }
        BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            if buf.len() < size {
                buf.resize(size, 0);
            }
            match self.with_file(fh, ino, |f| self.fs.read(f, offset, &mut buf[..size])) {
                Ok(n) => {
                    self.stats.bytes_read.add(n as u64);
                    self.done(Op::read, t, true);
                    reply.data(&buf[..n]);
                }
                Err(e) => {
                    self.done(Op::read, t, false);
                    reply.error(errno(e));
                }
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if let (Some(flusher), true) = (
            &self.writeback,
            write_flags.contains(WriteFlags::FUSE_WRITE_CACHE),
        ) {
            return self.write_back_late(flusher, fh, ino, offset, data, reply);
        }
        self.answer(Op::write, reply, || {
            let w = self.with_file(fh, ino, |f| {
                if self.caching.writeback {
                    return self.write_for_cache(f, offset, data, write_flags);
                }
                // O_APPEND from write(2) (the file's flags as they are now,
                // after any F_SETFL), not page-cache write-back of an mmap:
                // the engine places the data at the end atomically.
                if flags.0 & libc::O_APPEND != 0
                    && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE)
                {
                    self.fs.append(f, data)
                } else {
                    self.fs.write_at(f, offset, data)
                }
            })?;
            if w.offset != offset {
                self.stats.append_moved.add(1);
            }
            // Counted before the reply, so a client that reads the
            // statistics after its write returned sees the write.
            self.stats.bytes_written.add(w.len as u64);
            Ok(w.len as u32)
        });
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
        self.done(Op::flush, t, true);
        reply.error(Errno::ENOSYS);
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
        self.answer(Op::release, reply, || {
            self.release_handle(fh);
            Ok(())
        });
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        if self.fsync_is_noop() {
            // Every write was durable when it was answered. ENOSYS makes the
            // kernel stop sending FSYNC for this connection: fsync(2) then
            // costs no round trip. The kernel still writes dirty mmap pages
            // back (as WRITEs, durable on return) before it would have sent
            // FSYNC, and reports their errors, so msync and fsync of a
            // mapped file keep their meaning.
            let t = clock::now();
            self.done(Op::fsync, t, true);
            reply.error(Errno::ENOSYS);
            return;
        }
        self.answer(Op::fsync, reply, || {
            self.with_file(fh, ino, |f| self.fs.fsync(f, datasync))
        });
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.caching.kernel_opendir {
            // ENOSYS: the kernel opens directories itself from now on (no
            // OPENDIR, no RELEASEDIR: two round trips fewer per listing),
            // sends fh 0 (`with_dir`), and caches listings in its page
            // cache (FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR, its default for a
            // server without opendir), dropped whenever it changes the
            // directory or is told to (`crate::inval`). Not an error: it is
            // the answer.
            let t = clock::now();
            self.done(Op::opendir, t, true);
            reply.error(Errno::ENOSYS);
            return;
        }
        let cred = self.cred(req);
        self.answer(Op::opendir, reply, || {
            let dir = self.fs.opendir(&cred, ino.0)?;
            Ok((self.handles.insert(dir), FopenFlags::empty()))
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let t = clock::now();
        let r = self.with_dir(fh, ino, |dir| {
            self.fs.readdir(dir, offset, &mut |e: DirEntry| {
                !reply.add(
                    INodeNo(e.ino),
                    e.cookie,
                    file_type(e.kind),
                    OsStr::from_bytes(&e.name),
                )
            })
        });
        match r {
            Ok(()) => {
                self.done(Op::readdir, t, true);
                reply.ok();
            }
            Err(e) => {
                self.done(Op::readdir, t, false);
                reply.error(errno(e));
            }
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _hold = self.hold();
        let t = clock::now();
        let mark = self.refs.mark();
        // Collect first, then getattr outside the engine's readdir callback
        // (no engine call re-enters another).
        let mut batch = Vec::new();
        let r = self.with_dir(fh, ino, |dir| {
            self.fs.readdir(dir, offset, &mut |e: DirEntry| {
                batch.push(e);
                batch.len() < READDIRPLUS_BATCH
            })
        });
        if let Err(e) = r {
            self.done(Op::readdirplus, t, false);
            reply.error(errno(e));
            return;
        }
        for e in batch {
            // The kernel takes a reference to each entry but `.` and `..`
            // (`crate::kernel_refs`): counted before the reply, given back
            // if it does not fit.
            let counted = e.name != b"." && e.name != b"..";
            let full = match self.fs.getattr(e.ino) {
                Ok(mut attr) => {
                    if counted && self.refs.hand(&self.fs, &mut attr, mark).is_err() {
                        // Removed by a client since readdir saw it.
                        continue;
                    }
                    let full = reply.add(
                        INodeNo(e.ino),
                        e.cookie,
                        OsStr::from_bytes(&e.name),
                        &TTL,
                        &file_attr(&attr),
                        Generation(attr.generation),
                    );
                    if full && counted {
                        self.refs.unhand(&self.fs, e.ino);
                    }
                    full
                }
                // Removed since readdir saw it: leave the entry out.
                Err(err) if err.errno() == libc::ENOENT => continue,
                // Damaged (errors=): list the name with no attributes and
                // no caching, so `ls -l` shows it and its stat the error
                // (as ext4 shows a damaged inode), instead of hiding it.
                Err(_) => {
                    let a = FileAttr {
                        ino: INodeNo(e.ino),
                        kind: file_type(e.kind),
                        nlink: 1,
                        ..negative_attr()
                    };
                    if counted {
                        self.refs.count(e.ino);
                    }
                    let full = reply.add(
                        INodeNo(e.ino),
                        e.cookie,
                        OsStr::from_bytes(&e.name),
                        &Duration::ZERO,
                        &a,
                        Generation(0),
                    );
                    if full && counted {
                        self.refs.unhand(&self.fs, e.ino);
                    }
                    full
                }
            };
            if full {
                break;
            }
        }
        self.done(Op::readdirplus, t, true);
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.answer(Op::releasedir, reply, || {
            self.release_handle(fh);
            Ok(())
        });
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        if self.fsync_is_noop() {
            // Directory changes are durable on return in every mode; in
            // these modes nothing else is pending either (see `fsync`).
            let t = clock::now();
            self.done(Op::fsyncdir, t, true);
            reply.error(Errno::ENOSYS);
            return;
        }
        self.answer(Op::fsyncdir, reply, || {
            match self.handles.with(fh.0, |d| self.fs.fsync(d, datasync)) {
                Some(r) => r,
                None if fh.0 == 0 && self.caching.kernel_opendir => {
                    self.with_dir(fh, ino, |d| self.fs.fsync(d, datasync))
                }
                None => self.fs.sync(),
            }
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let t = clock::now();
        let s = self.fs.statfs();
        self.done(Op::statfs, t, true);
        reply.statfs(
            s.blocks,
            s.blocks_free,
            s.blocks_avail,
            s.files,
            s.files_free,
            s.block_size,
            s.name_max,
            s.block_size,
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.xattr_set(req, ino, name, value, flags, reply);
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.xattr_get(req, ino, name, size, reply);
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.xattr_list(req, ino, size, reply);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.xattr_remove(req, ino, name, reply);
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        // With default_permissions the kernel decides and never asks; this
        // answers only when a mount was made without it.
        let cred = self.cred(req);
        self.answer(Op::access, reply, || {
            self.fs.access(&cred, ino.0, (mask.bits() & 7) as u32)
        });
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
        if self.caching.kernel_open {
            // ENOSYS: the kernel creates with MKNOD from now on and opens
            // the new file itself (`crate::open`): a CREATE's file gets a
            // RELEASE until the first OPEN was refused, which a run of
            // creations (untar) never sends. The answer, not an error.
            let t = clock::now();
            self.done(Op::create, t, true);
            reply.error(Errno::ENOSYS);
            return;
        }
        let cred = self.cred_with_umask(req, umask);
        self.answer(Op::create, reply, || {
            let mark = self.refs.mark();
            // Created, or, when someone else created the name since the
            // kernel's lookup and O_EXCL is not set, opened.
            let (mut attr, file) = self.fs.create(
                &cred,
                parent.0,
                name_bytes(name),
                mode & 0o7777,
                api::OpenFlags::new(flags),
            )?;
            let fopen = match self
                .prepare_open(&file, flags)
                .and_then(|f| self.refs.hand(&self.fs, &mut attr, mark).map(|()| f))
            {
                Ok(f) => f,
                Err(e) => {
                    self.fs.release(file);
                    return Err(e);
                }
            };
            Ok((attr, self.handles.insert(file), fopen))
        });
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.answer(Op::fallocate, reply, || {
            let flags = FallocFlags::from_bits(mode)?;
            self.with_file(fh, ino, |f| self.fs.fallocate(f, offset, length, flags))
        });
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        if self.caching.writeback {
            // The kernel asks without writing its dirty pages back first
            // (fs/fuse/file.c, fuse_lseek), so the pool's holes may be data
            // in its cache. ENOSYS: it stops asking and answers itself,
            // every byte up to its size being data, as POSIX allows.
            let t = clock::now();
            self.done(Op::lseek, t, true);
            reply.error(Errno::ENOSYS);
            return;
        }
        self.answer(Op::lseek, reply, || {
            let w = match whence {
                libc::SEEK_DATA => Whence::Data,
                libc::SEEK_HOLE => Whence::Hole,
                _ => return fail(libc::EINVAL),
            };
            if offset < 0 {
                return fail(libc::ENXIO);
            }
            let off = self.with_file(fh, ino, |f| self.fs.seek(f, offset as u64, w))?;
            Ok(off.min(i64::MAX as u64) as i64)
        });
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
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.answer(Op::copy_file_range, reply, || {
            if !flags.is_empty() {
                return fail(libc::EINVAL);
            }
            let n = if self.caching.kernel_open {
                // fh 0: the files' handles, each opened for this request
                // (`KernelOpens::with` would nest two shard locks).
                let root = Credentials::root();
                let src = self
                    .fs
                    .open(&root, ino_in.0, api::OpenFlags::new(libc::O_RDONLY))?;
                let r = self.opens.with(&self.fs, ino_out.0, |dst| {
                    let n = self.fs.copy_range(&src, offset_in, dst, offset_out, len)?;
                    self.fs.fsync(dst, true).map(|()| n)
                });
                self.fs.release(src);
                r?
            } else {
                // Two handles: each taken out of the table on its own (`with`
                // would nest two shard locks).
                let ebadf = || api::Error::Errno(libc::EBADF);
                let src = self.handles.get(fh_in.0).ok_or_else(ebadf)?;
                let dst = self.handles.get(fh_out.0).ok_or_else(ebadf)?;
                let n = self.fs.copy_range(&src, offset_in, &dst, offset_out, len)?;
                if self.caching.writeback {
                    // Durable when answered, as every write (`fsync_is_noop`).
                    self.fs.fsync(&dst, true)?;
                }
                n
            };
            self.stats.bytes_written.add(n);
            // COPY_MAX keeps every count within the reply's 32 bits.
            Ok(n.min(u32::MAX as u64) as u32)
        });
    }

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
        let _hold = self.hold();
        let t = clock::now();
        let cred = self.cred(req);
        let r = crate::fileattr::serve(&self.fs, &cred, ino.0, cmd, in_data, out_size)
            .unwrap_or(fail(libc::ENOTTY));
        match r {
            Ok(data) => {
                if crate::fileattr::changes_inode(cmd) {
                    // The flags and the ctime changed: the kernel expects
                    // neither of an ioctl.
                    self.inval.changed(Change::Attr { ino: ino.0 });
                }
                self.done(Op::ioctl, t, true);
                reply.ioctl(0, &data);
            }
            Err(e) => {
                self.done(Op::ioctl, t, false);
                reply.error(errno(e));
            }
        }
    }
}
