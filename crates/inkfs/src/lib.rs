//! inkfs: a crash-consistent, NOVA-style log-structured file system for
//! persistent memory, in user space.
//!
//! Programs use [`api`]: mount a pool, then create, read and write files
//! with the caller's credentials; the engine applies POSIX's permission
//! rules and keeps every call crash-consistent in the chosen mode.
//!
//! ```
//! use inkfs::api::{Credentials, Filesystem, Follow, MountOptions, OpenFlags, ROOT_INO};
//! # fn main() -> inkfs::api::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let pool = dir.path().join("example.pool");
//! Filesystem::create_pool(&pool, 16 << 20, &Default::default())?; // mkfs
//! let fs = Filesystem::open_pool(&pool, MountOptions::default())?;
//! let me = Credentials::current_process();
//! let dir = fs.mkdir(&me, ROOT_INO, b"notes", 0o755)?;
//! let flags = OpenFlags::new(libc::O_RDWR | libc::O_CREAT | libc::O_EXCL);
//! let (_, file) = fs.create(&me, dir.ino, b"today", 0o644, flags)?;
//! fs.write(&file, 0, b"durable on return")?;
//! let mut buf = [0u8; 7];
//! fs.read(&file, 0, &mut buf)?;
//! assert_eq!(&buf, b"durable");
//! fs.release(file);
//! let found = fs.resolve(&me, ROOT_INO, b"/notes/today", Follow::Yes)?;
//! assert_eq!(found.size, 17);
//! fs.unmount()?;
//! # Ok(()) }
//! ```
//!
//! Public modules: [`api`] (the surface), [`types`] and [`error`] (what it
//! speaks in), [`pmem`] (pools: mapping, claiming, flushing), [`fsck`]
//! (offline check and repair), [`scrub`] (the online check's report),
//! `crashtest` (crash exploration; the `crashtest` feature).
//!
//! Internal modules (one concern each; public only with the `testing`
//! feature, for the engine's own tests): `format` (every on-media
//! structure, docs/FORMAT.md), `superblock`, `alloc` (per-lane block and
//! inode-slot allocators), `log` (per-inode logs), `journal` (the lite redo
//! journal), `inode` (records, tables, DRAM state rebuilt from logs),
//! `extents`, `pagetable`, `filemap`, `dir` (DRAM indexes), `fs` (mount,
//! attributes, handles, commit helpers), `namei` (namespace operations),
//! `rename`,
//! `file` (data operations), `xattr`, `shift` (collapse/insert range),
//! `fiemap`, `flags` (chattr), `perm` (POSIX permission rules), `gc` (log
//! GC), `recovery` (crash rebuild), `health` (errors met while mounted);
//! the kernel-free path's engine side: `shared`, `epoch`, `shm` (a pool
//! other processes read), `lease` (client engines writing under leases),
//! `recycle` (a client's displaced blocks), `blockset` (the server's books
//! of a lease's blocks).

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
pub mod blockdev;
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
    alloc, blockset, dir, epoch, extents, fiemap, file, filemap, flags, format, fs, gc, health,
    holds, inode, inthash, journal, lanechunks, lanelease, lease, log, namei, pagetable, perm,
    recovery, recycle, rename, rmlocal, shared, shift, shm, superblock, time, xattr,
);

pub use error::{Error, Result};
#[cfg(feature = "testing")]
pub use fs::{FileHandle, Fs, MountReport};
