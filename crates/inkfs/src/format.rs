//! The on-media format (version in [`FORMAT_VERSION`]): every persistent structure, defined once.
//!
//! docs/FORMAT.md is the prose version of this file and states the persist
//! order of every update path. All integers are little-endian (inkfs runs on
//! x86_64 only, so native order is little-endian; the compile-time check
//! below keeps it honest). Structures hold only what recovery needs: no
//! locks, no DRAM pointers, no "updating" flags.

use std::mem::size_of;

#[cfg(not(target_endian = "little"))]
compile_error!("inkfs' on-media format is little-endian and is read with native loads");

pub const BLOCK_SIZE: u64 = 4096;
pub const BLOCK_SHIFT: u32 = 12;
pub const MAGIC: [u8; 8] = *b"INKFSpm1";
/// 2: a log may begin with any entry (fast GC unlinks the page holding the
/// first attribute snapshot once a newer one supersedes it); it must hold
/// one somewhere. 3: the superblock records corruption met while mounted
/// (the `errors_*` fields), an inode record's `flags` field holds its
/// `chattr` flags, which older software would ignore instead of enforcing
/// (both formerly reserved, hence zero in older pools), and a DIR_ADD's
/// `seq` is the name's readdir position, a keyed hash of the name (dir.rs),
/// where older pools' sequence numbers stay valid positions. 4: an inode
/// record's `log_gen` counts the times log GC unlinked pages of its log
/// (formerly reserved, hence zero in older pools). 5: hybrid pools: the
/// superblock names a data device (`data_*` fields, formerly reserved,
/// hence zero: no data device in older pools), a FILE_WRITE may map pages
/// to device blocks (numbers from `DEV_BLOCK_BASE`), and blocks 0 and 1
/// hold the device's recorded path (`DataRecord`) past the superblock.
/// 6: small log heads: a log's first page may be a 1 KiB chunk of a block
/// shared with other logs' heads (`log_head` tagged with the chunk,
/// `log_page_id`), and a lane's save area lists its chunk blocks' free
/// chunks (`SaveHeader::chunk_blocks`, formerly reserved, hence zero).
/// Older pools are read as they are and marked with this version by the
/// first read-write mount.
pub const FORMAT_VERSION: u32 = 6;

/// Block numbers of the two superblock copies.
pub const SUPER_PRIMARY_BLOCK: u64 = 0;
pub const SUPER_BACKUP_BLOCK: u64 = 1;
/// The lane areas start right after the superblocks.
pub const LANES_FIRST_BLOCK: u64 = 2;

/// Per-lane fixed area: journal block, free-list save area, first inode-table block.
pub const LANE_JOURNAL_BLOCK: u64 = 0;
pub const LANE_SAVE_FIRST_BLOCK: u64 = 1;
pub const LANE_SAVE_BLOCKS: u64 = 16;
pub const LANE_INODE_TABLE_BLOCK: u64 = LANE_SAVE_FIRST_BLOCK + LANE_SAVE_BLOCKS;
pub const LANE_STRIDE_BLOCKS: u64 = LANE_INODE_TABLE_BLOCK + 1;
pub const LANES_MAX: u32 = 256;

/// The root directory's inode number (lane 0, slot 0).
pub const ROOT_INO: u64 = 1;
pub const NAME_MAX: usize = 255;
pub const SYMLINK_MAX: usize = 4095;
/// Largest file size; writes beyond fail with EFBIG.
pub const MAX_FILE_BYTES: u64 = 1 << 46;
/// Pages of the largest file: a FILE_WRITE maps pages below this.
pub const MAX_FILE_PAGES: u64 = MAX_FILE_BYTES / BLOCK_SIZE;
/// Highest link count of a file (ext4's limit): link(2) fails with EMLINK
/// there, and a larger count on media is corruption.
pub const LINK_MAX: u32 = 65000;

/// Plain old data: `#[repr(C)]` types without padding for which every bit
/// pattern is a valid value, so they can be copied to and from media.
///
/// # Safety
/// Implement only for `#[repr(C)]` types made of integers and byte arrays,
/// with no implicit padding (the size assertions next to each type check it).
pub unsafe trait Pod: Copy + 'static {
    fn zeroed() -> Self {
        // SAFETY: every bit pattern, including all zeros, is valid (trait contract).
        unsafe { std::mem::zeroed() }
    }
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: no padding, so every byte is initialised (trait contract).
        unsafe { std::slice::from_raw_parts(self as *const Self as *const u8, size_of::<Self>()) }
    }
    fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: every bit pattern is valid (trait contract).
        unsafe { std::slice::from_raw_parts_mut(self as *mut Self as *mut u8, size_of::<Self>()) }
    }
    fn from_bytes(bytes: &[u8]) -> Self {
        debug_assert!(bytes.len() >= size_of::<Self>());
        let mut v = Self::zeroed();
        let n = size_of::<Self>();
        v.as_bytes_mut().copy_from_slice(&bytes[..n]);
        v
    }
}

macro_rules! pod {
    ($t:ty, $size:expr) => {
        // SAFETY: repr(C), integers and byte arrays only, size asserted below.
        unsafe impl Pod for $t {}
        const _: () = assert!(size_of::<$t>() == $size);
    };
}

// ---------------------------------------------------------------------------
// Superblock
// ---------------------------------------------------------------------------

