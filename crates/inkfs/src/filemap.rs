//! A file's DRAM index (file page → data block), rebuilt from the log's
//! FILE_WRITE entries and never persisted. It is one of two structures,
//! chosen by the file's shape:
//!
//! - an extent tree ([`ExtentTree`]) while extents are long: a few bytes
//!   for a file of any size written sequentially, or a sparse one;
//! - a page table ([`PageTable`]) once copy-on-write has cut a dense file
//!   into short extents (strict mode's random overwrites end at one extent
//!   per page). The tree would then be tens of thousands of entries deep in
//!   cache misses on every read and overwrite; the table is two loads, and
//!   8 bytes per page, as NOVA's radix tree.
//!
//! The switch is by DRAM cost with hysteresis, so a file does not flip back
//! and forth: to the table when its extents average ≤ 8 pages and its
//! leaves would be at least half full; back to the tree when runs average
//! > 32 pages, leaves are under an eighth full, or few runs are left.

use crate::extents::{Extent, ExtentTree, TreeIter};
use crate::pagetable::{PageTable, Runs, LEAF_BYTES, LEAF_PAGES};

/// Below this many extents a tree is shallow and cheap: a file keeps it.
const TABLE_MIN_EXTENTS: u64 = 256;

#[derive(Clone, Debug)]
enum Index {
    Tree(ExtentTree),
    Table(PageTable),
}

#[derive(Clone, Debug)]
pub struct FileMap {
    index: Index,
    /// Extent count at which a tree is next considered for a table (the
    /// check walks the tree, so it is made at doubling counts only).
    next_check: u64,
}

impl Default for FileMap {
    fn default() -> Self {
        FileMap {
            index: Index::Tree(ExtentTree::default()),
            next_check: TABLE_MIN_EXTENTS,
        }
    }
}

/// Which structure indexes a file (statistics and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexKind {
    ExtentTree,
    PageTable,
}

impl FileMap {
    pub fn mapped_pages(&self) -> u64 {
        match &self.index {
            Index::Tree(t) => t.mapped_pages(),
            Index::Table(t) => t.mapped_pages(),
        }
    }

    /// Maximal runs of pages on consecutive blocks (for the tree, its
    /// entries, which adjacent writes may have left unmerged).
    pub fn extent_count(&self) -> usize {
        match &self.index {
            Index::Tree(t) => t.extent_count(),
            Index::Table(t) => t.runs() as usize,
        }
    }

    pub fn index_kind(&self) -> IndexKind {
        match &self.index {
            Index::Tree(_) => IndexKind::ExtentTree,
            Index::Table(_) => IndexKind::PageTable,
        }
    }

    /// An extent containing `page` and starting at or before it, if
    /// `page` is mapped. Not necessarily maximal.
    #[inline]
    pub fn find(&self, page: u64) -> Option<Extent> {
        match &self.index {
            Index::Tree(t) => t.find(page),
            Index::Table(t) => t.find(page),
        }
    }

    /// An extent containing `page`, or else the first one after it.
    pub fn next_from(&self, page: u64) -> Option<Extent> {
        match &self.index {
            Index::Tree(t) => t.next_from(page),
            Index::Table(t) => t.next_from(page),
        }
    }

