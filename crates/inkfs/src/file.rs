//! File data: read, write (copy-on-write or in place, per mode), append,
//! truncate, fsync (fallocate and SEEK_DATA/SEEK_HOLE: file/space.rs).
//!
//! A write never makes new data visible before it is durable: data goes to
//! blocks with non-temporal stores, the FILE_WRITE entries that map them are
//! flushed, one fence covers both, and only then does the tail move.

use crate::blockdev::dev::Page;
use crate::blockdev::engine::DEV_BYTES_BASE;
use crate::blockdev::readahead::WINDOW_MAX_BLOCKS;
use crate::blockdev::Side;
use crate::error::{errno, Error, Result};
use crate::filemap::FileMap;
use crate::format::*;
use crate::fs::{live, FileHandle, Fs};
use crate::inode::{self, write, Inode, InodeState};
use crate::log::{Entry, EntryBuf, LogCursor, NewPages};
use crate::pmem::Pmem;
use crate::recycle::Recycled;
use crate::time::now_ns;
use crate::types::*;

mod space;

/// Bytes to lay over pages: caller data, zeros, or another file's bytes.
#[derive(Clone, Copy)]
enum Src<'a> {
    Data {
        off: u64,
        data: &'a [u8],
    },
    Zeros {
        off: u64,
        len: u64,
    },
    /// Bytes of a file in the pool (copy_file_range): byte `off + i` is
    /// the file's byte `from + i`, holes read as zeros. `map: None` is the
    /// destination file itself, as its mapping stands before this write.
    File {
        off: u64,
        len: u64,
        from: u64,
        map: Option<&'a FileMap>,
    },
}

impl Src<'_> {
    fn range(&self) -> (u64, u64) {
        match *self {
            Src::Data { off, data } => (off, off + data.len() as u64),
            Src::Zeros { off, len } | Src::File { off, len, .. } => (off, off + len),
        }
    }
    /// The part of `[lo, hi)` this source covers.
    fn clip(&self, lo: u64, hi: u64) -> (u64, u64) {
        let (a, b) = self.range();
        (a.max(lo), b.min(hi))
    }
}

/// FILE_WRITE entries of one operation, kept on the stack for the common
/// case (a write maps to few extents); spills to the heap only when the
/// allocator hands out many fragments. A `SmallVec`, not an array zeroed
/// at each operation: the two of a `DataTx` were two `memset`s of 256 B
/// per write (4 % of a served append's samples).
struct Pieces(smallvec::SmallVec<[WriteEntry; 4]>);

impl Pieces {
    fn new() -> Pieces {
        Pieces(smallvec::SmallVec::new())
    }
    fn push(&mut self, w: WriteEntry) {
        self.0.push(w);
    }
    fn iter(&self) -> impl Iterator<Item = &WriteEntry> {
        self.0.iter()
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    fn set_mtime(&mut self, mtime_ns: i64) {
        for w in self.0.iter_mut() {
            w.mtime_ns = mtime_ns;
        }
    }
}

/// State of one data operation being prepared: what it allocated (to undo
/// on failure) and what it will append.
struct DataTx {
    pieces: Pieces,
    /// Pieces that map fresh blocks (freed if the operation fails).
    fresh: Pieces,
    pages: NewPages,
    /// The inode's block reservation as this operation leaves it.
    prealloc: (u64, u64),
    /// Blocks taken from the reservation, subtracted from the reserved
    /// count when the operation ends: that atomic add is a locked
    /// instruction, which waits for all earlier stores, so before the copy
    /// it would only delay it. Per side (a hybrid pool's reservation may be
    /// on either).
    reserved_taken: u64,
    reserved_taken_dev: u64,
    /// Hybrid pools: where fresh blocks go (`Fs::place`).
    side: Side,
    /// Hybrid pools: device blocks were written, to be flushed before the
    /// commit that names them.
    dev_written: bool,
    /// Hybrid pools: the DRAM cache of device blocks keeps what this
    /// operation writes (not for a posix mount's write-back, whose pages
    /// the kernel's page cache holds: `DataStore::write`).
    cache_written: bool,
    /// A client's recycled blocks of the inode (recycle.rs), taken from
    /// its state for the operation and handed back by `commit_data` or
    /// `abort_data`.
    recycled: Recycled,
}

impl DataTx {
    fn new(st: &mut InodeState) -> DataTx {
        DataTx {
            pieces: Pieces::new(),
            fresh: Pieces::new(),
            pages: NewPages::default(),
            prealloc: st.prealloc,
            reserved_taken: 0,
            reserved_taken_dev: 0,
            side: Side::Pm,
            dev_written: false,
            cache_written: true,
            recycled: std::mem::take(&mut st.recycled),
        }
    }