/// `Superblock::state` values.
pub const STATE_CLEAN: u32 = 1;
pub const STATE_MOUNTED: u32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub magic: [u8; 8],
    pub version: u32,
    pub block_size: u32,
    pub size_bytes: u64,
    pub total_blocks: u64,
    pub lane_count: u32,
    /// STATE_CLEAN after a clean unmount, STATE_MOUNTED while in use.
    pub state: u32,
    /// Bumped at every mount; the free-list save areas are trusted only when
    /// their epoch equals the epoch of the clean unmount that wrote them.
    pub mount_epoch: u64,
    /// First block the allocator manages (after all lane areas).
    pub first_data_block: u64,
    pub uuid: [u8; 16],
    pub created_unix_ns: u64,
    /// Last clean unmount time (0 if never).
    pub unmounted_unix_ns: u64,
    /// Corruption met while mounted (version 3; ext4's `s_error_count` and
    /// first/last error fields): how many times since mkfs or the last
    /// fsck that cleared it. Non-zero: a read-write mount refuses the pool
    /// until `inkfs fsck -y` finds it clean (docs/FORMAT.md, "Errors
    /// record"). Zero in pools of older versions.
    pub errors_count: u64,
    /// When the first and the last of those errors were met (unix ns).
    pub first_error_unix_ns: u64,
    /// The inode concerned (0: none, e.g. a superblock or journal).
    pub first_error_ino: u64,
    pub last_error_unix_ns: u64,
    pub last_error_ino: u64,
    /// What was damaged: an [`ErrorReason`] code.
    pub first_error_reason: u32,
    pub last_error_reason: u32,
    /// Hybrid pools (version 5): the data device's uuid, written in its
    /// label (its first block). All zero: no data device, file data on PM
    /// only; then every other `data_*` field is zero too.
    pub data_uuid: [u8; 16],
    /// Blocks of the data device the pool uses (label, save area, data).
    pub data_blocks: u64,
    /// First device block the allocator manages: after the label and the
    /// free-list save area (`dev_first_data_block(data_blocks)`).
    pub data_first_block: u64,
    /// Placement: a write of at least this many bytes puts its new pages on
    /// the data device; smaller ones on PM (docs/DESIGN.md, "Hybrid
    /// pools"). A mount option may override it.
    pub data_threshold_bytes: u32,
    /// Blocks an appending file reserves on the device at a time, so that
    /// it grows in extents of this many blocks.
    pub data_unit_blocks: u32,
    pub reserved: [u8; 76],
    /// crc32c of every byte before this field.
    pub checksum: u32,
}
pod!(Superblock, 256);
// The offsets docs/FORMAT.md gives for the version 3 fields.
const _: () = assert!(std::mem::offset_of!(Superblock, unmounted_unix_ns) == 80);
const _: () = assert!(std::mem::offset_of!(Superblock, errors_count) == 88);
const _: () = assert!(std::mem::offset_of!(Superblock, first_error_unix_ns) == 96);
const _: () = assert!(std::mem::offset_of!(Superblock, first_error_ino) == 104);
const _: () = assert!(std::mem::offset_of!(Superblock, last_error_unix_ns) == 112);
const _: () = assert!(std::mem::offset_of!(Superblock, last_error_ino) == 120);
const _: () = assert!(std::mem::offset_of!(Superblock, first_error_reason) == 128);
const _: () = assert!(std::mem::offset_of!(Superblock, last_error_reason) == 132);
const _: () = assert!(std::mem::offset_of!(Superblock, data_uuid) == 136);
const _: () = assert!(std::mem::offset_of!(Superblock, data_blocks) == 152);
const _: () = assert!(std::mem::offset_of!(Superblock, data_first_block) == 160);
const _: () = assert!(std::mem::offset_of!(Superblock, data_threshold_bytes) == 168);
const _: () = assert!(std::mem::offset_of!(Superblock, data_unit_blocks) == 172);
const _: () = assert!(std::mem::offset_of!(Superblock, reserved) == 176);
const _: () = assert!(std::mem::offset_of!(Superblock, checksum) == 252);

/// What a runtime error found damaged (`Superblock::*_error_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ErrorReason {
    /// An inode's log: page chain, footer, entry length, checksum or fields.
    Log = 1,
    /// An inode record: state, number, kind, or a head/tail that disagrees
    /// with the loaded inode.
    InodeRecord = 2,
    /// An inode-table chain: trailer magic or link.
    InodeTable = 3,
    /// The directory tree: a parent chain that misses the root, an inode
    /// slot handed out while its record is in use.
    Namespace = 4,
    /// A superblock copy that differs from the mounted one.
    Superblock = 5,
    /// A lane journal holding a commit word while no transaction runs.
    Journal = 6,
}

impl ErrorReason {
    pub fn code(self) -> u32 {
        self as u32
    }
    pub fn from_code(code: u32) -> Option<ErrorReason> {
        Some(match code {
            1 => ErrorReason::Log,
            2 => ErrorReason::InodeRecord,
            3 => ErrorReason::InodeTable,
            4 => ErrorReason::Namespace,
            5 => ErrorReason::Superblock,
            6 => ErrorReason::Journal,
            _ => return None,
        })
    }
    /// A short name for messages and JSON.
    pub fn name(self) -> &'static str {
        match self {
            ErrorReason::Log => "log",
            ErrorReason::InodeRecord => "inode-record",
            ErrorReason::InodeTable => "inode-table",
            ErrorReason::Namespace => "namespace",
            ErrorReason::Superblock => "superblock",
            ErrorReason::Journal => "journal",
        }
    }
}

impl Superblock {
    /// Whether the pool has a data device (a hybrid pool).
    pub fn has_data_device(&self) -> bool {
        self.data_uuid != [0; 16]
    }
    pub fn compute_checksum(&self) -> u32 {
        let bytes = self.as_bytes();
        crc32c::crc32c(&bytes[..bytes.len() - 4])
    }
    pub fn seal(&mut self) {
        self.checksum = self.compute_checksum();
    }
}

