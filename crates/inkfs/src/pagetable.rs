//! A file's DRAM index as a two-level page table: file page → data block,
//! one slot per page (NOVA keeps a radix tree of pages the same way).
//!
//! It is the index for files that copy-on-write has cut into one-page
//! extents, where an extent tree is ~65,000 nodes deep in cache misses for
//! a 256 MiB file. Here a lookup is two dependent loads, and an overwrite
//! changes one slot. [`crate::filemap`] decides when a file uses it.

use crate::extents::Extent;

/// Pages per leaf: a leaf is one 4 KiB array of block numbers.
pub const LEAF_PAGES: u64 = 512;
const LEAF_SHIFT: u32 = LEAF_PAGES.trailing_zeros();
const _: () = assert!(LEAF_PAGES.is_power_of_two());

/// A lookup extends the run it returns over at most this many pages: reads
/// want a run, not the whole file's worth of contiguity.
const FIND_RUN_PAGES_MAX: u64 = 256;

#[derive(Clone, Debug)]
struct Leaf {
    /// Block of each page; 0 is a hole (block 0 is the superblock, never
    /// file data).
    blocks: [u64; LEAF_PAGES as usize],
    mapped: u32,
}

/// Bytes of DRAM one leaf takes.
pub const LEAF_BYTES: u64 = std::mem::size_of::<Leaf>() as u64;

#[derive(Clone, Debug, Default)]
pub struct PageTable {
    /// Indexed by `page >> LEAF_SHIFT`; `None` where no page is mapped.
    leaves: Vec<Option<Box<Leaf>>>,
    mapped_pages: u64,
    /// Pairs of neighbouring pages mapped to neighbouring blocks; the
    /// extent count is `mapped_pages - links`.
    links: u64,
    leaves_used: u64,
}

impl PageTable {
    pub fn mapped_pages(&self) -> u64 {
        self.mapped_pages
    }

    /// Maximal runs of contiguous pages on contiguous blocks.
    pub fn runs(&self) -> u64 {
        self.mapped_pages - self.links
    }

    /// DRAM this table takes (leaves and the top level).
    pub fn bytes(&self) -> u64 {
        self.leaves_used * LEAF_BYTES + self.leaves.len() as u64 * 8
    }

    /// The table's size if `[page, page + pages)` were mapped: top-level
    /// slots, and leaves at most (every leaf the range touches new).
    pub fn shape_after(&self, page: u64, pages: u64) -> (u64, u64) {
        let last_leaf = (page + pages - 1) >> LEAF_SHIFT;
        let top = (self.leaves.len() as u64).max(last_leaf + 1);
        let touched = last_leaf - (page >> LEAF_SHIFT) + 1;
        (top, self.leaves_used + touched)
    }

    fn get(&self, page: u64) -> u64 {
        match self.leaves.get((page >> LEAF_SHIFT) as usize) {
            Some(Some(leaf)) => leaf.blocks[(page & (LEAF_PAGES - 1)) as usize],
            _ => 0,
        }
    }

    /// Whether `page` and `page + 1` are mapped to consecutive blocks.
    fn linked(&self, page: u64) -> bool {
        let b = self.get(page);
        b != 0 && self.get(page + 1) == b + 1
    }

    /// The run of pages from `page` on consecutive blocks (at most
    /// `FIND_RUN_PAGES_MAX` long), if `page` is mapped.
    pub fn find(&self, page: u64) -> Option<Extent> {
        let block = self.get(page);
        if block == 0 {
            return None;
        }
        let mut pages = 1;
        while pages < FIND_RUN_PAGES_MAX && self.get(page + pages) == block + pages {
            pages += 1;
        }
        Some(Extent { page, block, pages })
    }

