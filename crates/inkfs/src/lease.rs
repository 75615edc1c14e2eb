//! Write leases of the kernel-free path (docs/KERNEL-FREE.md, "Writing:
//! per-inode leases"), the engine's side of both parties.
//!
//! **Client.** An engine attached to a pool another process owns
//! (`Fs::attach_client`) writes only the data of inodes the server leased
//! to it, with blocks the server reserved for it: its allocator starts
//! empty and holds only those. It never writes the journal, the
//! superblock, an inode record other than a leased inode's tail, and it
//! never collects logs (the server's GC does, once it has the inode back).
//! The commit is the engine's own (entries and data persisted, fence, the
//! 8-byte tail store, fence), so every crash guarantee of docs/FORMAT.md
//! holds unchanged. Blocks it frees (the copy-on-write's displaced pages,
//! a truncate's tail, a prealloc it drops) may still be read by the server
//! or other clients: they go to a list the client sends to the server,
//! which holds them in its limbo.
//!
//! Outside a lease write (`ClientWrites`), the client engine refuses every
//! change with EROFS, as a read-only attach does: `Client::call` cannot
//! write behind the server's back.
//!
//! **Server.** A [`LeaseHook`] is told before the engine uses any inode
//! (`revalidate`): the mount recalls a lease there. After a recall (or the
//! holder's death) the server catches its cached inode up from its own
//! tail and settles the blocks ([`Fs::lease_refs`], and `RangeSet`),
//! having first made the tail it adopted durable (a holder killed between
//! its tail store and that line's write-back leaves it only visible).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::alloc::grant;
use crate::error::{errno, Error, Result};
use crate::format::{log_page_id, BLOCK_SIZE, DEV_BLOCK_BASE, INODE_TAIL_FIELD, LOG_CHUNK_ID_MIN};
pub use crate::blockset::RangeSet;
use crate::epoch::SharedTable;
use crate::fs::{FileHandle, Fs};
use crate::recycle::Recycled;
use crate::inode::{lock, read, write, Body};
use crate::log;
use crate::pmem::Pmem;
use crate::types::{FileKind, Mode};

/// Told by the engine before it uses an inode (the server's lease table):
/// a lease held on it by another process is recalled before this returns.
pub trait LeaseHook: Send + Sync {
    fn before_use(&self, ino: u64);
    /// Whether another process holds `ino`'s lease now (it may be
    /// committing to its log: this engine's cached state may be behind).
    fn is_leased(&self, ino: u64) -> bool;
}

/// Freed ranges a client keeps before it sends them (four message lines,
/// written at once: a random overwrite frees one range per write).
pub const FREED_RANGES_MAX: usize = 4 * crate::api::lease::RANGES_PER_LINE;
/// Freed blocks a client keeps before it sends them (4 MiB): the server
/// cannot reuse them meanwhile, so they count as used in `statfs`.
pub const FREED_BLOCKS_MAX: u64 = 1024;

/// What a client engine keeps of its writes.
#[derive(Default)]
pub(crate) struct ClientSide {
    /// Lease writes in progress (the only time the engine may write).
    writing: AtomicU32,
    /// Blocks freed by this client, for the server's limbo.
    freed: Mutex<Freed>,
    /// `freed` holds a full batch (read after every lease write: a load,
    /// not the lock).
    freed_due: AtomicBool,
    /// The readers' epoch table and this client's own slot in it: with
    /// them, blocks its overwrites displace are recycled (recycle.rs).
    epochs: std::sync::OnceLock<(SharedTable, usize)>,
    /// Blocks waiting before recycled ones are reused.
    recycle_batch: AtomicU64,
    /// Recycled blocks reused (statistics, tests).
    recycled_reused: AtomicU64,
    /// Per side (PM, data device): the server had fewer blocks of that
    /// side than this client asked for (`set_client_side_full`), so writes
    /// placed there spill to the other side.
    full: [AtomicBool; 2],
    /// One bit per [`MAP_CHUNK_BLOCKS`] blocks of the pool: this process
    /// mapped them already ([`Pmem::map_ahead`]; mapping them again costs a
    /// page-table walk per page).
    mapped: Vec<AtomicU64>,
    /// Leases given back so far, plus one: bumped before any lease goes
    /// back (and when the session ends), which unmarks every inode found
    /// current under a lease ([`Fs::client_mark_current`]).
    lease_count: AtomicU64,
    /// The lane leased to this client and its directory leases
    /// (lanelease.rs).
    pub(crate) lane: crate::lanelease::ClientLane,
}

