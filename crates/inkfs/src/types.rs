//! The types of the public engine API (shared by the FUSE mount, the C ABI
//! and the preload library).

pub use crate::format::inode_flags;
use crate::format::Superblock;
pub use crate::format::{ErrorReason, FileKind};

/// Consistency mode, chosen when a pool is opened (docs/MODES.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// Every call durable on return and atomic: data copy-on-write.
    #[default]
    Strict,
    /// Every call durable on return; overwrites in place (not atomic).
    Sync,
    /// Metadata atomic and durable; file data durable at fsync/fdatasync.
    Posix,
}

impl Mode {
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "strict" => Some(Mode::Strict),
            "sync" => Some(Mode::Sync),
            "posix" => Some(Mode::Posix),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Mode::Strict => "strict",
            Mode::Sync => "sync",
            Mode::Posix => "posix",
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct MountOptions {
    pub mode: Mode,
    pub read_only: bool,
    /// What to do on corruption met while mounted (ext4's `errors=`).
    pub errors: ErrorsPolicy,
    /// Hybrid pools: the data device, when not at the path recorded at
    /// mkfs (`data=PATH`), or already open. Matched by its label's uuid.
    pub data: Option<DataDevice>,
    /// Hybrid pools: bytes of DRAM caching data-device blocks
    /// (`data_cache=SIZE`); None: [`DATA_CACHE_DEFAULT_BYTES`].
    pub data_cache_bytes: Option<u64>,
    /// Hybrid pools: the placement threshold for this mount
    /// (`data_threshold=SIZE`): writes of at least this many bytes go to
    /// the data device. None: the one recorded at mkfs.
    pub data_threshold_bytes: Option<u64>,
    /// Hybrid pools: how sequential readers are read ahead
    /// (`data_readahead=`).
    pub data_readahead: ReadaheadMode,
}

/// How a hybrid mount reads ahead of sequential readers into its DRAM
/// cache of device blocks (docs/DESIGN.md, "Readahead").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadaheadMode {
    /// Threads of the store, each with one device read in flight.
    #[default]
    Threads,
    /// One thread keeping several device reads in flight through io_uring
    /// (threads where io_uring is not available).
    Uring,
    /// None: a reader's miss reads the request's blocks only.
    Off,
}

impl ReadaheadMode {
    pub fn parse(s: &str) -> Option<ReadaheadMode> {
        match s {
            "threads" => Some(ReadaheadMode::Threads),
            "uring" => Some(ReadaheadMode::Uring),
            "off" => Some(ReadaheadMode::Off),
            _ => None,
        }
    }
}

/// DRAM cache of data-device blocks when the mount does not say.
pub const DATA_CACHE_DEFAULT_BYTES: u64 = 256 << 20;

/// A hybrid pool's data device, as a mount is given it.
#[derive(Clone)]
pub enum DataDevice {
    /// A block device or file to open (instead of the recorded path).
    Path(std::path::PathBuf),
    /// A device already open: the crash simulator's, an in-memory one.
    Open(std::sync::Arc<dyn crate::blockdev::BlockDev>),
}

impl std::fmt::Debug for DataDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DataDevice::Path(p) => write!(f, "Path({})", p.display()),
            DataDevice::Open(d) => write!(f, "Open({})", d.describe()),
        }
    }
}

/// What the engine does when it meets corruption while mounted, besides
/// failing the call with EIO, counting it, saying so on stderr and in the
/// system log, and recording it in the superblock (ext4's `errors=`;
/// docs/DESIGN.md "Errors met while mounted").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ErrorsPolicy {
    /// Turn read-only: every later mutating call fails with EROFS (reads go
    /// on), log GC stops, so the damage cannot spread before `inkfs fsck`
    /// has looked at it. The unmount still saves the allocator and marks
    /// the pool clean, so that it can be mounted read-only to copy data off.
    #[default]
    RemountRo,
    /// Keep serving; only the damaged objects fail.
    Continue,
}