    /// The run containing `page`, or the first one after it.
    pub fn next_from(&self, page: u64) -> Option<Extent> {
        let mut leaf_no = page >> LEAF_SHIFT;
        let mut slot = page & (LEAF_PAGES - 1);
        while let Some(l) = self.leaves.get(leaf_no as usize) {
            if let Some(leaf) = l {
                if let Some(i) = (slot..LEAF_PAGES).find(|&i| leaf.blocks[i as usize] != 0) {
                    return self.find((leaf_no << LEAF_SHIFT) + i);
                }
            }
            leaf_no += 1;
            slot = 0;
        }
        None
    }

    /// Maximal runs in page order.
    pub fn iter(&self) -> Runs<'_> {
        Runs {
            table: self,
            page: 0,
        }
    }

    /// Map `[page, page + pages)` to blocks from `block`, or unmap it when
    /// `block == 0`; blocks no longer referenced go to `released`, in runs.
    pub fn map(&mut self, page: u64, pages: u64, block: u64, released: &mut impl FnMut(u64, u64)) {
        debug_assert!(pages > 0);
        if block == 0 {
            self.unmap(page, pages, released);
        } else {
            self.map_slots(page, pages, block, released);
        }
    }

    /// Unmap `[page, page + pages)` leaf by leaf, visiting only leaves that
    /// exist: a hole entry may span up to 2^20 pages (a punch far past the
    /// end of file, replayed at every log load), and walking those slots
    /// one by one took seconds for a punch of a few TiB.
    fn unmap(&mut self, page: u64, pages: u64, released: &mut impl FnMut(u64, u64)) {
        let end = page
            .saturating_add(pages)
            .min((self.leaves.len() as u64) << LEAF_SHIFT);
        let mut at = page;
        while at < end {
            let leaf_no = at >> LEAF_SHIFT;
            let chunk_end = ((leaf_no + 1) << LEAF_SHIFT).min(end);
            // (Emptying a leaf may drop it and the empty ones after it.)
            if matches!(self.leaves.get(leaf_no as usize), Some(Some(_))) {
                self.map_slots(at, chunk_end - at, 0, released);
            }
            at = chunk_end;
        }
    }

    /// Set every slot of `[page, page + pages)`, keeping the counters.
    fn map_slots(
        &mut self,
        page: u64,
        pages: u64,
        block: u64,
        released: &mut impl FnMut(u64, u64),
    ) {
        let mut freed = Coalesce::default();
        self.unlink_around(page, pages);
        for i in 0..pages {
            let new = if block == 0 { 0 } else { block + i };
            let old = self.set(page + i, new);
            freed.push(old, released);
        }
        self.link_around(page, pages);
        freed.flush(released);
        debug_assert!(self.check());
    }

    /// Unmap every page at or after `from_page`.
    pub fn truncate(&mut self, from_page: u64, released: &mut impl FnMut(u64, u64)) {
        let end = (self.leaves.len() as u64) << LEAF_SHIFT;
        if from_page >= end {
            return;
        }
        // Page by page within the first leaf; whole leaves after it.
        let first_whole = from_page.next_multiple_of(LEAF_PAGES).min(end);
        if from_page < first_whole {
            self.map(from_page, first_whole - from_page, 0, released);
        }
        let mut freed = Coalesce::default();
        // The page before the first whole leaf may link into it.
        let mut prev = first_whole.checked_sub(1).map_or(0, |p| self.get(p));
        // (Emptying the first leaf may have dropped it and those after.)
        let from_leaf = ((first_whole >> LEAF_SHIFT) as usize).min(self.leaves.len());
        for l in self.leaves.drain(from_leaf..) {
            let Some(leaf) = l else {
                prev = 0;
                continue;
            };
            self.leaves_used -= 1;
            self.mapped_pages -= leaf.mapped as u64;
            for &b in leaf.blocks.iter() {
                if b != 0 && prev != 0 && b == prev + 1 {
                    self.links -= 1;
                }
                prev = b;
                freed.push(b, released);
            }
        }
        freed.flush(released);
        while matches!(self.leaves.last(), Some(None)) {
            self.leaves.pop();
        }
        debug_assert!(self.check());
    }

    /// Drop the links `[page - 1, page + pages)` make, before they change.
    fn unlink_around(&mut self, page: u64, pages: u64) {
        for p in page.saturating_sub(1)..page + pages {
            if self.linked(p) {
                self.links -= 1;
            }
        }
    }

    fn link_around(&mut self, page: u64, pages: u64) {
        for p in page.saturating_sub(1)..page + pages {
            if self.linked(p) {
                self.links += 1;
            }
        }
    }

    /// Set one slot; returns the block it held. Leaves come and go with
    /// their first and last mapped page.
    fn set(&mut self, page: u64, block: u64) -> u64 {
        let leaf_no = (page >> LEAF_SHIFT) as usize;
        let slot = (page & (LEAF_PAGES - 1)) as usize;
        if leaf_no >= self.leaves.len() {
            if block == 0 {
                return 0;
            }
            self.leaves.resize_with(leaf_no + 1, || None);
        }
        let entry = &mut self.leaves[leaf_no];
        if entry.is_none() {
            if block == 0 {
                return 0;
            }
            *entry = Some(Box::new(Leaf {
                blocks: [0; LEAF_PAGES as usize],
                mapped: 0,
            }));
            self.leaves_used += 1;
        }
        let Some(leaf) = entry.as_mut() else {
            unreachable!("the leaf was just made");
        };
        let old = std::mem::replace(&mut leaf.blocks[slot], block);
        match (old != 0, block != 0) {
            (false, true) => {
                leaf.mapped += 1;
                self.mapped_pages += 1;
            }
            (true, false) => {
                leaf.mapped -= 1;
                self.mapped_pages -= 1;
                if leaf.mapped == 0 {
                    *entry = None;
                    self.leaves_used -= 1;
                    if leaf_no + 1 == self.leaves.len() {
                        while matches!(self.leaves.last(), Some(None)) {
                            self.leaves.pop();
                        }
                    }
                }
            }
            _ => {}
        }
        old
    }

    /// Whether the counters agree with the slots (debug builds check it
    /// after every change).
    pub fn check(&self) -> bool {
        let (mut mapped, mut links, mut used) = (0, 0, 0);
        let mut prev = 0u64;
        for l in &self.leaves {
            let Some(leaf) = l else {
                prev = 0;
                continue;
            };
            used += 1;
            let here = leaf.blocks.iter().filter(|&&b| b != 0).count() as u64;
            if here != leaf.mapped as u64 || here == 0 {
                return false;
            }
            mapped += here;
            for &b in leaf.blocks.iter() {
                if b != 0 && prev != 0 && b == prev + 1 {
                    links += 1;
                }
                prev = b;
            }
        }
        mapped == self.mapped_pages
            && links == self.links
            && used == self.leaves_used
            && !matches!(self.leaves.last(), Some(None))
    }
}

