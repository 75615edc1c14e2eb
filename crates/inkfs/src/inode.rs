//! Inodes: the persistent record in a lane's inode table, the DRAM state
//! rebuilt from the inode's log, and the cache that holds loaded inodes.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};

use crate::alloc::BlockAllocator;
use crate::dir::{Child, DirIndex};
use crate::error::{Error, Result};
use crate::filemap::FileMap;
use crate::format::*;
use crate::log::{self, Entry, LogCursor};
use crate::pmem::{read_pod, write_pod, Pmem};
use crate::superblock::Geometry;

/// What an inode holds besides attributes.
#[derive(Debug)]
pub enum Body {
    File(FileMap),
    Dir(DirIndex),
    Symlink {
        target: Vec<u8>,
        block: u64,
    },
    /// FIFOs, sockets, device nodes: attributes only.
    Special,
}

/// The DRAM state of one inode, guarded by the inode's RwLock.
#[derive(Debug)]
pub struct InodeState {
    /// Latest attribute snapshot (the header field is unused in DRAM).
    pub attr: AttrEntry,
    /// `inode_flags` bits, as the inode record holds them.
    pub flags: u32,
    pub generation: u64,
    pub log: LogCursor,
    /// The record's `log_gen` when the log was last read or GC'd here.
    pub log_gen: u64,
    pub body: Body,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Entries in the log (for compaction decisions).
    pub log_entries: u64,
    /// Log length (pages) at which fast GC next scans the log; doubling
    /// keeps the scans' cost linear in what was appended.
    pub fast_gc_at: u64,
    /// Open handles; an unlinked inode lives until the last one closes.
    pub open_count: u32,
    /// Unlinked while open (INODE_ORPHAN on media).
    pub orphan: bool,
    /// Freed: every operation through a stale reference fails.
    pub gone: bool,
    /// Posix mode: attributes (mtime) changed in DRAM only, persisted at fsync.
    pub attr_dirty: bool,
    /// Posix mode: the size before the first extension committed without a
    /// fence since this inode's last fence, i.e. the size a crash may still
    /// bring back; `None` when the size in DRAM is durable.
    pub unfenced_size: Option<u64>,
    /// Data blocks reserved in DRAM past the end of the file (start, count),
    /// see `file::PREALLOC_BLOCKS`. Never on media.
    pub prealloc: (u64, u64),
    /// A lease holder's blocks displaced from this file, for its next
    /// overwrites (recycle.rs). Never on media; empty but in a client.
    pub recycled: crate::recycle::Recycled,
}

impl InodeState {
    /// The state of an inode of `kind` before any entry of its log is
    /// applied (log replay starts here).
    pub fn empty(kind: FileKind, generation: u64, orphan: bool) -> InodeState {
        InodeState {
            attr: AttrEntry::from_bytes(&[0u8; 64]),
            flags: 0,
            generation,
            log: LogCursor::default(),
            log_gen: 0,
            body: match kind {
                FileKind::File => Body::File(FileMap::default()),
                FileKind::Dir => Body::Dir(DirIndex::default()),
                FileKind::Symlink => Body::Symlink {
                    target: Vec::new(),
                    block: 0,
                },
                _ => Body::Special,
            },
            xattrs: BTreeMap::new(),
            log_entries: 0,
            fast_gc_at: 0,
            open_count: 0,
            orphan,
            gone: false,
            attr_dirty: false,
            unfenced_size: None,
            prealloc: (0, 0),
            recycled: Default::default(),
        }
    }

    pub fn file(&self) -> Option<&FileMap> {
        match &self.body {
            Body::File(m) => Some(m),
            _ => None,
        }
    }
    pub fn file_mut(&mut self) -> Option<&mut FileMap> {
        match &mut self.body {
            Body::File(m) => Some(m),
            _ => None,
        }
    }
    pub fn dir(&self) -> Option<&DirIndex> {
        match &self.body {
            Body::Dir(d) => Some(d),
            _ => None,
        }
    }
    pub fn dir_mut(&mut self) -> Option<&mut DirIndex> {
        match &mut self.body {
            Body::Dir(d) => Some(d),
            _ => None,
        }
    }
}

/// A loaded inode. The kind and location never change while it lives.
#[derive(Debug)]
pub struct Inode {
    pub ino: u64,
    pub kind: FileKind,
    /// Byte offset of the InodeRecord.
    pub rec_off: u64,
    pub state: RwLock<InodeState>,
    /// A client engine: the client's lease count (`Fs::client_mark_current`)
    /// at which this state was last found current under the inode's write
    /// lease; 0 never. While it equals the count, no other party can have
    /// changed the record, and uses skip the check against it (shared.rs).
    pub(crate) lease_mark: AtomicU64,
}

