//! Formatting a pool (mkfs) and reading, validating and rewriting its
//! superblocks.

use crate::alloc::{BlockAllocator, InodeSlots};
use crate::error::{Error, Result};
use crate::format::*;
use crate::pmem::{read_pod, write_pod, Pmem};
use crate::types::FormatOptions;

/// Smallest pool mkfs accepts beyond the fixed areas.
pub const MIN_DATA_BLOCKS: u64 = 64;

/// Which copy a superblock came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SuperSource {
    Primary,
    /// The primary was damaged; the backup was used (and should be rewritten).
    Backup,
}

/// Pool geometry derived from a validated superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub lane_count: u32,
    pub total_blocks: u64,
    pub first_data_block: u64,
    /// Hybrid pools: the device blocks file data may use, as FILE_WRITE
    /// names them (`DEV_BLOCK_BASE + device block`), `[dev_first,
    /// dev_end)`; both 0 without a data device.
    pub dev_first: u64,
    pub dev_end: u64,
}

impl Geometry {
    pub fn of(sb: &Superblock) -> Geometry {
        let (dev_first, dev_end) = if sb.has_data_device() {
            (
                DEV_BLOCK_BASE + sb.data_first_block,
                DEV_BLOCK_BASE + sb.data_blocks,
            )
        } else {
            (0, 0)
        };
        Geometry {
            lane_count: sb.lane_count,
            total_blocks: sb.total_blocks,
            first_data_block: sb.first_data_block,
            dev_first,
            dev_end,
        }
    }
    /// Whether the pool has a data device.
    pub fn has_device(&self) -> bool {
        self.dev_end > self.dev_first
    }
    /// True if `[block, block + len)` lies in the data device's managed
    /// blocks (none without a device).
    pub fn is_dev_range(&self, block: u64, len: u64) -> bool {
        block >= self.dev_first
            && len > 0
            && block
                .checked_add(len)
                .is_some_and(|end| end <= self.dev_end)
    }
    /// True if `[block, block + len)` may hold file data: the PM data area
    /// or, in a hybrid pool, the data device (never both: the two ranges
    /// are far apart). Everything else the logs name (log pages, table
    /// blocks, symlink targets) is on PM: `is_data_range`.
    pub fn is_file_data_range(&self, block: u64, len: u64) -> bool {
        self.is_data_range(block, len) || self.is_dev_range(block, len)
    }
    /// True if `[block, block + len)` lies inside the allocator-managed area.
    pub fn is_data_range(&self, block: u64, len: u64) -> bool {
        block >= self.first_data_block
            && len > 0
            && block
                .checked_add(len)
                .is_some_and(|end| end <= self.total_blocks)
    }
    /// The largest inode number the pool can hold (`lane_slots_max` slots
    /// in each lane).
    pub fn ino_max(&self) -> u64 {
        lane_slots_max(self.total_blocks.saturating_sub(self.first_data_block))
            .saturating_mul(self.lane_count as u64)
    }
    /// True if `ino` can name an inode of this pool (1 ..= `ino_max`).
    pub fn is_ino(&self, ino: u64) -> bool {
        (1..=self.ino_max()).contains(&ino)
    }
    /// True if `id` can name a log page: a block of the data area, or a
    /// chunk of one (`format::log_page_id`).
    pub fn is_log_page(&self, id: u64) -> bool {
        log_page_id(id).is_some_and(|(block, _)| self.is_data_range(block, 1))
    }
    /// True if `tail` can be a log's tail: in a page of the data area, at
    /// an entry boundary, not inside the page's footer.
    pub fn is_log_tail(&self, tail: u64) -> bool {
        self.is_data_range(tail / BLOCK_SIZE, 1)
            && tail.is_multiple_of(ENTRY_UNIT)
            && tail % BLOCK_SIZE <= LOG_PAGE_PAYLOAD
    }
}

pub fn default_lanes() -> u32 {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get()) as u32;
    cpus.clamp(4, 64)
}

