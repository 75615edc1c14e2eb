//! Log garbage collection, NOVA's two kinds.
//!
//! **Fast GC** unlinks log pages whose every entry is dead, copying nothing:
//! one persisted 8-byte store per run of dead pages (the previous page's
//! footer link, or the inode's head). **Thorough GC** (compaction), when
//! fewer than half of a log's entries are live, writes a compact log that
//! describes the inode's current state and switches the inode to it with
//! one journaled (head, tail) change.
//!
//! When an entry is dead. A *positive* entry (DIR_ADD, XATTR_SET, a
//! FILE_WRITE that maps blocks, the snapshot in SET_ATTR/LINK_CHANGE) is dead
//! once later entries supersede all it says: the same name, every page it
//! maps, a later snapshot. Its side effects (mtime, ctime, size) are
//! superseded with it: the superseding entry sets the same fields. A
//! *negative* entry (DIR_REMOVE, XATTR_REMOVE, a hole FILE_WRITE, the
//! truncation a shrinking SET_ATTR implies) cancels older positive ones, so
//! it may go only when no older entry about its key survives in the log;
//! otherwise a replay would resurrect what it cancelled.
//!
//! A guard against anything this reasoning misses (a shrinking SET_ATTR's
//! effect depends on the size before it): the surviving entries are
//! replayed in DRAM and must rebuild exactly what the whole log does, or
//! nothing is dropped.
//!
//! Crash safety. Fast GC unlinks runs of dead pages oldest first, each with
//! one persisted atomic store; a crash between two leaves the oldest runs
//! dropped, which replays to the same state by the same argument (what
//! supersedes a dropped entry is newer, so still present; what a dropped
//! negative entry cancelled is older, so already gone). Pages return to the
//! allocator only after every link is persisted. Compaction writes and
//! flushes the new log before the journal commit: a crash before the commit
//! leaves the old log (the new pages are unreferenced, free to recovery),
//! after it the new one.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::extents::Extent;
use crate::filemap::FileMap;
use crate::format::*;
use crate::fs::{rec, Fs};
use crate::inode::{apply_entry, Body, Inode, InodeState};
use crate::log::{self, Entry, EntryBuf, LogCursor, NewPages};
use crate::pmem::Pmem;
use crate::types::GcStats;

/// Logs shorter than this many entries are never compacted.
const MIN_ENTRIES: u64 = 128;
/// Pages per FILE_WRITE entry written by compaction.
const MAX_PAGES: u64 = 1 << 20;

/// Entries a compact log of this inode would hold.
fn live_entries(st: &InodeState) -> u64 {
    2 + st.xattrs.len() as u64
        + match &st.body {
            Body::File(m) => m.extent_count() as u64,
            Body::Dir(d) => d.len() as u64,
            Body::Symlink { .. } => 1,
            Body::Special => 0,
        }
}

/// Logs shorter than this many pages are never scanned by fast GC: below
/// that, compaction (which copies at most half of a small log) is cheaper
/// than a scan.
const FAST_MIN_PAGES: u64 = 4;

/// GC after an operation committed, under the inode's write lock.
///
/// Compaction first, when it is due: its cost is the live half of the log,
/// known from DRAM. Otherwise a fast GC scan when the log has grown by half
/// since the last one: a scan reads the whole log, so the growth rule keeps
/// its cost O(1) per appended page; it pays off on logs too live to compact
/// whose dead entries cluster (a hot page, name churn, a hot xattr).
/// Whether a client holding this inode's lease should give it back so that
/// the server collects its log (lease.rs): at least seven dead entries for
/// each live one, on a log of at least 16384 entries (1 MiB). Each time
/// costs the server a settling (it replays every entry the client
/// appended, and goes through the file's blocks), a compaction and a new
/// grant, and two round trips: ~10 ms for a 32 MiB file cut into pages,
/// measured. So it is paid for by seven times the live entries' worth of
/// writes, where the engine's own rule (half dead) would pay it at every
/// live entries' worth; the log holds at most eight times what a compact
/// one would (64 bytes an entry: for a file in 4 KiB extents, 1/8 of its
/// size).
pub(crate) fn client_should_yield(st: &InodeState) -> bool {
    const CLIENT_MIN_ENTRIES: u64 = 128 * MIN_ENTRIES;
    st.log_entries >= CLIENT_MIN_ENTRIES && st.log_entries >= 8 * live_entries(st)
}