impl Inode {
    /// Freed by another process since this object was loaded (shared.rs).
    pub fn is_gone(&self) -> bool {
        read(&self.state).gone
    }
}

/// Rebuild an inode's DRAM state by replaying its log.
pub fn load<P: Pmem + ?Sized>(
    pm: &P,
    geo: &Geometry,
    ino: u64,
    rec: &InodeRecord,
) -> Result<InodeState> {
    load_with_pages(pm, geo, ino, rec).map(|(st, _)| st)
}

/// `load`, also returning the log's pages (recovery marks them in use).
pub fn load_with_pages<P: Pmem + ?Sized>(
    pm: &P,
    geo: &Geometry,
    ino: u64,
    rec: &InodeRecord,
) -> Result<(InodeState, Vec<u64>)> {
    let corrupt = |m: String| Error::Corrupt(format!("inode {ino}: {m}"));
    let kind = FileKind::from_u32(rec.kind)
        .ok_or_else(|| corrupt(format!("unknown kind {}", rec.kind)))?;
    let mut st = InodeState::empty(kind, rec.generation, rec.state == INODE_ORPHAN);
    st.flags = record_flags(rec).map_err(corrupt)?;
    st.log.head = rec.log_head;
    st.log.tail = rec.log_tail;
    st.log_gen = rec.log_gen;
    // A log starts with an attribute entry, but fast GC may later unlink
    // that page once a newer attribute entry supersedes it: the log must
    // hold one somewhere.
    let mut seen_attr = false;
    let summary = log::walk(pm, geo, ino, rec.log_head, rec.log_tail, |off, e| {
        // Every snapshot, not only the last: none the engine writes is out
        // of range for the inode's kind (its mode, links and size).
        let fits = match &e {
            Entry::Attr { attr, .. } => {
                seen_attr = true;
                attr.check(kind)
            }
            _ => Ok(()),
        };
        fits.and_then(|()| apply_entry(pm, geo, &mut st, e, &mut |_, _| {}))
            .map_err(|m| corrupt(format!("log offset {off}: {m}")))
    })?;
    if !seen_attr {
        return Err(corrupt("log holds no attribute entry".into()));
    }
    if let Body::Symlink { block: 0, .. } = st.body {
        return Err(corrupt("symlink without a target".into()));
    }
    debug_assert_eq!(FileKind::from_mode(st.attr.mode), Some(kind));
    st.log.pages = summary.pages.len() as u64;
    st.log_entries = summary.entries;
    Ok((st, summary.pages))
}

/// The flags of an inode record, if they are ones inkfs knows.
pub fn record_flags(rec: &InodeRecord) -> std::result::Result<u32, String> {
    if rec.flags & !(inode_flags::KNOWN as u64) != 0 {
        return Err(format!("unknown inode flags {:#x}", rec.flags));
    }
    Ok(rec.flags as u32)
}