/// Block number of lane `lane`'s fixed area.
pub fn lane_first_block(lane: u32) -> u64 {
    LANES_FIRST_BLOCK + lane as u64 * LANE_STRIDE_BLOCKS
}

/// First block after all lane areas.
pub fn lanes_end_block(lane_count: u32) -> u64 {
    lane_first_block(lane_count)
}

// ---------------------------------------------------------------------------
// Redo journal (one per lane, one block)
// ---------------------------------------------------------------------------

/// Fixed header at the start of a lane's journal block.
///
/// A transaction is committed when `commit` holds a non-zero record count
/// and a crc32c that matches the records: both live in one 8-byte word, so
/// the commit point is a single atomic store. See docs/FORMAT.md.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalHeader {
    /// Transaction sequence number (also covered by the crc).
    pub seq: u64,
    /// `count as u64 | (crc32c as u64) << 32`; 0 means "no transaction".
    pub commit: u64,
    pub reserved: [u8; 48],
}
pod!(JournalHeader, 64);

/// One redo record: store `value` at byte offset `offset` (8-byte aligned).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalRecord {
    pub offset: u64,
    pub value: u64,
}
pod!(JournalRecord, 16);

pub const JOURNAL_MAX_RECORDS: usize =
    (BLOCK_SIZE as usize - size_of::<JournalHeader>()) / size_of::<JournalRecord>();

pub fn journal_commit_word(count: u32, crc: u32) -> u64 {
    count as u64 | (crc as u64) << 32
}

pub fn journal_crc(seq: u64, records: &[JournalRecord]) -> u32 {
    let mut crc = crc32c::crc32c(&seq.to_le_bytes());
    for r in records {
        crc = crc32c::crc32c_append(crc, r.as_bytes());
    }
    crc
}

// ---------------------------------------------------------------------------
// Free-list save area (one per lane, LANE_SAVE_BLOCKS blocks)
// ---------------------------------------------------------------------------

/// Header of a lane's save area, written at clean unmount. Followed by
/// `block_ranges` then `inode_ranges` `SavedRange`s.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaveHeader {
    pub magic: u64,
    /// Must equal `Superblock::mount_epoch` of the unmount that wrote it.
    pub epoch: u64,
    pub block_ranges: u32,
    pub inode_ranges: u32,
    /// Next never-used inode slot of this lane (slots at or above are free).
    pub inode_slots_used: u64,
    /// Blocks carved into log chunks that have a free chunk (version 6;
    /// reserved, hence zero, before): `SavedRange`s after the inode
    /// ranges, `start` the block, `len` its bitmap of chunks in use.
    pub chunk_blocks: u32,
    pub reserved: [u8; 24],
    /// crc32c over the header (this field zero) and all ranges.
    pub checksum: u32,
}
pod!(SaveHeader, 64);
pub const SAVE_MAGIC: u64 = u64::from_le_bytes(*b"INKSAVE1");

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SavedRange {
    pub start: u64,
    pub len: u64,
}
pod!(SavedRange, 16);

pub const SAVE_MAX_RANGES: usize =
    ((LANE_SAVE_BLOCKS * BLOCK_SIZE) as usize - size_of::<SaveHeader>()) / size_of::<SavedRange>();

// ---------------------------------------------------------------------------
// Inode table (per lane: a chain of blocks of inode records)
// ---------------------------------------------------------------------------

/// `InodeRecord::state` values.
pub const INODE_FREE: u64 = 0;
pub const INODE_LIVE: u64 = 1;
/// Unlinked while open: reclaimed at the next mount after a crash.
pub const INODE_ORPHAN: u64 = 2;

/// The persistent inode: where its log is, and whether it exists. Every
/// attribute lives in the log.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InodeRecord {
    /// INODE_FREE / INODE_LIVE / INODE_ORPHAN; changed by one atomic store
    /// (journaled when other logs change with it).
    pub state: u64,
    /// Block number of the first log page.
    pub log_head: u64,
    /// Byte offset (pool-relative) just past the last committed entry.
    pub log_tail: u64,
    /// Incremented each time the slot is reused (FUSE/NFS generation).
    pub generation: u64,
    /// The inode's own number, for fsck.
    pub ino: u64,
    /// `FileKind` as u32, fixed at creation.
    pub kind: u32,
    pub reserved0: u32,
    /// `inode_flags` bits (the Linux `FS_*_FL` values of `chattr`); no
    /// other bit may be set. Changed together with the log tail through the
    /// journal (the change also logs the new ctime). Zero in a version 2
    /// pool, where these bytes were reserved.
    pub flags: u64,
    /// Bumped (one persisted store) each time log GC unlinks pages from the
    /// log, before they are freed (format 4). A process that cached a
    /// position in the log (a client of the kernel-free path) replays from
    /// the head when it changed, since the pages around its position may be
    /// gone. Any value is valid; zero in older pools.
    pub log_gen: u64,
    pub reserved: [u8; 64],
}
pod!(InodeRecord, 128);

