//! The engine's hooks into the block side, for `file.rs`'s data path and
//! `fs.rs`'s space accounting: read file bytes wherever they are, choose a
//! side for new pages, allocate there (or on the other side when one is
//! full), write and flush device blocks.
//!
//! A pool without a data device takes the PM branch of every hook (one
//! comparison of a block number, or `self.data` being None).

use super::dev::Page;
use super::store::{DataStore, Side};
use crate::error::{Error, Result};
use crate::format::*;
use crate::fs::Fs;
use crate::pmem::Pmem;

/// Blocks an appending file reserves on PM at a time (ext4-like
/// per-inode preallocation; see `file.rs`).
pub const PM_PREALLOC_BLOCKS: u64 = 16;

/// The first byte address of the device side.
pub const DEV_BYTES_BASE: u64 = DEV_BLOCK_BASE * BLOCK_SIZE;

/// A device error as the errno the caller sees (EIO when the OS gave none).
pub fn io_errno(e: std::io::Error) -> Error {
    Error::Errno(e.raw_os_error().unwrap_or(libc::EIO))
}

impl<P: Pmem> Fs<P> {
    fn store_or_corrupt(&self, what: u64) -> Result<&DataStore> {
        self.data.as_ref().ok_or_else(|| {
            Error::Corrupt(format!(
                "block {what} is on a data device, and this pool has none"
            ))
        })
    }

    /// Read the file bytes at byte address `at` (a block number times
    /// `BLOCK_SIZE`, plus an offset), on PM or on the device.
    pub(crate) fn data_read(&self, at: u64, buf: &mut [u8]) -> Result<()> {
        self.data_read_ahead_to(at, buf, u64::MAX, false)
    }

    /// `data_read` for `Fs::read`: a device read here reads ahead no
    /// further than block `ahead_limit` (the end of the file's device
    /// blocks that follow, `readahead_limit`); `file_start`: the read is
    /// at offset 0 of its file.
    pub(crate) fn data_read_ahead_to(
        &self,
        at: u64,
        buf: &mut [u8],
        ahead_limit: u64,
        file_start: bool,
    ) -> Result<()> {
        if at < DEV_BYTES_BASE {
            self.pm.read(at, buf);
            return Ok(());
        }
        self.store_or_corrupt(at / BLOCK_SIZE)?
            .read_ahead_to(at, buf, ahead_limit, file_start)
            .map_err(io_errno)
    }

    /// Where the new pages of a write of `bytes` go (always PM without a
    /// data device): `Placement::choose` with PM's free space.
    pub(crate) fn place(&self, bytes: u64) -> Side {
        match &self.data {
            None => Side::Pm,
            // A client's allocator holds only its reservation, which says
            // nothing of PM's free space: by size alone.
            Some(d) if self.is_client() => d.policy.by_size(bytes),
            Some(d) => d.policy.choose(
                bytes,
                self.blocks.free_blocks(),
                self.blocks.capacity_blocks(),
            ),
        }
    }

    /// Blocks an appending file reserves at a time on `side`.
    pub(crate) fn prealloc_blocks(&self, side: Side) -> u64 {
        match (side, &self.data) {
            (Side::Dev, Some(d)) => d.policy.unit_blocks,
            _ => PM_PREALLOC_BLOCKS,
        }
    }

    /// Up to `want` blocks for file data on `side`, starting at `goal`
    /// when it is free and on that side; on the other side when `side` is
    /// full. None: both are full.
    ///
    /// A client engine's allocator holds only its reservation, so an empty
    /// side means "ask the server", not "full": it spills only to get
    /// round a side the server said is full (`client_side_full`).
    pub(crate) fn alloc_file_blocks(&self, side: Side, goal: u64, want: u64) -> Option<(u64, u64)> {
        let goal_on = |s: Side| if Side::of(goal) == s { goal } else { 0 };
        let pm = || self.blocks.alloc_near(self.lane(), goal_on(Side::Pm), want);
        match &self.data {
            None => pm(),
            Some(d) => {
                let dev = || d.blocks.alloc_near(self.lane(), goal_on(Side::Dev), want);
                let spill = |full: Side| !self.is_client() || self.client_side_full(full);
                match side {
                    Side::Dev => dev().or_else(|| spill(Side::Dev).then(pm).flatten()),
                    Side::Pm => pm().or_else(|| spill(Side::Pm).then(dev).flatten()),
                }
            }
        }
    }

