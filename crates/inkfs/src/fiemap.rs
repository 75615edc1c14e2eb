//! FIEMAP: where a file's data lives in the pool.
//!
//! The FUSE mount cannot serve it: the kernel answers FS_IOC_FIEMAP itself
//! (`ioctl_fiemap` in fs/ioctl.c, before any file system ioctl) and FUSE
//! has no `->fiemap`, so the ioctl fails with EOPNOTSUPP and never reaches
//! the server. This is for front ends that call the engine directly (the C
//! ABI, the LD_PRELOAD library).

use crate::error::{errno, Result};
use crate::format::*;
use crate::fs::{live, Fs};
use crate::inode::read;
use crate::pmem::Pmem;
use crate::types::{FiemapExtent, FiemapFlags};

impl<P: Pmem> Fs<P> {
    /// The extents of file `ino` that overlap bytes `[start, start + len)`,
    /// in file order, as FS_IOC_FIEMAP reports them: whole extents (the
    /// first may begin before `start`), maximal runs of pages on
    /// consecutive blocks, blocks kept past the end of file included, the
    /// file's last extent flagged LAST. A hybrid pool's device extents
    /// give their byte offset on the data device and are flagged `device`
    /// (as XFS gives a realtime file's). Never UNWRITTEN: fallocate maps
    /// blocks it has zeroed (the pool has no unwritten state). Other kinds
    /// of inode hold no file data: no extents. As fiemap_prep: `len == 0`
    /// is EINVAL, `start` past the largest file EFBIG.
    pub fn fiemap(&self, ino: u64, start: u64, len: u64) -> Result<Vec<FiemapExtent>> {
        if len == 0 {
            return errno(libc::EINVAL);
        }
        if start >= MAX_FILE_BYTES {
            return errno(libc::EFBIG);
        }
        let end = start.saturating_add(len).min(MAX_FILE_BYTES);
        let inode = self.iget(ino)?;
        let st = read(&inode.state);
        live(&st)?;
        let Some(map) = st.file() else {
            return Ok(Vec::new());
        };
        let (first, stop) = (start / BLOCK_SIZE, end.div_ceil(BLOCK_SIZE));
        // Runs starting before `stop`, merged across extents that continue
        // on the next block; one more run tells whether the last is LAST.
        let mut runs: Vec<(u64, u64, u64)> = Vec::new();
        let mut page = first;
        let mut beyond = false;
        while let Some(e) = map.next_from(page) {
            match runs.last_mut() {
                Some(l) if l.0 + l.2 == e.page && l.1 + l.2 == e.block => l.2 += e.pages,
                _ if e.page >= stop => {
                    beyond = true;
                    break;
                }
                _ => runs.push((e.page, e.block, e.pages)),
            }
            page = e.end();
        }
        let count = runs.len();
        Ok(runs
            .into_iter()
            .enumerate()
            .map(|(i, (page, block, pages))| {
                // A run never crosses from the pool to the device: no pool
                // reaches DEV_BLOCK_BASE blocks (format.rs).
                debug_assert!(block >= DEV_BLOCK_BASE || block + pages <= DEV_BLOCK_BASE);
                let device = block >= DEV_BLOCK_BASE;
                let on_side = if device { block - DEV_BLOCK_BASE } else { block };
                FiemapExtent {
                    logical: page * BLOCK_SIZE,
                    physical: on_side * BLOCK_SIZE,
                    length: pages * BLOCK_SIZE,
                    flags: FiemapFlags {
                        last: i + 1 == count && !beyond,
                        device,
                    },
                }
            })
            .collect())
    }
}
