//! The one surface every front end calls: the FUSE mount, the C ABI and
//! the preload library get the same answers to the same requests from here.
//!
//! A [`Filesystem`] is a mounted pool. Every call that a process makes
//! through a path or a name takes the caller's [`Credentials`], and the
//! engine applies POSIX's rules itself (Linux's, errno for errno): owner,
//! group and other bits with supplementary groups, root's overrides, search
//! permission on directories looked in, sticky directories, set-user-ID and
//! set-group-ID rules, `chattr` flags, and the open flags (`O_TRUNC`,
//! `O_APPEND`, `O_NOATIME`, `O_EXCL`). Checks that guard a change are made
//! under the locks of that change, so the state checked is the state
//! changed. A front end with a kernel in front of it (FUSE with
//! `default_permissions`) gets a second opinion; one without (the C ABI)
//! gets the only one it needs.
//!
//! Calls come in two shapes. Inode-shaped calls name a directory by inode
//! number and a single name in it, as FUSE requests do ([`Filesystem::lookup`],
//! [`Filesystem::create`], ...). Path-shaped callers resolve a path first
//! ([`Filesystem::resolve`], [`Filesystem::resolve_parent`]), which checks
//! search permission along the way and follows symbolic links as Linux's
//! path walk does.
//!
//! An open file is a [`File`]: the inode, kept alive while open even when
//! unlinked, and how it was opened. Reads and writes through it check the
//! access mode it was opened with and touch no shared structure but the
//! inode (no global lock, no system call, no allocation on the data path).
//!
//! ```
//! use inkfs::api::{Credentials, Filesystem, MountOptions, OpenFlags, ROOT_INO};
//! # fn main() -> inkfs::api::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("doc.pool");
//! Filesystem::create_pool(&path, 16 << 20, &Default::default())?;
//! let fs = Filesystem::open_pool(&path, MountOptions::default())?;
//! let me = Credentials::current_process();
//! let (_, file) = fs.create(&me, ROOT_INO, b"hello", 0o644, OpenFlags::new(libc::O_WRONLY))?;
//! fs.write(&file, 0, b"durable on return")?;
//! fs.release(file);
//! let attr = fs.lookup(&me, ROOT_INO, b"hello")?;
//! assert_eq!(attr.size, 17);
//! fs.unmount()?;
//! # Ok(()) }
//! ```

pub mod attach;
pub mod client;
pub mod dirlease;
pub mod lanelease;
pub mod lanes;
pub mod lease;
pub mod ns;
mod path;
pub mod pool;
pub mod ring;

use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::fs::{FileHandle, Fs, KernelTimes};
use crate::perm::{self, Actor};
use crate::pmem::{MappedPool, PoolFile, PoolOpenOptions};

pub use crate::blockdev::{
    BlockDev, DataStats, FileDev, HybridFormat, Side, DATA_THRESHOLD_DEFAULT,
    DATA_UNIT_DEFAULT_BLOCKS,
};
pub use crate::error::{Error, Result};
pub use crate::fs::MountReport;
pub use crate::perm::{Credentials, MAY_EXEC, MAY_READ, MAY_WRITE};
pub use crate::pmem::Pmem;
pub use crate::scrub::{ScrubProgress, ScrubReport};
pub use crate::shm::SharedEpochs;
pub use crate::types::{
    inode_flags, Attr, DirEntry, ErrorEvent, ErrorReason, ErrorRecord, ErrorStats, ErrorsPolicy,
    FallocFlags, FiemapExtent, FileKind, FormatOptions, GcStats, Mode, MountOptions, RenameFlags,
    SetAttr, StatFs, TimeSet, Whence, XattrFlags,
};
pub use crate::types::{DataDevice, ReadaheadMode, DATA_CACHE_DEFAULT_BYTES};
pub use path::{Follow, Resolved, PATH_MAX, SYMLINKS_MAX};
pub use pool::{looks_like_inkfs, read_data_path, read_summary, DataSummary, PoolSummary};

/// How long a write that finds no free block waits for attached clients'
/// calls to end (the blocks they hold to leave the limbo) before it
/// reports ENOSPC.
pub const LIMBO_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The root directory's inode number.
pub const ROOT_INO: u64 = crate::format::ROOT_INO;

/// open(2) flags, as Linux numbers them. The access mode (`O_ACCMODE`)
/// and the creation flags act at open; the status flags (`O_APPEND`,
/// `O_NOATIME`, `O_SYNC`, `O_DSYNC`, `O_DIRECT`, `O_NONBLOCK`) stay with the
/// [`File`] and may change with [`File::set_status_flags`] (F_SETFL).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFlags(pub i32);