pub const INODE_RECORD_SIZE: u64 = 128;
/// Records per inode-table block; the last 128 bytes hold the chain link.
pub const INODES_PER_TABLE_BLOCK: u64 = BLOCK_SIZE / INODE_RECORD_SIZE - 1;
pub const INODE_STATE_FIELD: u64 = 0;
pub const INODE_HEAD_FIELD: u64 = 8;
pub const INODE_TAIL_FIELD: u64 = 16;
pub const INODE_FLAGS_FIELD: u64 = 48;
pub const INODE_LOG_GEN_FIELD: u64 = 56;
const _: () = assert!(std::mem::offset_of!(InodeRecord, log_gen) as u64 == INODE_LOG_GEN_FIELD);
const _: () = assert!(std::mem::offset_of!(InodeRecord, flags) as u64 == INODE_FLAGS_FIELD);

/// Inode flags, as `FS_IOC_GETFLAGS`/`FS_IOC_SETFLAGS` (`chattr`) name
/// them: the Linux `FS_*_FL` values, stored as they are in
/// `InodeRecord::flags`.
pub mod inode_flags {
    /// `chattr +i`: no change to the inode's data, attributes, xattrs or
    /// names (for a directory: its entries), by anyone.
    pub const IMMUTABLE: u32 = 0x10;
    /// `chattr +a`: a file is written only at its end; a directory gains
    /// entries but loses none; neither is renamed, unlinked or re-owned.
    pub const APPEND: u32 = 0x20;
    /// `chattr +d`: a hint to backup programs (dump(8)); nothing enforced.
    pub const NODUMP: u32 = 0x40;
    /// `chattr +A`: no atime updates. inkfs never updates atime on access
    /// (only setattr sets it), so this holds for every inode; the flag is
    /// kept so that it reads back as set.
    pub const NOATIME: u32 = 0x80;
    /// Every bit inkfs stores; anything else is refused (EOPNOTSUPP) or, on
    /// media, corruption.
    pub const KNOWN: u32 = IMMUTABLE | APPEND | NODUMP | NOATIME;
    /// Changing these needs privilege (CAP_LINUX_IMMUTABLE).
    pub const PRIVILEGED: u32 = IMMUTABLE | APPEND;
    /// A new inode takes these from its directory (as ext4 and tmpfs).
    pub const INHERITED: u32 = NODUMP | NOATIME;
}

/// The values `InodeRecord::state` may hold.
pub fn inode_state_valid(state: u64) -> bool {
    matches!(state, INODE_FREE | INODE_LIVE | INODE_ORPHAN)
}

/// Most inode slots one lane can have: its first table block, plus one
/// table block per block of the data area (where tables grow), each
/// holding `INODES_PER_TABLE_BLOCK` records. Saved high waters and inode
/// numbers on media are bounded by it (`Geometry::ino_max`).
pub fn lane_slots_max(data_blocks: u64) -> u64 {
    data_blocks
        .saturating_add(1)
        .saturating_mul(INODES_PER_TABLE_BLOCK)
}

/// Trailer of an inode-table block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableTrailer {
    pub magic: u64,
    /// Next table block of this lane, 0 = end of chain.
    pub next_block: u64,
    pub reserved: [u8; 112],
}
pod!(TableTrailer, 128);
pub const TABLE_MAGIC: u64 = u64::from_le_bytes(*b"INKITBL1");
pub const TABLE_TRAILER_OFFSET: u64 = INODES_PER_TABLE_BLOCK * INODE_RECORD_SIZE;

/// Split an inode number into (lane, slot).
pub fn ino_to_lane_slot(ino: u64, lane_count: u32) -> (u32, u64) {
    debug_assert!(ino >= 1);
    let n = ino - 1;
    ((n % lane_count as u64) as u32, n / lane_count as u64)
}

pub fn lane_slot_to_ino(lane: u32, slot: u64, lane_count: u32) -> u64 {
    slot * lane_count as u64 + lane as u64 + 1
}

// ---------------------------------------------------------------------------
// File kinds
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum FileKind {
    File = 1,
    Dir = 2,
    Symlink = 3,
    Fifo = 4,
    Socket = 5,
    CharDev = 6,
    BlockDev = 7,
}

impl FileKind {
    pub fn from_u32(v: u32) -> Option<FileKind> {
        Some(match v {
            1 => FileKind::File,
            2 => FileKind::Dir,
            3 => FileKind::Symlink,
            4 => FileKind::Fifo,
            5 => FileKind::Socket,
            6 => FileKind::CharDev,
            7 => FileKind::BlockDev,
            _ => return None,
        })
    }
    /// The S_IFMT bits.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::File => libc::S_IFREG,
            FileKind::Dir => libc::S_IFDIR,
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::Fifo => libc::S_IFIFO,
            FileKind::Socket => libc::S_IFSOCK,
            FileKind::CharDev => libc::S_IFCHR,
            FileKind::BlockDev => libc::S_IFBLK,
        }
    }
    pub fn from_mode(mode: u32) -> Option<FileKind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => FileKind::File,
            libc::S_IFDIR => FileKind::Dir,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDev,
            libc::S_IFBLK => FileKind::BlockDev,
            _ => return None,
        })
    }
}

/// The bits an attribute snapshot's mode may have: type and permissions.
pub const MODE_BITS: u32 = libc::S_IFMT | 0o7777;

// ---------------------------------------------------------------------------
// Log pages and entries
// ---------------------------------------------------------------------------

/// Log entries are whole cache lines so one entry never shares a line with
/// the next (a flush of one never re-writes another).
pub const ENTRY_UNIT: u64 = 64;
/// Entries live in the first 4032 bytes of a log page; the footer follows.
pub const LOG_PAGE_PAYLOAD: u64 = BLOCK_SIZE - 64;
pub const LOG_FOOTER_OFFSET: u64 = LOG_PAGE_PAYLOAD;
pub const LOG_MAGIC: u64 = u64::from_le_bytes(*b"INKLOGP1");

