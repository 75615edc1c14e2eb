//! The inode scan: every record of every table block, as the next mount
//! would read it (journal applied). A live or orphan inode's record is
//! checked (state, number, kind, flags), its log loaded through the
//! engine's own decoder, the blocks it uses recorded (a block used twice
//! or outside the data area is an error), bytes mapped past its end of
//! file and readdir positions checked. What is kept of each inode
//! (`InoInfo`) feeds the namespace walk and the free-list check.

use std::collections::BTreeMap;
use std::fmt;

use super::check::{show_name, Checker, C_DIRS, C_FILES, C_INODES, C_ORPHANS, C_OTHER, C_SYMLINKS};
use super::repair::Fix;
use super::report::{ProblemKind, Progress};
use crate::error::Error;
use crate::filemap::FileMap;
use crate::format::*;
use crate::inode;
use crate::pmem::Pmem;

fn corrupt_message(e: Error) -> String {
    match e {
        Error::Corrupt(m) => m,
        other => other.to_string(),
    }
}

/// Who uses a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Use {
    Table(u32),
    Log(u64),
    /// A block carved into log chunks (the heads of several logs).
    LogChunks,
    Data(u64),
    Symlink(u64),
}

impl Use {
    fn ino(self) -> Option<u64> {
        match self {
            Use::Table(_) | Use::LogChunks => None,
            Use::Log(i) | Use::Data(i) | Use::Symlink(i) => Some(i),
        }
    }
}

impl fmt::Display for Use {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Use::Table(l) => write!(f, "the inode table of lane {l}"),
            Use::Log(i) => write!(f, "the log of inode {i}"),
            Use::LogChunks => write!(f, "log chunks"),
            Use::Data(i) => write!(f, "the data of inode {i}"),
            Use::Symlink(i) => write!(f, "the symlink target of inode {i}"),
        }
    }
}

/// Used blocks as disjoint ranges: start → (end, user).
#[derive(Default)]
pub(super) struct BlockMap {
    pub(super) map: BTreeMap<u64, (u64, Use)>,
    pub(super) used: u64,
    /// Blocks carved into log chunks: the inode whose log head each chunk
    /// is (0: none).
    pub(super) chunks: BTreeMap<u64, [u64; LOG_CHUNKS_PER_BLOCK as usize]>,
}

impl BlockMap {
    /// Record `[start, start + len)` (inside the data area) as used by `u`;
    /// on overlap, the first shared block and its other user.
    fn add(&mut self, start: u64, len: u64, u: Use) -> std::result::Result<(), (u64, Use)> {
        let end = start + len;
        let mut merge_with = None;
        if let Some((&s, &(e, o))) = self.map.range(..=start).next_back() {
            if e > start {
                return Err((start, o));
            }
            if e == start && o == u {
                merge_with = Some(s);
            }
        }
        if let Some((&s, &(_, o))) = self.map.range(start..end).next() {
            return Err((s, o));
        }
        match merge_with {
            Some(s) => {
                if let Some(v) = self.map.get_mut(&s) {
                    v.0 = end;
                }
            }
            None => {
                self.map.insert(start, (end, u));
            }
        }
        self.used += len;
        Ok(())
    }
}

/// What the check keeps of one live or orphan inode.
pub(super) struct InoInfo {
    pub(super) lane: u32,
    pub(super) slot: u64,
    pub(super) state: u64,
    pub(super) kind: FileKind,
    /// None when its log could not be read.
    pub(super) body: Option<Loaded>,
}

pub(super) struct Loaded {
    pub(super) nlink: u32,
    /// Directories: the ".." in the last attribute snapshot.
    pub(super) parent: u64,
    /// Directories: (name, child, child kind).
    pub(super) children: Vec<(Vec<u8>, u64, FileKind)>,
}

