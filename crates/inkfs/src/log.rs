//! Per-inode logs: appending entries to linked 4 KiB log pages, and walking
//! a log back from media with every step bounded and checked.
//!
//! An append never makes anything visible by itself: entries are written
//! past the tail and flushed; the caller commits them by moving the tail
//! (one persisted 8-byte store, or a journal record when several logs move
//! together). A crash before that leaves the old tail, and everything past
//! it is ignored.

use std::collections::HashSet;
use std::mem::size_of;

use crate::alloc::BlockAllocator;
use crate::error::{Error, Result};
use crate::format::*;
use crate::pmem::{read_pod, write_pod, Pmem};
use crate::superblock::Geometry;

/// DRAM position of one log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogCursor {
    /// First page (a page id: a block number, or a chunk's tagged id,
    /// `format::log_page_id`); 0 = the log has no page yet.
    pub head: u64,
    /// Byte offset where the next entry goes (== the committed tail when
    /// this cursor describes media).
    pub tail: u64,
    /// Pages in the chain up to and including the tail's page.
    pub pages: u64,
}

impl LogCursor {
    /// The page the tail is in: the head chunk while the log has not
    /// outgrown it, else the whole page holding the tail.
    pub fn tail_span(&self) -> LogPageSpan {
        let head = LogPageSpan::of(self.head);
        if head.holds(self.tail) {
            head
        } else {
            LogPageSpan::of(self.tail / BLOCK_SIZE)
        }
    }
}

/// The span of page id `page`, if the id names a page or chunk of the
/// data area.
fn page_span(geo: &Geometry, page: u64) -> Option<LogPageSpan> {
    geo.is_log_page(page).then(|| LogPageSpan::of(page))
}

/// Pages allocated by an append that is not committed yet; released if the
/// operation fails.
#[derive(Debug, Default)]
pub struct NewPages {
    pub blocks: Vec<u64>,
}

impl NewPages {
    pub fn release(self, alloc: &BlockAllocator) {
        for b in self.blocks {
            // The pages were never reachable below a committed tail.
            let _ = alloc.free_log_page(b);
        }
    }
}

/// Write `entry` (already sealed, a multiple of ENTRY_UNIT) at the cursor,
/// linking a new page first if it does not fit. What it writes is durable
/// at the next fence (it does not fence). Returns the entry's offset.
pub fn append<P: Pmem + ?Sized>(
    pm: &P,
    alloc: &BlockAllocator,
    lane: u32,
    owner_ino: u64,
    cur: &mut LogCursor,
    entry: &[u8],
    new_pages: &mut NewPages,
) -> Result<u64> {
    let len = entry.len() as u64;
    debug_assert!(len > 0 && len.is_multiple_of(ENTRY_UNIT) && len <= LOG_PAGE_PAYLOAD);
    debug_assert_eq!(
        entry[1] as u64 * ENTRY_UNIT,
        len,
        "units field must match length"
    );
    if cur.head == 0 {
        // A new log starts in a chunk when its first entry fits one: most
        // logs (a small file's, an empty directory's) never outgrow it.
        let small = len <= LOG_CHUNK_PAYLOAD;
        let page = new_page(pm, alloc, lane, owner_ino, small, new_pages)?;
        *cur = LogCursor {
            head: page,
            tail: LogPageSpan::of(page).base,
            pages: 1,
        };
    } else if cur.tail - cur.tail_span().base + len > cur.tail_span().payload {
        let page = new_page(pm, alloc, lane, owner_ino, false, new_pages)?;
        link_page(pm, cur, page);
    }
    let at = cur.tail;
    // Whole, aligned cache lines: non-temporal stores go to media in
    // parallel with the operation's data, where a cached store would need
    // its own write-back (~130 ns on the append path) before the fence.
    debug_assert!(at.is_multiple_of(ENTRY_UNIT));
    pm.copy_nt(at, entry);
    cur.tail += len;
    Ok(at)
}

/// A new page (a chunk if `small`), its footer written and flushed; its
/// page id. A chunk's entries start empty: its block's other chunks are
/// other logs', so nothing but this footer is written.
fn new_page<P: Pmem + ?Sized>(
    pm: &P,
    alloc: &BlockAllocator,
    lane: u32,
    owner_ino: u64,
    small: bool,
    new_pages: &mut NewPages,
) -> Result<u64> {
    let id = if small {
        alloc.alloc_chunk(lane)
    } else {
        alloc.alloc_meta(lane)
    }
    .ok_or(Error::Errno(libc::ENOSPC))?;
    new_pages.blocks.push(id);
    let footer = LogPageFooter {
        next_block: 0,
        magic: LOG_MAGIC,
        owner_ino,
        reserved: [0; 40],
    };
    let off = LogPageSpan::of(id).footer();
    write_pod(pm, off, &footer);
    pm.flush(off, 64);
    Ok(id)
}

