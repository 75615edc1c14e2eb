//! Hybrid pools: metadata on PM, bulk file data on a block device (the
//! FSMAC design; docs/DESIGN.md "Hybrid pools", docs/FORMAT.md "Data
//! device").
//!
//! Everything that is not file data stays on PM: logs, inode tables, the
//! journals, directories, symlink targets, and file data written in small
//! pieces. A file's large writes put their pages on the data device, named
//! in the file's FILE_WRITE entries by block numbers from
//! `DEV_BLOCK_BASE`, so the logs, the DRAM indexes, log GC, recovery and
//! fsck carry device blocks exactly as PM blocks; only the bytes move
//! elsewhere. The ordering rule of every mode holds across the two: the
//! device blocks an entry names are written and flushed before the log
//! tail that commits the entry is stored.
//!
//! The pieces, one file each:
//! - `dev.rs`: the [`BlockDev`] trait, page-aligned buffers, [`FileDev`]
//!   (a block device or a file on another file system, O_DIRECT);
//! - `layout.rs`: the device's label and free-list save area;
//! - `flush.rs`: group commit of the device flush;
//! - `deferred.rs`: posix appends committed after one flush shared by
//!   many (their tails stored after it);
//! - `cache.rs`: the DRAM cache of device blocks;
//! - `bounce.rs`: aligned buffers for reads that bypass the cache;
//! - `readahead.rs`: reads ahead of sequential readers, on threads;
//! - `hugebuf.rs`: readahead's read buffers, on transparent huge pages;
//! - `stamps.rs`: every process's device writes announced in shared
//!   memory, which keeps each process's cache coherent with the others';
//! - `store.rs`: the block side of a mounted pool (device, allocator,
//!   cache, flush, placement, counters);
//! - `attach.rs`: finding, checking and attaching the device at mount;
//! - `engine.rs`: the engine's hooks (read, placement, allocation, device
//!   writes and flushes for `file.rs`).
//!
//! The crash model of the device (writes lost or kept, each on its own,
//! until a flush) is in the simulator, `pmem::SimDevice`.

pub mod dev;

macro_rules! internal {
    ($($name:ident),* $(,)?) => {$(
        #[cfg(feature = "testing")]
        pub mod $name;
        #[cfg(not(feature = "testing"))]
        #[allow(dead_code)]
        pub(crate) mod $name;
    )*};
}

internal!(
    attach, bounce, cache, deferred, engine, flush, hugebuf, layout, readahead, stamps, store
);

pub use attach::{HybridFormat, DATA_THRESHOLD_DEFAULT, DATA_UNIT_DEFAULT_BLOCKS};
pub use dev::{BlockDev, FileDev, Page};
pub use store::{DataStats, Side};

use std::io;
use std::sync::Mutex;

/// A block device in DRAM with no crash model (every write is durable at
/// once): for tests and examples that need a data device but no crashes.
#[derive(Debug)]
pub struct MemDev {
    bytes: Mutex<Vec<u8>>,
    flushes: std::sync::atomic::AtomicU64,
}

impl MemDev {
    pub fn new(size_bytes: u64) -> MemDev {
        MemDev {
            bytes: Mutex::new(vec![0; size_bytes as usize]),
            flushes: Default::default(),
        }
    }
    /// Flushes issued so far.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// A copy of the contents.
    pub fn image(&self) -> Vec<u8> {
        self.bytes.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    /// A device holding `image`.
    pub fn from_image(image: Vec<u8>) -> MemDev {
        MemDev {
            bytes: Mutex::new(image),
            flushes: Default::default(),
        }
    }
    fn range(&self, off: u64, len: usize) -> io::Result<std::ops::Range<usize>> {
        let size = self.size_bytes();
        match off.checked_add(len as u64) {
            Some(end) if end <= size => Ok(off as usize..end as usize),
            _ => Err(io::Error::from_raw_os_error(libc::EIO)),
        }
    }
}

impl BlockDev for MemDev {
    fn size_bytes(&self) -> u64 {
        self.bytes.lock().unwrap_or_else(|p| p.into_inner()).len() as u64
    }
    fn read_at(&self, off: u64, buf: &mut [Page]) -> io::Result<()> {
        let out = dev::as_bytes_mut(buf);
        let r = self.range(off, out.len())?;
        out.copy_from_slice(&self.bytes.lock().unwrap_or_else(|p| p.into_inner())[r]);
        Ok(())
    }
    fn write_at(&self, off: u64, data: &[Page]) -> io::Result<()> {
        let data = dev::as_bytes(data);
        let r = self.range(off, data.len())?;
        self.bytes.lock().unwrap_or_else(|p| p.into_inner())[r].copy_from_slice(data);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.flushes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    fn describe(&self) -> String {
        "memory (tests)".into()
    }
}