/// Blocks mapped ahead at once (2 MiB): a reservation's blocks are mapped
/// in whole chunks, each once per process.
const MAP_CHUNK_BLOCKS: u64 = 512;

impl ClientSide {
    fn new(total_blocks: u64) -> ClientSide {
        let chunks = total_blocks.div_ceil(MAP_CHUNK_BLOCKS);
        ClientSide {
            mapped: (0..chunks.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            recycle_batch: AtomicU64::new(crate::recycle::RECYCLE_BATCH_BLOCKS),
            lease_count: AtomicU64::new(1),
            ..ClientSide::default()
        }
    }

    /// Mark chunk `c` mapped: whether it was not yet.
    fn first_map(&self, c: u64) -> bool {
        let Some(word) = self.mapped.get((c / 64) as usize) else {
            return false;
        };
        let bit = 1u64 << (c % 64);
        word.fetch_or(bit, Ordering::Relaxed) & bit == 0
    }
}

/// A client's freed blocks not sent yet: ranges, adjacent ones merged (a
/// sequential overwrite frees block after block), and their block count.
#[derive(Default)]
struct Freed {
    ranges: Vec<(u64, u64)>,
    blocks: u64,
}

impl Freed {
    fn push(&mut self, start: u64, len: u64) {
        self.blocks += len;
        debug_assert!(start < LOG_CHUNK_ID_MIN, "a log chunk on the freed list");
        match self.ranges.last_mut() {
            Some((s, l)) if *s + *l == start => *l += len,
            Some((s, l)) if start + len == *s => {
                *s = start;
                *l += len;
            }
            _ => {
                if self.ranges.capacity() == 0 {
                    // Once, not at each batch's first free (a write path).
                    self.ranges.reserve_exact(FREED_RANGES_MAX * 2);
                }
                self.ranges.push((start, len));
            }
        }
    }

    /// Whether the batch should go to the server now.
    fn due(&self) -> bool {
        self.ranges.len() >= FREED_RANGES_MAX || self.blocks >= FREED_BLOCKS_MAX
    }

    fn take(&mut self) -> Vec<(u64, u64)> {
        self.blocks = 0;
        let keep = self.ranges.capacity();
        std::mem::replace(&mut self.ranges, Vec::with_capacity(keep))
    }
}

/// A lease write in progress on a client engine: while one lives, the
/// engine may write (see the module comment).
pub struct ClientWrites<'a> {
    side: &'a ClientSide,
}