/// A log's first page may be a chunk: a quarter of a block, shared with
/// other logs' first pages (version 6). Its entries take the first 960
/// bytes, its footer (the same `LogPageFooter`) the last 64. Only a head
/// is small: the pages it links to are whole blocks.
pub const LOG_CHUNK_BYTES: u64 = 1024;
pub const LOG_CHUNKS_PER_BLOCK: u64 = BLOCK_SIZE / LOG_CHUNK_BYTES;
pub const LOG_CHUNK_PAYLOAD: u64 = LOG_CHUNK_BYTES - 64;
/// Bitmap of a chunk block whose every chunk is in use.
pub const LOG_CHUNKS_FULL: u64 = (1 << LOG_CHUNKS_PER_BLOCK) - 1;
/// A log page id (`log_head`, the pages a walk reports) names a chunk by
/// its block with `chunk + 1` in the bits from here up; a whole page is
/// its block number alone.
const LOG_CHUNK_TAG_SHIFT: u32 = 60;

/// Every chunk's page id is at least this (above every block number, the
/// data device's included).
pub const LOG_CHUNK_ID_MIN: u64 = 1 << LOG_CHUNK_TAG_SHIFT;
const _: () = assert!(LOG_CHUNK_ID_MIN > DEV_BLOCK_BASE << 8);

/// The page id of chunk `chunk` (0 … 3) of `block`.
pub const fn log_chunk_id(block: u64, chunk: u64) -> u64 {
    block | ((chunk + 1) << LOG_CHUNK_TAG_SHIFT)
}

/// A log page id taken apart: its block and, for a chunk, which chunk.
/// None if the tag names no chunk (damage).
pub const fn log_page_id(id: u64) -> Option<(u64, Option<u64>)> {
    let tag = id >> LOG_CHUNK_TAG_SHIFT;
    let block = id & ((1 << LOG_CHUNK_TAG_SHIFT) - 1);
    match tag {
        0 => Some((block, None)),
        t if t <= LOG_CHUNKS_PER_BLOCK => Some((block, Some(t - 1))),
        _ => None,
    }
}

/// Where a log page's bytes are: its first byte, and how many bytes of
/// entries it holds before its footer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogPageSpan {
    pub base: u64,
    pub payload: u64,
}

impl LogPageSpan {
    /// The span of a valid page id (`log_page_id` is Some).
    pub const fn of(id: u64) -> LogPageSpan {
        match log_page_id(id) {
            Some((block, Some(chunk))) => LogPageSpan {
                base: block * BLOCK_SIZE + chunk * LOG_CHUNK_BYTES,
                payload: LOG_CHUNK_PAYLOAD,
            },
            Some((block, None)) => LogPageSpan {
                base: block * BLOCK_SIZE,
                payload: LOG_PAGE_PAYLOAD,
            },
            // Callers check ids first; an invalid one maps nowhere useful
            // but stays in bounds of arithmetic.
            None => LogPageSpan {
                base: 0,
                payload: 0,
            },
        }
    }
    pub const fn footer(&self) -> u64 {
        self.base + self.payload
    }
    /// True if log position `pos` lies in this page (its end included:
    /// a full page's tail sits there).
    pub const fn holds(&self, pos: u64) -> bool {
        pos >= self.base && pos <= self.base + self.payload
    }
}

/// Footer of every log page.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogPageFooter {
    /// Next page of this log (block number), 0 = none yet.
    pub next_block: u64,
    pub magic: u64,
    /// Inode that owns this log, for fsck.
    pub owner_ino: u64,
    pub reserved: [u8; 40],
}
pod!(LogPageFooter, 64);

/// Entry type tags (first byte of every entry).
pub mod entry_type {
    /// Never written: unused space reads as zero only by accident; entries
    /// below the tail are never of this type.
    pub const INVALID: u8 = 0;
    /// The rest of this page is unused; continue at the next page.
    pub const PAD: u8 = 1;
    pub const SET_ATTR: u8 = 2;
    pub const LINK_CHANGE: u8 = 3;
    pub const FILE_WRITE: u8 = 4;
    pub const DIR_ADD: u8 = 5;
    pub const DIR_REMOVE: u8 = 6;
    pub const SYMLINK: u8 = 7;
    pub const XATTR_SET: u8 = 8;
    pub const XATTR_REMOVE: u8 = 9;
}

/// First 8 bytes of every entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryHeader {
    pub kind: u8,
    /// Entry length in 64-byte units.
    pub units: u8,
    pub reserved: u16,
    /// crc32c of the whole entry with this field zero.
    pub checksum: u32,
}
pod!(EntryHeader, 8);

/// SET_ATTR and LINK_CHANGE: a full snapshot of the inode's attributes.
/// The last one in the log wins.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttrEntry {
    pub hdr: EntryHeader,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// Device number for device nodes; parent inode for directories.
    pub rdev_or_parent: u64,
}
pod!(AttrEntry, 64);

impl AttrEntry {
    /// The ranges of a snapshot of an inode of `kind`: the mode holds the
    /// kind's type bits and permissions only; at most `LINK_MAX` links (0
    /// is what an orphan's snapshots hold); a file's size at most
    /// `MAX_FILE_BYTES`, every other kind's 0 (their sizes are derived).
    /// Times, owner and a device number may hold any value. A directory's
    /// parent is checked against the pool's geometry (`Geometry::is_ino`).
    pub fn check(&self, kind: FileKind) -> Result<(), String> {
        if self.mode & !MODE_BITS != 0 || FileKind::from_mode(self.mode) != Some(kind) {
            return Err(format!("mode {:o} disagrees with kind {kind:?}", self.mode));
        }
        if self.nlink > LINK_MAX {
            return Err(format!("link count {} above {LINK_MAX}", self.nlink));
        }
        let size_max = if kind == FileKind::File {
            MAX_FILE_BYTES
        } else {
            0
        };
        if self.size > size_max {
            return Err(format!(
                "size {} above {size_max}, the maximum for a {kind:?}",
                self.size
            ));
        }
        Ok(())
    }
}