pub fn maybe_collect<P: Pmem>(fs: &Fs<P>, inode: &Inode, st: &mut InodeState) {
    // Read-only, also once errors=remount-ro has stopped writes.
    if !fs.may_write() || st.gone {
        return;
    }
    let compacts = st.log_entries >= MIN_ENTRIES && st.log_entries >= 2 * live_entries(st);
    let scans = st.log.pages >= st.fast_gc_at.max(FAST_MIN_PAGES);
    // A deferred tail (blockdev/deferred.rs) is stored first: compaction
    // would copy its entries into a committed log, and fast GC could
    // unlink entries that only uncommitted ones supersede. A failed flush
    // leaves the log to the next time.
    if (compacts || scans) && fs.settle_tail(inode.ino).is_err() {
        return;
    }
    if compacts {
        // Failure (ENOSPC) just leaves the old log; damage found in the old
        // chain goes through the errors= path.
        match compact(fs, inode, st) {
            Ok(()) => return,
            Err(e) => {
                fs.corruption(ErrorReason::Log, Some(inode.ino), e);
                if !fs.may_write() {
                    return;
                }
            }
        }
    }
    if scans {
        // An error (a log fast GC cannot read) leaves the log as it is: GC
        // is an optimisation. The damage itself goes through the errors=
        // path (the log was readable when the inode was loaded).
        if let Err(e) = fast_collect(fs, inode, st) {
            fs.corruption(ErrorReason::Log, Some(inode.ino), e);
        }
        st.fast_gc_at = next_scan(st.log.pages);
    }
}

static ALWAYS_CHECK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Check every fast GC drop set by replay, not only those of logs with a
/// shrinking truncate (tests: a refusal, counted in `GcStats::fast_refused`,
/// then means the liveness rules missed a case). Process-wide.
pub fn always_check_drops(on: bool) {
    ALWAYS_CHECK.store(on, Relaxed);
}

/// Log length at which the next fast GC scan runs: when the log has grown
/// by half (a scan reads the whole log; this keeps it O(1) per page).
fn next_scan(pages: u64) -> u64 {
    pages + (pages / 2).max(1)
}

/// Counters behind `Fs::gc_stats`.
#[derive(Default)]
pub struct GcCounters {
    fast_scans: AtomicU64,
    fast_pages_freed: AtomicU64,
    fast_refused: AtomicU64,
    compactions: AtomicU64,
    compaction_pages_freed: AtomicU64,
}

impl GcCounters {
    pub fn snapshot(&self) -> GcStats {
        GcStats {
            fast_scans: self.fast_scans.load(Relaxed),
            fast_pages_freed: self.fast_pages_freed.load(Relaxed),
            fast_refused: self.fast_refused.load(Relaxed),
            compactions: self.compactions.load(Relaxed),
            compaction_pages_freed: self.compaction_pages_freed.load(Relaxed),
        }
    }
}

// ---------------------------------------------------------------------------
// Fast GC
// ---------------------------------------------------------------------------

/// What fast GC needs to know of one entry.
enum Key {
    /// An attribute snapshot; `cut` is the first file page a shrinking
    /// size unmaps.
    Attr {
        cut: Option<u64>,
    },
    /// File pages `[start, end)` mapped to blocks, or punched when `hole`.
    /// `shrinks`: its size is below the size before it (collapse range).
    Write {
        start: u64,
        end: u64,
        hole: bool,
        shrinks: bool,
    },
    Dir {
        name: Box<[u8]>,
        add: bool,
    },
    Xattr {
        name: Box<[u8]>,
        set: bool,
    },
    Symlink,
}

/// Disjoint, merged ranges of file pages.
#[derive(Default)]
struct PageSet(BTreeMap<u64, u64>);

impl PageSet {
    fn insert(&mut self, mut start: u64, mut end: u64) {
        if let Some((&s, &e)) = self.0.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.0.remove(&s);
            }
        }
        while let Some((&s, &e)) = self.0.range(start..=end).next() {
            end = end.max(e);
            self.0.remove(&s);
        }
        self.0.insert(start, end);
    }
    fn covers(&self, start: u64, end: u64) -> bool {
        self.0
            .range(..=start)
            .next_back()
            .is_some_and(|(_, &e)| e >= end && e > start)
    }
    fn intersects(&self, start: u64, end: u64) -> bool {
        self.0
            .range(..end)
            .next_back()
            .is_some_and(|(_, &e)| e > start)
    }
}