    /// The operation is over: the recycled blocks go back to the state.
    fn hand_back(&mut self, st: &mut InodeState) {
        debug_assert!(st.recycled.is_empty(), "one operation at a time");
        st.recycled = std::mem::take(&mut self.recycled);
    }
}

/// Where the blocks a committed entry displaced go.
enum Displaced<'a> {
    /// A durable commit: to the allocator (or a client's server) at once.
    Free,
    /// A posix commit: freed after the next fence.
    Later(Vec<(u64, u64)>),
    /// A client's durable commit: kept for the inode's next overwrites,
    /// tagged with the epoch of the free (read at the first one).
    Recycle(&'a mut Recycled, Option<u64>),
}

impl Drop for DataTx {
    fn drop(&mut self) {
        // Dropped without `hand_back`, the blocks would stay neither the
        // inode's nor the client's (the server would get them back only
        // at the lease's settling).
        debug_assert!(self.recycled.is_empty(), "recycled blocks handed back");
    }
}

// Blocks reserved (in DRAM only) past the end of a file that is being
// appended to, so the next appends take blocks without touching the
// allocator and stay in one extent (as ext4's per-inode preallocation):
// `Fs::prealloc_blocks` (16 on PM, the pool's unit on a data device).
// Returned at the last close, truncate-free paths keep it; a crash simply
// leaves the blocks unreferenced, hence free.

fn write_entry(file_page: u64, block: u64, pages: u64, size: u64, mtime_ns: i64) -> WriteEntry {
    WriteEntry {
        hdr: EntryHeader::default_zero(),
        file_page,
        block,
        pages: pages as u32,
        reserved0: 0,
        size,
        mtime_ns,
        reserved: [0; 16],
    }
}

/// Pages per FILE_WRITE entry at most (the entry's count is 32 bits).
const MAX_PAGES_PER_ENTRY: u64 = 1 << 20;

/// Bytes one `copy_range` call copies at most: one call is one write of
/// the destination (atomic in strict mode, so its new blocks are all held
/// at once); callers loop on short copies, as copy_file_range(2) allows.
pub const COPY_MAX: u64 = 64 << 20;

/// Walk a file's bytes `[pos, pos + n)` as runs: `f(rel, Some(at), len)`
/// for `len` bytes mapped contiguously at pool offset `at`, `f(rel, None,
/// len)` for a hole; `rel` is the run's offset from `pos`.
fn runs(map: &FileMap, pos: u64, n: u64, mut f: impl FnMut(u64, Option<u64>, u64)) {
    let mut done = 0;
    while done < n {
        let p = pos + done;
        let page = p / BLOCK_SIZE;
        let in_page = p % BLOCK_SIZE;
        let (at, run) = match map.find(page) {
            Some(e) => (
                Some((e.block + (page - e.page)) * BLOCK_SIZE + in_page),
                (e.end() - page) * BLOCK_SIZE - in_page,
            ),
            None => {
                let hole_end = map
                    .next_from(page)
                    .map_or(u64::MAX, |e| e.page * BLOCK_SIZE);
                (None, hole_end - p)
            }
        };
        let take = run.min(n - done);
        debug_assert!(take > 0, "a run never ends where it starts");
        f(done, at, take);
        done += take;
    }
}

/// How far a hybrid pool's readahead may go after a read whose last page
/// is `last` (`blockdev/readahead.rs`): to the end of the device blocks
/// that follow it in the file's mapping, contiguous on the device, within
/// the file's `size`; the walk stops `WINDOW_MAX_BLOCKS` on (readahead
/// never goes further ahead). 0, nothing, when `last` is not on the
/// device. Readahead follows device blocks: without this bound it ran on
/// past the end of the file into whatever the device holds next, another
/// file's blocks or free ones (wasted bandwidth and cache, never wrong
/// data: the cache's stamps keep a fill that raced a write out).
fn readahead_limit(map: &FileMap, last: u64, size: u64) -> u64 {
    let Some(e) = map.find(last) else {
        return 0;
    };
    if Side::of(e.block) != Side::Dev {
        return 0;
    }
    let file_end = size.div_ceil(BLOCK_SIZE);
    let stop = file_end.min(last.saturating_add(1 + WINDOW_MAX_BLOCKS));
    // `dev_end` is the device block of file page `page` while the run
    // lasts.
    let (mut page, mut dev_end) = (e.end(), e.block + e.pages);
    while page < stop {
        match map.find(page) {
            Some(n) if n.block + (page - n.page) == dev_end => {
                dev_end = n.block + n.pages;
                page = n.end();
            }
            _ => break,
        }
    }
    // Mapped pages past the end of file are not the file's to read.
    dev_end - page.saturating_sub(file_end)
}

/// Whether a posix write of `[off, end)` overwrites in place a mapped
/// page between `durable` (a size a crash may bring back) and the size in
/// DRAM. Pages past the size are copied on write, and holes take fresh
/// blocks, so neither counts.
fn overwrites_past(st: &InodeState, off: u64, end: u64, durable: u64) -> bool {
    let (lo, hi) = (off.max(durable), end.min(st.attr.size));
    lo < hi
        && st.file().is_some_and(|m| {
            m.next_from(lo / BLOCK_SIZE)
                .is_some_and(|e| e.page * BLOCK_SIZE < hi)
        })
}

/// The pages `[lo, hi)` from the first to the last mapped page of `[first,
/// end)`, if any is mapped. A punch logs hole entries for these only: the
/// rest is a hole already, and a punch far past the end of file (up to
/// 64 TiB) would otherwise log one entry per 4 GiB of it.
fn mapped_span(map: &FileMap, first: u64, end: u64) -> Option<(u64, u64)> {
    let e = map.next_from(first).filter(|e| e.page < end)?;
    let lo = e.page.max(first);
    let mut hi = e.end();
    while let Some(e) = map.next_from(hi).filter(|e| e.page < end) {
        hi = e.end();
    }
    Some((lo, hi.min(end)))
}

impl<P: Pmem> Fs<P> {
    pub(crate) fn file_state_check(inode: &Inode) -> Result<()> {
        match inode.kind {
            FileKind::File => Ok(()),
            FileKind::Dir => errno(libc::EISDIR),
            _ => errno(libc::EINVAL),
        }
    }

    /// Read up to `buf.len()` bytes at `off`; short at end of file. Holes
    /// read as zeros.
    pub fn read(&self, fh: &FileHandle, off: u64, buf: &mut [u8]) -> Result<usize> {
        Self::file_state_check(&fh.inode)?;
        self.revalidate(&fh.inode)?;
        let st = inode::read(&fh.inode.state);
        let size = st.attr.size;
        if off >= size || buf.is_empty() {
            return Ok(0);
        }
        let n = (size - off).min(buf.len() as u64) as usize;
        let Some(map) = st.file() else {
            return errno(libc::EINVAL);
        };
        let ahead_limit = match self.data {
            Some(_) => readahead_limit(map, (off + n as u64 - 1) / BLOCK_SIZE, size),
            None => 0,
        };
        let mut failed = Ok(());
        runs(map, off, n as u64, |rel, at, len| {
            let part = &mut buf[rel as usize..(rel + len) as usize];
            match at {
                Some(at) if failed.is_ok() => {
                    failed = self.data_read_ahead_to(at, part, ahead_limit, off == 0 && rel == 0)
                }
                Some(_) => {}
                None => part.fill(0),
            }
        });
        failed.map(|()| n)
    }

