//! The engine seen from the FUSE front end.
//!
//! The front end is generic over this trait so that it can be driven by the
//! real engine ([`inkfs::Fs`], see `real.rs`) or by the small in-memory
//! reference engine ([`crate::memfs::MemFs`]) that the tests use to tell a
//! front-end bug from an engine bug. The methods mirror `inkfs::Fs` one for
//! one; generics keep the real path monomorphised (no dynamic dispatch).

use inkfs::scrub::{ScrubProgress, ScrubReport};
use inkfs::types::{Attr, DirEntry, FallocFlags, RenameFlags, SetAttr, StatFs, Whence, XattrFlags};
use inkfs::Result;

pub trait Engine: Send + Sync + 'static {
    /// An open file or directory; keeps an unlinked inode alive.
    type Handle: Send + Sync + 'static;

    fn handle_ino(&self, fh: &Self::Handle) -> u64;

    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr>;
    fn getattr(&self, ino: u64) -> Result<Attr>;
    fn setattr(&self, ino: u64, set: &SetAttr) -> Result<Attr>;
    fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        uid: u32,
        gid: u32,
    ) -> Result<Attr>;
    fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<(Attr, Self::Handle)>;
    fn mkdir(&self, parent: u64, name: &[u8], mode: u32, uid: u32, gid: u32) -> Result<Attr>;
    fn symlink(&self, parent: u64, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<Attr>;
    fn readlink(&self, ino: u64) -> Result<Vec<u8>>;
    fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr>;
    fn unlink(&self, parent: u64, name: &[u8]) -> Result<()>;
    fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()>;
    /// renameat2 by a caller with file-system ids `uid`/`gid`, which own
    /// the whiteout RENAME_WHITEOUT leaves behind (`inkfs::Fs::rename_as`).
    #[allow(clippy::too_many_arguments)]
    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
        uid: u32,
        gid: u32,
    ) -> Result<()>;
    fn readdir(&self, ino: u64, cookie: u64, f: &mut dyn FnMut(DirEntry) -> bool) -> Result<()>;
    fn open(&self, ino: u64) -> Result<Self::Handle>;
    /// open(2): `open` plus the checks that immutable and append-only
    /// inodes make of the open flags (`inkfs::Fs::open_with`). Engines
    /// without inode flags just open.
    fn open_with(&self, ino: u64, _flags: i32) -> Result<Self::Handle> {
        self.open(ino)
    }
    fn release(&self, fh: Self::Handle);
    fn read(&self, fh: &Self::Handle, off: u64, buf: &mut [u8]) -> Result<usize>;
    /// Serve a read without copying: call `reply` with the bytes in place
    /// and return true, or return false (without calling it) for `read`.
    fn read_in_place(
        &self,
        _fh: &Self::Handle,
        _off: u64,
        _len: usize,
        _reply: &mut dyn FnMut(&[u8]),
    ) -> Result<bool> {
        Ok(false)
    }
    fn write(&self, fh: &Self::Handle, off: u64, data: &[u8]) -> Result<usize>;
    fn append(&self, fh: &Self::Handle, data: &[u8]) -> Result<(u64, usize)>;
    fn fsync(&self, fh: &Self::Handle, datasync: bool) -> Result<()>;
    /// Whether `fsync` (and `sync`) never have anything to do, because
    /// every call was durable when it returned; the kernel is then told
    /// not to send FSYNC at all.
    fn fsync_is_noop(&self) -> bool {
        false
    }
    fn fallocate(&self, fh: &Self::Handle, off: u64, len: u64, flags: FallocFlags) -> Result<()>;
    /// copy_file_range inside the engine: up to `len` bytes of `src` at
    /// `src_off` to `dst` at `dst_off`; the bytes copied (short at the
    /// source's end). ENOSYS when the engine cannot (the kernel then copies
    /// through READ and WRITE requests itself).
    fn copy_range(
        &self,
        _src: &Self::Handle,
        _src_off: u64,
        _dst: &Self::Handle,
        _dst_off: u64,
        _len: u64,
    ) -> Result<u64> {
        Err(inkfs::Error::Errno(libc::ENOSYS))
    }
    fn seek(&self, fh: &Self::Handle, off: u64, whence: Whence) -> Result<u64>;
    fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: XattrFlags) -> Result<()>;
    fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>>;
    fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>>;
    fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()>;
    /// FS_IOC_GETFLAGS (`inkfs::types::inode_flags` bits); ENOTTY where
    /// the engine has no inode flags.
    fn get_flags(&self, _ino: u64) -> Result<u32> {
        Err(inkfs::Error::Errno(libc::ENOTTY))
    }
    /// FS_IOC_SETFLAGS; `privileged`: the caller may change immutable and
    /// append-only (CAP_LINUX_IMMUTABLE).
    fn set_flags(&self, _ino: u64, _flags: u32, _privileged: bool) -> Result<()> {
        Err(inkfs::Error::Errno(libc::ENOTTY))
    }
    fn statfs(&self) -> StatFs;
    fn sync(&self) -> Result<()>;
    /// Engine-specific fields of the statistics report (log and GC
    /// figures); none by default.
    fn report_lines(&self) -> Vec<crate::stats::Field> {
        Vec::new()
    }
    /// Whether mutating calls are refused now: a read-only mount, or an
    /// engine that turned read-only on corruption (`errors=remount-ro`).
    fn is_read_only(&self) -> bool {
        false
    }
    /// An online check of every checksum (`inkfs scrub`); `progress`
    /// returns false to stop it. ENOSYS for engines without one.
    fn scrub(&self, _progress: &mut dyn FnMut(ScrubProgress) -> bool) -> Result<ScrubReport> {
        Err(inkfs::Error::Errno(libc::ENOSYS))
    }
}