impl ErrorsPolicy {
    pub fn parse(s: &str) -> Option<ErrorsPolicy> {
        match s {
            "remount-ro" => Some(ErrorsPolicy::RemountRo),
            "continue" => Some(ErrorsPolicy::Continue),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            ErrorsPolicy::RemountRo => "remount-ro",
            ErrorsPolicy::Continue => "continue",
        }
    }
}

/// One error of the superblock's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorEvent {
    pub unix_ns: u64,
    pub ino: Option<u64>,
    /// The on-media reason code; [`ErrorReason::from_code`] names it.
    pub reason_code: u32,
}

impl ErrorEvent {
    pub fn reason(&self) -> Option<ErrorReason> {
        ErrorReason::from_code(self.reason_code)
    }
    /// "2026-11-22T10:31:07Z, inode 12, log".
    pub fn describe(&self) -> String {
        let what = self.reason().map_or_else(
            || format!("reason {}", self.reason_code),
            |r| r.name().into(),
        );
        match self.ino {
            Some(ino) => format!(
                "{}, inode {ino}, {what}",
                crate::time::utc_string(self.unix_ns)
            ),
            None => format!("{}, {what}", crate::time::utc_string(self.unix_ns)),
        }
    }
}

/// The superblock's record of errors met while mounted (format version 3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorRecord {
    /// Errors since mkfs or the last fsck that cleared the record; 0: none.
    pub count: u64,
    pub first: Option<ErrorEvent>,
    pub last: Option<ErrorEvent>,
}

impl ErrorRecord {
    pub fn of(sb: &Superblock) -> ErrorRecord {
        if sb.errors_count == 0 {
            return ErrorRecord::default();
        }
        let event = |unix_ns, ino, reason_code| ErrorEvent {
            unix_ns,
            ino: (ino != 0).then_some(ino),
            reason_code,
        };
        ErrorRecord {
            count: sb.errors_count,
            first: Some(event(
                sb.first_error_unix_ns,
                sb.first_error_ino,
                sb.first_error_reason,
            )),
            last: Some(event(
                sb.last_error_unix_ns,
                sb.last_error_ino,
                sb.last_error_reason,
            )),
        }
    }
    pub fn is_clear(&self) -> bool {
        self.count == 0
    }
    /// "3 errors met while mounted (first: ...; last: ...)", or "none".
    pub fn describe(&self) -> String {
        match (self.first, self.last) {
            (Some(f), Some(l)) if self.count > 1 => format!(
                "{} errors met while mounted (first: {}; last: {})",
                self.count,
                f.describe(),
                l.describe()
            ),
            (Some(f), _) => format!("1 error met while mounted ({})", f.describe()),
            _ => "none".into(),
        }
    }
}

/// Corruption met while mounted (`Fs::error_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorStats {
    pub policy: ErrorsPolicy,
    /// Errors met during this mount.
    pub count: u64,
    /// The superblock's record (this mount's errors included, unless the
    /// mount is read-only: a read-only mount writes nothing).
    pub recorded: ErrorRecord,
    /// The `remount-ro` policy turned the file system read-only.
    pub remounted_ro: bool,
}

#[derive(Clone, Debug)]
pub struct FormatOptions {
    /// Lanes (per-CPU partitions); 0 = one per online CPU, at least 2.
    pub lanes: u32,
    pub root_uid: u32,
    pub root_gid: u32,
    pub root_mode: u32,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            lanes: 0,
            root_uid: 0,
            root_gid: 0,
            root_mode: 0o755,
        }
    }
}

/// A point in time, nanoseconds since the Unix epoch.
pub type TimeNs = i64;

/// Attributes of an inode, as stat(2) reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub generation: u64,
    pub kind: FileKind,
    /// Full st_mode (type bits included).
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub size: u64,
    /// 512-byte units actually allocated.
    pub blocks: u64,
    pub atime_ns: TimeNs,
    pub mtime_ns: TimeNs,
    pub ctime_ns: TimeNs,
}

impl Attr {
    pub fn perm(&self) -> u32 {
        self.mode & 0o7777
    }
}

/// How setattr changes a timestamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(TimeNs),
}

