//! Regular files opened by the kernel alone (mount option `kernel_open`,
//! `Caching::kernel_open`): the server answers the first OPEN with ENOSYS,
//! after which the kernel sends neither OPEN nor RELEASE for regular files
//! (fs/fuse/file.c: `fc->no_open`) and every READ, WRITE, SETATTR of an
//! open file, FALLOCATE and COPY_FILE_RANGE comes with fh 0. Two round
//! trips fewer per open(2)/close(2) pair. CREATE is answered ENOSYS too:
//! the kernel then creates with MKNOD and opens the new file itself (no
//! RELEASE), where a CREATE's file would get a RELEASE until the first
//! OPEN was refused, which a run of creations (untar) never sends.
//!
//! Those requests are served through one engine handle per inode
//! ([`KernelOpens`]), opened read-write with root's credentials at the
//! first request that needs it: the kernel checked the caller's access at
//! open(2) (`default_permissions`, which the option needs), as our handle
//! of its OPEN used to record. The handle is released when the kernel's
//! lookup count of the inode ends (its FORGET, `crate::kernel_refs`):
//! the kernel holds the inode as long as any descriptor, mapping or
//! pending write-back refers to it, so an unlinked file stays readable and
//! writable until its last close, as POSIX promises, and is freed at the
//! FORGET that follows (the removal's pin, `InkFuse::removing`, keeps it
//! too). After a crash it is an orphan recovery frees, as before.
//!
//! What a per-open handle gave that this cannot (why the option is posix
//! mode with the writeback cache only, and off by default):
//! - the open's refusal of writers of immutable and append-only files
//!   (`chattr +i`, `+a`): the kernel does not know those flags, so such a
//!   write lands in the page cache and is refused at its write-back
//!   (reported at fsync and close, the pages dropped by `crate::inval`);
//! - `FOPEN_DIRECT_IO` per open (append-only files under the cache, O_APPEND
//!   opens without it): every open gets the kernel's no-open default,
//!   `FOPEN_KEEP_CACHE`;
//! - O_TRUNC at OPEN (`FUSE_ATOMIC_O_TRUNC`): not asked for on such a
//!   mount, so the kernel truncates with a SETATTR of the size, which
//!   `fuse_setattr` would otherwise skip as "done by OPEN".
//!
//! Ownership: the mount server's, DRAM only; shared by the FUSE worker
//! threads. No global lock: 64 shards by inode number; a request holds its
//! shard's read lock while it uses the handle, so the FORGET that takes
//! it out (write lock) waits for requests in flight.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::RwLock;

use fuser::FopenFlags;
use inkfs::api::{self, inode_flags, Credentials, File, OpenFlags};

use crate::fs::Caching;

use crate::handles::IntHasher;
use crate::Engine;

const SHARDS: usize = 64;

type Shard = RwLock<HashMap<u64, File, BuildHasherDefault<IntHasher>>>;

/// One engine handle per regular file the kernel has open (see the module
/// comment).
pub struct KernelOpens {
    shards: Box<[Shard]>,
}

impl Default for KernelOpens {
    fn default() -> Self {
        KernelOpens {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
        }
    }
}

impl KernelOpens {
    fn shard(&self, ino: u64) -> &Shard {
        &self.shards[(ino % SHARDS as u64) as usize]
    }

    /// Run `f` on `ino`'s handle, opened first if there is none. `f` must
    /// not use the table.
    pub fn with<T>(
        &self,
        engine: &Engine,
        ino: u64,
        f: impl FnOnce(&File) -> api::Result<T>,
    ) -> api::Result<T> {
        {
            // A poisoned shard only means a request panicked; the map is
            // still consistent.
            let shard = self.shard(ino).read().unwrap_or_else(|p| p.into_inner());
            if let Some(file) = shard.get(&ino) {
                return f(file);
            }
        }
        let file = open(engine, ino)?;
        {
            let mut shard = self.shard(ino).write().unwrap_or_else(|p| p.into_inner());
            match shard.entry(ino) {
                // Another request opened it meanwhile.
                Entry::Occupied(_) => engine.release(file),
                Entry::Vacant(v) => {
                    v.insert(file);
                }
            }
        }
        let shard = self.shard(ino).read().unwrap_or_else(|p| p.into_inner());
        match shard.get(&ino) {
            Some(file) => f(file),
            // Only a FORGET takes it out, and the kernel sends none while
            // a request on the inode is in flight.
            None => Err(api::Error::Errno(libc::EBADF)),
        }
    }

    /// The kernel forgot `ino`: release its handle (freeing the inode if
    /// it has no name left and nothing else holds it).
    pub fn forgotten(&self, engine: &Engine, ino: u64) {
        let file = self
            .shard(ino)
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ino);
        if let Some(file) = file {
            engine.release(file);
        }
    }

    /// Every handle still held (teardown after the kernel went away).
    pub fn drain(&self, engine: &Engine) {
        for shard in self.shards.iter() {
            let taken: Vec<File> = shard
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .drain()
                .map(|(_, f)| f)
                .collect();
            for file in taken {
                engine.release(file);
            }
        }
    }

    /// Handles held now (statistics and tests).
    pub fn held(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }
}

/// `ino` opened for the kernel: read-write where the engine allows it
/// (an immutable file, or a read-only mount, refuses writers: then
/// read-only, and a write-back is refused as it would have been at the
/// write). Partial pages are filled by reading through it.
fn open(engine: &Engine, ino: u64) -> api::Result<File> {
    let root = Credentials::root();
    let file = match engine.open(&root, ino, OpenFlags::new(libc::O_RDWR)) {
        Ok(f) => f,
        Err(e) if matches!(e.errno(), libc::EPERM | libc::EROFS | libc::EACCES) => {
            engine.open(&root, ino, OpenFlags::new(libc::O_RDONLY))?
        }
        Err(e) => return Err(e),
    };
    file.allow_cache_fill();
    Ok(file)
}

/// The open flags for `file`, opened with `flags`, and what the
/// writeback cache needs of it (see fs.rs's module comment): the
/// server's open, where the kernel does not open files itself.
pub fn flags(
    engine: &Engine,
    caching: Caching,
    file: &File,
    flags: i32,
) -> api::Result<FopenFlags> {
    let writes = flags & libc::O_ACCMODE != libc::O_RDONLY;
    if !caching.writeback {
        // Written through: an O_APPEND open is uncached, so that each
        // write(2) reaches us whole, as one request that the engine
        // places at its end of file atomically. Through the page cache
        // the kernel cuts a write at every page it has not read (each
        // piece a request of its own, at the end as it then is), and
        // places the data in its pages at its own end of file, stale
        // once a client appended under a lease: a lease granted between
        // two pieces let a client's record land inside ours.
        if writes && flags & libc::O_APPEND != 0 {
            return Ok(crate::fs::OPEN_FLAGS | FopenFlags::FOPEN_DIRECT_IO);
        }
        return Ok(crate::fs::OPEN_FLAGS);
    }
    if !writes {
        return Ok(crate::fs::OPEN_FLAGS);
    }
    file.allow_cache_fill();
    // An append-only file grows only at its end, and a write-back
    // rewrites whole pages from their start: such a file is written
    // through, uncached, as without the cache.
    if engine.get_flags(file.ino())? & inode_flags::APPEND != 0 {
        return Ok(crate::fs::OPEN_FLAGS | FopenFlags::FOPEN_DIRECT_IO);
    }
    Ok(crate::fs::OPEN_FLAGS)
}