/// Apply one log entry to DRAM state (replay, and after a commit).
/// `released` receives data blocks the entry makes unreachable.
pub fn apply_entry<P: Pmem + ?Sized>(
    pm: &P,
    geo: &Geometry,
    st: &mut InodeState,
    e: Entry<'_>,
    released: &mut impl FnMut(u64, u64),
) -> std::result::Result<(), String> {
    match e {
        Entry::Attr { attr, .. } => {
            if let Body::Dir(_) = st.body {
                if !geo.is_ino(attr.rdev_or_parent) {
                    return Err(format!("parent inode {} out of range", attr.rdev_or_parent));
                }
            }
            let shrink = attr.size < st.attr.size;
            st.attr = attr;
            if shrink {
                if let Body::File(map) = &mut st.body {
                    map.truncate(attr.size.div_ceil(BLOCK_SIZE), released);
                }
            }
        }
        Entry::Write(w) => {
            let Body::File(map) = &mut st.body else {
                return Err("write entry in a non-file log".into());
            };
            if w.block != 0 && !geo.is_file_data_range(w.block, w.pages as u64) {
                return Err(format!(
                    "write entry maps blocks {}+{} out of range",
                    w.block, w.pages
                ));
            }
            // `log::parse` checked the page range and the size.
            debug_assert!(w.check().is_ok());
            map.map(w.file_page, w.pages as u64, w.block, released);
            st.attr.size = w.size;
            st.attr.mtime_ns = w.mtime_ns;
            st.attr.ctime_ns = w.mtime_ns;
        }
        Entry::DirAdd { head, name } => {
            let Body::Dir(dir) = &mut st.body else {
                return Err("directory entry in a non-directory log".into());
            };
            if !geo.is_ino(head.ino) {
                return Err(format!(
                    "directory entry names inode {}, out of range",
                    head.ino
                ));
            }
            let kind = FileKind::from_u32(head.child_kind as u32).ok_or("bad child kind")?;
            dir.add(
                name,
                Child {
                    ino: head.ino,
                    kind,
                    seq: head.seq,
                },
            );
            st.attr.mtime_ns = head.mtime_ns;
            st.attr.ctime_ns = head.mtime_ns;
        }
        Entry::DirRemove { head, name } => {
            let Body::Dir(dir) = &mut st.body else {
                return Err("directory entry in a non-directory log".into());
            };
            if !geo.is_ino(head.ino) {
                return Err(format!(
                    "directory entry names inode {}, out of range",
                    head.ino
                ));
            }
            dir.remove(name);
            st.attr.mtime_ns = head.mtime_ns;
            st.attr.ctime_ns = head.mtime_ns;
        }
        Entry::Symlink(s) => {
            let Body::Symlink { target, block } = &mut st.body else {
                return Err("symlink entry in a non-symlink log".into());
            };
            if !geo.is_data_range(s.block, 1) {
                return Err(format!("symlink block {} out of range", s.block));
            }
            let mut t = vec![0u8; s.len as usize];
            pm.read(s.block * BLOCK_SIZE, &mut t);
            *target = t;
            *block = s.block;
        }
        Entry::XattrSet { head, name, value } => {
            st.xattrs.insert(name.to_vec(), value.to_vec());
            st.attr.ctime_ns = head.ctime_ns;
        }
        Entry::XattrRemove { head, name } => {
            st.xattrs.remove(name);
            st.attr.ctime_ns = head.ctime_ns;
        }
    }
    st.log_entries += 1;
    Ok(())
}

// ---------------------------------------------------------------------------
// Inode tables
// ---------------------------------------------------------------------------

/// Per lane, the blocks of its inode table chain, in order.
pub struct InodeTables {
    lanes: Vec<Mutex<LaneTable>>,
    lane_count: u32,
    geo: Geometry,
}

/// One lane's table chain as far as it has been walked. Chains are walked
/// lazily: a clean mount reads no table block until an inode in it is
/// needed (a pool of a million inodes has tens of thousands of them).
struct LaneTable {
    blocks: Vec<u64>,
    seen: std::collections::HashSet<u64>,
    /// Blocks (a prefix of `blocks`) whose trailer was read and checked:
    /// no record is read from a block before its trailer is.
    checked: usize,
    complete: bool,
}

impl InodeTables {
    /// Tables whose chains are walked on demand.
    pub fn open(geo: &Geometry) -> InodeTables {
        let lanes = (0..geo.lane_count)
            .map(|lane| {
                Mutex::new(LaneTable {
                    blocks: vec![lane_first_block(lane) + LANE_INODE_TABLE_BLOCK],
                    seen: Default::default(),
                    checked: 0,
                    complete: false,
                })
            })
            .collect();
        InodeTables {
            lanes,
            lane_count: geo.lane_count,
            geo: *geo,
        }
    }

    /// Walk every lane's table chain now (bounded, checked).
    pub fn load<P: Pmem + ?Sized>(pm: &P, geo: &Geometry) -> Result<InodeTables> {
        let t = InodeTables::open(geo);
        for lane in 0..geo.lane_count {
            t.extend(pm, lane, &mut lock(&t.lanes[lane as usize]), usize::MAX)?;
        }
        Ok(t)
    }

    /// Walk `lane`'s chain until it has more than `index` blocks or ends,
    /// checking the trailer of every block up to `index`.
    fn extend<P: Pmem + ?Sized>(
        &self,
        pm: &P,
        lane: u32,
        lt: &mut LaneTable,
        index: usize,
    ) -> Result<()> {
        while lt.checked <= index {
            if lt.checked == lt.blocks.len() {
                // Every block so far is checked: follow the last one's link,
                // read again even when the chain was found complete before:
                // another engine may have grown it since (a client holding
                // the lane's lease, lanelease.rs; the owner, seen by an
                // attached engine). A link only ever goes from 0 to a block
                // already written and persisted, so a new one is safe to
                // follow.
                let last = lt.blocks[lt.blocks.len() - 1];
                let trailer: TableTrailer = read_pod(pm, last * BLOCK_SIZE + TABLE_TRAILER_OFFSET);
                if trailer.next_block == 0 {
                    lt.complete = true;
                    break;
                }
                // A cycle revisits a block: the set finds it in O(1).
                if !self.geo.is_data_range(trailer.next_block, 1)
                    || !lt.seen.insert(trailer.next_block)
                {
                    return Err(Error::Corrupt(format!(
                        "lane {lane} inode table links to bad block {}",
                        trailer.next_block
                    )));
                }
                lt.blocks.push(trailer.next_block);
            }
            let block = lt.blocks[lt.checked];
            let trailer: TableTrailer = read_pod(pm, block * BLOCK_SIZE + TABLE_TRAILER_OFFSET);
            if trailer.magic != TABLE_MAGIC {
                return Err(Error::Corrupt(format!(
                    "lane {lane} inode table block {block} has a bad trailer"
                )));
            }
            lt.checked += 1;
        }
        Ok(())
    }