impl<P: Pmem + ?Sized> Checker<'_, P> {
    fn use_blocks(&mut self, start: u64, len: u64, u: Use) {
        // File data may be on a hybrid pool's data device; nothing else.
        let on_device = matches!(u, Use::Data(_)) && self.geo.is_dev_range(start, len);
        if !self.geo.is_data_range(start, len) && !on_device {
            self.error(
                ProblemKind::BlockRange,
                u.ino(),
                format!("blocks {start}+{len} of {u} lie outside the data area"),
                None,
            );
            return;
        }
        if let Err((b, other)) = self.blocks.add(start, len, u) {
            self.error(
                ProblemKind::BlockTwice,
                u.ino(),
                format!("block {b} is used by {u} and by {other}"),
                None,
            );
        }
    }

    /// Record log page `id` of inode `ino`: a whole page as a block, a
    /// chunk as its block (once, for every chunk of it) and the chunk's
    /// owner (a chunk two logs name is an error, as a block used twice).
    fn use_log_page(&mut self, id: u64, ino: u64) {
        let Some((block, Some(chunk))) = log_page_id(id) else {
            return self.use_blocks(id, 1, Use::Log(ino));
        };
        if !self.blocks.chunks.contains_key(&block) {
            // Not in the map yet: claim the block (a data or log block
            // already there is an error, reported here).
            self.use_blocks(block, 1, Use::LogChunks);
            let claimed = self
                .blocks
                .map
                .range(..=block)
                .next_back()
                .is_some_and(|(_, &(end, u))| end > block && u == Use::LogChunks);
            if !claimed {
                return;
            }
        }
        let owners = self.blocks.chunks.entry(block).or_default();
        let other = owners[chunk as usize];
        if other != 0 {
            self.error(
                ProblemKind::BlockTwice,
                Some(ino),
                format!(
                    "log chunk {chunk} of block {block} is the head of the logs of \
                     inode {ino} and inode {other}"
                ),
                None,
            );
            return;
        }
        owners[chunk as usize] = ino;
    }

    /// Bytes a file maps past its end of file must be zero: growing the
    /// file (truncate, fallocate, a write past the end) shows them as the
    /// file's contents (FORMAT.md, "Copy-on-write data"). Reads the tail of
    /// the last page and every page mapped beyond it.
    fn check_past_eof(&mut self, ino: u64, size: u64, map: &FileMap) {
        let first = size / BLOCK_SIZE;
        let mut dirty: Vec<(u64, u64)> = Vec::new();
        let mut dev_dirty: Vec<(u64, u64)> = Vec::new();
        let mut buf = [0u8; BLOCK_SIZE as usize];
        for e in map.iter().filter(|e| e.end() > first) {
            for page in e.page.max(first)..e.end() {
                let block = e.block + (page - e.page);
                let from = if page == first { size % BLOCK_SIZE } else { 0 };
                if self.geo.is_dev_range(block, 1) {
                    if self.dev_page_dirty(block, from as usize, &mut buf) {
                        dev_dirty.push((block, from));
                    }
                    continue;
                }
                if !self.geo.is_data_range(block, 1) {
                    continue; // reported by `use_blocks`
                }
                let part = &mut buf[from as usize..];
                self.pm.read(block * BLOCK_SIZE + from, part);
                if part.iter().any(|&b| b != 0) {
                    dirty.push((block * BLOCK_SIZE + from, BLOCK_SIZE - from));
                }
            }
        }
        if let Some(&(block, _)) = dev_dirty.first() {
            self.error(
                ProblemKind::PastEof,
                Some(ino),
                format!(
                    "{} page(s) on the data device hold non-zero bytes past the end of file \
                     (size {size}; first at device block {}); zeroed at repair",
                    dev_dirty.len(),
                    block - DEV_BLOCK_BASE
                ),
                Some(Fix::ZeroDevPastEof { pages: dev_dirty }),
            );
        }
        if let Some(&(off, _)) = dirty.first() {
            self.error(
                ProblemKind::PastEof,
                Some(ino),
                format!(
                    "{} page(s) hold non-zero bytes past the end of file (size {size}; first at pool \
                     offset {off}); zeroed at repair",
                    dirty.len()
                ),
                Some(Fix::ZeroPastEof { ranges: dirty }),
            );
        }
    }

    pub(super) fn scan_inodes(&mut self, phase: &'static str, progress: &mut dyn FnMut(Progress)) {
        let total: u64 = self
            .tables
            .iter()
            .map(|c| c.len() as u64 * INODES_PER_TABLE_BLOCK)
            .sum();
        let mut done = 0;
        progress(Progress { phase, done, total });
        for lane in 0..self.geo.lane_count {
            let chain = self.tables[lane as usize].clone();
            for (index, &block) in chain.iter().enumerate() {
                if block >= self.geo.first_data_block {
                    self.use_blocks(block, 1, Use::Table(lane));
                }
                for i in 0..INODES_PER_TABLE_BLOCK {
                    let slot = index as u64 * INODES_PER_TABLE_BLOCK + i;
                    let rec_off = block * BLOCK_SIZE + i * INODE_RECORD_SIZE;
                    self.check_inode(lane, slot, rec_off);
                }
                done += INODES_PER_TABLE_BLOCK;
                progress(Progress { phase, done, total });
            }
        }
    }

    fn check_inode(&mut self, lane: u32, slot: u64, rec_off: u64) {
        let rec = self.read_record(rec_off);
        let ino = lane_slot_to_ino(lane, slot, self.geo.lane_count);
        match rec.state {
            INODE_FREE => return,
            INODE_LIVE | INODE_ORPHAN => {}
            other => {
                self.error(
                    ProblemKind::InodeRecord,
                    Some(ino),
                    format!("unknown record state {other}"),
                    None,
                );
                return;
            }
        }
        let orphan = rec.state == INODE_ORPHAN;
        // An orphan's damage goes with it: the mount frees orphans unread.
        let orphan_fix = orphan.then_some(Fix::RebuildAllocator);
        if rec.ino != ino {
            self.error(
                ProblemKind::InodeRecord,
                Some(ino),
                format!(
                    "the record of lane {lane} slot {slot} names inode {}",
                    rec.ino
                ),
                orphan_fix,
            );
            return;
        }
        let Some(kind) = FileKind::from_u32(rec.kind) else {
            self.error(
                ProblemKind::InodeRecord,
                Some(ino),
                format!("unknown kind {}", rec.kind),
                orphan_fix,
            );
            return;
        };
        let rec = self.check_flags(ino, rec_off, rec);
        self.counts[C_INODES] += 1;
        self.counts[match kind {
            FileKind::Dir => C_DIRS,
            FileKind::File => C_FILES,
            FileKind::Symlink => C_SYMLINKS,
            _ => C_OTHER,
        }] += 1;
        if orphan {
            self.counts[C_ORPHANS] += 1;
            if self.sb.state == STATE_CLEAN {
                self.error(
                    ProblemKind::Orphan,
                    Some(ino),
                    "orphan (unlinked while open) left by a clean unmount; freed at repair".into(),
                    Some(Fix::RebuildAllocator),
                );
            } else {
                self.note(
                    ProblemKind::Orphan,
                    Some(ino),
                    "orphan (unlinked while open); it will be freed at mount".into(),
                    Some(Fix::RebuildAllocator),
                );
            }
        }
        let body = match inode::load_with_pages(self.pm, &self.geo, ino, &rec) {
            Err(e) => {
                self.error(ProblemKind::Log, Some(ino), corrupt_message(e), orphan_fix);
                None
            }
            Ok((st, pages)) => {
                for p in pages {
                    self.use_log_page(p, ino);
                }
                let mut children = Vec::new();
                match &st.body {
                    inode::Body::File(map) => {
                        for e in map.iter() {
                            self.use_blocks(e.block, e.pages, Use::Data(ino));
                        }
                        self.check_past_eof(ino, st.attr.size, map);
                    }
                    inode::Body::Symlink { block, .. } if *block != 0 => {
                        self.use_blocks(*block, 1, Use::Symlink(ino))
                    }
                    inode::Body::Dir(d) => {
                        children = d.iter().map(|(n, c)| (n.to_vec(), c.ino, c.kind)).collect();
                        self.check_positions(ino, d);
                    }
                    _ => {}
                }
                Some(Loaded {
                    nlink: st.attr.nlink,
                    parent: st.attr.rdev_or_parent,
                    children,
                })
            }
        };
        self.inodes.insert(
            ino,
            InoInfo {
                lane,
                slot,
                state: rec.state,
                kind,
                body,
            },
        );
    }

    /// Inode flags must be bits inkfs knows (the mount refuses the inode
    /// otherwise). Returns the record with them masked, so that the rest
    /// of the inode is still checked.
    fn check_flags(&mut self, ino: u64, rec_off: u64, rec: InodeRecord) -> InodeRecord {
        let Err(m) = inode::record_flags(&rec) else {
            return rec;
        };
        let value = rec.flags & inode_flags::KNOWN as u64;
        self.error(
            ProblemKind::InodeRecord,
            Some(ino),
            format!("{m}; the unknown bits are cleared at repair"),
            Some(Fix::MaskFlags {
                off: rec_off + INODE_FLAGS_FIELD,
                value,
            }),
        );
        InodeRecord {
            flags: value,
            ..rec
        }
    }

    /// Readdir positions must be unique within a directory (a name seen
    /// twice in one pass otherwise) and their cookies must fit an i64. The
    /// replay placed each offending name at a free position; the repair
    /// rewrites its entry there (before any other fix of the name: the
    /// inode scan's findings precede the namespace walk's).
    fn check_positions(&mut self, ino: u64, d: &crate::dir::DirIndex) {
        for (name, c) in d.displaced() {
            self.error(
                ProblemKind::DirPosition,
                Some(ino),
                format!(
                    "entry \"{}\": its readdir position is another entry's or out of range \
                     (moved to {})",
                    show_name(name),
                    c.seq
                ),
                Some(Fix::RetargetEntry {
                    dir: ino,
                    name: name.to_vec(),
                    ino: c.ino,
                    kind: c.kind,
                }),
            );
        }
    }
}