/// What the superblock of a hybrid pool records of its data device
/// (`crate::blockdev::format_device` writes the device's side first).
#[derive(Clone, Copy, Debug)]
pub struct DataFormat<'a> {
    pub uuid: [u8; 16],
    pub blocks: u64,
    pub threshold_bytes: u32,
    pub unit_blocks: u32,
    /// Where the device is (recorded, a hint for the mount).
    pub path: &'a [u8],
}

/// Lay out a fresh file system on `pm`, with an empty root directory.
/// The whole pool is overwritten; the caller decided that was wanted.
pub fn format<P: Pmem + ?Sized>(pm: &P, opts: &FormatOptions) -> Result<Superblock> {
    format_with(pm, opts, None, new_uuid(crate::time::now_ns()))
}

/// `format`, for a hybrid pool when `data` is given: `uuid` is the pool's
/// (the device's label names it, so the caller draws it first).
pub fn format_with<P: Pmem + ?Sized>(
    pm: &P,
    opts: &FormatOptions,
    data: Option<&DataFormat<'_>>,
    uuid: [u8; 16],
) -> Result<Superblock> {
    if let Some(d) = data {
        check_data_fields(d.blocks, d.threshold_bytes, d.unit_blocks).map_err(Error::BadPool)?;
        if d.uuid == [0; 16] {
            return Err(Error::BadPool("data device uuid is zero".into()));
        }
    }
    let record = match data {
        Some(d) => Some(DataRecord::new(d.path).ok_or_else(|| {
            Error::BadPool(format!(
                "data device path of {} bytes: 1 to {DATA_PATH_MAX} allowed",
                d.path.len()
            ))
        })?),
        None => None,
    };
    let lanes = if opts.lanes == 0 {
        default_lanes()
    } else {
        opts.lanes
    };
    if lanes > LANES_MAX {
        return Err(Error::BadPool(format!(
            "at most {LANES_MAX} lanes, asked for {lanes}"
        )));
    }
    let total_blocks = pm.size_bytes() / BLOCK_SIZE;
    let first_data_block = lanes_end_block(lanes);
    if total_blocks < first_data_block + MIN_DATA_BLOCKS {
        return Err(Error::BadPool(format!(
            "pool of {} bytes is too small: {} lanes need at least {} bytes",
            pm.size_bytes(),
            lanes,
            (first_data_block + MIN_DATA_BLOCKS) * BLOCK_SIZE
        )));
    }
    let geo = Geometry {
        lane_count: lanes,
        total_blocks,
        first_data_block,
        dev_first: data.map_or(0, |d| DEV_BLOCK_BASE + dev_first_data_block(d.blocks)),
        dev_end: data.map_or(0, |d| DEV_BLOCK_BASE + d.blocks),
    };

    // Invalidate any previous superblock first: a crash during mkfs must not
    // leave an old superblock describing half-overwritten lanes.
    pm.zero_nt(0, 2 * BLOCK_SIZE);
    pm.fence();

    for lane in 0..lanes {
        let first = lane_first_block(lane) * BLOCK_SIZE;
        pm.zero_nt(first, LANE_STRIDE_BLOCKS * BLOCK_SIZE);
        let trailer = TableTrailer {
            magic: TABLE_MAGIC,
            next_block: 0,
            reserved: [0; 112],
        };
        let table = first + LANE_INODE_TABLE_BLOCK * BLOCK_SIZE;
        write_pod(pm, table + TABLE_TRAILER_OFFSET, &trailer);
        pm.flush(table + TABLE_TRAILER_OFFSET, 128);
    }
    pm.fence();

    let now = crate::time::now_ns();
    let root_log = first_data_block;
    write_root(pm, root_log, opts, now);

    let blocks = BlockAllocator::new_all_free(lanes, first_data_block, total_blocks);
    blocks
        .mark_used(root_log, 1)
        .map_err(|e| Error::Corrupt(format!("mkfs allocator: {e:?}")))?;
    let slots = InodeSlots::new(lanes);
    let (root_lane, root_slot) = ino_to_lane_slot(ROOT_INO, lanes);
    slots
        .mark_used(root_lane, root_slot)
        .map_err(|e| Error::Corrupt(format!("mkfs inode slots: {e:?}")))?;

    let mut sb = Superblock {
        magic: MAGIC,
        version: FORMAT_VERSION,
        block_size: BLOCK_SIZE as u32,
        size_bytes: total_blocks * BLOCK_SIZE,
        total_blocks,
        lane_count: lanes,
        state: STATE_CLEAN,
        mount_epoch: 1,
        first_data_block,
        uuid,
        created_unix_ns: now as u64,
        unmounted_unix_ns: now as u64,
        errors_count: 0,
        first_error_unix_ns: 0,
        first_error_ino: 0,
        last_error_unix_ns: 0,
        last_error_ino: 0,
        first_error_reason: 0,
        last_error_reason: 0,
        data_uuid: data.map_or([0; 16], |d| d.uuid),
        data_blocks: data.map_or(0, |d| d.blocks),
        data_first_block: data.map_or(0, |d| dev_first_data_block(d.blocks)),
        data_threshold_bytes: data.map_or(0, |d| d.threshold_bytes),
        data_unit_blocks: data.map_or(0, |d| d.unit_blocks),
        reserved: [0; 76],
        checksum: 0,
    };
    let saved = blocks
        .save(pm, sb.mount_epoch, &slots)
        .map_err(|e| Error::Corrupt(format!("mkfs save area: {e:?}")))?;
    debug_assert!(saved, "a fresh allocator always fits its save area");
    debug_assert_eq!(Geometry::of(&sb), geo);
    sb.seal();
    if let Some(r) = &record {
        // Before the superblocks: until they are written the pool is
        // blank to a mount, whatever this record says.
        write_data_record(pm, r);
    }
    write_superblocks(pm, &sb);
    Ok(sb)
}

