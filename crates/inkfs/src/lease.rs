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
//! tail and settles the blocks ([`Fs::lease_refs`], and `RangeSet`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{errno, Error, Result};
use crate::fs::Fs;
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

/// What a client engine keeps of its writes.
#[derive(Default)]
pub(crate) struct ClientSide {
    /// Lease writes in progress (the only time the engine may write).
    writing: AtomicU32,
    /// Blocks freed by this client, for the server's limbo.
    freed: Mutex<Vec<(u64, u64)>>,
    /// Per side (PM, data device): the server said it is full (it had no
    /// block of that side for this client's last reservation request), so
    /// writes placed there spill to the other side.
    full: [AtomicBool; 2],
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
        fs.client = Some(ClientSide::default());
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
        lock(&side.freed).push((start, len));
        true
    }

    /// The blocks this client freed since the last call (to send to the
    /// server).
    pub fn take_client_freed(&self) -> Vec<(u64, u64)> {
        self.client
            .as_ref()
            .map(|c| std::mem::take(&mut *lock(&c.freed)))
            .unwrap_or_default()
    }

    /// Ranges this client freed and has not sent yet.
    pub fn client_freed_count(&self) -> usize {
        self.client.as_ref().map_or(0, |c| lock(&c.freed).len())
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
    /// keeps in reserve are freed (to the server, see `client_free`).
    pub fn client_release_inode(&self, ino: u64) {
        if let Some(inode) = self.cache.get(ino) {
            let mut st = write(&inode.state);
            self.drop_prealloc(&mut st);
        }
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
    /// (the mount's lease table does). EINVAL unless a regular file;
    /// ENOENT if it is gone or unlinked (an orphan).
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
        if inode.kind != FileKind::File {
            return errno(libc::EINVAL);
        }
        let st = read(&inode.state);
        if st.gone {
            return errno(libc::ENOENT);
        }
        let summary = log::walk(&self.pm, &self.geo, ino, st.log.head, st.log.tail, |_, _| {
            Ok(())
        })?;
        let mut out: Vec<(u64, u64)> = summary.pages.iter().map(|&p| (p, 1)).collect();
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

    /// Whether inode `ino` is an unlinked file kept alive by open handles.
    pub fn is_orphan(&self, ino: u64) -> Result<bool> {
        let inode = self.iget(ino)?;
        let st = read(&inode.state);
        Ok(st.orphan || st.gone)
    }

    /// Take up to `want` free blocks, in at most `ranges_max` ranges, from
    /// this (the server's) allocator for a client's reservation; empty when
    /// none is free.
    pub fn reserve_blocks(&self, want: u64, ranges_max: usize) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut left = want;
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

    /// Blocks a client gave back (unused, or freed by its writes): into
    /// the limbo, since readers may still hold them.
    pub fn return_blocks(&self, ranges: &[(u64, u64)]) {
        for &(start, len) in ranges {
            self.free_blocks(start, len);
        }
    }
}

/// A set of block numbers, kept as disjoint ranges (the server's books of
/// what each client may use or free).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// start -> end (exclusive); disjoint and not adjacent.
    ranges: BTreeMap<u64, u64>,
}

impl RangeSet {
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    pub fn from_ranges(ranges: &[(u64, u64)]) -> RangeSet {
        let mut s = RangeSet::new();
        for &(start, len) in ranges {
            s.insert(start, len);
        }
        s
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Blocks in the set.
    pub fn blocks(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }

    /// The ranges, as (start, len), in order.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        self.ranges.iter().map(|(&s, &e)| (s, e - s)).collect()
    }

    pub fn insert(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (mut lo, mut hi) = (start, start.saturating_add(len));
        // Merge with every range that overlaps or touches [lo, hi).
        let touching: Vec<(u64, u64)> = self
            .ranges
            .range(..=hi)
            .rev()
            .take_while(|(_, &e)| e >= lo)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in touching {
            self.ranges.remove(&s);
            lo = lo.min(s);
            hi = hi.max(e);
        }
        self.ranges.insert(lo, hi);
    }

    pub fn remove(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (lo, hi) = (start, start.saturating_add(len));
        let overlapping: Vec<(u64, u64)> = self
            .ranges
            .range(..hi)
            .rev()
            .take_while(|(_, &e)| e > lo)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in overlapping {
            self.ranges.remove(&s);
            if s < lo {
                self.ranges.insert(s, lo);
            }
            if e > hi {
                self.ranges.insert(hi, e);
            }
        }
    }

    /// Whether every block of `[start, start + len)` is in the set.
    pub fn contains(&self, start: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        self.ranges
            .range(..=start)
            .next_back()
            .is_some_and(|(_, &e)| e >= start.saturating_add(len))
    }

    /// The part of `[start, start + len)` in the set, as ranges.
    pub fn intersect(&self, start: u64, len: u64) -> Vec<(u64, u64)> {
        let (lo, hi) = (start, start.saturating_add(len));
        let mut out: Vec<(u64, u64)> = self
            .ranges
            .range(..hi)
            .rev()
            .take_while(|(_, &e)| e > lo)
            .map(|(&s, &e)| (s.max(lo), e.min(hi)))
            .map(|(s, e)| (s, e - s))
            .collect();
        out.reverse();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_sets_merge_split_and_intersect() {
        let mut s = RangeSet::from_ranges(&[(10, 5), (20, 5)]);
        assert_eq!(s.ranges(), vec![(10, 5), (20, 5)]);
        s.insert(15, 5); // fills the gap exactly: one range
        assert_eq!(s.ranges(), vec![(10, 15)]);
        s.remove(12, 3);
        assert_eq!(s.ranges(), vec![(10, 2), (15, 10)]);
        assert!(s.contains(15, 10));
        assert!(!s.contains(11, 5));
        assert_eq!(s.intersect(0, 100), vec![(10, 2), (15, 10)]);
        assert_eq!(s.intersect(11, 6), vec![(11, 1), (15, 2)]);
        s.remove(0, 100);
        assert!(s.is_empty());
        s.insert(5, 1);
        s.insert(3, 1);
        s.insert(4, 1);
        assert_eq!(s.ranges(), vec![(3, 3)]);
        assert_eq!(s.blocks(), 3);
    }
}
