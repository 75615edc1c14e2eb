//! What tools read of a pool without mounting it (`inkfs stat`, `mkfs`'s
//! "is there a pool here already?", fsck's state line): the superblock,
//! validated as the mount validates it.

use crate::error::Result;
use crate::format::{Superblock, STATE_CLEAN};
use crate::pmem::Pmem;
use crate::superblock::{self, SuperSource};
use crate::types::ErrorRecord;

pub use crate::format::{BLOCK_SIZE, FORMAT_VERSION, LANES_MAX};

/// A pool's superblock, as a tool reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolSummary {
    pub version: u32,
    pub size_bytes: u64,
    pub total_blocks: u64,
    /// Blocks before the data area (superblocks and lane areas).
    pub first_data_block: u64,
    pub lanes: u32,
    /// Cleanly unmounted; false: mounted now, or crashed (recovery runs at
    /// the next mount).
    pub clean: bool,
    pub uuid: [u8; 16],
    pub created_unix_ns: u64,
    /// Last clean unmount (0: never).
    pub unmounted_unix_ns: u64,
    /// Corruption met while mounted, kept until `inkfs fsck -y` clears it.
    pub errors: ErrorRecord,
    /// The primary superblock was damaged and the backup was read.
    pub from_backup: bool,
}

impl PoolSummary {
    pub(crate) fn of(sb: &Superblock, from_backup: bool) -> PoolSummary {
        PoolSummary {
            version: sb.version,
            size_bytes: sb.size_bytes,
            total_blocks: sb.total_blocks,
            first_data_block: sb.first_data_block,
            lanes: sb.lane_count,
            clean: sb.state == STATE_CLEAN,
            uuid: sb.uuid,
            created_unix_ns: sb.created_unix_ns,
            unmounted_unix_ns: sb.unmounted_unix_ns,
            errors: ErrorRecord::of(sb),
            from_backup,
        }
    }

    /// Blocks the allocator manages (file data, logs, inode tables).
    pub fn data_blocks(&self) -> u64 {
        self.total_blocks - self.first_data_block
    }
}

/// The pool's superblock (the backup if the primary is damaged); a pool
/// that is not inkfs, or one this version cannot use, is refused with the
/// reason.
pub fn read_summary<P: Pmem + ?Sized>(pool: &P) -> Result<PoolSummary> {
    let (sb, source) = superblock::read_superblock(pool)?;
    Ok(PoolSummary::of(&sb, source == SuperSource::Backup))
}

/// Whether either superblock copy carries inkfs's magic (a pool, maybe a
/// damaged or newer one): what mkfs refuses to overwrite without --force.
pub fn looks_like_inkfs<P: Pmem + ?Sized>(pool: &P) -> bool {
    superblock::looks_like_inkfs(pool)
}