    /// Non-overlapping extents in page order.
    pub fn iter(&self) -> Iter<'_> {
        match &self.index {
            Index::Tree(t) => Iter::Tree(t.iter()),
            Index::Table(t) => Iter::Table(t.iter()),
        }
    }

    /// Map pages `[page, page + pages)` to blocks starting at `block`, or
    /// unmap them when `block == 0`. Blocks no longer referenced are passed
    /// to `released` (the caller frees them once the change is committed).
    pub fn map(&mut self, page: u64, pages: u64, block: u64, released: &mut impl FnMut(u64, u64)) {
        // A page mapped again to the block it has (a sync- or posix-mode
        // overwrite in place, logged for its size and mtime) keeps that
        // block: the structures below report every displaced mapping, so
        // the new range is cut out of what they report here, once, for
        // every caller. A hole (`block == 0`) keeps nothing.
        let kept = if block == 0 {
            0..0
        } else {
            block..block + pages
        };
        let displaced = &mut |b: u64, n: u64| {
            let (lo, hi) = (b, b + n);
            if lo < kept.start.min(hi) {
                released(lo, kept.start.min(hi) - lo);
            }
            if kept.end.max(lo) < hi {
                released(kept.end.max(lo), hi - kept.end.max(lo));
            }
        };
        // A write far past a table's pages (a sparse tail) would grow its
        // top level by 8 bytes per 2 MiB of distance, up to 256 MiB for
        // the largest file: go back to the tree first.
        if let Index::Table(t) = &self.index {
            if block != 0 && !table_stays_cheap(t, page, pages) {
                self.switch_to_tree();
            }
        }
        match &mut self.index {
            Index::Tree(t) => t.map(page, pages, block, displaced),
            Index::Table(t) => t.map(page, pages, block, displaced),
        }
        self.reconsider();
    }

    /// Unmap every page at or after `from_page` (truncate).
    pub fn truncate(&mut self, from_page: u64, released: &mut impl FnMut(u64, u64)) {
        match &mut self.index {
            Index::Tree(t) => t.truncate(from_page, released),
            Index::Table(t) => t.truncate(from_page, released),
        }
        self.reconsider();
    }

    /// Switch structures when the file's shape has crossed a threshold.
    fn reconsider(&mut self) {
        match &self.index {
            Index::Tree(t) => {
                let extents = t.extent_count() as u64;
                if extents < self.next_check {
                    // Shrunk well below the last check: look again sooner.
                    if extents * 4 < self.next_check {
                        self.next_check = (extents * 2).max(TABLE_MIN_EXTENTS);
                    }
                    return;
                }
                self.next_check = extents * 2;
                if tree_wants_table(t) {
                    self.switch_to_table();
                }
            }
            Index::Table(t) => {
                if table_wants_tree(t) {
                    self.switch_to_tree();
                }
            }
        }
    }

    fn switch_to_table(&mut self) {
        let Index::Tree(t) = &self.index else { return };
        let mut table = PageTable::default();
        for e in t.iter() {
            table.map(e.page, e.pages, e.block, &mut |_, _| {
                unreachable!("a fresh table releases nothing")
            });
        }
        self.index = Index::Table(table);
    }

    fn switch_to_tree(&mut self) {
        let Index::Table(t) = &self.index else { return };
        let mut tree = ExtentTree::default();
        for e in t.iter() {
            tree.map(e.page, e.pages, e.block, &mut |_, _| {
                unreachable!("a fresh tree releases nothing")
            });
        }
        self.next_check = (tree.extent_count() as u64 * 2).max(TABLE_MIN_EXTENTS);
        self.index = Index::Tree(tree);
    }

    /// Whether the structure's own invariants hold (tests, debug checks).
    pub fn check(&self) -> bool {
        match &self.index {
            Index::Tree(t) => t.check(),
            Index::Table(t) => t.check(),
        }
    }
}

/// Short extents, and leaves that would be at least half full (but one).
fn tree_wants_table(t: &ExtentTree) -> bool {
    let extents = t.extent_count() as u64;
    let mapped = t.mapped_pages();
    if extents < TABLE_MIN_EXTENTS || extents * 8 < mapped {
        return false;
    }
    let (mut leaves, mut last_leaf, mut span_leaves) = (0u64, None, 0u64);
    for e in t.iter() {
        let first = e.page / LEAF_PAGES;
        let last = (e.end() - 1) / LEAF_PAGES;
        let from = last_leaf.map_or(first, |l: u64| first.max(l + 1));
        leaves += (last + 1).saturating_sub(from);
        last_leaf = Some(last);
        span_leaves = last + 1;
    }
    // One leaf of slack: a file being rebuilt in page order (recovery's
    // replay of a compacted log) is checked with its last leaf partly
    // filled, and would otherwise stay a tree for a doubling more.
    leaves * LEAF_BYTES + span_leaves * 8 <= mapped * 16 + LEAF_BYTES
}