/// File pages with an O(1) representation for the common case: a bitmap
/// over pages below `len` (every finite range a log mentions), plus
/// "everything from `from` on" (truncations). Logs of files whose pages
/// reach past `BITMAP_MAX_PAGES` use merged ranges instead.
enum Pages {
    Bits { words: Vec<u64>, from: u64 },
    Ranges(PageSet),
}

/// 2^26 pages (256 GiB of file): an 8 MiB bitmap at most.
const BITMAP_MAX_PAGES: u64 = 1 << 26;

impl Pages {
    /// A set for keys whose finite ranges end at or below `max_end`.
    fn new(max_end: u64) -> Pages {
        if max_end <= BITMAP_MAX_PAGES {
            Pages::Bits {
                words: vec![0; max_end.div_ceil(64) as usize],
                from: u64::MAX,
            }
        } else {
            Pages::Ranges(PageSet::default())
        }
    }

    fn insert(&mut self, start: u64, end: u64) {
        match self {
            Pages::Ranges(r) => r.insert(start, end),
            Pages::Bits { from, .. } if end == u64::MAX => *from = (*from).min(start),
            Pages::Bits { words, .. } => {
                for_words(start, end, |w, mask| words[w] |= mask);
            }
        }
    }

    fn covers(&self, start: u64, end: u64) -> bool {
        match self {
            Pages::Ranges(r) => r.covers(start, end),
            Pages::Bits { words, from } => {
                if start >= *from {
                    return true;
                }
                let stop = end.min(*from);
                if stop > words.len() as u64 * 64 {
                    return false;
                }
                let mut all = true;
                for_words(start, stop, |w, mask| all &= words[w] & mask == mask);
                all
            }
        }
    }

    fn intersects(&self, start: u64, end: u64) -> bool {
        match self {
            Pages::Ranges(r) => r.intersects(start, end),
            Pages::Bits { words, from } => {
                if end > *from {
                    return true;
                }
                let stop = end.min(words.len() as u64 * 64);
                let mut any = false;
                for_words(start, stop, |w, mask| any |= words[w] & mask != 0);
                any
            }
        }
    }
}

/// Call `f(word, mask)` for each 64-bit word of a bitmap that bits
/// `[start, end)` touch.
fn for_words(start: u64, end: u64, mut f: impl FnMut(usize, u64)) {
    let mut at = start;
    while at < end {
        let w = at / 64;
        let lo = at % 64;
        let hi = (end - w * 64).min(64);
        let mask = if hi - lo == 64 {
            u64::MAX
        } else {
            ((1u64 << (hi - lo)) - 1) << lo
        };
        f(w as usize, mask);
        at = (w + 1) * 64;
    }
}

/// Keys that entries in surviving pages mention (positive entries only:
/// those are what a dropped negative entry could resurrect).
struct Present<'a> {
    pages: Pages,
    names: HashSet<&'a [u8]>,
    xattrs: HashSet<&'a [u8]>,
}

/// Unlink the log pages of `inode` whose entries are all dead. Returns the
/// number of pages freed.
pub fn fast_collect<P: Pmem>(fs: &Fs<P>, inode: &Inode, st: &mut InodeState) -> crate::Result<u64> {
    fs.gc.fast_scans.fetch_add(1, Relaxed);
    let pages = log::chain_pages(&fs.pm, &fs.geo, st.log.head, st.log.pages)?;
    debug_assert!(pages
        .last()
        .is_some_and(|&p| LogPageSpan::of(p).holds(st.log.tail)));
    let (keys, first_entry) = read_keys(fs, inode, st, &pages)?;
    let keep = pages_to_keep(&keys, &superseded(&keys), &first_entry);
    if keep.iter().all(|&k| k) {
        return Ok(0);
    }
    // Without shrinking truncates every key is last-writer-wins and the
    // rules above are exact. A shrink's effect depends on the size before
    // it, which dropping entries can change: then the drop set is checked
    // by replaying the log with and without it.
    // A collapse's FILE_WRITE entries lower the size without unmapping
    // anything; dropping them could turn a later snapshot into a shrink,
    // so they are checked the same way.
    let has_shrink = keys.iter().any(|k| {
        matches!(
            k,
            Key::Attr { cut: Some(_) } | Key::Write { shrinks: true, .. }
        )
    });
    let check = has_shrink || ALWAYS_CHECK.load(Relaxed);
    if check && !replays_the_same(fs, inode, st, &pages, &keep)? {
        fs.gc.fast_refused.fetch_add(1, Relaxed);
        return Ok(0);
    }
    let dropped_entries: usize = (0..pages.len())
        .filter(|&i| !keep[i])
        .map(|i| first_entry[i + 1] - first_entry[i])
        .sum();
    let freed = unlink_dropped(fs, inode, st, &pages, &keep);
    st.log_entries -= dropped_entries as u64;
    fs.gc.fast_pages_freed.fetch_add(freed, Relaxed);
    Ok(freed)
}