/// Close the tail page (PAD marker if space remains) and point its footer at
/// `page`. Both are below nothing committed until the tail moves.
fn link_page<P: Pmem + ?Sized>(pm: &P, cur: &mut LogCursor, page: u64) {
    let old = cur.tail_span();
    let in_page = cur.tail - old.base;
    // Only a fresh, still empty head page has its tail at offset 0, and
    // every entry fits in an empty page (a new log's first entry goes to a
    // chunk only if it fits one).
    debug_assert!(in_page > 0);
    if in_page < old.payload {
        let pad = EntryHeader {
            kind: entry_type::PAD,
            units: 0,
            reserved: 0,
            checksum: 0,
        };
        write_pod(pm, cur.tail, &pad);
        pm.flush(cur.tail, 8);
    }
    let next_off = old.footer();
    pm.write_u64(next_off, page);
    pm.flush(next_off, 8);
    cur.tail = page * BLOCK_SIZE;
    cur.pages += 1;
}

/// One entry met while walking a log.
#[derive(Debug)]
pub enum Entry<'a> {
    Attr {
        link_change: bool,
        attr: AttrEntry,
    },
    Write(WriteEntry),
    DirAdd {
        head: DirEntryHead,
        name: &'a [u8],
    },
    DirRemove {
        head: DirEntryHead,
        name: &'a [u8],
    },
    Symlink(SymlinkEntry),
    XattrSet {
        head: XattrHead,
        name: &'a [u8],
        value: &'a [u8],
    },
    XattrRemove {
        head: XattrHead,
        name: &'a [u8],
    },
}

/// Decode one checksummed entry; anything inconsistent is corruption. Every
/// field is checked against the ranges docs/FORMAT.md gives ("Field
/// ranges"), except those that need the pool's geometry or the inode's kind
/// (`inode::load_with_pages`, `inode::apply_entry`). An entry is exactly as
/// long as its fields make it, as the engine writes it.
pub fn parse(bytes: &[u8]) -> std::result::Result<Entry<'_>, String> {
    if !entry_checksum_ok(bytes) {
        return Err("entry checksum mismatch".into());
    }
    let kind = bytes[0];
    let length = |head: usize, payload: usize| -> std::result::Result<(), String> {
        let want = entry_bytes(head, payload);
        if bytes.len() as u64 != want {
            Err(format!(
                "entry type {kind} is {} bytes long, its fields make {want}",
                bytes.len()
            ))
        } else {
            Ok(())
        }
    };
    // The fixed part first: the name and value lengths are read from it.
    let at_least = |n: usize| -> std::result::Result<(), String> {
        if bytes.len() < n {
            Err(format!(
                "entry type {kind} too short ({} bytes)",
                bytes.len()
            ))
        } else {
            Ok(())
        }
    };
    match kind {
        entry_type::SET_ATTR | entry_type::LINK_CHANGE => {
            length(size_of::<AttrEntry>(), 0)?;
            Ok(Entry::Attr {
                link_change: kind == entry_type::LINK_CHANGE,
                attr: AttrEntry::from_bytes(bytes),
            })
        }
        entry_type::FILE_WRITE => {
            length(size_of::<WriteEntry>(), 0)?;
            let w = WriteEntry::from_bytes(bytes);
            w.check()?;
            Ok(Entry::Write(w))
        }
        entry_type::DIR_ADD | entry_type::DIR_REMOVE => {
            const HEAD: usize = size_of::<DirEntryHead>();
            at_least(HEAD)?;
            let head = DirEntryHead::from_bytes(bytes);
            let n = head.name_len as usize;
            if n == 0 || n > NAME_MAX || HEAD + n > bytes.len() {
                return Err(format!("directory entry name length {n} out of range"));
            }
            length(HEAD, n)?;
            let name = &bytes[HEAD..HEAD + n];
            head.check(name)?;
            if kind == entry_type::DIR_ADD {
                Ok(Entry::DirAdd { head, name })
            } else {
                Ok(Entry::DirRemove { head, name })
            }
        }
        entry_type::SYMLINK => {
            length(size_of::<SymlinkEntry>(), 0)?;
            let s = SymlinkEntry::from_bytes(bytes);
            s.check()?;
            Ok(Entry::Symlink(s))
        }
        entry_type::XATTR_SET | entry_type::XATTR_REMOVE => {
            const HEAD: usize = size_of::<XattrHead>();
            at_least(HEAD)?;
            let head = XattrHead::from_bytes(bytes);
            let (n, v) = (head.name_len as usize, head.value_len as usize);
            if n == 0 || n > NAME_MAX || HEAD + n + v > bytes.len() {
                return Err("xattr entry lengths out of range".into());
            }
            length(HEAD, n + v)?;
            let name = &bytes[HEAD..HEAD + n];
            let set = kind == entry_type::XATTR_SET;
            head.check(set, name)?;
            if set {
                Ok(Entry::XattrSet {
                    head,
                    name,
                    value: &bytes[HEAD + n..HEAD + n + v],
                })
            } else {
                Ok(Entry::XattrRemove { head, name })
            }
        }
        other => Err(format!("unknown entry type {other}")),
    }
}

