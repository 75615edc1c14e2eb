//! The persistence layer: the one door through which the engine touches
//! persistent memory.
//!
//! Every byte the engine reads from or stores to a pool goes through
//! [`Pmem`]. The engine is generic over it, so the production backend
//! ([`MappedPool`]) is monomorphised into plain loads, stores and cache-line
//! write-backs — no dynamic dispatch and no per-store bookkeeping — while the
//! tests swap in the crash simulator (`SimPool`), which records every store,
//! flush and fence and can hand back the images a power cut could leave.
//!
//! Durability contract (x86 ADR model, see docs/FORMAT.md "Crash model"):
//! - `write`/`write_u64` are ordinary cached stores: they reach the
//!   persistence domain only once their lines are `flush`ed *and* a `fence`
//!   follows.
//! - `copy_nt`/`zero_nt` are non-temporal: they need no flush, only a fence.
//! - `write_u64` at an 8-byte aligned offset is the unit of failure
//!   atomicity: after a crash it holds the old or the new value, never a mix.

mod cpu;
mod lock;
mod map;
#[cfg(any(test, feature = "crashtest"))]
mod sim;

pub use cpu::{detect_flush_method, FlushMethod};
pub use lock::{probe as probe_pool, Holder, PoolBusy, PoolFile, FINISHING_WAIT};
pub use map::{MappedPool, OpenOptions as PoolOpenOptions};
#[cfg(any(test, feature = "crashtest"))]
pub use sim::{CrashImage, CrashImages, Killed, SimDevice, SimPool, SimTrace};

/// A cache line: the unit in which the hardware writes back to media.
pub const CACHE_LINE: u64 = 64;

/// Where a pool lives, which decides how bytes are made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// `/dev/daxX.Y`: persistent memory mapped directly, cache flushes persist.
    DeviceDax,
    /// A file on a DAX file system mapped with MAP_SHARED_VALIDATE|MAP_SYNC.
    FsDaxMapSync,
    /// A file on tmpfs or /dev/shm: DRAM standing in for PM (the standard way
    /// PM file systems are evaluated). Same instructions as real PM.
    Dram,
    /// A plain file on a disk file system: cache flushes do not persist, so
    /// every flush is an msync of the covered pages.
    MsyncFile,
    /// The crash simulator (tests only).
    Simulated,
}

impl BackendKind {
    pub fn describe(self) -> &'static str {
        match self {
            BackendKind::DeviceDax => "device DAX",
            BackendKind::FsDaxMapSync => "fs-DAX file (MAP_SYNC)",
            BackendKind::Dram => "DRAM (tmpfs/shm or hugetlbfs file, PM stand-in)",
            BackendKind::MsyncFile => "plain file (msync, slow)",
            BackendKind::Simulated => "crash simulator",
        }
    }
}

/// What `inkfs stat` reports about the backend a pool was opened with.
#[derive(Clone, Debug)]
pub struct BackendInfo {
    pub kind: BackendKind,
    pub flush: FlushMethod,
    pub size_bytes: u64,
}

/// The persistence API. Offsets are bytes from the start of the pool.
///
/// Implementations panic on an out-of-range access: the engine validates
/// every offset it derives from media before using it, so an out-of-range
/// access is an engine bug, not bad input.
pub trait Pmem: Send + Sync + 'static {
    fn size_bytes(&self) -> u64;
    fn info(&self) -> BackendInfo;

    /// Copy `buf.len()` bytes at `off` into `buf`.
    fn read(&self, off: u64, buf: &mut [u8]);
    /// 8-byte aligned atomic load.
    fn read_u64(&self, off: u64) -> u64;

    /// Cached stores; durable after `flush` + `fence`.
    fn write(&self, off: u64, data: &[u8]);
    /// 8-byte aligned atomic store (`off % 8 == 0`); durable after `flush` + `fence`.
    fn write_u64(&self, off: u64, value: u64);
    /// Non-temporal copy of bulk data (file pages); durable after `fence`.
    fn copy_nt(&self, off: u64, data: &[u8]);
    /// Non-temporal zeroing; durable after `fence`.
    fn zero_nt(&self, off: u64, len: u64);

    /// Write back every cache line that overlaps `[off, off + len)`.
    fn flush(&self, off: u64, len: u64);
    /// Order: every flush and non-temporal store issued before is durable
    /// before any store issued after.
    fn fence(&self);

    /// Flush + fence: the common "make this range durable now".
    #[inline]
    fn persist(&self, off: u64, len: u64) {
        self.flush(off, len);
        self.fence();
    }

    /// Make everything durable, whatever its state (clean unmount).
    fn sync_all(&self) -> std::io::Result<()>;

    /// A hint that the next operation will store at `off`: translate its
    /// address now. Called in the shadow of a fence's drain, so that the
    /// page walk for a page never touched before does not wait behind the
    /// next operation's lock. No store, no effect on contents; a no-op
    /// where there is no mapping.
    #[inline]
    fn prefetch_store(&self, _off: u64) {}

    /// A hint that stores will land in `[off, off + len)` soon (blocks a
    /// client was just reserved): map those pages now, in one call, rather
    /// than take a page fault at the first store to each (on a DRAM pool in
    /// 4 KiB pages a write fault cost 1.5 µs here, more than a whole 4 KiB
    /// write). No store, no effect on contents; a no-op where there is
    /// nothing to map.
    #[inline]
    fn map_ahead(&self, _off: u64, _len: u64) {}

    /// Whether pages are still being mapped in the background
    /// (`MappedPool::populate_in_background`): until then some first stores
    /// take page faults. Reported by the mount's statistics.
    fn populating(&self) -> bool {
        false
    }

    /// The bytes `[off, off + len)` in place, for zero-copy reads, when the
    /// backend is a plain mapping; `None` means "copy with `read`". Callers
    /// must hold whatever lock keeps writers off those bytes meanwhile.
    fn mapped(&self, _off: u64, _len: u64) -> Option<&[u8]> {
        None
    }
}

/// Read a plain-old-data value (an on-media struct) at `off`.
///
/// Only used with the `#[repr(C)]` on-media types of `format`, for which
/// every bit pattern is a valid value.
pub fn read_pod<T: crate::format::Pod, P: Pmem + ?Sized>(pm: &P, off: u64) -> T {
    let mut value = T::zeroed();
    pm.read(off, value.as_bytes_mut());
    value
}

/// Store a plain-old-data value at `off` (cached; caller flushes).
pub fn write_pod<T: crate::format::Pod, P: Pmem + ?Sized>(pm: &P, off: u64, value: &T) {
    pm.write(off, value.as_bytes());
}

/// Touch every page of a fresh pool once, before it is formatted, so that
/// the page faults a tmpfs-backed pool takes on first use are not charged to
/// whatever runs next (benchmarks measure steady state this way). Writes
/// zeros: only for pools about to be formatted.
pub fn prefault<P: Pmem + ?Sized>(pm: &P) {
    let mut off = 0;
    while off + 8 <= pm.size_bytes() {
        pm.write_u64(off, 0);
        off += 4096;
    }
}
