//! The types of the public engine API (shared by the FUSE mount, the C ABI
//! and the preload library).

pub use crate::format::inode_flags;
pub use crate::format::FileKind;

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

/// rename(2) flags (renameat2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
}

impl RenameFlags {
    /// From the Linux RENAME_* bits; unknown bits (RENAME_WHITEOUT) → EINVAL.
    pub fn from_bits(bits: u32) -> crate::Result<RenameFlags> {
        const NOREPLACE: u32 = 1;
        const EXCHANGE: u32 = 2;
        if bits & !(NOREPLACE | EXCHANGE) != 0 || bits == NOREPLACE | EXCHANGE {
            return crate::error::errno(libc::EINVAL);
        }
        Ok(RenameFlags {
            noreplace: bits & NOREPLACE != 0,
            exchange: bits & EXCHANGE != 0,
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
    pub blocks: u64,
    pub blocks_free: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
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
}

impl FallocFlags {
    /// From FALLOC_FL_* bits; unsupported combinations → EOPNOTSUPP/EINVAL as Linux.
    pub fn from_bits(bits: i32) -> crate::Result<FallocFlags> {
        let known =
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if bits & !known != 0 {
            return crate::error::errno(libc::EOPNOTSUPP);
        }
        let f = FallocFlags {
            keep_size: bits & libc::FALLOC_FL_KEEP_SIZE != 0,
            punch_hole: bits & libc::FALLOC_FL_PUNCH_HOLE != 0,
            zero_range: bits & libc::FALLOC_FL_ZERO_RANGE != 0,
        };
        if f.punch_hole && (!f.keep_size || f.zero_range) {
            return crate::error::errno(libc::EINVAL);
        }
        Ok(f)
    }
}

/// lseek whence values the engine answers (SEEK_SET/CUR/END are the caller's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Whence {
    Data,
    Hole,
}