/// What a walk saw besides the entries.
#[derive(Debug, Default)]
pub struct WalkSummary {
    /// Every page of the chain up to the tail's page, in order.
    pub pages: Vec<u64>,
    pub entries: u64,
}

/// Walk the committed entries of a log from `head` to `tail`, calling `f`
/// with each entry's offset and decoded form. Bounded: a bad pointer, a
/// cycle, a foreign page or a damaged entry ends the walk with
/// `Error::Corrupt`, never a hang or a panic.
pub fn walk<P: Pmem + ?Sized>(
    pm: &P,
    geo: &Geometry,
    owner_ino: u64,
    head: u64,
    tail: u64,
    mut f: impl FnMut(u64, Entry<'_>) -> Result<()>,
) -> Result<WalkSummary> {
    let corrupt = |what: String| Error::Corrupt(format!("inode {owner_ino} log: {what}"));
    if !geo.is_log_page(head) {
        return Err(corrupt(format!("head {head:#x} is not a log page of the data area")));
    }
    if !geo.is_log_tail(tail) {
        return Err(corrupt(format!("tail offset {tail} invalid")));
    }
    let mut summary = WalkSummary::default();
    let mut seen = HashSet::new();
    let mut page = head;
    let mut buf = [0u8; BLOCK_SIZE as usize];
    loop {
        // Short chains (nearly all) are checked against the page list; long
        // ones through a set, so a cycle is found in linear time either way.
        let revisit = if summary.pages.len() < 16 {
            summary.pages.contains(&page)
        } else {
            if seen.is_empty() {
                seen.extend(summary.pages.iter().copied());
            }
            !seen.insert(page)
        };
        if revisit {
            return Err(corrupt(format!("cycle in log chain at block {page}")));
        }
        summary.pages.push(page);
        let span = LogPageSpan::of(page);
        let footer: LogPageFooter = read_pod(pm, span.footer());
        if footer.magic != LOG_MAGIC || footer.owner_ino != owner_ino {
            return Err(corrupt(format!(
                "page {page:#x} is not a log page of this inode"
            )));
        }
        summary.entries += page_entries(pm, owner_ino, page, tail, &mut buf, &mut f)?;
        if span.holds(tail) {
            return Ok(summary);
        }
        let next = footer.next_block;
        if !geo.is_data_range(next, 1) {
            return Err(corrupt(format!(
                "page {page} links to block {next}, out of range, before the tail"
            )));
        }
        page = next;
    }
}

/// Walk the entries committed after position `from` (a tail this process
/// replayed to earlier, so an entry boundary in a page of this log) up to
/// `tail`: the rest of `from`'s page, then the pages its footer links to,
/// with `walk`'s checks. The caller knows the pages after `from` are still
/// this log's (the log's head and GC generation did not change). The
/// summary's pages are the ones entered after `from`'s page.
#[allow(clippy::too_many_arguments)]
pub fn walk_from<P: Pmem + ?Sized>(
    pm: &P,
    geo: &Geometry,
    owner_ino: u64,
    head: u64,
    from: u64,
    tail: u64,
    mut f: impl FnMut(u64, Entry<'_>) -> Result<()>,
) -> Result<WalkSummary> {
    let corrupt = |what: String| Error::Corrupt(format!("inode {owner_ino} log: {what}"));
    if !geo.is_log_page(head) || !geo.is_log_tail(from) || !geo.is_log_tail(tail) {
        return Err(corrupt(format!("positions {from}..{tail} invalid")));
    }
    let mut summary = WalkSummary::default();
    // `from` is in the head chunk, or in a whole page.
    let first = LogCursor {
        head,
        tail: from,
        pages: 0,
    }
    .tail_span();
    let first = if first.payload == LOG_CHUNK_PAYLOAD {
        head
    } else {
        from / BLOCK_SIZE
    };
    let mut page = first;
    let mut start = from - LogPageSpan::of(first).base;
    let mut buf = [0u8; BLOCK_SIZE as usize];
    loop {
        let span = LogPageSpan::of(page);
        let footer: LogPageFooter = read_pod(pm, span.footer());
        if footer.magic != LOG_MAGIC || footer.owner_ino != owner_ino {
            return Err(corrupt(format!(
                "page {page:#x} is not a log page of this inode"
            )));
        }
        summary.entries += page_entries_from(pm, owner_ino, page, start, tail, &mut buf, &mut f)?;
        if span.holds(tail) {
            return Ok(summary);
        }
        let next = footer.next_block;
        if !geo.is_data_range(next, 1) {
            return Err(corrupt(format!(
                "page {page} links to block {next}, out of range, before the tail"
            )));
        }
        if next == first || summary.pages.contains(&next) {
            return Err(corrupt(format!("cycle in log chain at block {next}")));
        }
        summary.pages.push(next);
        page = next;
        start = 0;
    }
}

/// Decode the entries of one log page (a page id: a whole page or a
/// chunk), calling `f` with each entry's offset: up to the tail on the
/// tail page (`tail` is the log's tail), else up to a PAD or the end of
/// the payload. Returns how many it saw.
pub fn page_entries<P: Pmem + ?Sized>(
    pm: &P,
    owner_ino: u64,
    page: u64,
    tail: u64,
    buf: &mut [u8; BLOCK_SIZE as usize],
    f: &mut impl FnMut(u64, Entry<'_>) -> Result<()>,
) -> Result<u64> {
    page_entries_from(pm, owner_ino, page, 0, tail, buf, f)
}

/// `page_entries` from byte `start` of the page on (an entry boundary: a
/// tail this process replayed to before).
fn page_entries_from<P: Pmem + ?Sized>(
    pm: &P,
    owner_ino: u64,
    page: u64,
    start: u64,
    tail: u64,
    buf: &mut [u8; BLOCK_SIZE as usize],
    f: &mut impl FnMut(u64, Entry<'_>) -> Result<()>,
) -> Result<u64> {
    let corrupt = |what: String| Error::Corrupt(format!("inode {owner_ino} log: {what}"));
    let span = LogPageSpan::of(page);
    let base = span.base;
    let tail_here = span.holds(tail);
    let end = if tail_here {
        tail - base
    } else {
        span.payload
    };
    debug_assert!(end <= span.payload);
    if start > end || !start.is_multiple_of(ENTRY_UNIT) {
        return Err(corrupt(format!(
            "position {} is past the tail or not an entry boundary",
            base + start
        )));
    }
    // Only the committed part of the page is read: a short log costs a
    // cache line, not a page (recovery reads every live inode's log).
    pm.read(base + start, &mut buf[start as usize..end as usize]);
    let mut pos = start;
    let mut count = 0;
    while pos < end {
        let kind = buf[pos as usize];
        if kind == entry_type::PAD {
            if tail_here {
                return Err(corrupt(format!(
                    "pad below the tail at offset {}",
                    base + pos
                )));
            }
            break;
        }
        let len = buf[pos as usize + 1] as u64 * ENTRY_UNIT;
        if len == 0 || pos + len > end {
            return Err(corrupt(format!(
                "entry at offset {} has bad length {len}",
                base + pos
            )));
        }
        let bytes = &buf[pos as usize..(pos + len) as usize];
        let entry = parse(bytes)
            .map_err(|e| corrupt(format!("offset {}: {e}", base + pos)))?;
        f(base + pos, entry)?;
        count += 1;
        pos += len;
    }
    Ok(count)
}

/// The pages of a committed log, found by following footers only (no entry
/// is read): `pages` is the chain length the DRAM cursor recorded. Used to
/// free a log whose entries were already replayed.
pub fn chain_pages<P: Pmem + ?Sized>(
    pm: &P,
    geo: &Geometry,
    head: u64,
    pages: u64,
) -> Result<Vec<u64>> {
    let mut out = Vec::with_capacity(pages as usize);
    let mut page = head;
    for i in 0..pages {
        // Only the head may be a chunk.
        let chunk_past_head = i > 0 && log_page_id(page).is_some_and(|(_, c)| c.is_some());
        if page_span(geo, page).is_none()
            || chunk_past_head
            || out.contains(&page) && out.len() < 64
        {
            return Err(Error::Corrupt(format!(
                "log chain from page {head:#x}: bad link to page {page:#x}"
            )));
        }
        out.push(page);
        if i + 1 < pages {
            page = footer(pm, page).next_block;
        }
    }
    Ok(out)
}

/// Read the footer of a log page (a page id).
pub fn footer<P: Pmem + ?Sized>(pm: &P, page: u64) -> LogPageFooter {
    read_pod(pm, LogPageSpan::of(page).footer())
}

/// Entries up to this size (every kind but large xattrs) are encoded on the
/// stack.
const INLINE_ENTRY_BYTES: usize = 320;

/// One entry, encoded and sealed: inline for the common sizes, on the heap
/// only for large xattr values (not a hot path).
pub struct EntryBuf {
    inline: [u8; INLINE_ENTRY_BYTES],
    heap: Vec<u8>,
    len: usize,
}

impl EntryBuf {
    fn new(kind: u8, head: &[u8], tails: &[&[u8]]) -> EntryBuf {
        let payload: usize = tails.iter().map(|t| t.len()).sum();
        let len = entry_bytes(head.len(), payload) as usize;
        debug_assert!(len as u64 <= LOG_PAGE_PAYLOAD);
        let mut b = EntryBuf {
            inline: [0; INLINE_ENTRY_BYTES],
            heap: Vec::new(),
            len,
        };
        if len > INLINE_ENTRY_BYTES {
            b.heap = vec![0; len];
        }
        let bytes = b.bytes_mut();
        bytes[..head.len()].copy_from_slice(head);
        let mut at = head.len();
        for t in tails {
            bytes[at..at + t.len()].copy_from_slice(t);
            at += t.len();
        }
        bytes[0] = kind;
        bytes[1] = (len as u64 / ENTRY_UNIT) as u8;
        seal_entry(bytes);
        b
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len > INLINE_ENTRY_BYTES {
            &mut self.heap[..]
        } else {
            &mut self.inline[..self.len]
        }
    }
    pub fn as_bytes(&self) -> &[u8] {
        if self.len > INLINE_ENTRY_BYTES {
            &self.heap[..]
        } else {
            &self.inline[..self.len]
        }
    }

    pub fn attr(link_change: bool, mut a: AttrEntry) -> EntryBuf {
        a.hdr = EntryHeader::default_zero();
        let kind = if link_change {
            entry_type::LINK_CHANGE
        } else {
            entry_type::SET_ATTR
        };
        EntryBuf::new(kind, a.as_bytes(), &[])
    }
    pub fn write(file_page: u64, block: u64, pages: u32, size: u64, mtime_ns: i64) -> EntryBuf {
        let w = WriteEntry {
            hdr: EntryHeader::default_zero(),
            file_page,
            block,
            pages,
            reserved0: 0,
            size,
            mtime_ns,
            reserved: [0; 16],
        };
        EntryBuf::new(entry_type::FILE_WRITE, w.as_bytes(), &[])
    }
    pub fn dir(
        add: bool,
        ino: u64,
        seq: u64,
        mtime_ns: i64,
        child_kind: FileKind,
        name: &[u8],
    ) -> EntryBuf {
        debug_assert!(!name.is_empty() && name.len() <= NAME_MAX);
        let h = DirEntryHead {
            hdr: EntryHeader::default_zero(),
            ino,
            seq,
            mtime_ns,
            name_len: name.len() as u16,
            child_kind: child_kind as u32 as u8,
            reserved: [0; 5],
        };
        let kind = if add {
            entry_type::DIR_ADD
        } else {
            entry_type::DIR_REMOVE
        };
        EntryBuf::new(kind, h.as_bytes(), &[name])
    }
    pub fn symlink(block: u64, len: u32) -> EntryBuf {
        let s = SymlinkEntry {
            hdr: EntryHeader::default_zero(),
            block,
            len,
            reserved: [0; 44],
        };
        EntryBuf::new(entry_type::SYMLINK, s.as_bytes(), &[])
    }
    pub fn xattr(set: bool, name: &[u8], value: &[u8], ctime_ns: i64) -> EntryBuf {
        debug_assert!(name.len() <= NAME_MAX && value.len() <= XATTR_VALUE_MAX);
        let h = XattrHead {
            hdr: EntryHeader::default_zero(),
            name_len: name.len() as u16,
            value_len: if set { value.len() as u16 } else { 0 },
            reserved: 0,
            ctime_ns,
        };
        if set {
            EntryBuf::new(entry_type::XATTR_SET, h.as_bytes(), &[name, value])
        } else {
            EntryBuf::new(entry_type::XATTR_REMOVE, h.as_bytes(), &[name])
        }
    }
}

impl EntryHeader {
    pub fn default_zero() -> EntryHeader {
        EntryHeader {
            kind: 0,
            units: 0,
            reserved: 0,
            checksum: 0,
        }
    }
}