/// Decode every entry's key, oldest first; `first_entry[i]` is the index of
/// page `i`'s first entry (one more element than pages). Reads only the
/// log: most scans of a live log find nothing to drop.
fn read_keys<P: Pmem>(
    fs: &Fs<P>,
    inode: &Inode,
    st: &InodeState,
    pages: &[u64],
) -> crate::Result<(Vec<Key>, Vec<usize>)> {
    let mut keys = Vec::with_capacity(st.log_entries as usize);
    let mut first_entry = Vec::with_capacity(pages.len() + 1);
    let mut buf = [0u8; BLOCK_SIZE as usize];
    // The file size replay reaches before each entry (a snapshot below it
    // is a shrink).
    let mut size = 0;
    for &page in pages {
        first_entry.push(keys.len());
        log::page_entries(
            &fs.pm,
            inode.ino,
            page,
            st.log.tail,
            &mut buf,
            &mut |_, e| {
                keys.push(key_of(&e, size));
                match e {
                    Entry::Attr { attr, .. } => size = attr.size,
                    Entry::Write(w) => size = w.size,
                    _ => {}
                }
                Ok(())
            },
        )?;
    }
    first_entry.push(keys.len());
    Ok((keys, first_entry))
}

/// Replay one log page into `into`.
fn replay_page<P: Pmem>(
    fs: &Fs<P>,
    inode: &Inode,
    tail: u64,
    page: u64,
    into: &mut InodeState,
    buf: &mut [u8; BLOCK_SIZE as usize],
) -> crate::Result<()> {
    log::page_entries(&fs.pm, inode.ino, page, tail, buf, &mut |_, e| {
        apply_entry(&fs.pm, &fs.geo, into, e, &mut |_, _| {})
            .map_err(|m| crate::Error::Corrupt(format!("inode {}: {m}", inode.ino)))
    })?;
    Ok(())
}

/// `size` is the file size the log replays to just before `e`.
fn key_of(e: &Entry<'_>, size: u64) -> Key {
    match e {
        Entry::Attr { attr, .. } => Key::Attr {
            cut: (attr.size < size).then(|| attr.size.div_ceil(BLOCK_SIZE)),
        },
        Entry::Write(w) => Key::Write {
            start: w.file_page,
            end: w.file_page + w.pages as u64,
            hole: w.block == 0,
            shrinks: w.size < size,
        },
        Entry::DirAdd { name, .. } => Key::Dir {
            name: (*name).into(),
            add: true,
        },
        Entry::DirRemove { name, .. } => Key::Dir {
            name: (*name).into(),
            add: false,
        },
        Entry::XattrSet { name, .. } => Key::Xattr {
            name: (*name).into(),
            set: true,
        },
        Entry::XattrRemove { name, .. } => Key::Xattr {
            name: (*name).into(),
            set: false,
        },
        Entry::Symlink(_) => Key::Symlink,
    }
}

