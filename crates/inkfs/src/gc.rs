//! Log garbage collection (NOVA's thorough GC): when fewer than half of an
//! inode's log entries are still live, write a compact log that describes
//! the inode's current state and switch the inode to it with one journaled
//! (head, tail) change. The old pages return to the allocator.
//!
//! Crash safety: the new log is written and flushed before the journal
//! commit; a crash before the commit leaves the old log in place (the new
//! pages are unreferenced and free to recovery), after it the new one.

use crate::format::*;
use crate::fs::{rec, Fs};
use crate::inode::{Body, Inode, InodeState};
use crate::log::{self, EntryBuf, LogCursor, NewPages};
use crate::pmem::Pmem;

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

pub fn maybe_compact<P: Pmem>(fs: &Fs<P>, inode: &Inode, st: &mut InodeState) {
    if fs.read_only
        || st.gone
        || st.log_entries < MIN_ENTRIES
        || st.log_entries < 2 * live_entries(st)
    {
        return;
    }
    // Failure (ENOSPC) just leaves the old log: compaction is an optimisation.
    let _ = compact(fs, inode, st);
}

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
    for p in old {
        fs.free_blocks(p, 1);
    }
    st.log = cur;
    st.log_entries = entries;
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