/// DRAM a table may take per mapped page before the tree is preferred.
const TABLE_BYTES_PER_PAGE_MAX: u64 = 64;

/// Whether mapping `[page, page + pages)` keeps a table within its bound.
fn table_stays_cheap(t: &PageTable, page: u64, pages: u64) -> bool {
    let (top, leaves) = t.shape_after(page, pages);
    leaves * LEAF_BYTES + top * 8 <= (t.mapped_pages() + pages) * TABLE_BYTES_PER_PAGE_MAX
}

/// Long runs again, sparse leaves, or few runs: the tree is the cheaper.
fn table_wants_tree(t: &PageTable) -> bool {
    let (runs, mapped) = (t.runs(), t.mapped_pages());
    runs < TABLE_MIN_EXTENTS / 4
        || runs * 32 < mapped
        || t.bytes() > mapped * TABLE_BYTES_PER_PAGE_MAX
}

pub enum Iter<'a> {
    Tree(TreeIter<'a>),
    Table(Runs<'a>),
}

impl Iterator for Iter<'_> {
    type Item = Extent;
    fn next(&mut self) -> Option<Extent> {
        match self {
            Iter::Tree(i) => i.next(),
            Iter::Table(i) => i.next(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Rng;
    use std::collections::BTreeMap;

    /// Compare a map with a page-by-page model: every lookup, the extents'
    /// coverage, and the released blocks.
    fn agrees(m: &FileMap, model: &BTreeMap<u64, u64>, upto: u64) {
        assert!(m.check());
        assert_eq!(m.mapped_pages(), model.len() as u64);
        for p in 0..upto {
            let got = m.find(p).map(|e| {
                assert!(e.page <= p && p < e.end());
                e.block + (p - e.page)
            });
            assert_eq!(got, model.get(&p).copied(), "page {p}");
            let next = m.next_from(p).map(|e| e.page.max(p));
            assert_eq!(
                next,
                model.range(p..).next().map(|(&q, _)| q),
                "next from {p}"
            );
        }
        let listed: Vec<(u64, u64)> = m
            .iter()
            .flat_map(|e| (0..e.pages).map(move |i| (e.page + i, e.block + i)))
            .collect();
        let want: Vec<(u64, u64)> = model.iter().map(|(&p, &b)| (p, b)).collect();
        assert_eq!(listed, want);
    }

    /// Random map/unmap/truncate over a file large enough to go through
    /// both structures, against a model; both conversions must happen.
    #[test]
    fn matches_a_page_model_through_both_structures() {
        let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
        let (mut to_table, mut to_tree) = (0, 0);
        for round in 0..6 {
            let span = 1500 + 500 * round;
            let mut m = FileMap::default();
            let mut model: BTreeMap<u64, u64> = BTreeMap::new();
            let mut next_block = 1_000_000;
            // Laid out sequentially first, as fio and most files are.
            m.map(0, span, next_block, &mut |_, _| {
                panic!("nothing to release")
            });
            for p in 0..span {
                model.insert(p, next_block + p);
            }
            next_block += span;
            let mut kind = m.index_kind();
            for step in 0..6000u64 {
                let mut released = Vec::new();
                let mut gone = Vec::new();
                // Mostly one-page overwrites (fragments); at times long
                // rewrites, holes and truncates (defragment, thin out).
                match rng.below(100) {
                    0 => {
                        let page = span / 2 + rng.below(span / 2);
                        m.truncate(page, &mut |b, n| released.push((b, n)));
                        gone.extend(model.range(page..).map(|(_, &b)| b));
                        model.retain(|&p, _| p < page);
                    }
                    1..=3 => {
                        let page = rng.below(span);
                        let pages = 1 + rng.below(64);
                        m.map(page, pages, 0, &mut |b, n| released.push((b, n)));
                        for p in page..page + pages {
                            gone.extend(model.remove(&p));
                        }
                    }
                    4..=5 => {
                        let page = rng.below(span);
                        let pages = 1 + rng.below(span / 2);
                        m.map(page, pages, next_block, &mut |b, n| released.push((b, n)));
                        for i in 0..pages {
                            gone.extend(model.insert(page + i, next_block + i));
                        }
                        next_block += pages;
                    }
                    _ => {
                        let page = rng.below(span);
                        m.map(page, 1, next_block, &mut |b, n| released.push((b, n)));
                        gone.extend(model.insert(page, next_block));
                        next_block += 1 + rng.below(2);
                    }
                }
                let mut freed: Vec<u64> = released.iter().flat_map(|&(b, n)| b..b + n).collect();
                freed.sort_unstable();
                gone.sort_unstable();
                assert_eq!(freed, gone, "round {round} step {step}");
                if m.index_kind() != kind {
                    match m.index_kind() {
                        IndexKind::PageTable => to_table += 1,
                        IndexKind::ExtentTree => to_tree += 1,
                    }
                    kind = m.index_kind();
                    agrees(&m, &model, span + 10);
                }
                if step % 500 == 0 {
                    agrees(&m, &model, span + 10);
                }
            }
            agrees(&m, &model, span + 10);
        }
        assert!(
            to_table > 0 && to_tree > 0,
            "{to_table} → table, {to_tree} → tree"
        );
    }

    /// The shape strict mode's random overwrites give a dense file: it ends
    /// in the page table, and a sequential rewrite brings back the tree.
    #[test]
    fn fragmented_dense_file_uses_the_table_and_rewrite_restores_the_tree() {
        let pages = 4096;
        let mut m = FileMap::default();
        m.map(0, pages, 1000, &mut |_, _| {});
        assert_eq!(m.index_kind(), IndexKind::ExtentTree);
        let mut rng = Rng::new(7);
        let mut block = 100_000;
        for _ in 0..pages {
            m.map(rng.below(pages), 1, block, &mut |_, _| {});
            block += 2;
        }
        assert_eq!(m.index_kind(), IndexKind::PageTable);
        m.map(0, pages, 1_000_000, &mut |_, _| {});
        assert_eq!(m.index_kind(), IndexKind::ExtentTree);
        assert_eq!(m.extent_count(), 1);
    }

    /// A sparse file whose every extent is one page stays a tree: a table
    /// would spend a 4 KiB leaf on each.
    #[test]
    fn sparse_file_keeps_the_tree() {
        let mut m = FileMap::default();
        for i in 0..5000 {
            m.map(i * 1024, 1, 10 + 2 * i, &mut |_, _| {});
        }
        assert_eq!(m.index_kind(), IndexKind::ExtentTree);
        assert_eq!(m.extent_count(), 5000);
    }

    /// `pages` pages, each its own extent (blocks two apart): a table.
    fn one_page_extents(pages: u64) -> FileMap {
        let mut m = FileMap::default();
        for p in 0..pages {
            m.map(p, 1, 10 + 2 * p, &mut |_, _| {});
        }
        assert_eq!(m.index_kind(), IndexKind::PageTable);
        m
    }

    /// A page written far past a table's pages moves the file back to the
    /// tree before the table's top level grows to span it.
    #[test]
    fn a_far_write_does_not_grow_the_table() {
        let mut m = one_page_extents(2048);
        let far = (crate::format::MAX_FILE_BYTES / 4096) - 1;
        m.map(far, 1, 99_999, &mut |_, _| panic!("nothing displaced"));
        assert_eq!(m.index_kind(), IndexKind::ExtentTree);
        assert_eq!(m.find(far).map(|e| e.block), Some(99_999));
        assert_eq!(m.find(7).map(|e| e.block), Some(24));
        assert_eq!(m.mapped_pages(), 2049);
    }

    #[test]
    fn truncate_to_zero_empties_a_table() {
        let mut m = one_page_extents(2048);
        let mut freed = 0;
        m.truncate(0, &mut |_, n| freed += n);
        assert_eq!(freed, 2048);
        assert_eq!(m.mapped_pages(), 0);
        assert_eq!(m.index_kind(), IndexKind::ExtentTree);
        assert!(m.iter().next().is_none());
    }

    /// `released` gets exactly the blocks no longer mapped, in both
    /// structures: none for a page mapped again to its own block (an
    /// in-place overwrite's entry), every one for a hole, whatever the
    /// block numbers (a hole over more pages than a block's number once
    /// kept that block from being freed: issue 17).
    #[test]
    fn released_blocks_are_exactly_the_unmapped_ones() {
        for table in [false, true] {
            let mut m = one_page_extents(300);
            if !table {
                m.switch_to_tree();
            }
            let released = |m: &mut FileMap, page, pages, block| {
                if table {
                    m.switch_to_table();
                }
                let mut got = Vec::new();
                m.map(page, pages, block, &mut |b, n| got.extend(b..b + n));
                got.sort_unstable();
                got
            };
            // Page p is at block 10 + 2p. In place: nothing.
            assert_eq!(
                released(&mut m, 5, 1, 20),
                Vec::<u64>::new(),
                "table {table}"
            );
            // Copy on write: the old block.
            assert_eq!(released(&mut m, 6, 1, 5000), vec![22], "table {table}");
            // A hole of 300 pages over blocks numbered 10..608: all of them.
            let mut want: Vec<u64> = (0..300).map(|p| 10 + 2 * p).filter(|&b| b != 22).collect();
            want.push(5000);
            want.sort_unstable();
            assert_eq!(released(&mut m, 0, 300, 0), want, "table {table}");
            assert_eq!(m.mapped_pages(), 0);
        }
        // A run mapped again to its own blocks, inside a longer extent.
        let mut m = FileMap::default();
        m.map(0, 64, 100, &mut |_, _| {});
        m.map(10, 20, 110, &mut |b, n| panic!("released {b}+{n}"));
        assert_eq!(m.find(15).map(|e| e.block + (15 - e.page)), Some(115));
    }

    /// A hole entry of 2^20 pages over a table: only the leaves that exist
    /// are visited (across empty leaves and past the last one), and the
    /// counters, runs and released blocks are those of a page-by-page
    /// unmap.
    #[test]
    fn a_long_hole_over_a_table_unmaps_leaf_by_leaf() {
        let mut m = one_page_extents(2048);
        let mut model: BTreeMap<u64, u64> = (0..2048).map(|p| (p, 10 + 2 * p)).collect();
        // Leaf 1 gone, a run of linked pages inside leaf 3.
        m.map(512, 512, 0, &mut |_, _| {});
        m.map(1600, 8, 90_000, &mut |_, _| {});
        for p in 512..1024 {
            model.remove(&p);
        }
        for i in 0..8 {
            model.insert(1600 + i, 90_000 + i);
        }
        m.switch_to_table();
        assert_eq!(m.index_kind(), IndexKind::PageTable);
        let mut freed: Vec<u64> = Vec::new();
        m.map(700, 1 << 20, 0, &mut |b, n| freed.extend(b..b + n));
        freed.sort_unstable();
        let mut gone: Vec<u64> = model.range(700..).map(|(_, &b)| b).collect();
        gone.sort_unstable();
        model.retain(|&p, _| p < 700);
        assert_eq!(freed, gone);
        agrees(&m, &model, 2100);
        m.map(0, 1 << 20, 0, &mut |_, _| {});
        assert_eq!(m.mapped_pages(), 0);
        assert!(m.iter().next().is_none());
    }
}