/// FILE_WRITE: pages `[file_page, file_page + pages)` now live in blocks
/// `[block, block + pages)`, or are a hole when `block == 0`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteEntry {
    pub hdr: EntryHeader,
    pub file_page: u64,
    pub block: u64,
    pub pages: u32,
    pub reserved0: u32,
    /// File size after this write.
    pub size: u64,
    /// mtime and ctime after this write.
    pub mtime_ns: i64,
    pub reserved: [u8; 16],
}
pod!(WriteEntry, 64);

impl WriteEntry {
    /// At least one page, every page below `MAX_FILE_PAGES`, a size at most
    /// `MAX_FILE_BYTES`. The block range is checked against the pool's
    /// geometry (`Geometry::is_data_range`).
    pub fn check(&self) -> Result<(), String> {
        if self.pages == 0 {
            return Err("write entry of zero pages".into());
        }
        if self
            .file_page
            .checked_add(self.pages as u64)
            .is_none_or(|end| end > MAX_FILE_PAGES)
        {
            return Err(format!(
                "write entry of pages {}+{} beyond the maximum file size",
                self.file_page, self.pages
            ));
        }
        if self.size > MAX_FILE_BYTES {
            return Err(format!(
                "write entry sets size {}, above the maximum {MAX_FILE_BYTES}",
                self.size
            ));
        }
        Ok(())
    }
}

/// DIR_ADD / DIR_REMOVE head; the name follows immediately.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirEntryHead {
    pub hdr: EntryHeader,
    pub ino: u64,
    /// Readdir position of the name (cookie = seq + 3), unique within the
    /// directory and at most `dir::POSITION_MAX`: a keyed hash of the name
    /// since version 3, a per-directory sequence number before. In a
    /// DIR_REMOVE, the removed name's position (not used by replay).
    pub seq: u64,
    /// Directory mtime and ctime after this change.
    pub mtime_ns: i64,
    pub name_len: u16,
    /// `FileKind` of the child, for readdir's d_type.
    pub child_kind: u8,
    pub reserved: [u8; 5],
}
pod!(DirEntryHead, 40);

/// Readdir cookies are derived from `DirEntryHead::seq` with room to spare:
/// a sequence at or above this is corruption.
pub const DIR_SEQ_LIMIT: u64 = 1 << 63;

/// A name a directory entry may hold: 1 to `NAME_MAX` bytes, neither '/'
/// nor NUL, not "." or "..".
pub fn dir_name_valid(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= NAME_MAX
        && !name.contains(&b'/')
        && !name.contains(&0)
        && name != b"."
        && name != b".."
}

impl DirEntryHead {
    /// The child (an inode number, at least 1; its upper bound is the
    /// pool's, `Geometry::is_ino`), the sequence number, the child kind and
    /// the name (`name_len` bytes, already cut from the entry).
    pub fn check(&self, name: &[u8]) -> Result<(), String> {
        if self.ino == 0 {
            return Err("directory entry names inode 0".into());
        }
        if self.seq >= DIR_SEQ_LIMIT {
            return Err(format!(
                "directory entry sequence {} out of range",
                self.seq
            ));
        }
        if FileKind::from_u32(self.child_kind as u32).is_none() {
            return Err(format!(
                "directory entry child kind {} invalid",
                self.child_kind
            ));
        }
        if !dir_name_valid(name) {
            return Err(format!(
                "directory entry name \"{}\" invalid",
                String::from_utf8_lossy(name).escape_debug()
            ));
        }
        Ok(())
    }
}

/// SYMLINK: the target is stored in one data block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SymlinkEntry {
    pub hdr: EntryHeader,
    pub block: u64,
    pub len: u32,
    pub reserved: [u8; 44],
}
pod!(SymlinkEntry, 64);

impl SymlinkEntry {
    /// A target of 1 to `SYMLINK_MAX` bytes (the block is checked against
    /// the pool's geometry).
    pub fn check(&self) -> Result<(), String> {
        if self.len == 0 || self.len as usize > SYMLINK_MAX {
            return Err(format!("symlink length {} out of range", self.len));
        }
        Ok(())
    }
}

/// XATTR_SET / XATTR_REMOVE head; name then value follow.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XattrHead {
    pub hdr: EntryHeader,
    pub name_len: u16,
    pub value_len: u16,
    pub reserved: u32,
    pub ctime_ns: i64,
}
pod!(XattrHead, 24);

/// Largest xattr value stored (ext4 without ea_inode stores about a block).
pub const XATTR_VALUE_MAX: usize = LOG_PAGE_PAYLOAD as usize - size_of::<XattrHead>() - NAME_MAX;

/// The xattr namespaces inkfs stores (system.* would need ACL support).
pub const XATTR_PREFIXES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];

/// A name an xattr may have: 1 to `NAME_MAX` bytes, no NUL, a known
/// namespace followed by at least one byte.
pub fn xattr_name_valid(name: &[u8]) -> bool {
    name.len() <= NAME_MAX
        && !name.contains(&0)
        && XATTR_PREFIXES
            .iter()
            .any(|p| name.len() > p.len() && name.starts_with(p))
}