    /// Zero-copy read: `f` gets the file's bytes `[off, off + len)` (clipped
    /// at the end of file) in place in the pool, under the inode's read lock
    /// so no writer changes or frees them meanwhile. `Ok(None)` (without
    /// calling `f`) when they are not one mapped run of a directly mapped
    /// pool: holes, extent boundaries, the crash simulator; use `read`.
    pub fn read_in_place<R>(
        &self,
        fh: &FileHandle,
        off: u64,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        Self::file_state_check(&fh.inode)?;
        self.revalidate(&fh.inode)?;
        let st = inode::read(&fh.inode.state);
        let size = st.attr.size;
        if off >= size || len == 0 {
            return Ok(Some(f(&[])));
        }
        let n = (size - off).min(len as u64);
        let Some(map) = st.file() else {
            return errno(libc::EINVAL);
        };
        let page = off / BLOCK_SIZE;
        let Some(e) = map.find(page) else {
            return Ok(None);
        };
        if (e.end() - page) * BLOCK_SIZE - off % BLOCK_SIZE < n {
            return Ok(None);
        }
        let at = (e.block + (page - e.page)) * BLOCK_SIZE + off % BLOCK_SIZE;
        if at >= DEV_BYTES_BASE {
            return Ok(None); // on the data device: `read` copies it
        }
        Ok(self.pm.mapped(at, n).map(f))
    }

    /// pwrite: write `data` at `off`. Durable on return in strict and sync
    /// mode; atomic in strict mode.
    pub fn write(&self, fh: &FileHandle, off: u64, data: &[u8]) -> Result<usize> {
        self.write_dropping(fh, off, data, fh.drops_setid)
    }

    /// `write`, with the set-id rule decided by the caller: `drops_setid`
    /// says whether this writer lacks CAP_FSETID (a kernel in front that
    /// knows the writer says so per write; write-back of its page cache
    /// never drops them, as mmap writes do not).
    pub fn write_dropping(
        &self,
        fh: &FileHandle,
        off: u64,
        data: &[u8],
        drops_setid: bool,
    ) -> Result<usize> {
        self.check_writable()?;
        Self::file_state_check(&fh.inode)?;
        self.revalidate(&fh.inode)?;
        if data.is_empty() {
            return Ok(0);
        }
        let mut st = write(&fh.inode.state);
        self.write_locked(fh, &mut st, off, data, drops_setid, false)?;
        Ok(data.len())
    }

    /// O_APPEND write: at the end of file, decided under the inode lock.
    pub fn append(&self, fh: &FileHandle, data: &[u8]) -> Result<(u64, usize)> {
        self.check_writable()?;
        Self::file_state_check(&fh.inode)?;
        self.revalidate(&fh.inode)?;
        let mut st = write(&fh.inode.state);
        let off = st.attr.size;
        if !data.is_empty() {
            self.write_locked(fh, &mut st, off, data, fh.drops_setid, false)?;
        }
        Ok((off, data.len()))
    }

