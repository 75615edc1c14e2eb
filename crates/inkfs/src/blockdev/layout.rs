//! The data device's own on-media side (docs/FORMAT.md, "Data device"):
//! the label in its first block (formatted once, checked at every mount)
//! and the free-list save area after it (written at clean unmount, read at
//! the next clean mount). The structures are in `format.rs`.

use std::io;

use super::dev::{self, BlockDev};
use crate::alloc::BlockAllocator;
use crate::format::*;

/// Format `dev` as the data device of the pool `pool_uuid`, using its
/// first `blocks` blocks: a label with a new uuid, and a save area saying
/// every data block is free for the epoch mkfs writes (1). Flushed before
/// it returns; the pool's superblock, which names the device, is written
/// after. Returns the device's uuid.
pub fn format_device(
    dev: &dyn BlockDev,
    pool_uuid: [u8; 16],
    blocks: u64,
    now_ns: i64,
) -> io::Result<[u8; 16]> {
    let mut uuid = crate::superblock::new_uuid(now_ns);
    if uuid == pool_uuid || uuid == [0; 16] {
        uuid[0] ^= 0x5a; // never equal to the pool's, never "no device"
    }
    let first = dev_first_data_block(blocks);
    // The save area first, the label last: a crash in between leaves no
    // label, so the device is not mistaken for a formatted one.
    let alloc = BlockAllocator::new_all_free(1, DEV_BLOCK_BASE + first, DEV_BLOCK_BASE + blocks);
    write_save_area(dev, blocks, 1, &ranges_of(&alloc))?;
    let mut label = DeviceLabel::zeroed();
    label.magic = DEV_LABEL_MAGIC;
    label.version = FORMAT_VERSION;
    label.block_size = BLOCK_SIZE as u32;
    label.uuid = uuid;
    label.pool_uuid = pool_uuid;
    label.blocks = blocks;
    label.first_data_block = first;
    label.created_unix_ns = now_ns as u64;
    label.seal();
    let mut page = dev::pages(1);
    page[0].0[..std::mem::size_of::<DeviceLabel>()].copy_from_slice(label.as_bytes());
    dev.write_at(DEV_LABEL_BLOCK * BLOCK_SIZE, &page)?;
    dev.flush()?;
    Ok(uuid)
}

/// The device's label, if it has a whole one.
pub fn read_label(dev: &dyn BlockDev) -> Result<DeviceLabel, String> {
    if dev.size_bytes() < BLOCK_SIZE {
        return Err(format!("{} bytes: too small to hold a label", dev.size_bytes()));
    }
    let mut page = dev::pages(1);
    dev.read_at(DEV_LABEL_BLOCK * BLOCK_SIZE, &mut page)
        .map_err(|e| format!("reading its label: {e}"))?;
    let label = DeviceLabel::from_bytes(&page[0].0);
    if label.magic != DEV_LABEL_MAGIC {
        return Err("not an inkfs data device (no label)".into());
    }
    if label.checksum != label.compute_checksum() {
        return Err("its label is damaged (checksum mismatch)".into());
    }
    Ok(label)
}

fn hex(uuid: &[u8; 16]) -> String {
    uuid.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `dev` is the data device the superblock `sb` names: its label's
/// uuid, pool and size, and a device at least that large. The reason
/// otherwise, in one line.
pub fn verify(dev: &dyn BlockDev, sb: &Superblock) -> Result<DeviceLabel, String> {
    let label = read_label(dev)?;
    if label.pool_uuid != sb.uuid {
        return Err(format!(
            "it is the data device of another pool (pool {}, this pool is {})",
            hex(&label.pool_uuid),
            hex(&sb.uuid)
        ));
    }
    if label.uuid != sb.data_uuid {
        return Err(format!(
            "it is data device {}, this pool's is {} (formatted again since?)",
            hex(&label.uuid),
            hex(&sb.data_uuid)
        ));
    }
    if label.blocks != sb.data_blocks || label.first_data_block != sb.data_first_block {
        return Err(format!(
            "its label says {} blocks from {}, the pool {} from {}",
            label.blocks, label.first_data_block, sb.data_blocks, sb.data_first_block
        ));
    }
    if dev.size_bytes() < sb.data_blocks * BLOCK_SIZE {
        return Err(format!(
            "it holds {} bytes, the pool uses {} (truncated?)",
            dev.size_bytes(),
            sb.data_blocks * BLOCK_SIZE
        ));
    }
    Ok(label)
}

/// Every free range of `alloc`, ascending.
pub fn ranges_of(alloc: &BlockAllocator) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = (0..alloc.lane_count())
        .flat_map(|l| alloc.free_ranges(l))
        .collect();
    all.sort_unstable();
    all
}

/// Write the save area: `ranges` for `epoch`, or, when they do not fit,
/// a header that matches no epoch (the next mount rebuilds by scanning).
/// Flushed before it returns. Ok(false): did not fit.
pub fn write_save_area(
    dev: &dyn BlockDev,
    blocks: u64,
    epoch: u64,
    ranges: &[(u64, u64)],
) -> io::Result<bool> {
    let fits = ranges.len() as u64 <= dev_save_max_ranges(blocks);
    let mut area = dev::pages(dev_save_blocks(blocks) as usize);
    let bytes = dev::as_bytes_mut(&mut area);
    let head = std::mem::size_of::<DeviceSaveHeader>();
    let mut h = DeviceSaveHeader::zeroed();
    if fits {
        h.magic = DEV_SAVE_MAGIC;
        h.epoch = epoch;
        h.ranges = ranges.len() as u64;
        for (i, &(start, len)) in ranges.iter().enumerate() {
            let r = SavedRange { start, len };
            bytes[head + i * 16..head + (i + 1) * 16].copy_from_slice(r.as_bytes());
        }
        bytes[..head].copy_from_slice(h.as_bytes());
        let end = head + ranges.len() * 16;
        h.checksum = crc32c::crc32c(&bytes[..end]);
    }
    bytes[..head].copy_from_slice(h.as_bytes());
    dev.write_at(DEV_SAVE_FIRST_BLOCK * BLOCK_SIZE, &area)?;
    dev.flush()?;
    Ok(fits)
}