/// Write the data record into both superblock blocks, primary then
/// backup, each persisted before the next.
pub fn write_data_record<P: Pmem + ?Sized>(pm: &P, r: &DataRecord) {
    for block in [SUPER_PRIMARY_BLOCK, SUPER_BACKUP_BLOCK] {
        let off = block * BLOCK_SIZE + DATA_RECORD_OFFSET;
        write_pod(pm, off, r);
        pm.persist(off, std::mem::size_of::<DataRecord>() as u64);
    }
}

/// The data device's recorded path: the primary's record, or the
/// backup's when the primary is damaged; None when neither is whole.
pub fn read_data_path<P: Pmem + ?Sized>(pm: &P) -> Option<Vec<u8>> {
    [SUPER_PRIMARY_BLOCK, SUPER_BACKUP_BLOCK].iter().find_map(|b| {
        let r: DataRecord = read_pod(pm, b * BLOCK_SIZE + DATA_RECORD_OFFSET);
        r.path().map(|p| p.to_vec())
    })
}

/// The ranges of a hybrid pool's data fields: a device of
/// `DEV_BLOCKS_MIN` … `DEV_BLOCKS_MAX` blocks, a threshold up to
/// `DATA_THRESHOLD_MAX`, a unit of 1 … `DATA_UNIT_BLOCKS_MAX` blocks.
pub fn check_data_fields(blocks: u64, threshold: u32, unit: u32) -> std::result::Result<(), String> {
    if !(DEV_BLOCKS_MIN..=DEV_BLOCKS_MAX).contains(&blocks) {
        return Err(format!(
            "data device of {blocks} blocks: {DEV_BLOCKS_MIN} to {DEV_BLOCKS_MAX} allowed"
        ));
    }
    if threshold > DATA_THRESHOLD_MAX {
        return Err(format!(
            "data threshold {threshold} bytes above {DATA_THRESHOLD_MAX}"
        ));
    }
    if unit == 0 || unit > DATA_UNIT_BLOCKS_MAX {
        return Err(format!(
            "data unit of {unit} blocks: 1 to {DATA_UNIT_BLOCKS_MAX} allowed"
        ));
    }
    Ok(())
}