impl XattrHead {
    /// The name (`name_len` bytes, already cut from the entry) and the
    /// value length: at most `XATTR_VALUE_MAX`, and 0 in XATTR_REMOVE.
    pub fn check(&self, set: bool, name: &[u8]) -> Result<(), String> {
        if !xattr_name_valid(name) {
            return Err(format!(
                "xattr name \"{}\" invalid",
                String::from_utf8_lossy(name).escape_debug()
            ));
        }
        let v = self.value_len as usize;
        if v > XATTR_VALUE_MAX || !set && v != 0 {
            return Err(format!("xattr value length {v} out of range"));
        }
        Ok(())
    }
}

/// Size in bytes of an entry carrying `payload` bytes after a `head`-byte head.
pub const fn entry_bytes(head: usize, payload: usize) -> u64 {
    ((head + payload) as u64).div_ceil(ENTRY_UNIT) * ENTRY_UNIT
}

/// crc32c of an entry with its checksum field (bytes 4..8) read as zero.
/// Entries are whole cache lines, so this runs over 8-byte words with the
/// SSE4.2 crc32 instruction: a 64-byte entry costs a few nanoseconds, on
/// every append and every entry a walk reads.
pub fn entry_crc(bytes: &[u8]) -> u32 {
    debug_assert!(bytes.len() >= 8 && bytes.len().is_multiple_of(8));
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU supports SSE4.2 (checked just above).
        return unsafe { entry_crc_sse42(bytes) };
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(&bytes[..4]), &[0; 4]);
    crc32c::crc32c_append(crc, &bytes[8..])
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "sse4.2")]
unsafe fn entry_crc_sse42(bytes: &[u8]) -> u32 {
    use std::arch::x86_64::_mm_crc32_u64;
    let mut crc = !0u32 as u64;
    for (i, chunk) in bytes.chunks_exact(8).enumerate() {
        let mut word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
        if i == 0 {
            word &= 0x0000_0000_ffff_ffff; // the checksum field counts as zero
        }
        crc = _mm_crc32_u64(crc, word);
    }
    !(crc as u32)
}

/// Compute and store an entry's checksum (over `bytes`, the whole entry).
pub fn seal_entry(bytes: &mut [u8]) {
    let crc = entry_crc(bytes);
    bytes[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// Check an entry read back from media.
pub fn entry_checksum_ok(bytes: &[u8]) -> bool {
    if bytes.len() < 8 || !bytes.len().is_multiple_of(8) {
        return false;
    }
    let stored = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    entry_crc(bytes) == stored
}

// ---------------------------------------------------------------------------
// Hybrid pools: the data device (version 5)
// ---------------------------------------------------------------------------

/// Device blocks are named in FILE_WRITE entries (and in DRAM indexes) as
/// `DEV_BLOCK_BASE + device block`: above any PM pool's range (a PM pool
/// of 2^48 blocks would be 1 EiB), so one u64 says which side a block is
/// on, runs of consecutive numbers never cross from one side to the
/// other, and every structure that maps pages to blocks works unchanged.
pub const DEV_BLOCK_BASE: u64 = 1 << 48;
/// Most blocks a data device may have (so that `DEV_BLOCK_BASE + block`
/// and its byte address stay far from overflow): 2^44 blocks, 64 PiB.
pub const DEV_BLOCKS_MAX: u64 = 1 << 44;
/// The smallest data device: label, one save block, and room for data.
pub const DEV_BLOCKS_MIN: u64 = 64;
/// The device's label: its first block.
pub const DEV_LABEL_BLOCK: u64 = 0;
/// The device's free-list save area starts after the label.
pub const DEV_SAVE_FIRST_BLOCK: u64 = 1;
/// Save-area blocks at most (1 MiB: 65,532 ranges).
pub const DEV_SAVE_BLOCKS_MAX: u64 = 256;
/// Largest placement threshold (larger writes than this always go to the
/// device when it has room).
pub const DATA_THRESHOLD_MAX: u32 = 1 << 30;
/// Largest device extent unit, in blocks (64 MiB).
pub const DATA_UNIT_BLOCKS_MAX: u32 = 16384;

/// Save-area blocks of a device of `blocks` blocks: one per 1024 blocks
/// (a range per 4 blocks of data, far more than allocation leaves), at
/// least 1, at most `DEV_SAVE_BLOCKS_MAX`.
pub fn dev_save_blocks(blocks: u64) -> u64 {
    (blocks / 1024).clamp(1, DEV_SAVE_BLOCKS_MAX)
}

/// The first device block the allocator manages.
pub fn dev_first_data_block(blocks: u64) -> u64 {
    DEV_SAVE_FIRST_BLOCK + dev_save_blocks(blocks)
}

pub const DEV_LABEL_MAGIC: [u8; 8] = *b"INKFSdv1";

/// The label in a data device's first block: who it is and which pool it
/// belongs to. Written at mkfs, never changed; a mount reads it to refuse
/// a wrong device.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLabel {
    pub magic: [u8; 8],
    /// The format version that wrote it.
    pub version: u32,
    pub block_size: u32,
    /// The device's own uuid (the superblock's `data_uuid`).
    pub uuid: [u8; 16],
    /// The uuid of the pool it belongs to (the superblock's `uuid`).
    pub pool_uuid: [u8; 16],
    /// Blocks the pool uses (the superblock's `data_blocks`).
    pub blocks: u64,
    pub first_data_block: u64,
    pub created_unix_ns: u64,
    pub reserved: [u8; 68],
    /// crc32c of every byte before this field.
    pub checksum: u32,
}
pod!(DeviceLabel, 144);

impl DeviceLabel {
    pub fn compute_checksum(&self) -> u32 {
        let bytes = self.as_bytes();
        crc32c::crc32c(&bytes[..bytes.len() - 4])
    }
    pub fn seal(&mut self) {
        self.checksum = self.compute_checksum();
    }
}

pub const DEV_SAVE_MAGIC: u64 = u64::from_le_bytes(*b"INKDSAV1");

/// Header of the device's free-list save area, written at clean unmount;
/// followed by `ranges` `SavedRange`s of device blocks (numbered as
/// FILE_WRITE names them, from `DEV_BLOCK_BASE`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceSaveHeader {
    pub magic: u64,
    /// Must equal `Superblock::mount_epoch` of the unmount that wrote it.
    pub epoch: u64,
    pub ranges: u64,
    pub reserved: [u8; 36],
    /// crc32c over the header (this field zero) and all ranges.
    pub checksum: u32,
}
pod!(DeviceSaveHeader, 64);