impl OpenFlags {
    pub fn new(bits: i32) -> OpenFlags {
        OpenFlags(bits)
    }
    pub fn bits(self) -> i32 {
        self.0
    }
    pub fn readable(self) -> bool {
        matches!(self.0 & libc::O_ACCMODE, libc::O_RDONLY | libc::O_RDWR)
    }
    pub fn writable(self) -> bool {
        matches!(self.0 & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR)
    }
    fn has(self, flag: i32) -> bool {
        self.0 & flag == flag
    }
    /// The permission bits open needs: read and/or write for the access
    /// mode, and write for `O_TRUNC` whatever the mode (may_open).
    fn access_mask(self) -> u32 {
        let mut mask = 0;
        if self.readable() {
            mask |= MAY_READ;
        }
        if self.writable() || self.has(libc::O_TRUNC) {
            mask |= MAY_WRITE;
        }
        mask
    }
}

/// The flags F_SETFL may change (fcntl(2)): the others are fixed at open.
const SETTABLE_STATUS_FLAGS: i32 =
    libc::O_APPEND | libc::O_NONBLOCK | libc::O_NOATIME | libc::O_DIRECT;

/// An inode kept alive (even unlinked) without being open: what a front
/// end holds while a kernel still refers to an inode it may write back to
/// (see [`Filesystem::pin`]).
#[derive(Debug)]
pub struct Pin {
    handle: FileHandle,
}

impl Pin {
    pub fn ino(&self) -> u64 {
        self.handle.ino()
    }
}

/// An open file or directory: the inode (kept alive while open, even
/// unlinked) and the flags it was opened with.
#[derive(Debug)]
pub struct File {
    handle: FileHandle,
    kind: FileKind,
    /// Status flags: changed by F_SETFL from any thread sharing the file.
    flags: AtomicI32,
    /// A kernel-free client's lease cell of this file's inode, with the
    /// client's id: set at the first write through the client, so later
    /// writes lock the cell without finding it in the client's table
    /// (`client::Client`).
    client_cell: std::sync::OnceLock<(u64, client::LeaseCell)>,
}

impl File {
    pub fn ino(&self) -> u64 {
        self.handle.ino()
    }
    /// The client cell slot (`client::Client`'s cache of its lease cell).
    pub(crate) fn client_cell(&self) -> &std::sync::OnceLock<(u64, client::LeaseCell)> {
        &self.client_cell
    }
    pub fn kind(&self) -> FileKind {
        self.kind
    }
    pub fn flags(&self) -> OpenFlags {
        OpenFlags(self.flags.load(Ordering::Relaxed))
    }
    /// F_SETFL: set `O_APPEND`, `O_NONBLOCK`, `O_NOATIME` and `O_DIRECT`
    /// as in `flags`; the access mode and other flags are kept. An
    /// append-only file keeps `O_APPEND` (EPERM otherwise, as Linux).
    pub fn set_status_flags(&self, flags: OpenFlags) -> Result<()> {
        let old = self.flags();
        if old.has(libc::O_APPEND) && !flags.has(libc::O_APPEND) && self.append_only() {
            return crate::error::errno(libc::EPERM);
        }
        let new = (old.0 & !SETTABLE_STATUS_FLAGS) | (flags.0 & SETTABLE_STATUS_FLAGS);
        self.flags.store(new, Ordering::Relaxed);
        Ok(())
    }
    /// Whether writes and allocations through this handle drop the file's
    /// set-id bits (a writer without CAP_FSETID). The engine decides it
    /// from the opener's credentials; a front end that opens its handles
    /// with root's (the preload library: the kernel checked the program's
    /// own open) says it here for the process it serves.
    pub fn set_drops_setid(&mut self, drops: bool) {
        self.handle.drops_setid = drops;
    }
    /// Let a write-only file be read as well: a kernel page cache in
    /// front of the engine (FUSE's writeback cache) fills the pages around
    /// a partial write by reading through the writer's own handle. That
    /// kernel refuses read(2) on a write-only descriptor itself, so only
    /// its page fills come this way; the open's permission checks were
    /// made with the access mode asked for. `flags()` says `O_RDWR` after.
    pub fn allow_cache_fill(&self) {
        let _ = self
            .flags
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |f| {
                (f & libc::O_ACCMODE == libc::O_WRONLY)
                    .then_some((f & !libc::O_ACCMODE) | libc::O_RDWR)
            });
    }
    fn append_only(&self) -> bool {
        let st = crate::inode::read(&self.handle.inode.state);
        st.flags & inode_flags::APPEND != 0
    }
    fn require(&self, readable: bool) -> Result<()> {
        let f = self.flags();
        if (readable && !f.readable()) || (!readable && !f.writable()) {
            return crate::error::errno(libc::EBADF);
        }
        Ok(())
    }
}

/// Where a write landed: an `O_APPEND` write goes to the end of file as it
/// stands when the write takes the inode's lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    pub offset: u64,
    pub len: usize,
}

/// A rename request: `from` in directory `from_dir` becomes `to` in
/// `to_dir`.
#[derive(Clone, Copy, Debug)]
pub struct Rename<'a> {
    pub from_dir: u64,
    pub from: &'a [u8],
    pub to_dir: u64,
    pub to: &'a [u8],
    pub flags: RenameFlags,
}