/// The root directory: inode record (lane 0, slot 0) and a one-entry log.
fn write_root<P: Pmem + ?Sized>(pm: &P, log_block: u64, opts: &FormatOptions, now: i64) {
    let page = log_block * BLOCK_SIZE;
    let mut attr = AttrEntry {
        hdr: EntryHeader {
            kind: entry_type::SET_ATTR,
            units: 1,
            reserved: 0,
            checksum: 0,
        },
        mode: libc::S_IFDIR | (opts.root_mode & 0o7777),
        uid: opts.root_uid,
        gid: opts.root_gid,
        nlink: 2,
        size: 0,
        atime_ns: now,
        mtime_ns: now,
        ctime_ns: now,
        rdev_or_parent: ROOT_INO,
    };
    seal_entry(attr.as_bytes_mut());
    write_pod(pm, page, &attr);
    let footer = LogPageFooter {
        next_block: 0,
        magic: LOG_MAGIC,
        owner_ino: ROOT_INO,
        reserved: [0; 40],
    };
    write_pod(pm, page + LOG_FOOTER_OFFSET, &footer);
    pm.flush(page, ENTRY_UNIT);
    pm.flush(page + LOG_FOOTER_OFFSET, 64);
    pm.fence();

    let rec = InodeRecord {
        state: INODE_LIVE,
        log_head: log_block,
        log_tail: page + ENTRY_UNIT,
        generation: 1,
        ino: ROOT_INO,
        kind: FileKind::Dir as u32,
        reserved0: 0,
        flags: 0,
        log_gen: 0,
        reserved: [0; 64],
    };
    let rec_off = lane_first_block(0) * BLOCK_SIZE + LANE_INODE_TABLE_BLOCK * BLOCK_SIZE;
    write_pod(pm, rec_off, &rec);
    pm.persist(rec_off, INODE_RECORD_SIZE);
}

