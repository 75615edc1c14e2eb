//! A hybrid pool's data device (docs/FORMAT.md, "Data device"): that it
//! is there and is the device the superblock names (its label's uuid,
//! pool and size), and, on a clean pool, that its saved free list is
//! exactly the device blocks no file maps (a block on neither is leaked,
//! one on both would be handed out twice).

use super::check::Checker;
use super::free_lists::compare;
use super::repair::Fix;
use super::report::ProblemKind;
use crate::blockdev::{dev, layout};
use crate::format::*;
use crate::pmem::Pmem;
use crate::types::{DataDevice, MountOptions};

impl<P: Pmem + ?Sized> Checker<'_, P> {
    /// Find and identify the data device the way a mount does (read-only):
    /// missing or wrong is an error fsck cannot repair.
    pub(super) fn check_data_device(&mut self, data: Option<&DataDevice>) {
        if !self.sb.has_data_device() && data.is_none() {
            return;
        }
        let opts = MountOptions {
            read_only: true,
            data: data.cloned(),
            ..Default::default()
        };
        match crate::blockdev::attach::open_device(self.pm, &self.sb, &opts) {
            Ok(dev) => self.dev = dev,
            Err(e) => self.error(
                ProblemKind::DataDevice,
                None,
                match e {
                    crate::Error::BadPool(m) => m,
                    other => other.to_string(),
                },
                None,
            ),
        }
    }

    /// Whether device block `block` holds a non-zero byte from `from` on
    /// (false when the device could not be read: reported elsewhere).
    pub(super) fn dev_page_dirty(&self, block: u64, from: usize, buf: &mut [u8]) -> bool {
        let Some(d) = &self.dev else { return false };
        let mut page = dev::pages(1);
        if d.read_at((block - DEV_BLOCK_BASE) * BLOCK_SIZE, &mut page)
            .is_err()
        {
            return false;
        }
        buf.copy_from_slice(&page[0].0);
        buf[from..].iter().any(|&b| b != 0)
    }

    /// On a clean pool, the device's saved free list against the device
    /// blocks in use.
    pub(super) fn check_device_save_area(&mut self) {
        let Some(d) = self.dev.clone() else { return };
        if self.sb.state != STATE_CLEAN || self.journal_pending {
            return;
        }
        let free = match layout::read_save_area(&*d, self.sb.data_blocks, self.sb.mount_epoch) {
            Ok(free) => free,
            Err(why) => {
                self.error(
                    ProblemKind::SaveArea,
                    None,
                    format!("the data device's saved free list of a clean pool is invalid ({why})"),
                    Some(Fix::RebuildAllocator),
                );
                return;
            }
        };
        let used: Vec<(u64, u64)> = self
            .blocks
            .map
            .range(DEV_BLOCK_BASE..)
            .map(|(&s, &(e, _))| (s, e))
            .collect();
        let free: Vec<(u64, u64)> = free.iter().map(|&(s, n)| (s, s + n)).collect();
        let (lo, hi) = (self.geo.dev_first, self.geo.dev_end);
        let (both, leaked) = compare(&used, &free, lo, hi);
        if let Some((b, n)) = both {
            self.error(
                ProblemKind::SaveArea,
                None,
                format!(
                    "{n} data-device block(s) in use are on its saved free list (first: device \
                     block {}); they would be handed out again",
                    b - DEV_BLOCK_BASE
                ),
                Some(Fix::RebuildAllocator),
            );
        }
        if let Some(((s, len), n)) = leaked {
            self.error(
                ProblemKind::BlockLeak,
                None,
                format!(
                    "{n} data-device block(s) are neither in use nor on its saved free list \
                     (first: device blocks {}+{len})",
                    s - DEV_BLOCK_BASE
                ),
                Some(Fix::RebuildAllocator),
            );
        }
    }
}