/// A mounted pool: the engine, with the rules of POSIX applied to each
/// caller. Shared by any number of threads (`&self` everywhere).
pub struct Filesystem<P: Pmem = MappedPool> {
    fs: Fs<P>,
}

impl Filesystem<MappedPool> {
    /// Create a pool file of `size_bytes` at `path` (which must not exist)
    /// and lay out an empty file system on it: mkfs for a plain or DRAM
    /// file. (`inkfs mkfs` also formats devices and existing files.)
    pub fn create_pool(path: &Path, size_bytes: u64, opts: &FormatOptions) -> Result<()> {
        let pool = MappedPool::open(
            path,
            &PoolOpenOptions {
                create_size_bytes: Some(size_bytes),
                read_only: false,
            },
        )?;
        Fs::format(&pool, opts)?;
        pool.sync_all()?;
        Ok(())
    }

    /// Claim the pool at `path` (an exclusive lock on it for a read-write
    /// mount, a shared one for read-only: a pool in use by another process
    /// is refused, naming it), map it and mount it: instant after a clean
    /// unmount, a journal replay and a scan of every live log after a crash.
    pub fn open_pool(path: &Path, opts: MountOptions) -> Result<Filesystem<MappedPool>> {
        let pool = MappedPool::open(
            path,
            &PoolOpenOptions {
                create_size_bytes: None,
                read_only: opts.read_only,
            },
        )?;
        Filesystem::mount(pool, opts)
    }

    /// Mount a pool whose claim the caller already holds (a descriptor
    /// passed over a unix socket, or opened with [`PoolFile::open`]).
    pub fn open_pool_file(file: PoolFile, opts: MountOptions) -> Result<Filesystem<MappedPool>> {
        let pool = MappedPool::map(
            file,
            &PoolOpenOptions {
                create_size_bytes: None,
                read_only: opts.read_only,
            },
        )?;
        Filesystem::mount(pool, opts)
    }
}

impl<P: Pmem> Filesystem<P> {
    /// Lay out an empty file system on `pool` (mkfs): its new superblock.
    pub fn format(pool: &P, opts: &FormatOptions) -> Result<PoolSummary> {
        let sb = Fs::format(pool, opts)?;
        Ok(PoolSummary::of(&sb, false))
    }

    /// Lay out an empty hybrid pool (mkfs): file data of large writes on
    /// `data.device`, everything else on `pool`. The device is formatted
    /// first (its label names the pool), then the pool.
    pub fn format_hybrid(
        pool: &P,
        opts: &FormatOptions,
        data: &HybridFormat<'_>,
    ) -> Result<PoolSummary> {
        let sb = crate::blockdev::attach::format_pool(pool, opts, data)?;
        Ok(PoolSummary::of(&sb, false))
    }

    /// The mounted pool's superblock.
    pub fn summary(&self) -> PoolSummary {
        PoolSummary::of(
            &self.fs.superblock(),
            self.fs.mount_report().used_backup_superblock,
        )
    }

    /// Mount a mapped pool (any [`Pmem`]: a mapped file or device, or the
    /// crash simulator in tests).
    pub fn mount(pool: P, opts: MountOptions) -> Result<Filesystem<P>> {
        Ok(Filesystem {
            fs: Fs::mount(pool, opts)?,
        })
    }

    /// Clean unmount: files still open are closed, unlinked ones freed,
    /// the allocator saved, the pool marked clean. Returns the pool (its
    /// claim is released when it is dropped).
    pub fn unmount(self) -> Result<P> {
        self.fs.unmount()
    }

    /// The engine behind the API, for the crate's own tools and tests.
    #[cfg(any(test, feature = "testing"))]
    pub fn engine(&self) -> &Fs<P> {
        &self.fs
    }

    pub fn pool(&self) -> &P {
        self.fs.pmem()
    }
    pub fn mode(&self) -> Mode {
        self.fs.mode()
    }
    /// Read-only: mounted so, or turned so by `errors=remount-ro`.
    pub fn is_read_only(&self) -> bool {
        self.fs.is_read_only()
    }
    /// Mounted read-only (`ro`), as opposed to turned read-only by errors.
    pub fn is_mounted_read_only(&self) -> bool {
        self.fs.is_mounted_read_only()
    }
    /// Whether fsync has nothing to do, ever: every call is durable when it
    /// returns (strict and sync modes, and read-only mounts).
    pub fn fsync_is_noop(&self) -> bool {
        self.fs.mode() != Mode::Posix || self.fs.is_read_only()
    }
    pub fn statfs(&self) -> StatFs {
        self.fs.statfs()
    }
    /// syncfs: make every pending posix-mode write durable.
    pub fn sync(&self) -> Result<()> {
        self.fs.sync()
    }
    pub fn mount_report(&self) -> &MountReport {
        self.fs.mount_report()
    }
    pub fn gc_stats(&self) -> GcStats {
        self.fs.gc_stats()
    }
    pub fn error_stats(&self) -> ErrorStats {
        self.fs.error_stats()
    }
    /// Hybrid pools: the block side's counters since mount (None: the pool
    /// has no data device).
    pub fn data_stats(&self) -> Option<DataStats> {
        self.fs.data_stats()
    }
    /// Hybrid pools: what the data device is (e.g. "file /var/tmp/d
    /// (O_DIRECT)"); None without one.
    pub fn data_device(&self) -> Option<String> {
        self.fs.data_device_description()
    }