pub fn new_uuid(now: i64) -> [u8; 16] {
    let mut seed = [0u8; 16];
    // getrandom may be unavailable in odd sandboxes: fall back to time + pid.
    // SAFETY: the buffer is valid for 16 bytes.
    let got = unsafe { libc::getrandom(seed.as_mut_ptr().cast(), 16, 0) };
    if got != 16 {
        seed[..8].copy_from_slice(&now.to_le_bytes());
        seed[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    seed[6] = (seed[6] & 0x0f) | 0x40;
    seed[8] = (seed[8] & 0x3f) | 0x80;
    seed
}

/// Write primary then backup, each persisted before the next: a crash
/// leaves at least one intact copy.
pub fn write_superblocks<P: Pmem + ?Sized>(pm: &P, sb: &Superblock) {
    debug_assert_eq!(sb.checksum, sb.compute_checksum());
    for block in [SUPER_PRIMARY_BLOCK, SUPER_BACKUP_BLOCK] {
        write_pod(pm, block * BLOCK_SIZE, sb);
        pm.persist(block * BLOCK_SIZE, std::mem::size_of::<Superblock>() as u64);
    }
}

/// Why one superblock copy was refused (mount, fsck).
pub fn check_one(sb: &Superblock, pool_bytes: u64) -> std::result::Result<(), String> {
    if sb.magic != MAGIC {
        if sb.magic == [0; 8] {
            return Err("no inkfs superblock (the area is blank)".into());
        }
        return Err(format!("bad magic {:02x?} (not an inkfs pool)", sb.magic));
    }
    if sb.checksum != sb.compute_checksum() {
        return Err("superblock checksum mismatch (damaged)".into());
    }
    if sb.version > FORMAT_VERSION {
        return Err(format!(
            "format version {} is newer than this inkfs understands ({FORMAT_VERSION}); upgrade inkfs",
            sb.version
        ));
    }
    if sb.version < 1 {
        return Err(format!("format version {} is invalid", sb.version));
    }
    if sb.block_size as u64 != BLOCK_SIZE {
        return Err(format!(
            "block size {} unsupported (only {BLOCK_SIZE})",
            sb.block_size
        ));
    }
    if sb.lane_count == 0 || sb.lane_count > LANES_MAX {
        return Err(format!("lane count {} out of range", sb.lane_count));
    }
    if sb.state != STATE_CLEAN && sb.state != STATE_MOUNTED {
        return Err(format!("state {} invalid", sb.state));
    }
    // Every mount adds one: the last value is out of range.
    if sb.mount_epoch == u64::MAX {
        return Err(format!("mount epoch {} out of range", sb.mount_epoch));
    }
    if sb.first_data_block != lanes_end_block(sb.lane_count)
        || !sb.size_bytes.is_multiple_of(BLOCK_SIZE)
        || sb.total_blocks != sb.size_bytes / BLOCK_SIZE
        || sb.total_blocks < sb.first_data_block + MIN_DATA_BLOCKS
    {
        return Err("inconsistent geometry in superblock".into());
    }
    if sb.has_data_device() {
        if sb.version < 5 {
            return Err(format!(
                "format version {} cannot have a data device",
                sb.version
            ));
        }
        check_data_fields(sb.data_blocks, sb.data_threshold_bytes, sb.data_unit_blocks)?;
        if sb.data_first_block != dev_first_data_block(sb.data_blocks) {
            return Err("inconsistent data device geometry in superblock".into());
        }
    } else if sb.data_blocks != 0
        || sb.data_first_block != 0
        || sb.data_threshold_bytes != 0
        || sb.data_unit_blocks != 0
    {
        return Err("data device fields set without a data device uuid".into());
    }
    if sb.size_bytes != pool_bytes {
        return Err(format!(
            "pool size mismatch: the superblock says {} bytes, the pool has {} bytes{}",
            sb.size_bytes,
            pool_bytes,
            if pool_bytes < sb.size_bytes {
                " (truncated?)"
            } else {
                ""
            }
        ));
    }
    Ok(())
}

/// Read and validate the superblock, falling back to the backup copy.
pub fn read_superblock<P: Pmem + ?Sized>(pm: &P) -> Result<(Superblock, SuperSource)> {
    let pool_bytes = pm.size_bytes();
    if pool_bytes < 2 * BLOCK_SIZE {
        return Err(Error::BadPool(format!(
            "pool of {pool_bytes} bytes is too small to hold a superblock"
        )));
    }
    let primary: Superblock = read_pod(pm, SUPER_PRIMARY_BLOCK * BLOCK_SIZE);
    let primary_err = match check_one(&primary, pool_bytes) {
        Ok(()) => return Ok((primary, SuperSource::Primary)),
        Err(e) => e,
    };
    let backup: Superblock = read_pod(pm, SUPER_BACKUP_BLOCK * BLOCK_SIZE);
    match check_one(&backup, pool_bytes) {
        Ok(()) => Ok((backup, SuperSource::Backup)),
        // Report the primary's reason: it is the one the user expects to be there.
        Err(_) => Err(Error::BadPool(primary_err)),
    }
}

/// True if the pool holds something that looks like an inkfs superblock
/// (valid or not), for mkfs's "refuse to overwrite" check.
pub fn looks_like_inkfs<P: Pmem + ?Sized>(pm: &P) -> bool {
    if pm.size_bytes() < 2 * BLOCK_SIZE {
        return false;
    }
    [SUPER_PRIMARY_BLOCK, SUPER_BACKUP_BLOCK].iter().any(|b| {
        let sb: Superblock = read_pod(pm, b * BLOCK_SIZE);
        sb.magic == MAGIC
    })
}
