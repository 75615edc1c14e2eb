//! Collapse and insert range (fallocate's FALLOC_FL_COLLAPSE_RANGE and
//! FALLOC_FL_INSERT_RANGE): a file's pages from an offset on move down or
//! up by whole blocks. No byte is copied: the data blocks stay where they
//! are and the file's mapping changes.
//!
//! One commit, as every single-inode operation: FILE_WRITE entries that
//! give every page whose mapping changes its new block (or make it a hole),
//! then a SET_ATTR with the new size and times, all appended past the tail,
//! fenced, and committed by one tail store. The entries cover disjoint page
//! ranges, so replaying them in order leaves exactly the new mapping
//! whatever the order, and a crash shows the file before the call or after
//! it. The blocks a collapse removes from the file return to the allocator
//! only after the commit is durable (a block reused before could be
//! overwritten while a crash still shows the old mapping).
//!
//! No new on-media structure: a collapse's FILE_WRITE entries carry the new,
//! smaller size, which log GC treats as a shrink (see `gc.rs`).

use crate::error::{errno, Error, Result};
use crate::extents::Extent;
use crate::filemap::FileMap;
use crate::format::*;
use crate::fs::{live, Fs};
use crate::inode::{self, Inode, InodeState};
use crate::log::{Entry, EntryBuf, NewPages};
use crate::pmem::Pmem;
use crate::time::now_ns;

/// Pages per FILE_WRITE entry at most (the entry's count is 32 bits).
const MAX_PAGES_PER_ENTRY: u64 = 1 << 20;

/// Largest number of pages a file may map (pages past it are refused by
/// replay as corruption).
const MAX_FILE_PAGES: u64 = MAX_FILE_BYTES / BLOCK_SIZE;

/// The file's mapped runs at or after `first` (cut at `first`), in page
/// order, adjacent runs on consecutive blocks merged.
fn runs_from(map: &FileMap, first: u64) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::new();
    let mut page = first;
    while let Some(e) = map.next_from(page) {
        let start = e.page.max(page);
        let run = Extent {
            page: start,
            block: e.block + (start - e.page),
            pages: e.end() - start,
        };
        match out.last_mut() {
            Some(l) if l.end() == run.page && l.block + l.pages == run.block => {
                l.pages += run.pages
            }
            _ => out.push(run),
        }
        page = e.end();
    }
    out
}

/// Page ranges `[start, end)` of `a` that no run of `b` covers; both sorted
/// and disjoint.
fn uncovered(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut j = 0;
    for &(mut s, e) in a {
        while j < b.len() && b[j].1 <= s {
            j += 1;
        }
        let mut k = j;
        while s < e {
            match b.get(k) {
                Some(&(bs, be)) if bs < e => {
                    if bs > s {
                        out.push((s, bs));
                    }
                    s = s.max(be);
                    k += 1;
                }
                _ => {
                    out.push((s, e));
                    s = e;
                }
            }
        }
    }
    out
}

/// The new mapping of one shift: FILE_WRITE pieces `(page, block, pages)`
/// (block 0 = hole) and the runs a collapse removes.
struct Plan {
    pieces: Vec<(u64, u64, u64)>,
    removed: Vec<Extent>,
}

/// Pages `[first, first + shift)` leave the file (`collapse`) or open as a
/// hole, and every mapped page after them moves by `shift`.
fn plan(map: &FileMap, first: u64, shift: u64, collapse: bool) -> Result<Plan> {
    let old = runs_from(map, first);
    let mut moved = Vec::with_capacity(old.len());
    let mut removed = Vec::new();
    for r in &old {
        if !collapse {
            moved.push(Extent {
                page: r.page + shift,
                ..*r
            });
            continue;
        }
        // Cut at the end of the collapsed range: below it goes, from it on
        // moves down.
        let cut = first + shift;
        if r.page < cut {
            let n = r.pages.min(cut - r.page);
            removed.push(Extent { pages: n, ..*r });
        }
        if r.end() > cut {
            let start = r.page.max(cut);
            moved.push(Extent {
                page: start - shift,
                block: r.block + (start - r.page),
                pages: r.end() - start,
            });
        }
    }
    // Blocks kept past the end of file (fallocate KEEP_SIZE) move too, and
    // must stay inside the largest file.
    if moved.last().is_some_and(|m| m.end() > MAX_FILE_PAGES) {
        return errno(libc::EFBIG);
    }
    let ranges = |v: &[Extent]| v.iter().map(|e| (e.page, e.end())).collect::<Vec<_>>();
    let holes = uncovered(&ranges(&old), &ranges(&moved));
    let mut pieces = Vec::new();
    let mut push = |mut page: u64, block: u64, mut pages: u64| {
        let mut block = block;
        while pages > 0 {
            let n = pages.min(MAX_PAGES_PER_ENTRY);
            pieces.push((page, block, n));
            page += n;
            if block != 0 {
                block += n;
            }
            pages -= n;
        }
    };
    for m in &moved {
        push(m.page, m.block, m.pages);
    }
    for (s, e) in holes {
        push(s, 0, e - s);
    }
    Ok(Plan { pieces, removed })
}