impl Drop for ClientWrites<'_> {
    fn drop(&mut self) {
        self.side.writing.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<P: Pmem> Fs<P> {
    /// An engine over a pool another process owns that may write the data
    /// of inodes leased to it (see the module comment); as
    /// [`Fs::attach`] otherwise. The mapping must be writable.
    pub fn attach_client(pm: P, mode: Mode) -> Result<Fs<P>> {
        Self::attach_client_with(pm, mode, None)
    }

    /// [`Fs::attach_client`] to a pool that may be hybrid: `data` as for
    /// [`Fs::attach_with`]. The client then writes device blocks too, from
    /// its reservation, as the engine does: written, flushed, then
    /// committed.
    pub fn attach_client_with(
        pm: P,
        mode: Mode,
        data: Option<(Arc<dyn crate::blockdev::BlockDev>, u64)>,
    ) -> Result<Fs<P>> {
        let mut fs = Fs::attach_with(pm, mode, data)?;
        fs.client = Some(ClientSide::new(fs.geo.total_blocks));
        Ok(fs)
    }

    /// This engine is a client's (`attach_client`).
    #[inline]
    pub(crate) fn is_client(&self) -> bool {
        self.client.is_some()
    }

    /// A lease write in progress on this client engine.
    #[inline]
    pub(crate) fn client_writing(&self) -> bool {
        self.client
            .as_ref()
            .is_some_and(|c| c.writing.load(Ordering::SeqCst) > 0)
    }

    /// Let this client engine write until the guard goes (the caller holds
    /// the lease of every inode it writes meanwhile). None on an engine
    /// that is not a client's.
    pub fn client_writes(&self) -> Option<ClientWrites<'_>> {
        let side = self.client.as_ref()?;
        side.writing.fetch_add(1, Ordering::SeqCst);
        Some(ClientWrites { side })
    }

    /// A client's free: the block goes to the server (see the module
    /// comment). True if this engine is a client's.
    pub(crate) fn client_free(&self, start: u64, len: u64) -> bool {
        let Some(side) = &self.client else {
            return false;
        };
        let mut freed = lock(&side.freed);
        freed.push(start, len);
        if freed.due() {
            side.freed_due.store(true, Ordering::Relaxed);
        }
        true
    }

    /// The blocks this client freed since the last call (to send to the
    /// server).
    pub fn take_client_freed(&self) -> Vec<(u64, u64)> {
        self.client
            .as_ref()
            .map(|c| {
                let mut freed = lock(&c.freed);
                c.freed_due.store(false, Ordering::Relaxed);
                freed.take()
            })
            .unwrap_or_default()
    }

    /// Whether this client has freed enough blocks (or ranges) since the
    /// last [`Fs::take_client_freed`] that they should go to the server
    /// now ([`FREED_RANGES_MAX`], [`FREED_BLOCKS_MAX`]). Until then they
    /// wait: sending costs a system call and wakes the server, which is
    /// most of a write's time when it happens at every write. A recall, a
    /// detach and a reservation request send them at once; the server's
    /// own writes have the rest of the free space.
    pub fn client_freed_due(&self) -> bool {
        self.client
            .as_ref()
            .is_some_and(|c| c.freed_due.load(Ordering::Relaxed))
    }

    /// A client engine: the server said `side` is full (or has room again:
    /// `full` false); see `alloc_file_blocks`.
    pub fn set_client_side_full(&self, side: crate::blockdev::Side, full: bool) {
        if let Some(c) = &self.client {
            c.full[side as usize].store(full, Ordering::Relaxed);
        }
    }

    /// Whether the server said `side` is full (a client engine).
    pub(crate) fn client_side_full(&self, side: crate::blockdev::Side) -> bool {
        self.client
            .as_ref()
            .is_some_and(|c| c.full[side as usize].load(Ordering::Relaxed))
    }

    /// Whether this engine's pool keeps file data on a data device too.
    pub fn is_hybrid(&self) -> bool {
        self.data.is_some()
    }

    /// Blocks the server reserved for this client join its allocator.
    pub fn add_reservation(&self, ranges: &[(u64, u64)]) -> Result<()> {
        if !self.is_client() {
            return errno(libc::EINVAL);
        }
        // This process's writes go there next: map the pages now, a chunk
        // at a time and each chunk once, instead of a page fault inside
        // each of those writes (the server mapped its own pages; this
        // mapping is new). Before the blocks are free to take: the reserve
        // thread adds them while other threads write, and a write that took
        // one first would fault its page in itself.
        if let Some(side) = &self.client {
            for &(start, len) in ranges {
                if start >= DEV_BLOCK_BASE {
                    continue;
                }
                // Clipped to the pool: a range outside it is refused below,
                // once nothing was mapped for it.
                let end = start.saturating_add(len).min(self.geo.total_blocks);
                for c in start / MAP_CHUNK_BLOCKS..end.div_ceil(MAP_CHUNK_BLOCKS) {
                    let first = (c * MAP_CHUNK_BLOCKS).max(self.geo.first_data_block);
                    let last = ((c + 1) * MAP_CHUNK_BLOCKS).min(self.geo.total_blocks);
                    if first < last && side.first_map(c) {
                        self.pm.map_ahead(first * BLOCK_SIZE, (last - first) * BLOCK_SIZE);
                    }
                }
            }
        }
        for &(start, len) in ranges {
            self.add_free_on_side(start, len)
                .map_err(|e| Error::Corrupt(format!("reserved blocks {start}+{len}: {e:?}")))?;
        }
        Ok(())
    }

    /// Free blocks of this client's reservation on each side (PM, data
    /// device).
    pub fn reservation_free(&self) -> (u64, u64) {
        (
            self.blocks.free_blocks(),
            self.data.as_ref().map_or(0, |d| d.blocks.free_blocks()),
        )
    }

    /// Take every block of this client's reservation it has not used (to
    /// return them to the server).
    pub fn drain_reservation(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        if !self.is_client() {
            return out;
        }
        let sides = std::iter::once(&self.blocks).chain(self.data.as_ref().map(|d| &d.blocks));
        for blocks in sides {
            for lane in 0..self.geo.lane_count {
                for (start, len) in blocks.free_ranges(lane) {
                    // Another thread of this client may take them
                    // meanwhile: only what is still free is returned.
                    if blocks.mark_used(start, len).is_ok() {
                        out.push((start, len));
                    }
                }
            }
        }
        out
    }

    /// A client lets inode `ino`'s lease go: the blocks its DRAM state
    /// keeps in reserve and its recycled blocks are freed (to the server,
    /// see `client_free`), and no inode counts as current any more
    /// ([`Fs::client_leases_changed`]).
    pub fn client_release_inode(&self, ino: u64) {
        self.client_leases_changed();
        if let Some(inode) = self.cache.get(ino) {
            let mut st = write(&inode.state);
            self.drop_prealloc(&mut st);
            let mut recycled = std::mem::take(&mut st.recycled);
            recycled.drain(|start, len| self.free_blocks(start, len));
        }
    }

    /// The client's lease count now: read before a write under a lease,
    /// given to [`Fs::client_mark_current`] after it. 0 on an engine that
    /// is not a client's.
    pub fn client_lease_count(&self) -> u64 {
        self.client
            .as_ref()
            .map_or(0, |c| c.lease_count.load(Ordering::SeqCst))
    }

    /// A lease of this client goes back (before the server hears of it),
    /// or the session ended: every inode must check its record again
    /// before its next use. Every inode, not only the lease's: a give-back
    /// is rare (a recall, a log due for GC), and one count is cheaper on
    /// the write path than a mark per inode that must reach the object a
    /// handle holds.
    pub fn client_leases_changed(&self) {
        if let Some(c) = &self.client {
            c.lease_count.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A write under `fh`'s inode's lease just found its state current (it
    /// checked the record, then committed itself), with the lease held
    /// since the count was `count` ([`Fs::client_lease_count`], read
    /// before the write): until a lease goes back, uses of the inode skip
    /// the check of its record (shared.rs). Safe because while this client
    /// holds the lease nobody else changes the record: other clients
    /// write only under the lease, which the server grants only after
    /// taking it back from this one; the server itself changes an inode
    /// (a namespace change, chmod, its log GC, the settling) only after
    /// its lease hook has recalled the lease, and a recall is answered by
    /// a give-back, which bumps the count first. The client's own commits
    /// keep its DRAM state and the record equal under the inode's lock.
    pub fn client_mark_current(&self, fh: &FileHandle, count: u64) {
        if self.is_client() && count != 0 {
            fh.inode.lease_mark.store(count, Ordering::Release);
        }
    }

    /// Whether `inode`'s state is current without a look at its record
    /// (see [`Fs::client_mark_current`]).
    #[inline]
    pub(crate) fn client_known_current(&self, inode: &crate::inode::Inode) -> bool {
        let Some(c) = &self.client else {
            return false;
        };
        let mark = inode.lease_mark.load(Ordering::Acquire);
        mark != 0 && mark == c.lease_count.load(Ordering::SeqCst)
    }

    /// This client engine recycles displaced blocks: the table readers pin
    /// their epochs in (the mount's, shared), and this client's own slot.
    /// Set once; without it every displaced block goes to the server.
    pub fn client_use_epochs(&self, table: SharedTable, own_slot: usize) {
        if let Some(side) = &self.client {
            let _ = side.epochs.set((table, own_slot));
        }
    }

    /// The epoch table this client engine pins in (its holds are there
    /// too), once set.
    pub(crate) fn client_epoch_table(&self) -> Option<&crate::epoch::EpochTable> {
        let (table, _) = self.client.as_ref()?.epochs.get()?;
        Some((**table).as_ref())
    }

    /// Reuse recycled blocks once `blocks` wait (instead of
    /// [`crate::recycle::RECYCLE_BATCH_BLOCKS`]): the crash simulator's
    /// short client sequence reuses from the first.
    pub fn client_recycle_batch(&self, blocks: u64) {
        if let Some(side) = &self.client {
            side.recycle_batch.store(blocks.max(1), Ordering::Relaxed);
        }
    }

    /// Recycled blocks this client reused so far.
    pub fn client_recycled_reused(&self) -> u64 {
        self.client
            .as_ref()
            .map_or(0, |c| c.recycled_reused.load(Ordering::Relaxed))
    }

    /// Whether a durable commit's displaced blocks are kept (recycle.rs).
    pub(crate) fn client_recycles(&self) -> bool {
        self.client.as_ref().is_some_and(|c| c.epochs.get().is_some())
    }

    /// The epoch a block freed now is tagged with. The fence first: the
    /// commit that displaced it (its tail store) is visible to every reader
    /// that pins later, so a reader pinned above the tag cannot have read
    /// the old log.
    pub(crate) fn client_free_epoch(&self) -> u64 {
        let Some((table, _)) = self.client.as_ref().and_then(|c| c.epochs.get()) else {
            return u64::MAX;
        };
        std::sync::atomic::fence(Ordering::SeqCst);
        (**table).as_ref().now()
    }

    /// Up to `want` recycled blocks of `r` that no other reader can hold.
    pub(crate) fn client_take_recycled(&self, r: &mut Recycled, want: u64) -> Option<(u64, u64)> {
        let side = self.client.as_ref()?;
        if r.wants_scan(side.recycle_batch.load(Ordering::Relaxed)) {
            let (table, own) = side.epochs.get()?;
            // After the frees being checked (their tags were read after a
            // fence too): a reader not seen pinned here pinned later, and
            // sees the commits that displaced them. Other threads of this
            // process count as readers (their pins are other words).
            std::sync::atomic::fence(Ordering::SeqCst);
            r.promote((**table).as_ref().oldest_pinned_but_mine(*own));
        }
        let got = r.take(want)?;
        debug_assert!(got.1 > 0 && got.1 <= want && got.0 >= self.geo.first_data_block);
        // Not a locked add: it would wait for this write's stores so far.
        // Threads of one client writing different inodes may race here: a
        // lost count would only be a statistic.
        let n = side.recycled_reused.load(Ordering::Relaxed);
        side.recycled_reused.store(n + got.1, Ordering::Relaxed);
        Some(got)
    }

    /// Whether a client holds inode `ino`'s lease now (the server's view).
    pub(crate) fn leased(&self, ino: u64) -> bool {
        self.lease_hook.get().is_some_and(|h| h.is_leased(ino))
    }

    /// A client engine: whether inode `ino`'s log has grown so that its
    /// lease should go back for the server to collect it (the client
    /// cannot: compaction commits through the server's journal).
    pub fn client_log_due(&self, ino: u64) -> bool {
        self.cache
            .get(ino)
            .is_some_and(|i| crate::gc::client_should_yield(&read(&i.state)))
    }

    /// [`Fs::client_log_due`] of a file open as `fh` (no cache lookup: the
    /// check runs after every lease write).
    pub(crate) fn client_log_due_of(&self, fh: &FileHandle) -> bool {
        crate::gc::client_should_yield(&read(&fh.inode.state))
    }

    /// The server, once a lease came back: log GC of inode `ino` as after
    /// any operation on it (the client collects nothing itself).
    pub fn collect_log(&self, ino: u64) -> Result<()> {
        self.check_writable()?;
        let inode = self.iget(ino)?;
        let mut st = write(&inode.state);
        if st.gone {
            return Ok(());
        }
        self.maybe_compact(&inode, &mut st);
        Ok(())
    }

    /// The server's lease table (set once; later calls are ignored).
    pub fn set_lease_hook(&self, hook: Arc<dyn LeaseHook>) {
        let _ = self.lease_hook.set(hook);
    }

    /// Inode `ino` caught up with its record, and the blocks it refers to:
    /// its log pages (head to tail) and its file's data blocks. For a
    /// lease: before the grant (what the holder may displace) and after the
    /// recall (what it keeps). Call with the lease hook silent for `ino`
    /// (the mount's lease table does). The record's tail line is written
    /// back and fenced before it returns (one flush, one fence): the caller
    /// frees what the adopted tail displaced, or grants the inode, only
    /// once that tail is durable. EINVAL unless a regular file; ENOENT if
    /// it is gone or unlinked (an orphan).
    pub fn lease_refs(&self, ino: u64) -> Result<Vec<(u64, u64)>> {
        let mut inode = self.iget(ino)?;
        // The server does not check records at each use (only its lease
        // holders write): this is where it catches up with one.
        if let Err(e) = self.catch_up_now(&inode) {
            if !(e.errno() == libc::ENOENT && inode.is_gone()) {
                return Err(e);
            }
            inode = self.iget_cached(ino)?;
        }
        // What was just adopted must be durable before anything is built
        // on it. A holder killed between a commit's tail store and that
        // line's write-back leaves the tail visible but not durable (all
        // it names was fenced before the store: the tail is the only such
        // line); the settle then frees the blocks it displaced, and their
        // reuse, once durable, would leave a power cut's recovery with
        // the old tail naming another file's blocks. Written back here,
        // at each grant and settle: one line, one fence.
        self.pm.flush(inode.rec_off + INODE_TAIL_FIELD, 8);
        self.pm.fence();
        if inode.kind != FileKind::File {
            return errno(libc::EINVAL);
        }
        let st = read(&inode.state);
        if st.gone {
            return errno(libc::ENOENT);
        }
        // The entries were replayed (at load, or by the catch-up above):
        // the pages are found by their footers alone, not by parsing every
        // entry again (a settling and a grant each do this, on logs of
        // tens of thousands of entries).
        let pages = log::chain_pages(&self.pm, &self.geo, st.log.head, st.log.pages)?;
        debug_assert_eq!(pages.len() as u64, st.log.pages);
        // A head chunk is not a block (its id is tagged) and the holder
        // never frees it (log GC is the server's): it is no block to settle.
        let mut out: Vec<(u64, u64)> = pages
            .iter()
            .filter(|&&p| p < LOG_CHUNK_ID_MIN)
            .map(|&p| (p, 1))
            .collect();
        if let Body::File(map) = &st.body {
            out.extend(map.iter().map(|e| (e.block, e.pages)));
        }
        // A hybrid pool: a client holding the lease writes the file's
        // device blocks without this engine's DRAM cache (in place, in
        // sync mode), and a read of another file reading ahead may have
        // cached them meanwhile. Dropped here, at the grant and when the
        // lease comes back, before any request reads the file again.
        self.forget_cached(&out);
        Ok(out)
    }

    /// The block of `ino`'s head log chunk, if its log starts in one (a
    /// file made under a lane lease: a block its client carved, which
    /// leaves the client's books at the lane's take-back, lanelease.rs).
    pub(crate) fn log_chunk_block(&self, ino: u64) -> Result<Option<u64>> {
        let inode = self.iget(ino)?;
        let st = read(&inode.state);
        Ok(match log_page_id(st.log.head) {
            Some((block, Some(_))) => Some(block),
            _ => None,
        })
    }

    /// Whether inode `ino` is an unlinked file kept alive by open handles.
    pub fn is_orphan(&self, ino: u64) -> Result<bool> {
        // As the record says now: a client under a lane lease may have
        // orphaned it since the owner cached it (lanelease.rs).
        let inode = self.iget_current(ino)?;
        let st = read(&inode.state);
        Ok(st.orphan || st.gone)
    }

    /// Take up to `want` free blocks, in at most `ranges_max` ranges, from
    /// this (the server's) allocator for a client's reservation, and no
    /// more than the guard allows (`alloc::grant`: never the server's
    /// keep, at most half of the free blocks above it); empty when none
    /// may be taken.
    pub fn reserve_blocks(&self, want: u64, ranges_max: usize) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let grantable =
            grant::grantable_blocks(self.blocks.free_blocks(), self.blocks.capacity_blocks());
        let mut left = want.min(grantable);
        while left > 0 && out.len() < ranges_max {
            match self.blocks.alloc(self.lane(), left) {
                Some((start, len)) => {
                    out.push((start, len));
                    left -= len;
                }
                None => break,
            }
        }
        out
    }

    /// Take up to `want` free data-device blocks (a hybrid pool), in at
    /// most `ranges_max` ranges, for a client's reservation; PM blocks when
    /// the device is full (a full side spills to the other, as the
    /// engine's own writes do); empty when both are.
    pub fn reserve_dev_blocks(&self, want: u64, ranges_max: usize) -> Vec<(u64, u64)> {
        let got = self.reserve_dev(want, ranges_max);
        if got.is_empty() {
            return self.reserve_blocks(want, ranges_max);
        }
        got
    }

    /// Blocks of a client's reservation it gave back unused (`unused`
    /// message; the mount's lease table checked they were reserved for
    /// it): free at once. No reader can hold one: a block reaches a reader
    /// only through a committed log entry, and a block committed by the
    /// client is never in its allocator again (displaced or cut, it goes
    /// to the freed list, `return`, the limbo).
    pub fn free_unused_blocks(&self, ranges: &[(u64, u64)]) {
        for &(start, len) in ranges {
            debug_assert!(start < LOG_CHUNK_ID_MIN, "a log chunk reserved: {start:#x}");
            self.free_now(start, len);
        }
    }

    /// Blocks a client gave back (freed by its writes, or left at its
    /// death): into the limbo, since readers may still hold them.
    pub fn return_blocks(&self, ranges: &[(u64, u64)]) {
        for &(start, len) in ranges {
            self.free_blocks(start, len);
        }
    }
}
