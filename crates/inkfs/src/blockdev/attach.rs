//! Finding and checking a hybrid pool's data device at mount, before the
//! mount writes anything: the device the mount names (`data=PATH`, or one
//! already open), else the path recorded at mkfs; refused, saying which
//! and why, when it is missing or is not the device the superblock names.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use super::cache::DataCache;
use super::dev::{BlockDev, FileDev};
use super::layout;
use super::store::{DataStore, Placement};
use crate::alloc::BlockAllocator;
use crate::error::{Error, Result};
use crate::format::*;
use crate::pmem::Pmem;
use crate::types::{DataDevice, MountOptions, ReadaheadMode, DATA_CACHE_DEFAULT_BYTES};

/// The data device of the pool whose superblock is `sb`, opened and
/// checked; None for a pool without one. Nothing is written.
pub fn open_device<P: Pmem + ?Sized>(
    pm: &P,
    sb: &Superblock,
    opts: &MountOptions,
) -> Result<Option<Arc<dyn BlockDev>>> {
    if !sb.has_data_device() {
        if opts.data.is_some() {
            return Err(Error::BadPool(
                "a data device was given, but this pool has none (it keeps file data on PM)".into(),
            ));
        }
        return Ok(None);
    }
    let (dev, name): (Arc<dyn BlockDev>, String) = match &opts.data {
        Some(DataDevice::Open(d)) => (d.clone(), d.describe()),
        Some(DataDevice::Path(p)) => (open_path(p, opts.read_only, "given")?, p.display().to_string()),
        None => {
            let recorded = crate::superblock::read_data_path(pm).ok_or_else(|| {
                Error::BadPool(
                    "the record of the data device's path is damaged; mount with data=PATH".into(),
                )
            })?;
            let path = Path::new(std::ffi::OsStr::from_bytes(&recorded));
            (
                open_path(path, opts.read_only, "recorded at mkfs")?,
                path.display().to_string(),
            )
        }
    };
    layout::verify(&*dev, sb)
        .map_err(|why| Error::BadPool(format!("data device {name}: {why}")))?;
    Ok(Some(dev))
}

fn open_path(path: &Path, read_only: bool, how: &str) -> Result<Arc<dyn BlockDev>> {
    match FileDev::open(path, read_only) {
        Ok(d) => Ok(Arc::new(d)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::BadPool(format!(
            "data device {} ({how}) is missing; mount with data=PATH if it moved",
            path.display()
        ))),
        Err(e) => Err(Error::BadPool(format!(
            "data device {} ({how}): {e}",
            path.display()
        ))),
    }
}

/// The block side of a mount: `dev` (checked by `open_device`) with its
/// allocator, and the placement and cache the superblock and the mount
/// options say.
pub fn store(
    dev: Arc<dyn BlockDev>,
    sb: &Superblock,
    opts: &MountOptions,
    blocks: BlockAllocator,
) -> DataStore {
    let policy = Placement {
        threshold_bytes: opts
            .data_threshold_bytes
            .unwrap_or(sb.data_threshold_bytes as u64),
        unit_blocks: sb.data_unit_blocks.max(1) as u64,
    };
    let cache = opts.data_cache_bytes.unwrap_or(DATA_CACHE_DEFAULT_BYTES);
    DataStore::with_readahead(dev, blocks, sb.data_blocks, policy, cache, opts.data_readahead)
}

/// The block side of an engine attached to a pool another process has
/// mounted (a client of the kernel-free path, docs/KERNEL-FREE.md): `dev`
/// is the device that process handed over, checked against the pool's
/// superblock here. Its allocator holds nothing until the owner reserves
/// blocks for it; its DRAM cache (`cache`: bytes and readahead) keeps
/// nothing until the engine is given the shared write stamps
/// (`Fs::data_use_stamps`: the owner and other clients write the device
/// behind its back); the placement threshold is the owner's mount's
/// (`threshold_bytes`).
pub fn client_store(
    dev: Arc<dyn BlockDev>,
    sb: &Superblock,
    lanes: u32,
    threshold_bytes: u64,
    cache: (u64, ReadaheadMode),
) -> Result<DataStore> {
    layout::verify(&*dev, sb)
        .map_err(|why| Error::BadPool(format!("data device {}: {why}", dev.describe())))?;
    let blocks = BlockAllocator::new_all_used(
        lanes,
        DEV_BLOCK_BASE + sb.data_first_block,
        DEV_BLOCK_BASE + sb.data_blocks,
    );
    let policy = Placement {
        threshold_bytes,
        unit_blocks: sb.data_unit_blocks.max(1) as u64,
    };
    Ok(DataStore::with_cache(
        dev,
        blocks,
        sb.data_blocks,
        policy,
        DataCache::for_client(cache.0),
        cache.1,
    ))
}