impl<P: Pmem> Fs<P> {
    /// fallocate COLLAPSE_RANGE (`collapse`) or INSERT_RANGE of
    /// `[off, off + len)`, under the inode's write lock. The caller checked
    /// that `len > 0` and `off + len` is within the largest file; the rest
    /// is checked here as ext4 checks it (errnos and order).
    pub(crate) fn shift_range(
        &self,
        inode: &Inode,
        st: &mut InodeState,
        off: u64,
        len: u64,
        collapse: bool,
    ) -> Result<()> {
        live(st)?;
        if !(off | len).is_multiple_of(BLOCK_SIZE) {
            return errno(libc::EINVAL);
        }
        let size = st.attr.size;
        let new_size = if collapse {
            // Reaching the end of file would be a truncate: ext4 refuses it.
            if off + len >= size {
                return errno(libc::EINVAL);
            }
            size - len
        } else {
            if len > MAX_FILE_BYTES - size {
                return errno(libc::EFBIG);
            }
            if off >= size {
                return errno(libc::EINVAL);
            }
            size + len
        };
        let map = st.file().ok_or(Error::Errno(libc::EINVAL))?;
        let plan = plan(map, off / BLOCK_SIZE, len / BLOCK_SIZE, collapse)?;
        let now = now_ns();
        let mut attr = st.attr;
        attr.size = new_size;
        attr.mtime_ns = now;
        attr.ctime_ns = now;
        let entries: Vec<WriteEntry> = plan
            .pieces
            .iter()
            .map(|&(page, block, pages)| WriteEntry {
                hdr: EntryHeader::default_zero(),
                file_page: page,
                block,
                pages: pages as u32,
                reserved0: 0,
                size: new_size,
                mtime_ns: now,
                reserved: [0; 16],
            })
            .collect();

        // Stage everything past the tail; nothing is visible yet.
        let mut cur = st.log;
        let mut pages = NewPages::default();
        let staged = entries
            .iter()
            .map(|w| EntryBuf::write(w.file_page, w.block, w.pages, w.size, w.mtime_ns))
            .chain(std::iter::once(EntryBuf::attr(false, attr)))
            .try_for_each(|e| {
                self.log_append(inode.ino, &mut cur, &e, &mut pages)
                    .map(|_| ())
            });
        if let Err(e) = staged {
            pages.release(&self.blocks);
            return Err(e);
        }
        // Commit: fence, tail store, fence.
        self.commit_tail(inode.rec_off, &cur, true);
        st.log = cur;

        // DRAM follows. The entries remap blocks the file keeps (a page's
        // old block may now be another page's), so what `map` reports as
        // displaced is not freed: the removed runs are exactly the blocks
        // that left the file.
        let mapped_before = st.file().map_or(0, |m| m.mapped_pages());
        let geo = self.geo;
        for w in &entries {
            let r = inode::apply_entry(&self.pm, &geo, st, Entry::Write(*w), &mut |_, _| {});
            debug_assert!(r.is_ok(), "a committed entry must apply: {r:?}");
        }
        let r = inode::apply_entry(
            &self.pm,
            &geo,
            st,
            Entry::Attr {
                link_change: false,
                attr,
            },
            &mut |_, _| {},
        );
        debug_assert!(r.is_ok(), "a committed entry must apply: {r:?}");
        let removed: u64 = plan.removed.iter().map(|e| e.pages).sum();
        debug_assert_eq!(
            st.file().map_or(0, |m| m.mapped_pages()),
            mapped_before - removed,
            "a shift keeps every block but the collapsed ones"
        );
        for e in &plan.removed {
            self.free_blocks(e.block, e.pages);
        }
        st.attr_dirty = false;
        st.unfenced_size = None;
        self.maybe_compact(inode, st);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uncovered_ranges() {
        assert_eq!(uncovered(&[(0, 10)], &[]), vec![(0, 10)]);
        assert_eq!(uncovered(&[(0, 10)], &[(0, 10)]), vec![]);
        assert_eq!(
            uncovered(&[(0, 10)], &[(2, 4), (6, 12)]),
            vec![(0, 2), (4, 6)]
        );
        assert_eq!(
            uncovered(&[(0, 3), (5, 9)], &[(1, 6)]),
            vec![(0, 1), (6, 9)]
        );
        assert_eq!(uncovered(&[(5, 9)], &[(0, 2), (20, 30)]), vec![(5, 9)]);
    }

    fn map_of(runs: &[(u64, u64, u64)]) -> FileMap {
        let mut m = FileMap::default();
        for &(page, block, pages) in runs {
            m.map(page, pages, block, &mut |_, _| panic!("fresh map"));
        }
        m
    }

    /// Applying a plan's pieces in order gives the shifted map.
    fn apply(map: &FileMap, p: &Plan) -> Vec<(u64, u64, u64)> {
        let mut m = map.clone();
        for &(page, block, pages) in &p.pieces {
            m.map(page, pages, block, &mut |_, _| {});
        }
        m.iter().map(|e| (e.page, e.block, e.pages)).collect()
    }

    #[test]
    fn collapse_moves_later_pages_down_and_removes_the_range() {
        // pages 0..4 on blocks 100..104, 6..8 on 200..202
        let m = map_of(&[(0, 100, 4), (6, 200, 2)]);
        let p = plan(&m, 1, 2, true).unwrap();
        assert_eq!(apply(&m, &p), vec![(0, 100, 1), (1, 103, 1), (4, 200, 2)]);
        assert_eq!(
            p.removed,
            vec![Extent {
                page: 1,
                block: 101,
                pages: 2
            }]
        );
    }

    #[test]
    fn insert_moves_later_pages_up_and_leaves_a_hole() {
        let m = map_of(&[(0, 100, 4), (6, 200, 2)]);
        let p = plan(&m, 1, 3, false).unwrap();
        assert_eq!(apply(&m, &p), vec![(0, 100, 1), (4, 101, 3), (9, 200, 2)]);
        assert!(p.removed.is_empty());
    }
}