/// setattr: `None` leaves a field unchanged (UTIME_OMIT for times).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Permission bits only (type bits are ignored).
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
}

impl SetAttr {
    /// The same request with every time it sets set to "now": how the
    /// permission and chattr rules judge times a kernel cache stamped.
    pub(crate) fn times_as_now(&self) -> SetAttr {
        SetAttr {
            atime: self.atime.map(|_| TimeSet::Now),
            mtime: self.mtime.map(|_| TimeSet::Now),
            ..*self
        }
    }
}

/// rename(2) flags (renameat2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
    /// RENAME_WHITEOUT: the old name is left holding a whiteout (a
    /// character device 0/0, mode 0), created in the same transaction as
    /// the rename and owned by the caller (`api::Filesystem::rename`).
    pub whiteout: bool,
}

impl RenameFlags {
    /// From the Linux RENAME_* bits, checked as renameat2(2) checks them:
    /// unknown bits, and EXCHANGE with NOREPLACE or WHITEOUT, are EINVAL.
    /// WHITEOUT needs no privilege (Linux dropped the CAP_MKNOD check in
    /// 5.8: a whiteout is a device no one can open).
    pub fn from_bits(bits: u32) -> crate::Result<RenameFlags> {
        const NOREPLACE: u32 = libc::RENAME_NOREPLACE;
        const EXCHANGE: u32 = libc::RENAME_EXCHANGE;
        const WHITEOUT: u32 = libc::RENAME_WHITEOUT;
        if bits & !(NOREPLACE | EXCHANGE | WHITEOUT) != 0
            || (bits & EXCHANGE != 0 && bits & (NOREPLACE | WHITEOUT) != 0)
        {
            return crate::error::errno(libc::EINVAL);
        }
        Ok(RenameFlags {
            noreplace: bits & NOREPLACE != 0,
            exchange: bits & EXCHANGE != 0,
            whiteout: bits & WHITEOUT != 0,
        })
    }
}

/// One directory entry from readdir. `cookie` resumes after this entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: FileKind,
    pub name: Vec<u8>,
    pub cookie: u64,
}

/// Log GC activity since mount (`Fs::gc_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcStats {
    /// Fast GC scans of a log.
    pub fast_scans: u64,
    /// Log pages fast GC unlinked (freed without copying an entry).
    pub fast_pages_freed: u64,
    /// Scans whose drop set failed the replay check (nothing was dropped).
    pub fast_refused: u64,
    /// Thorough GC runs (compacting rewrites of a log).
    pub compactions: u64,
    /// Log pages thorough GC freed (net of the pages it wrote).
    pub compaction_pages_freed: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    pub block_size: u32,
    /// Data blocks of both sides (PM's data area and, in a hybrid pool,
    /// the data device's), and those free: what df shows.
    pub blocks: u64,
    pub blocks_free: u64,
    /// Of `blocks_free`, those any writer can count on (statfs's
    /// `f_bavail`): PM's free blocks above the server's keep, which no
    /// reservation of the kernel-free path is granted (`alloc::grant`;
    /// the server's own writes through the mount may still use it, as
    /// ext4's reserved blocks serve root), and the data device's.
    pub blocks_avail: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
    /// Of `blocks` and `blocks_free`, those on the data device (0 without
    /// one); the rest are on PM.
    pub data_blocks: u64,
    pub data_blocks_free: u64,
}

/// setxattr flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XattrFlags {
    #[default]
    Any,
    /// XATTR_CREATE: fail with EEXIST if present.
    Create,
    /// XATTR_REPLACE: fail with ENODATA if absent.
    Replace,
}

impl XattrFlags {
    pub fn from_bits(bits: i32) -> crate::Result<XattrFlags> {
        match bits {
            0 => Ok(XattrFlags::Any),
            libc::XATTR_CREATE => Ok(XattrFlags::Create),
            libc::XATTR_REPLACE => Ok(XattrFlags::Replace),
            _ => crate::error::errno(libc::EINVAL),
        }
    }
}