/// Why a save area was not used (fsck reports it; a mount rebuilds).
pub fn read_save_area(
    dev: &dyn BlockDev,
    blocks: u64,
    epoch: u64,
) -> Result<Vec<(u64, u64)>, String> {
    let mut area = dev::pages(dev_save_blocks(blocks) as usize);
    dev.read_at(DEV_SAVE_FIRST_BLOCK * BLOCK_SIZE, &mut area)
        .map_err(|e| format!("reading the save area: {e}"))?;
    let bytes = dev::as_bytes(&area);
    let head = std::mem::size_of::<DeviceSaveHeader>();
    let h = DeviceSaveHeader::from_bytes(bytes);
    if h.magic != DEV_SAVE_MAGIC {
        return Err("no saved free list".into());
    }
    if h.epoch != epoch {
        return Err(format!("saved for epoch {}, the pool is at {epoch}", h.epoch));
    }
    if h.ranges > dev_save_max_ranges(blocks) {
        return Err(format!("{} ranges: more than the area holds", h.ranges));
    }
    let end = head + h.ranges as usize * 16;
    let mut zeroed = h;
    zeroed.checksum = 0;
    let crc = crc32c::crc32c_append(crc32c::crc32c(zeroed.as_bytes()), &bytes[head..end]);
    if crc != h.checksum {
        return Err("checksum mismatch".into());
    }
    let (lo, hi) = (
        DEV_BLOCK_BASE + dev_first_data_block(blocks),
        DEV_BLOCK_BASE + blocks,
    );
    let mut out = Vec::with_capacity(h.ranges as usize);
    let mut prev_end = lo;
    for i in 0..h.ranges as usize {
        let r = SavedRange::from_bytes(&bytes[head + i * 16..]);
        let ok = r.len > 0
            && r.start >= prev_end
            && r.start.checked_add(r.len).is_some_and(|e| e <= hi);
        if !ok {
            return Err(format!(
                "range {}+{} out of order or outside the device",
                r.start, r.len
            ));
        }
        prev_end = r.start + r.len;
        out.push((r.start, r.len));
    }
    Ok(out)
}

/// The device allocator from its save area (a clean mount), or None when
/// the area is not valid for `epoch`.
pub fn restore(
    dev: &dyn BlockDev,
    lanes: u32,
    blocks: u64,
    epoch: u64,
) -> Option<BlockAllocator> {
    let ranges = read_save_area(dev, blocks, epoch).ok()?;
    let a = BlockAllocator::new_all_used(
        lanes,
        DEV_BLOCK_BASE + dev_first_data_block(blocks),
        DEV_BLOCK_BASE + blocks,
    );
    for (start, len) in ranges {
        a.free(start, len).ok()?;
    }
    Some(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blockdev::MemDev;

    #[test]
    fn format_verify_save_restore() {
        let dev = MemDev::new(256 * BLOCK_SIZE);
        let pool = [7u8; 16];
        let uuid = format_device(&dev, pool, 256, 1).unwrap();
        let mut sb = Superblock::zeroed();
        sb.uuid = pool;
        sb.data_uuid = uuid;
        sb.data_blocks = 256;
        sb.data_first_block = dev_first_data_block(256);
        verify(&dev, &sb).unwrap();
        let a = restore(&dev, 2, 256, 1).unwrap();
        assert_eq!(a.free_blocks(), 256 - dev_first_data_block(256));
        assert!(restore(&dev, 2, 256, 2).is_none(), "another epoch");
        a.mark_used(DEV_BLOCK_BASE + 10, 5).unwrap();
        assert!(write_save_area(&dev, 256, 3, &ranges_of(&a)).unwrap());
        let b = restore(&dev, 2, 256, 3).unwrap();
        assert_eq!(ranges_of(&b), ranges_of(&a));

        let mut other = sb;
        other.uuid = [8; 16];
        assert!(verify(&dev, &other).unwrap_err().contains("another pool"));
        let mut other = sb;
        other.data_uuid = [9; 16];
        assert!(verify(&dev, &other).unwrap_err().contains("this pool's is"));
        let blank = MemDev::new(256 * BLOCK_SIZE);
        assert!(verify(&blank, &sb).unwrap_err().contains("no label"));
        let small = MemDev::new(128 * BLOCK_SIZE);
        format_device(&small, pool, 128, 1).unwrap();
        assert!(verify(&small, &sb).is_err());
    }

    #[test]
    fn too_many_ranges_leave_no_valid_save() {
        let dev = MemDev::new(64 * BLOCK_SIZE);
        let many: Vec<(u64, u64)> = (0..dev_save_max_ranges(64) + 1)
            .map(|i| (DEV_BLOCK_BASE + 2 + 2 * i, 1))
            .collect();
        assert!(!write_save_area(&dev, 64, 5, &many).unwrap());
        assert!(read_save_area(&dev, 64, 5).is_err());
    }
}