    /// Return blocks of either side to their allocator.
    pub(crate) fn free_on_side(&self, start: u64, len: u64) -> std::result::Result<(), crate::alloc::AllocError> {
        match (Side::of(start), &self.data) {
            (Side::Dev, Some(d)) => d.blocks.free(start, len),
            _ => self.blocks.free(start, len),
        }
    }

    /// Blocks starting at `block` entered (`n > 0`) or left inodes'
    /// reservations, on `block`'s side.
    pub(crate) fn reserved_changed_at(&self, block: u64, n: i64) {
        match (Side::of(block), &self.data) {
            (Side::Dev, Some(d)) => d.reserved_changed(n),
            _ => self.reserved_changed(n),
        }
    }

    /// Write `pages` to device blocks from `block` (not durable yet);
    /// `keep`: the DRAM cache keeps a copy (`DataStore::write`).
    pub(crate) fn dev_write(&self, block: u64, pages: &[Page], keep: bool) -> Result<()> {
        self.store_or_corrupt(block)?
            .write(block, pages, keep)
            .map_err(io_errno)
    }

    /// Run `f` with a write buffer of `WRITE_RUN_PAGES` pages lent by the
    /// store of device block `block` (`DataStore::with_write_buf`).
    pub(crate) fn with_dev_write_buf<R>(
        &self,
        block: u64,
        f: impl FnOnce(&mut [Page]) -> Result<R>,
    ) -> Result<R> {
        self.store_or_corrupt(block)?.with_write_buf(f)
    }

    /// Make every device write completed so far durable (group commit);
    /// nothing to do without a device.
    pub(crate) fn dev_sync(&self) -> Result<()> {
        match &self.data {
            Some(d) => d.sync().map_err(io_errno),
            None => Ok(()),
        }
    }

    /// Add blocks of either side to the allocator of their side (a
    /// client's reservation).
    pub(crate) fn add_free_on_side(&self, start: u64, len: u64) -> std::result::Result<(), crate::alloc::AllocError> {
        match (Side::of(start), &self.data) {
            (Side::Dev, Some(d)) => d.blocks.free(start, len),
            (Side::Dev, None) => Err(crate::alloc::AllocError::OutOfRange { start, len }),
            (Side::Pm, _) => self.blocks.free(start, len),
        }
    }

    /// Up to `want` free device blocks in at most `ranges_max` ranges (for
    /// a client's reservation), dropped from the DRAM cache (the client
    /// writes them behind its back); empty without a data device or when
    /// it is full.
    pub(crate) fn reserve_dev(&self, want: u64, ranges_max: usize) -> Vec<(u64, u64)> {
        let Some(d) = &self.data else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut left = want;
        while left > 0 && out.len() < ranges_max {
            match d.blocks.alloc(self.lane(), left) {
                Some((start, len)) => {
                    out.push((start, len));
                    left -= len;
                }
                None => break,
            }
        }
        d.forget(&out);
        out
    }

    /// The server's DRAM cache forgets `ranges` (their device blocks): a
    /// client may have written them.
    pub(crate) fn forget_cached(&self, ranges: &[(u64, u64)]) {
        if let (Some(d), false) = (&self.data, self.is_client()) {
            d.forget(ranges);
        }
    }

    /// Announce this engine's device writes in, and check its DRAM cache
    /// of device blocks against, the shared write stamps of `table` (the
    /// epoch table every process of the pool maps: stamps.rs). A client
    /// calls it before its first read; the owner when it shares the pool.
    pub fn data_use_stamps(&self, table: crate::epoch::SharedTable) {
        if let Some(d) = &self.data {
            d.use_stamps(table);
        }
    }

    /// Counters of the block side since mount (None: no data device).
    pub fn data_stats(&self) -> Option<super::DataStats> {
        self.data.as_ref().map(|d| d.stats())
    }

    /// What the data device is, for `inkfs stat` (None: no data device).
    pub fn data_device_description(&self) -> Option<String> {
        self.data.as_ref().map(|d| d.device().describe())
    }
}