/// fallocate(2) modes supported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FallocFlags {
    pub keep_size: bool,
    pub punch_hole: bool,
    pub zero_range: bool,
    /// FALLOC_FL_COLLAPSE_RANGE: remove the range, the rest of the file
    /// moves down (offset and length block-aligned, the range ends before
    /// the end of file).
    pub collapse_range: bool,
    /// FALLOC_FL_INSERT_RANGE: insert a hole, the rest of the file moves
    /// up (offset and length block-aligned, offset inside the file).
    pub insert_range: bool,
}

impl FallocFlags {
    /// From FALLOC_FL_* bits, checked as vfs_fallocate (Linux 6.18) checks
    /// them: one mode (allocate, punch, zero, collapse, insert), KEEP_SIZE
    /// required by punch and refused by collapse and insert; anything else
    /// (unknown bits, UNSHARE_RANGE, WRITE_ZEROES, two modes) is EOPNOTSUPP.
    pub fn from_bits(bits: i32) -> crate::Result<FallocFlags> {
        let modes = libc::FALLOC_FL_PUNCH_HOLE
            | libc::FALLOC_FL_ZERO_RANGE
            | libc::FALLOC_FL_COLLAPSE_RANGE
            | libc::FALLOC_FL_INSERT_RANGE;
        if bits & !(modes | libc::FALLOC_FL_KEEP_SIZE) != 0 {
            return crate::error::errno(libc::EOPNOTSUPP);
        }
        let f = FallocFlags {
            keep_size: bits & libc::FALLOC_FL_KEEP_SIZE != 0,
            punch_hole: bits & libc::FALLOC_FL_PUNCH_HOLE != 0,
            zero_range: bits & libc::FALLOC_FL_ZERO_RANGE != 0,
            collapse_range: bits & libc::FALLOC_FL_COLLAPSE_RANGE != 0,
            insert_range: bits & libc::FALLOC_FL_INSERT_RANGE != 0,
        };
        f.check()?;
        Ok(f)
    }

    /// The combinations Linux accepts (see `from_bits`); EOPNOTSUPP else.
    pub fn check(&self) -> crate::Result<()> {
        let modes = [
            self.punch_hole,
            self.zero_range,
            self.collapse_range,
            self.insert_range,
        ];
        if modes.iter().filter(|&&m| m).count() > 1
            || (self.punch_hole && !self.keep_size)
            || (self.shifts() && self.keep_size)
        {
            return crate::error::errno(libc::EOPNOTSUPP);
        }
        Ok(())
    }

    /// Collapse or insert: the call moves the file's pages.
    pub fn shifts(&self) -> bool {
        self.collapse_range || self.insert_range
    }
}

/// One extent of a file's data, as FIEMAP reports it (`Fs::fiemap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FiemapExtent {
    /// Byte offset in the file.
    pub logical: u64,
    /// Byte offset in the pool, or on the data device when
    /// `flags.device` (a hybrid pool's device extent).
    pub physical: u64,
    /// Bytes (a multiple of the block size).
    pub length: u64,
    pub flags: FiemapFlags,
}

/// FIEMAP_EXTENT_* flags inkfs can report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FiemapFlags {
    /// FIEMAP_EXTENT_LAST: the file's last extent.
    pub last: bool,
    /// The extent is on a hybrid pool's data device and `physical` is a
    /// byte offset on that device, not in the pool. Linux has no FIEMAP
    /// flag for this: XFS reports a realtime file's extents (which live on
    /// its realtime device) the same way, device offsets with no flag, so
    /// `bits()` does not show it either.
    pub device: bool,
}

impl FiemapFlags {
    /// The FIEMAP_EXTENT_* bits (linux/fiemap.h).
    pub fn bits(&self) -> u32 {
        const FIEMAP_EXTENT_LAST: u32 = 0x1;
        if self.last {
            FIEMAP_EXTENT_LAST
        } else {
            0
        }
    }
}

/// lseek whence values the engine answers (SEEK_SET/CUR/END are the caller's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Whence {
    Data,
    Hole,
}
