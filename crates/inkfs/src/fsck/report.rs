//! What fsck tells its caller: each problem found (kind, severity, the
//! inode concerned, whether fsck can and did repair it), progress of a long
//! check, and the report with its totals and e2fsck-style exit code. Kept
//! apart from the check so the CLI and the tests read the vocabulary
//! without the machinery.

use std::fmt;

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
    /// A hybrid pool's data device is missing, or is not the one the
    /// superblock names (another pool's, formatted again, truncated).
    DataDevice,
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
            ProblemKind::DataDevice => "data-device",
        }
    }

    /// Damage that keeps the repair mount from working (the mount's
    /// recovery scan would refuse it), when fsck has no fix for it.
    pub(super) fn blocks_repair(self) -> bool {
        matches!(
            self,
            ProblemKind::InodeTable
                | ProblemKind::InodeRecord
                | ProblemKind::Log
                | ProblemKind::Root
                | ProblemKind::Journal
                | ProblemKind::BlockRange
                | ProblemKind::BlockTwice
                | ProblemKind::DataDevice
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
    /// Hybrid pools: the data device's data blocks, and those file extents
    /// use (both 0 without a data device).
    pub data_blocks_total: u64,
    pub data_blocks_used: u64,
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