/// Ranges the save area of a device of `blocks` blocks holds.
pub fn dev_save_max_ranges(blocks: u64) -> u64 {
    (dev_save_blocks(blocks) * BLOCK_SIZE - size_of::<DeviceSaveHeader>() as u64)
        / size_of::<SavedRange>() as u64
}

pub const DATA_RECORD_MAGIC: u64 = u64::from_le_bytes(*b"INKDREC1");
/// Where the data record sits in superblock blocks 0 and 1 (the
/// superblock fills their first 256 bytes; the rest was zero before).
pub const DATA_RECORD_OFFSET: u64 = 2048;
/// Longest recorded device path.
pub const DATA_PATH_MAX: usize = 2000;

/// Where a hybrid pool's data device was at mkfs (its path), after the
/// superblock in blocks 0 and 1, written in the same order as the
/// superblock (primary, then backup). Only a hint: the device is matched
/// by uuid, and the mount option `data=PATH` overrides it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataRecord {
    pub magic: u64,
    pub path_len: u32,
    pub reserved0: u32,
    pub path: [u8; DATA_PATH_MAX],
    pub reserved: [u8; 28],
    /// crc32c of every byte before this field.
    pub checksum: u32,
}
pod!(DataRecord, 2048);
const _: () = assert!(DATA_RECORD_OFFSET + size_of::<DataRecord>() as u64 <= BLOCK_SIZE);
const _: () = assert!(DATA_RECORD_OFFSET >= size_of::<Superblock>() as u64);

impl DataRecord {
    pub fn new(path: &[u8]) -> Option<DataRecord> {
        if path.is_empty() || path.len() > DATA_PATH_MAX {
            return None;
        }
        let mut r = DataRecord::zeroed();
        r.magic = DATA_RECORD_MAGIC;
        r.path_len = path.len() as u32;
        r.path[..path.len()].copy_from_slice(path);
        r.checksum = r.compute_checksum();
        Some(r)
    }
    pub fn compute_checksum(&self) -> u32 {
        let bytes = self.as_bytes();
        crc32c::crc32c(&bytes[..bytes.len() - 4])
    }
    /// The recorded path, if the record is whole.
    pub fn path(&self) -> Option<&[u8]> {
        let ok = self.magic == DATA_RECORD_MAGIC
            && self.checksum == self.compute_checksum()
            && (1..=DATA_PATH_MAX).contains(&(self.path_len as usize));
        ok.then(|| &self.path[..self.path_len as usize])
    }
}

const _: () =
    assert!(size_of::<JournalHeader>() as u64 + (JOURNAL_MAX_RECORDS * 16) as u64 <= BLOCK_SIZE);
const _: () = assert!(TABLE_TRAILER_OFFSET + size_of::<TableTrailer>() as u64 == BLOCK_SIZE);
const _: () = assert!(LOG_FOOTER_OFFSET + size_of::<LogPageFooter>() as u64 == BLOCK_SIZE);
const _: () = assert!(LOG_CHUNK_PAYLOAD + size_of::<LogPageFooter>() as u64 == LOG_CHUNK_BYTES);
const _: () = assert!(BLOCK_SIZE.is_multiple_of(LOG_CHUNK_BYTES) && LOG_CHUNKS_PER_BLOCK <= 8);
const _: () = assert!(LOG_CHUNK_PAYLOAD.is_multiple_of(ENTRY_UNIT));
const _: () = assert!(entry_bytes(size_of::<DirEntryHead>(), NAME_MAX) <= LOG_PAGE_PAYLOAD);
const _: () = assert!(XATTR_VALUE_MAX >= 3072);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_crc_matches_crc32c_with_zeroed_field() {
        let mut x = 0x1234_5678_9abc_def0u64;
        for len in [8usize, 64, 128, 320, 4032] {
            let mut bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let mut zeroed = bytes.clone();
            zeroed[4..8].fill(0);
            assert_eq!(entry_crc(&bytes), crc32c::crc32c(&zeroed), "len {len}");
            seal_entry(&mut bytes);
            assert!(entry_checksum_ok(&bytes));
            bytes[len - 1] ^= 1;
            assert!(!entry_checksum_ok(&bytes));
        }
    }

    #[test]
    fn superblock_round_trip() {
        let mut sb = Superblock::zeroed();
        sb.magic = MAGIC;
        sb.version = FORMAT_VERSION;
        sb.size_bytes = 1 << 30;
        sb.seal();
        let back = Superblock::from_bytes(sb.as_bytes());
        assert_eq!(back, sb);
        assert_eq!(back.checksum, back.compute_checksum());
    }
}