    /// copy_file_range(2) inside the pool: copy up to `len` bytes of `src`
    /// from `src_off` to `dst` at `dst_off`; the bytes never leave the pool.
    /// Returns the bytes copied: short at the source's end of file and at
    /// [`COPY_MAX`], 0 at or past it. The copy is one write of `dst` (atomic
    /// in strict mode, durable on return in strict and sync mode); source
    /// holes are written as zeros. Overlapping ranges of one file: EINVAL.
    pub fn copy_range(
        &self,
        src: &FileHandle,
        src_off: u64,
        dst: &FileHandle,
        dst_off: u64,
        len: u64,
    ) -> Result<u64> {
        self.check_writable()?;
        Self::file_state_check(&src.inode)?;
        Self::file_state_check(&dst.inode)?;
        self.revalidate(&src.inode)?;
        self.revalidate(&dst.inode)?;
        // As the VFS checks copy_file_range(2): the count is cut at the
        // source's end of file and at the largest file size first.
        if dst_off >= MAX_FILE_BYTES {
            return errno(libc::EFBIG);
        }
        let len = len.min(COPY_MAX).min(MAX_FILE_BYTES - dst_off);
        let clip = |size: u64| len.min(size.saturating_sub(src_off));
        if src.inode.ino == dst.inode.ino {
            let mut st = write(&dst.inode.state);
            let n = clip(st.attr.size);
            if n > 0 && src_off < dst_off.saturating_add(n) && dst_off < src_off + n {
                return errno(libc::EINVAL);
            }
            return self.copy_locked(&dst.inode, &mut st, None, src_off, dst_off, n, dst.drops_setid);
        }
        // Two inodes: locked in inode-number order, as every operation on
        // several inodes locks them (namei.rs, `Locked`).
        let (from, mut to);
        if src.inode.ino < dst.inode.ino {
            from = inode::read(&src.inode.state);
            to = write(&dst.inode.state);
        } else {
            to = write(&dst.inode.state);
            from = inode::read(&src.inode.state);
        }
        let n = clip(from.attr.size);
        let map = from.file().ok_or(Error::Errno(libc::EINVAL))?;
        self.copy_locked(
            &dst.inode,
            &mut to,
            Some(map),
            src_off,
            dst_off,
            n,
            dst.drops_setid,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn copy_locked(
        &self,
        inode: &Inode,
        st: &mut InodeState,
        map: Option<&FileMap>,
        from: u64,
        off: u64,
        len: u64,
        drops_setid: bool,
    ) -> Result<u64> {
        if len == 0 {
            return Ok(0);
        }
        off.checked_add(len).ok_or(Error::Errno(libc::EFBIG))?;
        let src = Src::File {
            off,
            len,
            from,
            map,
        };
        self.write_src_locked(inode, st, src, drops_setid, false)?;
        Ok(len)
    }

    pub(crate) fn write_locked(
        &self,
        fh: &FileHandle,
        st: &mut InodeState,
        off: u64,
        data: &[u8],
        drops_setid: bool,
        defer: bool,
    ) -> Result<bool> {
        off.checked_add(data.len() as u64)
            .ok_or(Error::Errno(libc::EFBIG))?;
        self.write_src_locked(&fh.inode, st, Src::Data { off, data }, drops_setid, defer)
    }

    /// Lay `src` over the file: the one write path of write, append and
    /// copy_range. `src` must not be empty. `drops_setid`: the writer lacks
    /// CAP_FSETID, so the file's set-id bits go, in the same commit.
    /// `defer`: a posix append to fresh device blocks may leave its commit
    /// to the next round (`write_deferring`). Returns whether device data
    /// is left to flush (only ever with `defer`).
    fn write_src_locked(
        &self,
        inode: &Inode,
        st: &mut InodeState,
        src: Src<'_>,
        drops_setid: bool,
        defer: bool,
    ) -> Result<bool> {
        live(st)?;
        let (off, end) = src.range();
        debug_assert!(off < end, "callers skip empty writes");
        // Under the lock: a chattr cannot slip between check and write.
        crate::flags::deny_write(st, off)?;
        if end > MAX_FILE_BYTES {
            return errno(libc::EFBIG);
        }
        // The clock is read once the data's non-temporal stores are in
        // flight, so that the read overlaps their drain instead of delaying
        // the copy; the entries are stamped then.
        const STAMPED_BELOW: i64 = 0;
        let now = STAMPED_BELOW;
        if let Some(durable) = st.unfenced_size {
            // Posix: an earlier extension is not durable yet, so a crash
            // may bring back a smaller size, and the old end-of-file page
            // (or blocks kept past it) with it. Bytes past that size must
            // read as zeros then; an overwrite in place that reaches past
            // it makes the extension durable first. (Appends start at the
            // size in DRAM and copy on write from there: no fence.)
            // Only a write that overwrites a mapped page there: one that
            // fills holes takes fresh blocks (the kernel's write-backs
            // reach the pool out of order, and would otherwise settle a
            // deferred tail each: blockdev/deferred.rs).
            if overwrites_past(st, off, end, durable) {
                self.persist_tail(inode, st)?;
            }
        }
        let new_size = st.attr.size.max(end);
        let mut tx = DataTx::new(st);
        tx.side = self.place(end - off);
        // A write-back from the kernel's page cache (`defer`): that cache
        // keeps the pages, so ours does not take a second copy.
        tx.cache_written = !defer;
        let r = match self.mode {
            Mode::Strict => self.cow_range(
                st,
                off / BLOCK_SIZE,
                (end - 1) / BLOCK_SIZE + 1,
                src,
                new_size,
                now,
                &mut tx,
            ),
            Mode::Sync | Mode::Posix => self.in_place_range(
                st,
                off / BLOCK_SIZE,
                (end - 1) / BLOCK_SIZE + 1,
                src,
                new_size,
                now,
                &mut tx,
            ),
        };
        if let Err(e) = r {
            self.abort_data(st, &mut tx);
            return Err(e);
        }
        let now = now_ns();
        tx.pieces.set_mtime(now);
        // file_remove_privs: a write by a caller without CAP_FSETID drops
        // set-user-ID, and set-group-ID when group-executable. The new mode
        // is metadata: durable on return in every mode.
        let killed = drops_setid
            .then(|| crate::perm::killed_setid(st.attr.mode))
            .flatten();
        if tx.pieces.is_empty() {
            // Posix-mode overwrite in place: data durable at fsync; the new
            // mtime is persisted then too.
            debug_assert!(self.mode == Mode::Posix);
            tx.hand_back(st);
            st.attr.mtime_ns = now;
            st.attr.ctime_ns = now;
            st.attr_dirty = true;
            if let Some(bits) = killed {
                let mut a = st.attr;
                a.mode = (a.mode & libc::S_IFMT) | bits;
                self.commit_attr(inode, st, a)?;
            }
            self.drop_capabilities(inode, st, drops_setid)?;
            // Overwritten in place on the device: durable at the next flush.
            return Ok(defer && tx.dev_written);
        }
        let attr = killed.map(|bits| {
            let mut a = st.attr;
            a.mode = (a.mode & libc::S_IFMT) | bits;
            a.size = new_size;
            a.mtime_ns = now;
            a.ctime_ns = now;
            a
        });
        let durable = self.mode != Mode::Posix || attr.is_some();
        let deferred = defer && !durable && self.displaces_nothing(st, &tx);
        self.commit_data(inode, st, &mut tx, attr, durable, deferred)?;
        self.drop_capabilities(inode, st, drops_setid)?;
        Ok(deferred)
    }

    /// Whether `tx` may be deferred: it wrote device blocks (there is a
    /// flush to share), and every page it maps is a fresh block over a
    /// hole of the file's map, so it displaces no block (an append into a
    /// partial last page copies that page on write, and the old block,
    /// freed at once, could be reused and overwritten while a crash could
    /// still bring back the entry naming it).
    fn displaces_nothing(&self, st: &InodeState, tx: &DataTx) -> bool {
        let Some(map) = st.file() else {
            return false;
        };
        tx.dev_written
            && tx.pieces.iter().count() == tx.fresh.iter().count()
            && tx.fresh.iter().all(|w| {
                map.next_from(w.file_page)
                    .is_none_or(|e| e.page >= w.file_page + w.pages as u64)
            })
    }

    /// file_remove_privs also removes file capabilities: a write by a
    /// caller without CAP_FSETID drops `security.capability` (its own
    /// commit; the write stands either way).
    fn drop_capabilities(&self, inode: &Inode, st: &mut InodeState, drops_setid: bool) -> Result<()> {
        const CAPABILITY: &[u8] = b"security.capability";
        if drops_setid && st.xattrs.contains_key(CAPABILITY) {
            self.log_xattr(inode, st, false, CAPABILITY, &[])?;
        }
        Ok(())
    }

    /// Append the prepared entries (plus an optional trailing SET_ATTR),
    /// commit the tail, and bring DRAM up to date. `deferred`: leave the
    /// tail on media where it is and note the inode's new DRAM tail for
    /// the next round (blockdev/deferred.rs) instead of flushing the device.
    fn commit_data(
        &self,
        inode: &Inode,
        st: &mut InodeState,
        tx: &mut DataTx,
        attr: Option<AttrEntry>,
        durable: bool,
        deferred: bool,
    ) -> Result<()> {
        debug_assert!(!deferred || (!durable && attr.is_none()));
        let old_size = st.attr.size;
        let mut cur = st.log;
        let mut appended = Ok(());
        for w in tx.pieces.iter() {
            let e = EntryBuf::write(w.file_page, w.block, w.pages, w.size, w.mtime_ns);
            appended = if deferred {
                self.log_append_unsettled(inode.ino, &mut cur, &e, &mut tx.pages)
            } else {
                self.log_append(inode.ino, &mut cur, &e, &mut tx.pages)
            }
            .map(|_| ());
            if appended.is_err() {
                break;
            }
        }
        if let (Ok(()), Some(a)) = (&appended, attr) {
            appended = self
                .log_append(
                    inode.ino,
                    &mut cur,
                    &EntryBuf::attr(false, a),
                    &mut tx.pages,
                )
                .map(|_| ());
        }
        // The device blocks the entries name are durable before the tail
        // that commits them is stored, in every mode (a posix commit's
        // tail may persist at any moment after its store).
        if let (Ok(()), true, false) = (&appended, tx.dev_written, deferred) {
            appended = self.dev_sync();
        }
        if let Err(e) = appended {
            self.abort_data(st, tx);
            return Err(e);
        }
        if deferred {
            // The entries (and PM data) durable now; the tail waits for
            // the round's flush. Noted under the inode's lock: a round
            // that notes it flushes after this append's device writes.
            self.pm.fence();
            if let Some(d) = self.deferred() {
                d.note(inode.ino, inode.rec_off, cur.tail);
            }
        } else {
            self.commit_tail(inode.rec_off, &cur, durable);
        }
        st.log = cur;
        st.prealloc = tx.prealloc;
        // Blocks the entries displace (copy-on-write pages, a shrinking
        // size) return to the allocator only once the commit is durable:
        // a posix-mode commit has no final fence, and a block reused and
        // overwritten before the tail is durable would show the next
        // operation's bytes through the old mapping after a crash.
        // A durable commit frees them at once (no heap allocation on the
        // strict/sync write path), or a client keeps them for the inode's
        // next overwrites (recycle.rs); a posix one collects them.
        let mut displaced = if !durable {
            Displaced::Later(Vec::new())
        } else if self.client_recycles() {
            Displaced::Recycle(&mut tx.recycled, None)
        } else {
            Displaced::Free
        };
        for w in tx.pieces.iter() {
            self.apply_committed(st, Entry::Write(*w), &mut displaced);
        }
        if let Some(a) = attr {
            self.apply_committed(
                st,
                Entry::Attr {
                    link_change: false,
                    attr: a,
                },
                &mut displaced,
            );
        }
        if let Displaced::Later(list) = displaced {
            if !list.is_empty() {
                self.pm.fence();
                for (b, n) in list {
                    self.free_blocks(b, n);
                }
            }
        }
        tx.hand_back(st);
        if durable {
            st.attr_dirty = false;
            st.unfenced_size = None;
        } else if st.attr.size > old_size {
            st.unfenced_size.get_or_insert(old_size);
        }
        self.maybe_compact(inode, st);
        if st.prealloc.1 > 0 {
            // Translate the next append's block while this commit drains.
            // Its page is usually untouched since mount; on a DRAM pool in
            // 4 KiB pages over scattered physical memory that page walk
            // (~100 ns under virtualisation) would otherwise start only
            // after the next append's lock, in series with this drain.
            self.pm.prefetch_store(st.prealloc.0 * BLOCK_SIZE);
        }
        // Last: a locked instruction waits for the commit's stores to drain,
        // and everything above overlaps that drain.
        self.settle_reserved(tx);
        Ok(())
    }

    /// Apply a committed entry to DRAM and free the blocks it displaced
    /// (never the blocks it maps itself: an in-place entry remaps them; a
    /// hole entry maps none) as `displaced` says.
    fn apply_committed(&self, st: &mut InodeState, e: Entry<'_>, displaced: &mut Displaced<'_>) {
        let geo = self.geo;
        // `released` gets only blocks nothing maps any more: an in-place
        // entry's own blocks are cut out by the file map.
        let mut released = |b: u64, n: u64| match displaced {
            Displaced::Free => self.free_blocks(b, n),
            Displaced::Later(list) => list.push((b, n)),
            // Only PM blocks are recycled: the overwrites that take them
            // are the ones placed on PM (`alloc_data`); a hybrid pool's
            // device block taken there put a small write on the device
            // (with a device flush per write).
            Displaced::Recycle(kept, tag) if Side::of(b) == Side::Pm => {
                let tag = *tag.get_or_insert_with(|| self.client_free_epoch());
                let k = kept.keep(b, n, tag);
                if k < n {
                    self.free_blocks(b + k, n - k);
                }
            }
            Displaced::Recycle(..) => self.free_blocks(b, n),
        };
        let r = inode::apply_entry(&self.pm, &geo, st, e, &mut released);
        debug_assert!(r.is_ok(), "a committed entry must apply: {r:?}");
    }

    fn abort_data(&self, st: &mut InodeState, tx: &mut DataTx) {
        tx.hand_back(st);
        for w in tx.fresh.iter() {
            self.free_blocks(w.block, w.pages as u64);
        }
        st.prealloc = tx.prealloc;
        self.settle_reserved(tx);
        std::mem::take(&mut tx.pages).release(&self.blocks);
    }

    /// Blocks taken from the reservation are no longer reserved (in use, or
    /// freed by an abort).
    fn settle_reserved(&self, tx: &mut DataTx) {
        let taken = std::mem::take(&mut tx.reserved_taken);
        if taken > 0 {
            self.reserved_changed(-(taken as i64));
        }
        let taken = std::mem::take(&mut tx.reserved_taken_dev);
        if taken > 0 {
            self.reserved_changed_at(crate::format::DEV_BLOCK_BASE, -(taken as i64));
        }
    }

    /// Blocks for file data: from the inode's reservation when it continues
    /// the file, else near `goal`; an append reserves a few more.
    fn alloc_data(
        &self,
        tx: &mut DataTx,
        goal: u64,
        want: u64,
        appending: bool,
    ) -> Result<(u64, u64)> {
        // A client's overwrite (no goal) takes the blocks its earlier
        // overwrites of this file displaced, once no reader can hold them:
        // mapped already, and kept out of the server's books (recycle.rs).
        if goal == 0 && !appending && tx.side == Side::Pm {
            if let Some(got) = self.client_take_recycled(&mut tx.recycled, want) {
                return Ok(got);
            }
        }
        let (start, len) = tx.prealloc;
        // The reservation serves the file's next pages when they belong on
        // its side (a hybrid pool's small and large writes go to different
        // sides).
        if len > 0 && goal == start && Side::of(start) == tx.side {
            let k = want.min(len);
            tx.prealloc = (start + k, len - k);
            match Side::of(start) {
                Side::Pm => tx.reserved_taken += k,
                Side::Dev => tx.reserved_taken_dev += k,
            }
            return Ok((start, k));
        }
        // A client's append the reservation does not continue takes the
        // blocks a truncate (or overwrite) of this file gave up, as an
        // overwrite does: an append-and-truncate loop (a log, a WAL) then
        // writes blocks its mapping holds already instead of a fresh
        // reservation's, each page of which costs a populate or a fault,
        // and the server hears nothing. They come off a truncated extent
        // in order, so consecutive appends stay in one extent.
        if appending && tx.side == Side::Pm {
            if let Some(got) = self.client_take_recycled(&mut tx.recycled, want) {
                return Ok(got);
            }
        }
        let unit = self.prealloc_blocks(tx.side);
        let ask = if appending && goal != 0 && want < unit {
            want + unit - 1
        } else {
            want
        };
        let (block, got) = self
            .alloc_file_blocks(tx.side, goal, ask)
            .ok_or(Error::Errno(libc::ENOSPC))?;
        if got <= want {
            return Ok((block, got));
        }
        if len > 0 {
            self.reserved_changed_at(start, -(len as i64));
            self.free_blocks(start, len);
        }
        tx.prealloc = (block + want, got - want);
        self.reserved_changed_at(block, (got - want) as i64);
        Ok((block, want))
    }

    /// Copy-on-write pages `[first, end)`: fresh blocks hold the old
    /// contents overlaid with `src`.
    #[allow(clippy::too_many_arguments)]
    fn cow_range(
        &self,
        st: &InodeState,
        first: u64,
        end: u64,
        src: Src<'_>,
        size: u64,
        now: i64,
        tx: &mut DataTx,
    ) -> Result<()> {
        let mut page = first;
        let appending = first * BLOCK_SIZE >= st.attr.size;
        // Grow contiguously after the previous page's block when possible:
        // appends, and writes into holes. An overwrite has no goal: the
        // block after the previous page's is almost always this page's own
        // old one, so looking for it cost two tree walks for nothing.
        let overwrite = !appending
            && st.file().is_some_and(|m| {
                // A file without holes needs no lookup. (Blocks kept past
                // the end can fool the count; then a hole is filled without
                // a goal: placement only, never correctness.)
                m.mapped_pages() == st.attr.size.div_ceil(BLOCK_SIZE) || m.find(page).is_some()
            });
        let mut goal = match page
            .checked_sub(1)
            .filter(|_| !overwrite)
            .and_then(|p| st.file().and_then(|m| m.find(p)))
        {
            Some(e) => e.block + (page - e.page),
            None => 0,
        };
        while page < end {
            let want = (end - page).min(MAX_PAGES_PER_ENTRY);
            let (block, got) = self.alloc_data(tx, goal, want, appending)?;
            goal = block + got;
            let w = write_entry(page, block, got, size, now);
            tx.fresh.push(w);
            tx.pieces.push(w);
            if Side::of(block) == Side::Dev {
                self.fill_dev_run(st, page, block, got, src, tx)?;
            } else {
                for i in 0..got {
                    self.fill_page(st, page + i, block + i, src)?;
                }
            }
            page += got;
        }
        Ok(())
    }

    /// Device blocks `[block, block + n)` get file pages `[page, page +
    /// n)`: old contents (zeros for a hole) overlaid with `src`, built in
    /// DRAM (in a buffer the store lends: `WRITE_RUN_PAGES`) and written in
    /// runs of its size. Flushed at commit.
    #[allow(clippy::too_many_arguments)]
    fn fill_dev_run(
        &self,
        st: &InodeState,
        page: u64,
        block: u64,
        n: u64,
        src: Src<'_>,
        tx: &mut DataTx,
    ) -> Result<()> {
        self.with_dev_write_buf(block, |buf| {
            let mut done = 0;
            while done < n {
                let k = (n - done).min(buf.len() as u64);
                for i in 0..k {
                    self.page_image(st, page + done + i, src, &mut buf[i as usize])?;
                }
                tx.dev_written = true;
                self.dev_write(block + done, &buf[..k as usize], tx.cache_written)?;
                done += k;
            }
            Ok(())
        })
    }

    /// File page `page` as it will read after `src` is laid over it, in
    /// DRAM: its old contents (zeros for a hole) where `src` leaves them.
    fn page_image(&self, st: &InodeState, page: u64, src: Src<'_>, out: &mut Page) -> Result<()> {
        let p0 = page * BLOCK_SIZE;
        let (a, b) = src.clip(p0, p0 + BLOCK_SIZE);
        if a != p0 || b != p0 + BLOCK_SIZE {
            // Bytes past EOF in the last page are always zero, so the whole
            // old page can be copied.
            match st.file().and_then(|m| m.find(page)) {
                Some(e) => self.data_read((e.block + (page - e.page)) * BLOCK_SIZE, &mut out.0)?,
                None => out.0.fill(0),
            }
        }
        if a < b {
            let (lo, hi) = ((a - p0) as usize, (b - p0) as usize);
            self.load_src(st, src, a, b, &mut out.0[lo..hi])?;
        }
        Ok(())
    }

    /// Sync/posix: pages already mapped are overwritten in place; holes get
    /// fresh blocks. Sync mode logs every piece (size and mtime durable);
    /// posix mode logs only what changes the mapping or the size.
    #[allow(clippy::too_many_arguments)]
    fn in_place_range(
        &self,
        st: &InodeState,
        first: u64,
        end: u64,
        src: Src<'_>,
        size: u64,
        now: i64,
        tx: &mut DataTx,
    ) -> Result<()> {
        let Some(map) = st.file() else {
            return errno(libc::EINVAL);
        };
        let grows = size != st.attr.size;
        // Bytes past the old end of file must stay zero until the new size
        // commits (a crash before it would otherwise leave them behind, to
        // reappear when the file grows): pages written past the old end
        // are copied on write even in these modes.
        debug_assert!(
            st.unfenced_size.is_none_or(|d| {
                let (a, b) = src.range();
                !overwrites_past(st, a, b, d)
            }),
            "no overwrite in place past a size a crash may undo"
        );
        let cow_from = if src.range().1 > st.attr.size {
            st.attr.size / BLOCK_SIZE
        } else {
            u64::MAX
        };
        // Two passes: every page that needs a fresh block first, so that an
        // ENOSPC leaves nothing overwritten in place; then the overwrites.
        for in_place_pass in [false, true] {
            let mut page = first;
            while page < end {
                match map.find(page) {
                    Some(e) if page >= cow_from => {
                        let run_end = e.end().min(end);
                        if !in_place_pass {
                            self.cow_range(st, page, run_end, src, size, now, tx)?;
                        }
                        page = run_end;
                    }
                    Some(e) => {
                        let run_end = e.end().min(end).min(cow_from);
                        if in_place_pass {
                            self.overwrite_run(
                                st,
                                page,
                                run_end,
                                e.block + (page - e.page),
                                src,
                                size,
                                grows,
                                now,
                                tx,
                            )?;
                        }
                        page = run_end;
                    }
                    None => {
                        let hole_end = map.next_from(page).map_or(end, |e| e.page.min(end));
                        if !in_place_pass {
                            self.cow_range(st, page, hole_end, src, size, now, tx)?;
                        }
                        page = hole_end;
                    }
                }
            }
        }
        Ok(())
    }

    /// Overwrite pages `[page, run_end)`, mapped to blocks from `block`, in
    /// place; sync mode (or a size change) logs them.
    #[allow(clippy::too_many_arguments)]
    fn overwrite_run(
        &self,
        st: &InodeState,
        page: u64,
        run_end: u64,
        block: u64,
        src: Src<'_>,
        size: u64,
        grows: bool,
        now: i64,
        tx: &mut DataTx,
    ) -> Result<()> {
        if Side::of(block) == Side::Dev {
            // Whole blocks to the device: partial pages read, merged and
            // written back (not atomic, as any overwrite in place).
            self.fill_dev_run(st, page, block, run_end - page, src, tx)?;
        } else {
            let (a, b) = src.clip(page * BLOCK_SIZE, run_end * BLOCK_SIZE);
            let at = block * BLOCK_SIZE + (a - page * BLOCK_SIZE);
            self.store_src(st, src, a, b, at)?;
        }
        if self.mode == Mode::Sync || grows {
            tx.pieces
                .push(write_entry(page, block, run_end - page, size, now));
        }
        Ok(())
    }

    /// Fill fresh block `block` with file page `page`: old contents (zeros
    /// for a hole) overlaid with `src`, written non-temporally.
    fn fill_page(&self, st: &InodeState, page: u64, block: u64, src: Src<'_>) -> Result<()> {
        let p0 = page * BLOCK_SIZE;
        let (a, b) = src.clip(p0, p0 + BLOCK_SIZE);
        let dst = block * BLOCK_SIZE;
        if a == p0 && b == p0 + BLOCK_SIZE {
            return self.store_src(st, src, a, b, dst);
        }
        let mut buf = [0u8; BLOCK_SIZE as usize];
        // Bytes past EOF in the last page are always zero (truncate zeroes
        // them; fsck checks it), so only the old page's bytes below EOF are
        // read: a small append (a log record) reads what the page holds so
        // far, not the whole page, whose lines were all written with
        // non-temporal stores (each a miss).
        if let Some(e) = st.file().and_then(|m| m.find(page)) {
            let n = st.attr.size.saturating_sub(p0).min(BLOCK_SIZE) as usize;
            self.data_read((e.block + (page - e.page)) * BLOCK_SIZE, &mut buf[..n])?;
        }
        if a < b {
            let (lo, hi) = ((a - p0) as usize, (b - p0) as usize);
            self.load_src(st, src, a, b, &mut buf[lo..hi])?;
        }
        self.pm.copy_nt(dst, &buf);
        Ok(())
    }

    /// Store bytes `[a, b)` of `src` at pool offset `at`, non-temporally.
    /// `st` is the destination's state (the source of `Src::File` with no
    /// map of its own).
    fn store_src(&self, st: &InodeState, src: Src<'_>, a: u64, b: u64, at: u64) -> Result<()> {
        debug_assert!(at < DEV_BYTES_BASE, "stores to PM only; device runs are built in DRAM");
        match src {
            Src::Data { off, data } => self
                .pm
                .copy_nt(at, &data[(a - off) as usize..(b - off) as usize]),
            Src::Zeros { .. } => self.pm.zero_nt(at, b - a),
            Src::File { off, from, map, .. } => match map.or(st.file()) {
                Some(map) => {
                    let mut failed = Ok(());
                    runs(map, from + (a - off), b - a, |rel, run, len| match run {
                        Some(run) if failed.is_ok() => {
                            failed = self.copy_in_pool(run, at + rel, len)
                        }
                        Some(_) => {}
                        None => self.pm.zero_nt(at + rel, len),
                    });
                    return failed;
                }
                None => self.pm.zero_nt(at, b - a),
            },
        }
        Ok(())
    }

    /// Bytes `[a, b)` of `src` into `buf` (DRAM); see `store_src`.
    fn load_src(&self, st: &InodeState, src: Src<'_>, a: u64, b: u64, buf: &mut [u8]) -> Result<()> {
        debug_assert_eq!(buf.len() as u64, b - a);
        match src {
            Src::Data { off, data } => {
                buf.copy_from_slice(&data[(a - off) as usize..(b - off) as usize])
            }
            Src::Zeros { .. } => buf.fill(0),
            Src::File { off, from, map, .. } => match map.or(st.file()) {
                Some(map) => {
                    let mut failed = Ok(());
                    runs(map, from + (a - off), b - a, |rel, run, len| {
                        let part = &mut buf[rel as usize..(rel + len) as usize];
                        match run {
                            Some(run) if failed.is_ok() => failed = self.data_read(run, part),
                            Some(_) => {}
                            None => part.fill(0),
                        }
                    });
                    return failed;
                }
                None => buf.fill(0),
            },
        }
        Ok(())
    }

    /// Copy `len` pool bytes from `from` to `to` non-temporally, straight
    /// from the mapping when the pool is mapped.
    fn copy_in_pool(&self, from: u64, to: u64, len: u64) -> Result<()> {
        // A copy reads blocks the write does not store to: another file's,
        // or other bytes of the same file (overlapping ranges are refused).
        debug_assert!(from + len <= to || to + len <= from, "copy overlaps itself");
        if from < DEV_BYTES_BASE {
            if let Some(bytes) = self.pm.mapped(from, len) {
                self.pm.copy_nt(to, bytes);
                return Ok(());
            }
        }
        let mut buf = [0u8; BLOCK_SIZE as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(BLOCK_SIZE);
            self.data_read(from + done, &mut buf[..n as usize])?;
            self.pm.copy_nt(to + done, &buf[..n as usize]);
            done += n;
        }
        Ok(())
    }

    /// Zero `[a, b)` inside one page (a partial page of truncate, punch or
    /// zero-range) the way the mode writes data.
    fn zero_partial(
        &self,
        st: &InodeState,
        a: u64,
        b: u64,
        size: u64,
        now: i64,
        tx: &mut DataTx,
    ) -> Result<()> {
        debug_assert!(a < b && a / BLOCK_SIZE == (b - 1) / BLOCK_SIZE);
        let page = a / BLOCK_SIZE;
        if st.file().and_then(|m| m.find(page)).is_none() {
            return Ok(()); // a hole already reads as zeros
        }
        // Copy-on-write in every mode: truncate and fallocate are atomic
        // (docs/MODES.md), and zeroing in place before the commit would
        // show a crash half-zeroed pages under the old size and mapping.
        let src = Src::Zeros { off: a, len: b - a };
        self.cow_range(st, page, page + 1, src, size, now, tx)
    }

    /// Shrink or grow to `new_size` with attributes `a` (mtime/ctime set by
    /// the caller); one transaction: the zeroed partial page, then the
    /// SET_ATTR whose smaller size unmaps everything past it.
    pub(crate) fn truncate_locked(
        &self,
        inode: &Inode,
        st: &mut InodeState,
        mut a: AttrEntry,
        new_size: u64,
    ) -> Result<()> {
        let old_size = st.attr.size;
        // Truncate is durable on return, and so is the data it keeps: a
        // posix overwrite in place on the data device, not yet flushed,
        // is flushed first (on PM, the commit's fence drains it).
        self.dev_sync()?;
        let mut tx = DataTx::new(st);
        if new_size < old_size && !new_size.is_multiple_of(BLOCK_SIZE) {
            let page_end = (new_size / BLOCK_SIZE + 1) * BLOCK_SIZE;
            if let Err(e) = self.zero_partial(st, new_size, page_end, old_size, a.ctime_ns, &mut tx)
            {
                self.abort_data(st, &mut tx);
                return Err(e);
            }
        }
        a.size = new_size;
        self.commit_data(inode, st, &mut tx, Some(a), true, false)
    }

    /// fsync/fdatasync. Strict and sync mode made everything durable
    /// already; posix mode makes in-place data (and a pending mtime)
    /// durable here.
    pub fn fsync(&self, fh: &FileHandle, datasync: bool) -> Result<()> {
        let inode = &fh.inode;
        if self.mode != Mode::Posix || self.read_only {
            // Every call already ended with its commit fenced: nothing is
            // pending (strict and sync), or nothing can be (read-only).
            return Ok(());
        }
        // Data written in place on the data device becomes durable first
        // (group commit: one flush for every fsync waiting on it).
        self.dev_sync()?;
        let mut st = write(&inode.state);
        if st.gone {
            return Ok(());
        }
        if !self.may_write() {
            // errors=remount-ro: what was committed is made durable (the
            // tail rewritten with its own value, written back, fenced), but
            // a pending mtime would need a log entry: say it was not.
            self.persist_tail(inode, &mut st)?;
            return if st.attr_dirty && !datasync {
                errno(libc::EROFS)
            } else {
                Ok(())
            };
        }
        if st.attr_dirty && !datasync {
            let mut cur: LogCursor = st.log;
            let mut pages = NewPages::default();
            if let Err(e) = self.log_append(
                inode.ino,
                &mut cur,
                &EntryBuf::attr(false, st.attr),
                &mut pages,
            ) {
                pages.release(&self.blocks);
                return Err(e);
            }
            st.log = cur;
            st.log_entries += 1;
            st.attr_dirty = false;
        }
        self.persist_tail(inode, &mut st)?;
        Ok(())
    }

    /// Posix mode: make every committed entry of the inode durable now
    /// (deferred ones too: settled, their device blocks flushed first).
    fn persist_tail(&self, inode: &Inode, st: &mut InodeState) -> Result<()> {
        self.settle_tail(inode.ino)?;
        // Another thread's posix write may have stored the tail without a
        // fence: write the line back again from here, then fence.
        self.pm.fence();
        self.pm
            .write_u64(inode.rec_off + INODE_TAIL_FIELD, st.log.tail);
        self.pm.persist(inode.rec_off + INODE_TAIL_FIELD, 8);
        st.unfenced_size = None;
        Ok(())
    }

    /// A handle's inode state, for front ends that need the size under lock.
    pub fn handle_size(&self, fh: &FileHandle) -> u64 {
        inode::read(&fh.inode.state).attr.size
    }
}

#[cfg(test)]
mod tests {
    use crate::pmem::SimPool;
    use crate::types::*;
    use crate::fs::Fs;

    #[test]
    fn appends_stay_in_one_extent() {
        let pm = SimPool::new(32 << 20);
        Fs::format(
            &pm,
            &FormatOptions {
                lanes: 2,
                ..Default::default()
            },
        )
        .unwrap();
        let fs = Fs::mount(pm, MountOptions::default()).unwrap();
        let (_, fh) = fs.create(1, b"f", 0o644, 0, 0).unwrap();
        for _ in 0..500 {
            fs.append(&fh, &[1u8; 4096]).unwrap();
        }
        let st = crate::inode::read(&fh.inode.state);
        let extents = st.file().unwrap().extent_count();
        assert!(extents <= 2, "500 appends made {extents} extents");
        assert!(
            st.log.pages <= 4,
            "log of {} pages after compaction",
            st.log.pages
        );
    }
}
