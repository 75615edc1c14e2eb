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
    /// Hybrid pools: the data device the superblock names.
    pub data: Option<DataSummary>,
}

/// What a hybrid pool's superblock says of its data device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataSummary {
    pub uuid: [u8; 16],
    /// Device blocks the pool uses (label and save area included).
    pub blocks: u64,
    /// First block file data may use.
    pub first_data_block: u64,
    /// Writes of at least this many bytes go to the device.
    pub threshold_bytes: u32,
    /// Blocks an appending file reserves on the device at a time.
    pub unit_blocks: u32,
}

impl DataSummary {
    /// Blocks file data may use on the device.
    pub fn data_blocks(&self) -> u64 {
        self.blocks - self.first_data_block
    }
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
            data: sb.has_data_device().then_some(DataSummary {
                uuid: sb.data_uuid,
                blocks: sb.data_blocks,
                first_data_block: sb.data_first_block,
                threshold_bytes: sb.data_threshold_bytes,
                unit_blocks: sb.data_unit_blocks,
            }),
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

/// Where a hybrid pool's data device was recorded at mkfs (None: no
/// record, or a damaged one: the mount then needs `data=PATH`).
pub fn read_data_path<P: Pmem + ?Sized>(pool: &P) -> Option<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    superblock::read_data_path(pool)
        .map(|p| std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&p)))
}
