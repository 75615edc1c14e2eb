//! inkfs: a crash-consistent, NOVA-style log-structured file system for
//! persistent memory, in user space.
//!
//! Module map (one concern each):
//! - [`pmem`]: the persistence layer (mapped pools, flush/fence, crash simulator)
//! - [`format`]: every on-media structure (docs/FORMAT.md)
//! - [`superblock`]: formatting a pool and validating its superblocks
//! - [`alloc`]: per-lane block and inode-slot allocators (DRAM)
//! - [`log`]: per-inode logs: append, link pages, walk
//! - [`journal`]: the lite redo journal for multi-inode operations
//! - [`inode`]: inode records, tables, DRAM state rebuilt from logs, cache
//! - [`extents`], [`dir`]: DRAM indexes of files and directories
//! - [`fs`]: mount/unmount, attributes, handles, commit helpers
//! - [`namei`]: namespace operations; [`file`]: data operations; [`xattr`]
//! - [`shift`]: collapse and insert range; [`fiemap`]: extent reports
//! - [`flags`]: inode flags (chattr): storage and the immutable/append-only rules
//! - [`gc`]: log compaction; [`recovery`]: crash rebuild
//! - [`health`]: corruption met while mounted (errors= policy, error record)
//! - [`scrub`]: online check of a mounted pool
//! - [`fsck`]: offline consistency check and repair
//! - [`crashtest`]: crash exploration (ACE-style workloads on the simulator)

pub mod alloc;
pub mod crashtest;
pub mod dir;
pub mod error;
pub mod extents;
pub mod fiemap;
pub mod file;
pub mod filemap;
pub mod flags;
pub mod format;
pub mod fs;
pub mod fsck;
pub mod gc;
pub mod health;
pub mod inode;
pub mod journal;
pub mod log;
pub mod namei;
pub mod pagetable;
pub mod perm;
pub mod pmem;
pub mod recovery;
pub mod scrub;
pub mod shift;
pub mod superblock;
// Test and bench support (one seeded RNG, one median), not part of the file
// system; self-contained, meant to move behind a `testing` feature.
#[doc(hidden)]
pub mod testkit;
pub mod time;
pub mod types;
pub mod xattr;

pub use error::{Error, Result};
pub use fs::{FileHandle, Fs, MountReport};