/// A client's DRAM cache of device blocks when `CLIENT_CACHE_ENV` does
/// not say: small beside the server's (every attached process has one),
/// and enough for the largest readahead window (a quarter of the cache).
pub const CLIENT_CACHE_DEFAULT_MIB: u64 = 32;
/// The size of a client's cache of device blocks, in MiB (0: no cache
/// and no readahead, every read from the device).
pub const CLIENT_CACHE_ENV: &str = "INKFS_CLIENT_DATA_CACHE_MIB";
/// How a client reads ahead: `threads` (the default), `uring`, `off`.
pub const CLIENT_READAHEAD_ENV: &str = "INKFS_CLIENT_READAHEAD";

/// A client's cache size (bytes) and readahead, from the environment;
/// a value that does not parse is the default.
pub fn client_cache() -> (u64, ReadaheadMode) {
    let mib = std::env::var(CLIENT_CACHE_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(CLIENT_CACHE_DEFAULT_MIB);
    let mode = std::env::var(CLIENT_READAHEAD_ENV)
        .ok()
        .and_then(|v| ReadaheadMode::parse(v.trim()))
        .unwrap_or_default();
    (mib.saturating_mul(1 << 20), mode)
}

/// How mkfs lays out a hybrid pool's data device.
#[derive(Clone, Copy, Debug)]
pub struct HybridFormat<'a> {
    /// The device, open for writing.
    pub device: &'a dyn BlockDev,
    /// Where the device is, recorded for the mount to find it.
    pub path: &'a Path,
    /// Blocks of the device the pool uses: None, all of it.
    pub blocks: Option<u64>,
    /// Writes of at least this many bytes go to the device.
    pub threshold_bytes: u32,
    /// Blocks an appending file reserves on the device at a time.
    pub unit_blocks: u32,
}

/// Placement threshold mkfs records when not told (docs/DESIGN.md,
/// "Hybrid pools": a judgment, not yet measured).
pub const DATA_THRESHOLD_DEFAULT: u32 = 64 << 10;
/// Device extent unit mkfs records when not told: 1 MiB.
pub const DATA_UNIT_DEFAULT_BLOCKS: u32 = 256;

/// mkfs of a hybrid pool: the device's label and save area first
/// (flushed), then the pool, whose superblock names the device. A crash
/// before the superblocks are written leaves no pool (mkfs zeroes them
/// first); the device's label alone makes nothing mountable.
pub fn format_pool<P: Pmem + ?Sized>(
    pm: &P,
    opts: &crate::types::FormatOptions,
    data: &HybridFormat<'_>,
) -> Result<Superblock> {
    let dev_blocks_max = data.device.size_bytes() / BLOCK_SIZE;
    let blocks = data.blocks.unwrap_or(dev_blocks_max).min(DEV_BLOCKS_MAX);
    if blocks > dev_blocks_max {
        return Err(Error::BadPool(format!(
            "data device of {} bytes is smaller than the {} bytes asked for",
            data.device.size_bytes(),
            blocks * BLOCK_SIZE
        )));
    }
    crate::superblock::check_data_fields(blocks, data.threshold_bytes, data.unit_blocks)
        .map_err(Error::BadPool)?;
    let path = data.path.as_os_str().as_bytes();
    if path.is_empty() || path.len() > DATA_PATH_MAX {
        return Err(Error::BadPool(format!(
            "data device path of {} bytes: 1 to {DATA_PATH_MAX} allowed",
            path.len()
        )));
    }
    let now = crate::time::now_ns();
    let pool_uuid = crate::superblock::new_uuid(now);
    let uuid = layout::format_device(data.device, pool_uuid, blocks, now)?;
    crate::superblock::format_with(
        pm,
        opts,
        Some(&crate::superblock::DataFormat {
            uuid,
            blocks,
            threshold_bytes: data.threshold_bytes,
            unit_blocks: data.unit_blocks,
            path,
        }),
        pool_uuid,
    )
}