    pub fn lane_count(&self) -> u32 {
        self.lane_count
    }

    /// Every table block of `lane` (recovery).
    pub fn blocks<P: Pmem + ?Sized>(&self, pm: &P, lane: u32) -> Result<Vec<u64>> {
        let mut lt = lock(&self.lanes[lane as usize]);
        self.extend(pm, lane, &mut lt, usize::MAX)?;
        Ok(lt.blocks.clone())
    }

    /// Re-read every trailer of `lane`'s chain (scrub), under the lane's
    /// mutex so a chain growing meanwhile is seen whole: the magic, and each
    /// link equal to the chain walked before. Returns the blocks found good
    /// (in order) and the first problem.
    pub fn verify_chain<P: Pmem + ?Sized>(&self, pm: &P, lane: u32) -> (Vec<u64>, Option<String>) {
        let mut lt = lock(&self.lanes[lane as usize]);
        if let Err(e) = self.extend(pm, lane, &mut lt, usize::MAX) {
            // `extend` stopped at the damage; the blocks before it are good.
            let msg = match e {
                Error::Corrupt(m) => m,
                other => other.to_string(),
            };
            return (lt.blocks.clone(), Some(msg));
        }
        debug_assert!(lt.complete);
        for (i, &block) in lt.blocks.iter().enumerate() {
            let trailer: TableTrailer = read_pod(pm, block * BLOCK_SIZE + TABLE_TRAILER_OFFSET);
            if trailer.magic != TABLE_MAGIC {
                return (
                    lt.blocks[..i].to_vec(),
                    Some(format!(
                        "lane {lane} inode table block {block} has a bad trailer"
                    )),
                );
            }
            let next = lt.blocks.get(i + 1).copied().unwrap_or(0);
            if trailer.next_block != next {
                return (
                    lt.blocks[..=i].to_vec(),
                    Some(format!(
                        "lane {lane} inode table block {block} links to block {}, \
                         but the chain continues at {next}",
                        trailer.next_block
                    )),
                );
            }
        }
        (lt.blocks.clone(), None)
    }

    /// Record offset of an inode number, if its slot exists.
    pub fn record_offset<P: Pmem + ?Sized>(&self, pm: &P, ino: u64) -> Result<Option<u64>> {
        if ino == 0 {
            return Ok(None);
        }
        let (lane, slot) = ino_to_lane_slot(ino, self.lane_count);
        let index = (slot / INODES_PER_TABLE_BLOCK) as usize;
        let mut lt = lock(&self.lanes[lane as usize]);
        self.extend(pm, lane, &mut lt, index)?;
        Ok(lt
            .blocks
            .get(index)
            .map(|b| b * BLOCK_SIZE + (slot % INODES_PER_TABLE_BLOCK) * INODE_RECORD_SIZE))
    }

    /// Record offset for a slot about to be used, growing the lane's chain
    /// by one zeroed, persisted block if needed. A crash after the block is
    /// written but before it is linked leaks nothing: an unlinked block is
    /// free to the recovery scan.
    pub fn ensure_slot<P: Pmem + ?Sized>(
        &self,
        pm: &P,
        alloc: &BlockAllocator,
        lane: u32,
        slot: u64,
    ) -> Result<u64> {
        let mut lt = lock(&self.lanes[lane as usize]);
        let index = (slot / INODES_PER_TABLE_BLOCK) as usize;
        self.extend(pm, lane, &mut lt, index)?;
        if lt.blocks.len() <= index {
            // Growing: the new block links after the chain's true end.
            self.extend(pm, lane, &mut lt, usize::MAX)?;
        }
        while lt.blocks.len() <= index {
            let block = alloc.alloc_meta(lane).ok_or(Error::Errno(libc::ENOSPC))?;
            pm.zero_nt(block * BLOCK_SIZE, BLOCK_SIZE);
            let trailer = TableTrailer {
                magic: TABLE_MAGIC,
                next_block: 0,
                reserved: [0; 112],
            };
            write_pod(pm, block * BLOCK_SIZE + TABLE_TRAILER_OFFSET, &trailer);
            pm.persist(block * BLOCK_SIZE + TABLE_TRAILER_OFFSET, 128);
            let last = lt.blocks[lt.blocks.len() - 1];
            let link = last * BLOCK_SIZE + TABLE_TRAILER_OFFSET + 8;
            pm.write_u64(link, block);
            pm.persist(link, 8);
            lt.blocks.push(block);
            lt.seen.insert(block);
        }
        Ok(lt.blocks[index] * BLOCK_SIZE + (slot % INODES_PER_TABLE_BLOCK) * INODE_RECORD_SIZE)
    }

