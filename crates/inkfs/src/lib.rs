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
//! - [`crashtest`]: crash exploration (ACE-style workloads on the simulator;
//!   the `crashtest` feature)
//!
//! Front ends use [`api`] only; the other engine modules are internal
//! (public with the `testing` feature, for the engine's own tests).

/// Internal modules: `pub(crate)`, and public only with the `testing`
/// feature, which the engine's own tests and benchmarks enable (a
/// dev-dependency of the crate on itself) so they can reach inside. Items
/// only the tests, the crash harness or fsck use are dead code without it;
/// with it every item is public and none is reported, as before modules
/// were closed.
macro_rules! internal {
    ($($name:ident),* $(,)?) => {$(
        #[cfg(feature = "testing")]
        pub mod $name;
        #[cfg(not(feature = "testing"))]
        #[allow(dead_code)]
        pub(crate) mod $name;
    )*};
}

// The public surface: the API every front end calls, the value types and
// errors it speaks in, the pools it mounts, and the administration tools
// (fsck, scrub's report).
pub mod api;
pub mod error;
pub mod fsck;
pub mod pmem;
pub mod scrub;
pub mod types;

/// Test and benchmark support (one seeded RNG, one median): not part of
/// the file system, no engine internals; the crash simulator, the crash
/// exploration and the benchmark runner share it.
#[doc(hidden)]
pub mod testkit;

/// Crash exploration on the simulator (`inkfs crashtest`, the crash tests).
#[cfg(feature = "crashtest")]
pub mod crashtest;

internal!(
    alloc, dir, extents, fiemap, file, filemap, flags, format, fs, gc, health, inode, journal, log,
    namei, pagetable, perm, recovery, shift, superblock, time, xattr,
);

pub use error::{Error, Result};
#[cfg(feature = "testing")]
pub use fs::{FileHandle, Fs, MountReport};