/// The end of the furthest finite page range any key mentions.
fn max_page_end(keys: &[Key]) -> u64 {
    keys.iter()
        .map(|k| match k {
            Key::Write { end, .. } => *end,
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}

/// What the backward pass found for each entry.
struct Verdicts {
    /// Everything the entry says is superseded by later entries about the
    /// same keys (which also set the same attribute fields).
    dead: Vec<bool>,
    /// For a negative entry: the attribute fields it sets (mtime, ctime,
    /// size, or the whole snapshot of a shrink) are set again later, so it
    /// may go if it cancels nothing that survives.
    fields_reset: Vec<bool>,
}

/// Newest to oldest: is everything each entry says superseded by a later
/// entry about the same keys?
fn superseded(keys: &[Key]) -> Verdicts {
    let mut dead = vec![false; keys.len()];
    let mut fields_reset = vec![false; keys.len()];
    let mut later_attr = false;
    // Later entries that set the size (snapshots, writes), mtime (those and
    // directory entries) and ctime (those and xattr entries).
    let (mut later_size, mut later_mtime, mut later_ctime) = (false, false, false);
    let mut covered = Pages::new(max_page_end(keys));
    let mut names: HashSet<&[u8]> = HashSet::new();
    let mut xattrs: HashSet<&[u8]> = HashSet::new();
    for (i, key) in keys.iter().enumerate().rev() {
        (dead[i], fields_reset[i]) = match key {
            Key::Attr { cut } => {
                // A later shrink to a size at or below this one unmaps all
                // this one did.
                let d = later_attr && cut.is_none_or(|c| covered.covers(c, u64::MAX));
                if let Some(c) = cut {
                    covered.insert(*c, u64::MAX);
                }
                (d, later_attr)
            }
            Key::Write { start, end, .. } => {
                let d = covered.covers(*start, *end);
                covered.insert(*start, *end);
                (d, later_size && later_mtime)
            }
            Key::Dir { name, .. } => (!names.insert(name), later_mtime),
            Key::Xattr { name, .. } => (!xattrs.insert(name), later_ctime),
            Key::Symlink => (false, false),
        };
        match key {
            Key::Attr { .. } => {
                later_attr = true;
                (later_size, later_mtime, later_ctime) = (true, true, true);
            }
            Key::Write { .. } => (later_size, later_mtime, later_ctime) = (true, true, true),
            Key::Dir { .. } => (later_mtime, later_ctime) = (true, true),
            Key::Xattr { .. } => later_ctime = true,
            Key::Symlink => {}
        }
    }
    Verdicts { dead, fields_reset }
}

/// Oldest to newest: a page goes if every entry in it is superseded, or is
/// a negative entry that cancels nothing surviving before it (its positive
/// part, a shrink's attribute snapshot, superseded). The tail page stays.
fn pages_to_keep(keys: &[Key], v: &Verdicts, first_entry: &[usize]) -> Vec<bool> {
    let n = first_entry.len() - 1;
    let mut keep = vec![true; n];
    let mut present = Present {
        pages: Pages::new(max_page_end(keys)),
        names: HashSet::new(),
        xattrs: HashSet::new(),
    };
    for (i, k) in keep.iter_mut().enumerate() {
        let range = first_entry[i]..first_entry[i + 1];
        let droppable = |j: usize| {
            v.dead[j]
                || v.fields_reset[j]
                    && match &keys[j] {
                        Key::Attr { cut: Some(c) } => !present.pages.intersects(*c, u64::MAX),
                        Key::Write {
                            start,
                            end,
                            hole: true,
                            ..
                        } => !present.pages.intersects(*start, *end),
                        Key::Dir { name, add: false } => !present.names.contains(&name[..]),
                        Key::Xattr { name, set: false } => !present.xattrs.contains(&name[..]),
                        _ => false,
                    }
        };
        *k = i + 1 == n || !range.clone().all(droppable);
        if *k {
            for key in &keys[range] {
                match key {
                    Key::Write {
                        start,
                        end,
                        hole: false,
                        ..
                    } => present.pages.insert(*start, *end),
                    Key::Dir { name, add: true } => {
                        present.names.insert(name);
                    }
                    Key::Xattr { name, set: true } => {
                        present.xattrs.insert(name);
                    }
                    _ => {}
                }
            }
        }
    }
    keep
}

/// Replay the whole log and only its kept pages: both must rebuild the
/// same state.
fn replays_the_same<P: Pmem>(
    fs: &Fs<P>,
    inode: &Inode,
    st: &InodeState,
    pages: &[u64],
    keep: &[bool],
) -> crate::Result<bool> {
    let mut whole = InodeState::empty(inode.kind, st.generation, st.orphan);
    let mut kept = InodeState::empty(inode.kind, st.generation, st.orphan);
    let mut buf = [0u8; BLOCK_SIZE as usize];
    for (&page, &k) in pages.iter().zip(keep) {
        replay_page(fs, inode, st.log.tail, page, &mut whole, &mut buf)?;
        if k {
            replay_page(fs, inode, st.log.tail, page, &mut kept, &mut buf)?;
        }
    }
    let same_body = match (&kept.body, &whole.body) {
        (Body::File(a), Body::File(b)) => merged(a) == merged(b),
        (Body::Dir(a), Body::Dir(b)) => a.same_children(b),
        (
            Body::Symlink {
                target: a,
                block: x,
            },
            Body::Symlink {
                target: b,
                block: y,
            },
        ) => a == b && x == y,
        (Body::Special, Body::Special) => true,
        _ => false,
    };
    Ok(same_body && kept.attr == whole.attr && kept.xattrs == whole.xattrs)
}

/// A file map as maximal extents (replays of different histories may
/// split the same mapping differently).
fn merged(map: &FileMap) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::with_capacity(map.extent_count());
    for e in map.iter() {
        match out.last_mut() {
            Some(l) if l.end() == e.page && l.block + l.pages == e.block => l.pages += e.pages,
            _ => out.push(e),
        }
    }
    out
}

/// Unlink every run of dropped pages, oldest first, each with one persisted
/// 8-byte store; then free them. Returns how many were freed.
fn unlink_dropped<P: Pmem>(
    fs: &Fs<P>,
    inode: &Inode,
    st: &mut InodeState,
    pages: &[u64],
    keep: &[bool],
) -> u64 {
    debug_assert!(keep.last() == Some(&true), "the tail page always stays");
    // In posix mode the last tail store may not be fenced yet: it must be
    // durable before any page it depends on is unlinked.
    fs.pm.fence();
    let mut freed = Vec::new();
    let mut i = 0;
    while i < pages.len() {
        if keep[i] {
            i += 1;
            continue;
        }
        let next = (i..pages.len())
            .find(|&j| keep[j])
            .unwrap_or(pages.len() - 1);
        let link = if i == 0 {
            inode.rec_off + INODE_HEAD_FIELD
        } else {
            // The head may be a chunk: its footer ends its 1 KiB.
            LogPageSpan::of(pages[i - 1]).footer()
        };
        fs.pm.write_u64(link, pages[next]);
        fs.pm.persist(link, 8);
        if i == 0 {
            st.log.head = pages[next];
        }
        freed.extend_from_slice(&pages[i..next]);
        i = next;
    }
    st.log.pages -= freed.len() as u64;
    // Readers in other processes that cached a position in this log must
    // replay it from the head: the generation says so, durable before any
    // unlinked page can be reused (a crash between leaves the old value,
    // which no one reads after a crash: clients die with the server).
    if !freed.is_empty() {
        bump_log_gen(fs, inode, st);
    }
    for &p in &freed {
        // A head chunk a leased lane's client carved: held until the
        // lane's settle (lanechunks.rs).
        if !fs.hold_leased_chunk(inode.ino, p) {
            fs.free_blocks(p, 1);
        }
    }
    freed.len() as u64
}

/// Count one more change of the log's pages in its record (one persisted
/// store), before the pages that left it are freed.
fn bump_log_gen<P: Pmem>(fs: &Fs<P>, inode: &Inode, st: &mut InodeState) {
    st.log_gen = st.log_gen.wrapping_add(1);
    fs.pm.write_u64(inode.rec_off + INODE_LOG_GEN_FIELD, st.log_gen);
    fs.pm.persist(inode.rec_off + INODE_LOG_GEN_FIELD, 8);
}

// ---------------------------------------------------------------------------
// Thorough GC
// ---------------------------------------------------------------------------

/// Rewrite the inode's log from its DRAM state.
pub fn compact<P: Pmem>(fs: &Fs<P>, inode: &Inode, st: &mut InodeState) -> crate::Result<()> {
    // The old chain, by its footers (its entries are already in DRAM).
    let old = log::chain_pages(&fs.pm, &fs.geo, st.log.head, st.log.pages)?;
    let mut cur = LogCursor::default();
    let mut pages = NewPages::default();
    let entries = match write_compact(fs, inode, st, &mut cur, &mut pages) {
        Ok(n) => n,
        Err(e) => {
            pages.release(&fs.blocks);
            return Err(e);
        }
    };
    fs.commit_journal(&[
        rec(inode.rec_off, INODE_HEAD_FIELD, cur.head),
        rec(inode.rec_off, INODE_TAIL_FIELD, cur.tail),
    ]);
    // The old pages may come back as this log's new head one day: a reader
    // in another process that cached a position in the old log must see
    // more than the head to know it is gone (shared.rs).
    bump_log_gen(fs, inode, st);
    fs.gc.compactions.fetch_add(1, Relaxed);
    fs.gc
        .compaction_pages_freed
        .fetch_add((old.len() as u64).saturating_sub(cur.pages), Relaxed);
    for p in old {
        fs.free_blocks(p, 1);
    }
    st.log = cur;
    st.log_entries = entries;
    // A compact log has nothing dead.
    st.fast_gc_at = next_scan(cur.pages);
    Ok(())
}

fn write_compact<P: Pmem>(
    fs: &Fs<P>,
    inode: &Inode,
    st: &InodeState,
    cur: &mut LogCursor,
    pages: &mut NewPages,
) -> crate::Result<u64> {
    let mut n = 0u64;
    let mut put = |e: &EntryBuf, cur: &mut LogCursor, pages: &mut NewPages| -> crate::Result<()> {
        fs.log_append(inode.ino, cur, e, pages)?;
        n += 1;
        Ok(())
    };
    let a = st.attr;
    put(&EntryBuf::attr(false, a), cur, pages)?;
    match &st.body {
        Body::File(map) => {
            for e in map.iter() {
                let mut page = e.page;
                while page < e.end() {
                    let k = (e.end() - page).min(MAX_PAGES);
                    let block = e.block + (page - e.page);
                    put(
                        &EntryBuf::write(page, block, k as u32, a.size, a.mtime_ns),
                        cur,
                        pages,
                    )?;
                    page += k;
                }
            }
        }
        Body::Dir(d) => {
            for (name, child) in d.iter() {
                put(
                    &EntryBuf::dir(true, child.ino, child.seq, a.mtime_ns, child.kind, name),
                    cur,
                    pages,
                )?;
            }
        }
        Body::Symlink { target, block } => {
            put(&EntryBuf::symlink(*block, target.len() as u32), cur, pages)?
        }
        Body::Special => {}
    }
    for (name, value) in &st.xattrs {
        put(&EntryBuf::xattr(true, name, value, a.ctime_ns), cur, pages)?;
    }
    // Entries above set mtime/ctime as a side effect; the final snapshot
    // restores the exact attributes.
    put(&EntryBuf::attr(false, a), cur, pages)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::{PageSet, Pages};

    /// The bitmap form answers as the range form does.
    #[test]
    fn page_bitmap_agrees_with_ranges() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..50 {
            let max_end = 1 + rnd(300);
            let mut bits = Pages::new(max_end);
            let mut ranges = PageSet::default();
            assert!(matches!(bits, Pages::Bits { .. }));
            for _ in 0..40 {
                let start = rnd(max_end);
                let end = if rnd(8) == 0 {
                    u64::MAX
                } else {
                    start + 1 + rnd(max_end - start)
                };
                bits.insert(start, end);
                ranges.insert(start, end);
                for _ in 0..20 {
                    let a = rnd(max_end + 5);
                    let b = if rnd(6) == 0 {
                        u64::MAX
                    } else {
                        (a + 1 + rnd(70)).min(max_end)
                    };
                    if a >= b {
                        continue;
                    }
                    assert_eq!(bits.covers(a, b), ranges.covers(a, b), "covers {a}..{b}");
                    assert_eq!(
                        bits.intersects(a, b),
                        ranges.intersects(a, b),
                        "intersects {a}..{b}"
                    );
                }
            }
        }
        assert!(matches!(Pages::new(1 << 40), Pages::Ranges(_)));
    }

    #[test]
    fn page_set_merges_and_answers_cover_and_overlap() {
        let mut s = PageSet::default();
        s.insert(10, 20);
        s.insert(30, 40);
        assert!(s.covers(10, 20) && s.covers(12, 15) && !s.covers(9, 12));
        assert!(!s.covers(15, 35), "a gap at 20..30");
        assert!(s.intersects(19, 31) && s.intersects(0, 11) && !s.intersects(20, 30));
        s.insert(20, 30); // fills the gap: one range
        assert_eq!(s.0.len(), 1);
        assert!(s.covers(10, 40));
        s.insert(5, 12);
        s.insert(38, u64::MAX);
        assert_eq!(s.0.len(), 1);
        assert!(s.covers(5, u64::MAX) && !s.covers(4, 6));
        assert!(!s.intersects(0, 5));
    }
}