    /// True if `off` is the state, head, tail or flags field of some inode
    /// record (the only targets the journal may write).
    pub fn is_record_field<P: Pmem + ?Sized>(&self, pm: &P, off: u64) -> Result<bool> {
        let in_block = off % BLOCK_SIZE;
        if in_block >= TABLE_TRAILER_OFFSET
            || !matches!(
                in_block % INODE_RECORD_SIZE,
                INODE_STATE_FIELD | INODE_HEAD_FIELD | INODE_TAIL_FIELD | INODE_FLAGS_FIELD
            )
        {
            return Ok(false);
        }
        let block = off / BLOCK_SIZE;
        for lane in 0..self.lane_count {
            if self.blocks(pm, lane)?.contains(&block) {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

// ---------------------------------------------------------------------------
// Inode cache
// ---------------------------------------------------------------------------

const CACHE_SHARDS: usize = 64;

/// Loaded inodes by number, sharded so lookups of different inodes rarely
/// meet on a lock. Handles hold `Arc<Inode>` directly, so reads and writes
/// never touch this map.
pub struct InodeCache {
    shards: Vec<RwLock<InoMap>>,
}

/// One shard: keyed by inode numbers, which the engine hands out (no
/// caller picks them, so no flooding to resist), hashed by the engine's
/// integer hasher rather than std's SipHash: every step of a path walk
/// looks an inode up here.
type InoMap = crate::inthash::IntMap<Arc<Inode>>;

impl Default for InodeCache {
    fn default() -> Self {
        InodeCache {
            shards: (0..CACHE_SHARDS)
                .map(|_| RwLock::new(InoMap::default()))
                .collect(),
        }
    }
}

impl InodeCache {
    fn shard(&self, ino: u64) -> &RwLock<InoMap> {
        &self.shards[(ino as usize) % CACHE_SHARDS]
    }

    pub fn get(&self, ino: u64) -> Option<Arc<Inode>> {
        read(self.shard(ino)).get(&ino).cloned()
    }

    /// Get, or load with `load` while holding the shard's write lock, so a
    /// concurrent free (which removes under the same lock) cannot leave a
    /// stale inode behind.
    pub fn get_or_load(
        &self,
        ino: u64,
        load: impl FnOnce() -> Result<Arc<Inode>>,
    ) -> Result<Arc<Inode>> {
        if let Some(i) = self.get(ino) {
            return Ok(i);
        }
        let mut shard = write(self.shard(ino));
        if let Some(i) = shard.get(&ino) {
            return Ok(i.clone());
        }
        let inode = load()?;
        shard.insert(ino, inode.clone());
        Ok(inode)
    }

    pub fn insert(&self, inode: Arc<Inode>) {
        write(self.shard(inode.ino)).insert(inode.ino, inode);
    }

    pub fn remove(&self, ino: u64) {
        write(self.shard(ino)).remove(&ino);
    }

    /// Remove `inode` if it is still the object cached for its number (a
    /// stale one another process freed: a fresh object a thread loaded
    /// meanwhile stays).
    pub fn remove_stale(&self, inode: &Inode) {
        let mut shard = write(self.shard(inode.ino));
        if shard
            .get(&inode.ino)
            .is_some_and(|c| std::ptr::eq(Arc::as_ptr(c), inode))
        {
            shard.remove(&inode.ino);
        }
    }

    pub fn all(&self) -> Vec<Arc<Inode>> {
        self.shards
            .iter()
            .flat_map(|s| read(s).values().cloned().collect::<Vec<_>>())
            .collect()
    }
}

// Lock helpers: a poisoned lock means a thread panicked while holding it;
// the engine's invariants are asserted before any state is mutated, so the
// data is still consistent and we continue rather than cascade panics.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
pub fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}
pub fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}