/// Iterator over a [`PageTable`]'s maximal runs.
pub struct Runs<'a> {
    table: &'a PageTable,
    page: u64,
}

impl Iterator for Runs<'_> {
    type Item = Extent;
    fn next(&mut self) -> Option<Extent> {
        let first = self.table.next_from(self.page)?;
        let mut e = first;
        // `find` stops runs at FIND_RUN_PAGES_MAX; iteration wants them whole.
        while let Some(more) = self
            .table
            .find(e.end())
            .filter(|m| m.block == e.block + e.pages)
        {
            e.pages += more.pages;
        }
        self.page = e.end();
        Some(e)
    }
}

/// Gathers released blocks into runs, so a range's release is one call per
/// run of consecutive blocks.
#[derive(Default)]
struct Coalesce {
    start: u64,
    len: u64,
}

impl Coalesce {
    fn push(&mut self, block: u64, released: &mut impl FnMut(u64, u64)) {
        if block == 0 {
            return;
        }
        if self.len > 0 && self.start + self.len == block {
            self.len += 1;
            return;
        }
        self.flush(released);
        self.start = block;
        self.len = 1;
    }

    fn flush(&mut self, released: &mut impl FnMut(u64, u64)) {
        if self.len > 0 {
            released(self.start, self.len);
            self.len = 0;
        }
    }
}