    /// A hybrid pool's data device as a descriptor to hand an attached
    /// client (None: no data device, or one without a descriptor).
    pub fn data_device_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.fs.data.as_ref().and_then(|d| d.device().shared_fd())
    }

    /// A hybrid pool's placement threshold as mounted: writes of at least
    /// this many bytes go to the data device (None: no data device).
    pub fn data_threshold_bytes(&self) -> Option<u64> {
        self.fs.data.as_ref().map(|d| d.policy.threshold_bytes)
    }

    /// Inodes loaded in DRAM and the log pages they hold.
    pub fn loaded_log_pages(&self) -> (u64, u64) {
        self.fs.loaded_log_pages()
    }
    /// Serve read-only clients in other processes that pin epochs in
    /// `table` (client.rs): from now on the blocks this engine frees wait
    /// in a limbo until no client's call can still be reading them. Before
    /// the first client, frees go straight to the free lists.
    pub fn share_epochs(&self, table: std::sync::Arc<SharedEpochs>) {
        self.fs.share_epochs(table);
        // Clients change only inodes leased to them, and the server takes
        // a lease back (and catches the inode up, `lease_refs`) before it
        // uses the inode: its cached inodes stay current without checking
        // their records at each access.
        self.fs.set_shared(false);
    }
    /// Return to the free lists the freed blocks no client can hold now
    /// (the server calls it when clients move on or go).
    pub fn reclaim_limbo(&self) {
        self.fs.reclaim_limbo()
    }
    /// Freed blocks waiting for clients to move on.
    pub fn limbo_blocks(&self) -> u64 {
        self.fs.limbo_blocks()
    }

    /// Verify every checksum of the mounted pool while it keeps serving
    /// (`inkfs scrub`); `progress` returns false to stop early.
    pub fn scrub(&self, progress: &mut dyn FnMut(ScrubProgress) -> bool) -> ScrubReport {
        self.fs.scrub(progress)
    }

    // -------------------------------------------------------------------
    // Names
    // -------------------------------------------------------------------

    /// `name` in directory `dir`: search permission on `dir`.
    pub fn lookup(&self, cred: &Credentials, dir: u64, name: &[u8]) -> Result<Attr> {
        let child = self
            .fs
            .lookup_ino_checked(dir, name, |a| perm::may_lookup(cred, a))?;
        self.fs.getattr(child)
    }

    /// `name` in directory `dir` (search permission on `dir`): its inode
    /// number and kind as the directory's entry records them, the child
    /// not loaded. For a path walk's step through a directory, whose next
    /// step loads the child anyway (and finds it gone, or not a
    /// directory, as a `lookup` would have).
    pub fn lookup_entry(
        &self,
        cred: &Credentials,
        dir: u64,
        name: &[u8],
    ) -> Result<(u64, FileKind)> {
        self.fs
            .lookup_child_checked(dir, name, |a| perm::may_lookup(cred, a))
    }

    /// Attributes by inode number (stat of a name already looked up, or
    /// fstat): no permission is needed beyond reaching the inode.
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        self.fs.getattr(ino)
    }

    /// access(2)/faccessat(2): whether `cred` may read, write or execute
    /// (`mask` of [`MAY_READ`], [`MAY_WRITE`], [`MAY_EXEC`]) inode `ino`.
    /// Writing is refused on a read-only file system (EROFS) and on an
    /// immutable inode (EPERM), as Linux's inode_permission does.
    pub fn access(&self, cred: &Credentials, ino: u64, mask: u32) -> Result<()> {
        let a = self.fs.getattr(ino)?;
        if mask & MAY_WRITE != 0 {
            if self.fs.is_read_only() && writes_to_fs(a.kind) {
                return crate::error::errno(libc::EROFS);
            }
            if self.fs.get_flags(ino)? & inode_flags::IMMUTABLE != 0 {
                return crate::error::errno(libc::EPERM);
            }
        }
        perm::check_access(cred, &a, mask & 7)
    }

    /// chmod, chown, utimes, truncate. `via`: the open file a truncate goes
    /// through (ftruncate: it must be open for writing, EINVAL otherwise);
    /// without one, a truncate needs write permission on the inode.
    pub fn setattr(
        &self,
        cred: &Credentials,
        ino: u64,
        set: &SetAttr,
        via: Option<&File>,
    ) -> Result<Attr> {
        self.setattr_checked(cred, ino, set, via, None)
    }

    /// setattr from a front end whose kernel keeps a regular file's mtime
    /// and ctime itself between write-backs (FUSE's writeback cache): it
    /// stamps them at each write and sends them as explicit values, with its
    /// own write-back of them and with every setattr, a `touch` to "now"
    /// included, and it has checked the caller's right to set them
    /// (`default_permissions`). So explicit times are judged as "now" is
    /// (owner or writer; allowed on an append-only file) and applied as
    /// given; `ctime` is the kernel's change time (None: now). Everything
    /// else in `set` is checked as by [`Filesystem::setattr`].
    pub fn setattr_kernel_times(
        &self,
        cred: &Credentials,
        ino: u64,
        set: &SetAttr,
        ctime: Option<i64>,
        via: Option<&File>,
    ) -> Result<Attr> {
        self.setattr_checked(cred, ino, set, via, Some(KernelTimes { ctime }))
    }

    /// `setattr_kernel_times` for a writeback-cache mount's write-back of
    /// times (no mode, owner or size change: EINVAL): on a file with
    /// deferred write-backs its commit joins them (the flag): durable once
    /// a [`Filesystem::commit_deferred`] that began after this call
    /// returned Ok; otherwise as `setattr_kernel_times`.
    pub fn setattr_kernel_times_deferring(
        &self,
        cred: &Credentials,
        ino: u64,
        set: &SetAttr,
        ctime: Option<i64>,
    ) -> Result<(Attr, bool)> {
        let kernel = Some(KernelTimes { ctime });
        if set.mode.is_some() || set.uid.is_some() || set.gid.is_some() || set.size.is_some() {
            // Not the times alone: as `setattr_kernel_times` without a
            // handle (a size change needs the caller's).
            return crate::error::errno(libc::EINVAL);
        }
        self.fs
            .setattr_times_deferring(Actor::Caller(cred), ino, set, kernel)
    }

    fn setattr_checked(
        &self,
        cred: &Credentials,
        ino: u64,
        set: &SetAttr,
        via: Option<&File>,
        kernel: Option<KernelTimes>,
    ) -> Result<Attr> {
        if set.size.is_some() {
            match via {
                Some(f) if !f.flags().writable() => return crate::error::errno(libc::EINVAL),
                Some(_) => {}
                None => {
                    let a = self.fs.getattr(ino)?;
                    if a.kind == FileKind::File {
                        perm::check_access(cred, &a, MAY_WRITE)?;
                    }
                }
            }
        }
        self.fs
            .setattr_times_from(Actor::Caller(cred), ino, set, kernel)
    }

    /// mknod(2): a regular file, FIFO, socket or device node (the type in
    /// `mode`'s S_IFMT bits; a device node needs root, as CAP_MKNOD).
    pub fn mknod(
        &self,
        cred: &Credentials,
        dir: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
    ) -> Result<Attr> {
        let t = mode & libc::S_IFMT;
        if (t == libc::S_IFCHR || t == libc::S_IFBLK) && !cred.is_root() {
            return crate::error::errno(libc::EPERM);
        }
        self.fs
            .mknod_as(Actor::Caller(cred), dir, name, mode, rdev, (0, 0))
    }

    pub fn mkdir(&self, cred: &Credentials, dir: u64, name: &[u8], mode: u32) -> Result<Attr> {
        self.fs
            .mkdir_as(Actor::Caller(cred), dir, name, mode, (0, 0))
    }

    pub fn symlink(
        &self,
        cred: &Credentials,
        dir: u64,
        name: &[u8],
        target: &[u8],
    ) -> Result<Attr> {
        self.fs
            .symlink_as(Actor::Caller(cred), dir, name, target, (0, 0))
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        self.fs.readlink(ino)
    }

    /// link(2): a new name `name` in `dir` for inode `ino`.
    pub fn link(&self, cred: &Credentials, ino: u64, dir: u64, name: &[u8]) -> Result<Attr> {
        self.fs.link_as(Actor::Caller(cred), ino, dir, name)
    }

    pub fn unlink(&self, cred: &Credentials, dir: u64, name: &[u8]) -> Result<()> {
        self.fs.remove_name(Actor::Caller(cred), dir, name, false)
    }

    pub fn rmdir(&self, cred: &Credentials, dir: u64, name: &[u8]) -> Result<()> {
        self.fs.remove_name(Actor::Caller(cred), dir, name, true)
    }

    /// renameat2(2), with RENAME_NOREPLACE, RENAME_EXCHANGE and
    /// RENAME_WHITEOUT (the whiteout is owned by the caller).
    pub fn rename(&self, cred: &Credentials, r: &Rename<'_>) -> Result<()> {
        let (from, to) = ((r.from_dir, r.from), (r.to_dir, r.to));
        self.fs
            .rename_for(Actor::Caller(cred), from, to, r.flags, (0, 0))
    }

    // -------------------------------------------------------------------
    // Open files
    // -------------------------------------------------------------------

    /// open(2) of `name` in `dir` with `O_CREAT`: create a regular file
    /// (owner, group and mode from `cred` and the directory), or, if the
    /// name exists and `O_EXCL` is not set, open what it names. Returns its
    /// attributes and the open file; `created` is in the attributes' link
    /// count only by inference, so callers that need it compare inode
    /// numbers with a lookup.
    pub fn create(
        &self,
        cred: &Credentials,
        dir: u64,
        name: &[u8],
        mode: u32,
        flags: OpenFlags,
    ) -> Result<(Attr, File)> {
        loop {
            match self
                .fs
                .create_as(Actor::Caller(cred), dir, name, mode, (0, 0))
            {
                Ok((attr, handle)) => {
                    // A new file: open's permission checks are passed by
                    // creating it (may_open skips them for a new file).
                    let file = self.file(handle, FileKind::File, flags, cred);
                    return Ok((attr, file));
                }
                Err(Error::Errno(libc::EEXIST)) if !flags.has(libc::O_EXCL) => {
                    let attr = match self.lookup(cred, dir, name) {
                        Err(Error::Errno(libc::ENOENT)) => continue, // removed meanwhile
                        r => r?,
                    };
                    if attr.kind == FileKind::Dir {
                        return crate::error::errno(libc::EISDIR);
                    }
                    let file = self.open(cred, attr.ino, flags)?;
                    return Ok((self.fs.getattr(attr.ino)?, file));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// open(2) of inode `ino` (the path already resolved): the access mode
    /// and `O_TRUNC` need read/write permission, `O_NOATIME` ownership; a
    /// directory opens only for reading (EISDIR), a symbolic link not at
    /// all (ELOOP: the caller follows links), a device, FIFO or socket not
    /// through the engine (ENXIO). `chattr` flags may refuse writing.
    /// `O_TRUNC` on a regular file truncates it.
    pub fn open(&self, cred: &Credentials, ino: u64, flags: OpenFlags) -> Result<File> {
        let a = self.fs.getattr(ino)?;
        match a.kind {
            // O_TRUNC asks for write access too (may_open), so a
            // directory refuses it whatever the access mode.
            FileKind::Dir if flags.access_mask() & MAY_WRITE != 0 => {
                return crate::error::errno(libc::EISDIR)
            }
            FileKind::Dir | FileKind::File => {}
            FileKind::Symlink => return crate::error::errno(libc::ELOOP),
            _ => return crate::error::errno(libc::ENXIO),
        }
        if flags.has(libc::O_DIRECTORY) && a.kind != FileKind::Dir {
            return crate::error::errno(libc::ENOTDIR);
        }
        if flags.access_mask() & MAY_WRITE != 0 && self.fs.is_read_only() {
            return crate::error::errno(libc::EROFS);
        }
        perm::check_access(cred, &a, flags.access_mask())?;
        if flags.has(libc::O_NOATIME) && !cred.owns(&a) {
            return crate::error::errno(libc::EPERM);
        }
        let handle = self.fs.open_with(ino, flags.bits())?;
        let file = self.file(handle, a.kind, flags, cred);
        if flags.has(libc::O_TRUNC) && a.kind == FileKind::File {
            let zero = SetAttr {
                size: Some(0),
                ..SetAttr::default()
            };
            if let Err(e) = self.fs.setattr_as(Actor::Caller(cred), ino, &zero) {
                self.release(file);
                return Err(e);
            }
        }
        Ok(file)
    }

    fn file(
        &self,
        mut handle: FileHandle,
        kind: FileKind,
        flags: OpenFlags,
        cred: &Credentials,
    ) -> File {
        handle.drops_setid = !cred.is_root();
        File {
            handle,
            kind,
            flags: AtomicI32::new(flags.bits() & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC)),
            client_cell: std::sync::OnceLock::new(),
        }
    }

    /// close(2): the last close of an unlinked file frees it.
    pub fn release(&self, file: File) {
        self.fs.release(file.handle)
    }

    /// Keep inode `ino` from being freed (and its number from being given
    /// to a new inode) until [`Filesystem::unpin`], as an open handle does,
    /// unlinked or not; no permission is checked and nothing is written.
    /// For a front end whose kernel may still send requests for an inode
    /// after the call that unlinked it (FUSE's writeback cache writes the
    /// ctime it stamped at unlink back afterwards): held until that kernel
    /// forgets the inode. After a crash, recovery frees a pinned orphan as
    /// it frees one left open.
    pub fn pin(&self, ino: u64) -> Result<Pin> {
        Ok(Pin {
            handle: self.fs.open(ino)?,
        })
    }

    /// Let a pinned inode go: the last of its handles and pins frees it if
    /// it is unlinked.
    pub fn unpin(&self, pin: Pin) {
        self.fs.release(pin.handle)
    }

    /// pread(2): up to `buf.len()` bytes at `off`, short at end of file.
    pub fn read(&self, file: &File, off: u64, buf: &mut [u8]) -> Result<usize> {
        file.require(true)?;
        self.fs.read(&file.handle, off, buf)
    }

    /// A read served in place: `f` gets the file's bytes `[off, off+len)`
    /// (clipped at end of file) straight from the pool under the inode's
    /// read lock; `Ok(None)` when they are not one mapped run (use `read`).
    pub fn read_in_place<R>(
        &self,
        file: &File,
        off: u64,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        file.require(true)?;
        self.fs.read_in_place(&file.handle, off, len, f)
    }

    /// write(2)/pwrite(2) as a process makes it: at the end of file if the
    /// file is `O_APPEND` (the end as it stands under the inode's lock),
    /// else at `off`; made durable before returning with `O_SYNC`/`O_DSYNC`
    /// (every write is, in strict and sync modes). A writer other than root
    /// drops the file's set-id bits and file capabilities.
    pub fn write(&self, file: &File, off: u64, data: &[u8]) -> Result<Written> {
        let flags = file.flags();
        let written = if flags.has(libc::O_APPEND) {
            self.append(file, data)?
        } else {
            self.write_at(file, off, data)?
        };
        if flags.has(libc::O_DSYNC) && !self.fsync_is_noop() {
            // O_SYNC includes O_DSYNC's bit; O_DSYNC alone is fdatasync.
            self.fs.fsync(&file.handle, !flags.has(libc::O_SYNC))?;
        }
        Ok(written)
    }

    /// A write at `off` whatever the file's `O_APPEND` says (a front end
    /// whose kernel decided the offset: page-cache write-back of a shared
    /// mapping), with no `O_SYNC` handling (its kernel calls fsync).
    pub fn write_at(&self, file: &File, off: u64, data: &[u8]) -> Result<Written> {
        file.require(false)?;
        let len = self.waiting_for_limbo(|| self.fs.write(&file.handle, off, data))?;
        Ok(Written { offset: off, len })
    }

    /// A write whose place and set-id rule a kernel in front decided
    /// (FUSE with its writeback cache owns the file's size, so the end of
    /// file an O_APPEND write goes to is its own): at `off` whatever the
    /// file's `O_APPEND` says; set-id bits and file capabilities dropped
    /// only if `kill_setid` (that kernel asks when the writer lacks
    /// CAP_FSETID; a write-back of its page cache never does, as a write
    /// through mmap does not). No `O_SYNC` handling: that kernel calls
    /// fsync.
    pub fn write_placed(
        &self,
        file: &File,
        off: u64,
        data: &[u8],
        kill_setid: bool,
    ) -> Result<Written> {
        file.require(false)?;
        let len = self
            .fs
            .write_dropping(&file.handle, off, data, kill_setid)?;
        Ok(Written { offset: off, len })
    }

    /// `write_placed` without set-id changes, for a write-back of a
    /// kernel's page cache in posix mode: an append to fresh device blocks
    /// is *deferred*, committed by the next [`Filesystem::commit_deferred`]
    /// (docs/DESIGN.md, "Deferred commits, answered late"). The flag says
    /// whether device data is left to flush (a deferred append or an
    /// overwrite in place on the device): the write is durable once a
    /// `commit_deferred` that began after this call returned Ok; if not,
    /// it is as `write_placed` left it. Strict and sync mounts and pools
    /// without a data device never defer.
    pub fn write_back(&self, file: &File, off: u64, data: &[u8]) -> Result<(Written, bool)> {
        file.require(false)?;
        let pending = self.fs.write_deferring(&file.handle, off, data, false)?;
        Ok((
            Written {
                offset: off,
                len: data.len(),
            },
            pending,
        ))
    }

    /// Commit every write-back deferred before this call (one device flush
    /// for all of them): each is durable when this returns Ok. An error
    /// leaves them pending (the next call tries again).
    pub fn commit_deferred(&self) -> Result<()> {
        self.fs.commit_deferred()
    }

    /// A write at the end of file, decided under the inode's lock.
    pub fn append(&self, file: &File, data: &[u8]) -> Result<Written> {
        file.require(false)?;
        let (offset, len) = self.waiting_for_limbo(|| self.fs.append(&file.handle, data))?;
        Ok(Written { offset, len })
    }

    /// `op`, a write that changes nothing when it fails, again while the
    /// blocks freed under attached clients' calls come back, if it found
    /// no space and some are waiting in the limbo (client.rs): a client
    /// stalled in a call delays the writes that need the space it holds,
    /// up to [`LIMBO_WAIT`], instead of failing them at once. Nothing is
    /// added to a write that succeeds.
    fn waiting_for_limbo<T>(&self, mut op: impl FnMut() -> Result<T>) -> Result<T> {
        let mut r = op();
        // The clock is read only once a write found no space: on every
        // write it was a vDSO call (~30 ns here) on the durable path.
        let mut deadline = None;
        while matches!(r, Err(Error::Errno(libc::ENOSPC))) && self.fs.limbo_blocks() > 0 {
            let now = std::time::Instant::now();
            if now >= *deadline.get_or_insert(now + LIMBO_WAIT) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
            self.fs.reclaim_limbo();
            r = op();
        }
        r
    }

    /// copy_file_range(2) inside the pool (see `Fs::copy_range`).
    pub fn copy_range(
        &self,
        src: &File,
        src_off: u64,
        dst: &File,
        dst_off: u64,
        len: u64,
    ) -> Result<u64> {
        src.require(true)?;
        dst.require(false)?;
        if dst.flags().has(libc::O_APPEND) {
            return crate::error::errno(libc::EBADF);
        }
        self.fs
            .copy_range(&src.handle, src_off, &dst.handle, dst_off, len)
    }

    /// fsync(2) (`datasync`: fdatasync). Nothing to do in strict and sync
    /// modes.
    pub fn fsync(&self, file: &File, datasync: bool) -> Result<()> {
        self.fs.fsync(&file.handle, datasync)
    }

    /// fallocate(2): the file must be open for writing.
    pub fn fallocate(&self, file: &File, off: u64, len: u64, flags: FallocFlags) -> Result<()> {
        file.require(false)?;
        self.fs.fallocate(&file.handle, off, len, flags)
    }

    /// lseek(2) with SEEK_DATA or SEEK_HOLE (the caller keeps the offset
    /// for SEEK_SET/CUR/END).
    pub fn seek(&self, file: &File, off: u64, whence: Whence) -> Result<u64> {
        self.fs.seek(&file.handle, off, whence)
    }

    /// FIEMAP: the extents mapping `[start, start+len)` of the file.
    pub fn fiemap(&self, file: &File, start: u64, len: u64) -> Result<Vec<FiemapExtent>> {
        self.fs.fiemap(file.ino(), start, len)
    }

    /// FS_IOC_GETFLAGS: the inode's `chattr` flags ([`inode_flags`]).
    pub fn get_flags(&self, ino: u64) -> Result<u32> {
        self.fs.get_flags(ino)
    }

    /// FS_IOC_SETFLAGS: only the owner or root may change flags, and only
    /// root the immutable and append-only ones.
    pub fn set_flags(&self, cred: &Credentials, ino: u64, flags: u32) -> Result<()> {
        let a = self.fs.getattr(ino)?;
        if !cred.owns(&a) {
            return crate::error::errno(libc::EPERM);
        }
        self.fs.set_flags(ino, flags, cred.is_root())
    }

    // -------------------------------------------------------------------
    // Directories
    // -------------------------------------------------------------------

    /// opendir: read permission on the directory.
    pub fn opendir(&self, cred: &Credentials, ino: u64) -> Result<File> {
        self.open(
            cred,
            ino,
            OpenFlags::new(libc::O_RDONLY | libc::O_DIRECTORY),
        )
    }

    /// The entries of an open directory after `cookie` (0: from the
    /// start, "." and ".." first): `f` is called for each until it returns
    /// false. A name is never returned twice in one pass, whatever else
    /// changes meanwhile; each entry's cookie resumes after it.
    pub fn readdir(
        &self,
        dir: &File,
        cookie: u64,
        f: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        if dir.kind != FileKind::Dir {
            return crate::error::errno(libc::ENOTDIR);
        }
        self.fs.readdir(dir.ino(), cookie, f)
    }

    // -------------------------------------------------------------------
    // Extended attributes
    // -------------------------------------------------------------------

    pub fn setxattr(
        &self,
        cred: &Credentials,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
    ) -> Result<()> {
        self.fs
            .setxattr_as(Actor::Caller(cred), ino, name, value, flags)
    }

    pub fn getxattr(&self, cred: &Credentials, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        self.fs.getxattr_as(Actor::Caller(cred), ino, name)
    }

    /// The names `cred` may see (`trusted.` ones only for root).
    pub fn listxattr(&self, cred: &Credentials, ino: u64) -> Result<Vec<Vec<u8>>> {
        self.fs.listxattr_as(Actor::Caller(cred), ino)
    }

    pub fn removexattr(&self, cred: &Credentials, ino: u64, name: &[u8]) -> Result<()> {
        self.fs.removexattr_as(Actor::Caller(cred), ino, name)
    }
}

/// Whether writing to an inode of this kind writes to the file system (a
/// device node's or FIFO's data does not, so EROFS does not apply).
fn writes_to_fs(kind: FileKind) -> bool {
    matches!(kind, FileKind::File | FileKind::Dir | FileKind::Symlink)
}
