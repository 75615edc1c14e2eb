//! A file's DRAM index as an extent tree: file page → data block extents.
//! The index of most files (see [`crate::filemap`]). Rebuilt from the
//! log's FILE_WRITE entries; never persisted.

use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub page: u64,
    pub block: u64,
    pub pages: u64,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.page + self.pages
    }
}

#[derive(Clone, Debug, Default)]
pub struct ExtentTree {
    /// first page → (first block, page count); extents never overlap.
    map: BTreeMap<u64, (u64, u64)>,
    mapped_pages: u64,
}

impl ExtentTree {
    pub fn mapped_pages(&self) -> u64 {
        self.mapped_pages
    }
    pub fn extent_count(&self) -> usize {
        self.map.len()
    }

    /// The extent containing `page`, if any.
    pub fn find(&self, page: u64) -> Option<Extent> {
        let (&start, &(block, pages)) = self.map.range(..=page).next_back()?;
        (page < start + pages).then_some(Extent {
            page: start,
            block,
            pages,
        })
    }

    /// First extent that contains `page` or starts after it.
    pub fn next_from(&self, page: u64) -> Option<Extent> {
        if let Some(e) = self.find(page) {
            return Some(e);
        }
        self.map.range(page..).next().map(|(&p, &(b, n))| Extent {
            page: p,
            block: b,
            pages: n,
        })
    }

    pub fn iter(&self) -> TreeIter<'_> {
        TreeIter(self.map.iter())
    }

    /// Map pages `[page, page + pages)` to blocks starting at `block`, or
    /// unmap them when `block == 0`. Blocks no longer referenced are passed
    /// to `released` (the caller frees them once the change is committed).
    pub fn map(&mut self, page: u64, pages: u64, block: u64, released: &mut impl FnMut(u64, u64)) {
        debug_assert!(pages > 0);
        if block != 0 && self.remap_whole_extent(page, pages, block, released) {
            return;
        }
        let end = page + pages;
        // Appending past every extent (the common case) displaces nothing.
        let past_all = self
            .map
            .last_key_value()
            .is_none_or(|(&p, &(_, n))| p + n <= page);
        if !past_all {
            self.unmap_range(page, end, released);
        }
        if block != 0 {
            self.insert_merging(page, block, pages);
        }
        debug_assert!(self.check());
    }

    /// Unmap every page at or after `from_page` (truncate).
    /// Fast path of [`map`](Self::map) for the common copy-on-write
    /// overwrite: `[page, page + pages)` is exactly one existing extent, so
    /// only its block changes (one tree walk instead of a remove and two
    /// inserts). It does not merge with the neighbours: merged extents are
    /// an economy of memory, not an invariant anything relies on.
    fn remap_whole_extent(
        &mut self,
        page: u64,
        pages: u64,
        block: u64,
        released: &mut impl FnMut(u64, u64),
    ) -> bool {
        match self.map.range_mut(..=page).next_back() {
            Some((&p, v)) if p == page && v.1 == pages => {
                let old = std::mem::replace(&mut v.0, block);
                released(old, pages);
                true
            }
            _ => false,
        }
    }

    pub fn truncate(&mut self, from_page: u64, released: &mut impl FnMut(u64, u64)) {
        self.unmap_range(from_page, u64::MAX, released);
    }

    fn unmap_range(&mut self, page: u64, end: u64, released: &mut impl FnMut(u64, u64)) {
        let first = self.find(page);
        if let Some(e) = first.filter(|e| end <= e.end()) {
            // The range lies inside one extent (a page overwritten in the
            // middle of a file): cut it out without scanning.
            self.cut_inside(e, page, end, released);
            return;
        }
        let mut overlapping = Vec::new();
        if let Some(e) = first {
            overlapping.push(e);
        }
        for (&p, &(b, n)) in self.map.range(page..end) {
            if overlapping.first().is_none_or(|e| e.page != p) {
                overlapping.push(Extent {
                    page: p,
                    block: b,
                    pages: n,
                });
            }
        }
        for e in overlapping {
            self.map.remove(&e.page);
            self.mapped_pages -= e.pages;
            let cut_start = e.page.max(page);
            let cut_end = e.end().min(end);
            released(e.block + (cut_start - e.page), cut_end - cut_start);
            if e.page < cut_start {
                self.insert_raw(e.page, e.block, cut_start - e.page);
            }
            if cut_end < e.end() {
                self.insert_raw(cut_end, e.block + (cut_end - e.page), e.end() - cut_end);
            }
        }
    }

    /// Unmap `[page, end)`, which lies inside extent `e`: shorten `e` in
    /// place to the part before, re-insert the part after.
    fn cut_inside(&mut self, e: Extent, page: u64, end: u64, released: &mut impl FnMut(u64, u64)) {
        debug_assert!(e.page <= page && end <= e.end() && page < end);
        released(e.block + (page - e.page), end - page);
        self.mapped_pages -= end - page;
        if e.page < page {
            if let Some(v) = self.map.get_mut(&e.page) {
                v.1 = page - e.page;
            }
        } else {
            self.map.remove(&e.page);
        }
        if end < e.end() {
            self.map
                .insert(end, (e.block + (end - e.page), e.end() - end));
        }
    }

    fn insert_raw(&mut self, page: u64, block: u64, pages: u64) {
        self.map.insert(page, (block, pages));
        self.mapped_pages += pages;
    }

    fn insert_merging(&mut self, page: u64, block: u64, pages: u64) {
        // Appends usually continue the previous extent: grow it in place.
        if let Some((&p, &mut (b, ref mut n))) = self.map.range_mut(..page).next_back() {
            if p + *n == page && b + *n == block {
                *n += pages;
                self.mapped_pages += pages;
                let merged_end = p + *n;
                if let Some(&(nb, nn)) = self.map.get(&merged_end) {
                    if b + (merged_end - p) == nb {
                        self.map.remove(&merged_end);
                        if let Some(v) = self.map.get_mut(&p) {
                            v.1 += nn;
                        }
                    }
                }
                return;
            }
        }
        let mut pages = pages;
        if let Some(&(b, n)) = self.map.get(&(page + pages)) {
            if block + pages == b {
                self.map.remove(&(page + pages));
                self.mapped_pages -= n;
                pages += n;
            }
        }
        self.insert_raw(page, block, pages);
    }

    pub fn check(&self) -> bool {
        let mut prev_end = 0;
        let mut total = 0;
        for (&p, &(_, n)) in &self.map {
            if p < prev_end || n == 0 {
                return false;
            }
            prev_end = p + n;
            total += n;
        }
        total == self.mapped_pages
    }
}

/// Iterator over an [`ExtentTree`]'s extents, in page order.
pub struct TreeIter<'a>(std::collections::btree_map::Iter<'a, u64, (u64, u64)>);

impl Iterator for TreeIter<'_> {
    type Item = Extent;
    fn next(&mut self) -> Option<Extent> {
        self.0
            .next()
            .map(|(&page, &(block, pages))| Extent { page, block, pages })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(m: &ExtentTree) -> Vec<(u64, u64, u64)> {
        m.iter().map(|e| (e.page, e.block, e.pages)).collect()
    }

    #[test]
    fn overwrite_splits_and_releases() {
        let mut m = ExtentTree::default();
        let mut rel = Vec::new();
        m.map(0, 10, 100, &mut |b, n| rel.push((b, n)));
        m.map(3, 2, 500, &mut |b, n| rel.push((b, n)));
        assert_eq!(collect(&m), vec![(0, 100, 3), (3, 500, 2), (5, 105, 5)]);
        assert_eq!(rel, vec![(103, 2)]);
        assert_eq!(m.mapped_pages(), 10);
        rel.clear();
        m.truncate(4, &mut |b, n| rel.push((b, n)));
        assert_eq!(collect(&m), vec![(0, 100, 3), (3, 500, 1)]);
        assert_eq!(rel, vec![(501, 1), (105, 5)]);
    }

    /// ExtentTree against a page-by-page model over random map/unmap/truncate.
    #[test]
    fn matches_a_page_model() {
        use std::collections::BTreeMap;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _round in 0..50 {
            let mut m = ExtentTree::default();
            let mut model: BTreeMap<u64, u64> = BTreeMap::new();
            let mut next_block = 1000;
            for _ in 0..200 {
                let page = rnd(64);
                let pages = 1 + rnd(8);
                let mut released = Vec::new();
                match rnd(10) {
                    0 => {
                        m.truncate(page, &mut |b, n| released.push((b, n)));
                        let gone: Vec<u64> = model.range(page..).map(|(&p, _)| p).collect();
                        let mut want: Vec<u64> = gone.iter().map(|p| model[p]).collect();
                        for p in gone {
                            model.remove(&p);
                        }
                        let mut got: Vec<u64> =
                            released.iter().flat_map(|&(b, n)| b..b + n).collect();
                        got.sort();
                        want.sort();
                        assert_eq!(got, want);
                    }
                    1 | 2 => {
                        m.map(page, pages, 0, &mut |b, n| released.push((b, n)));
                        for p in page..page + pages {
                            model.remove(&p);
                        }
                    }
                    _ => {
                        // Sometimes continue the previous block run (merges).
                        let block = if rnd(2) == 0 {
                            next_block
                        } else {
                            next_block + 100
                        };
                        m.map(page, pages, block, &mut |b, n| released.push((b, n)));
                        for (i, p) in (page..page + pages).enumerate() {
                            model.insert(p, block + i as u64);
                        }
                        next_block = block + pages;
                    }
                }
                assert!(m.check());
                assert_eq!(m.mapped_pages(), model.len() as u64);
                for p in 0..80 {
                    let got = m.find(p).map(|e| e.block + (p - e.page));
                    assert_eq!(got, model.get(&p).copied(), "page {p}");
                }
            }
        }
    }

    #[test]
    fn adjacent_contiguous_extents_merge() {
        let mut m = ExtentTree::default();
        m.map(0, 2, 10, &mut |_, _| {});
        m.map(2, 2, 12, &mut |_, _| {});
        assert_eq!(collect(&m), vec![(0, 10, 4)]);
        m.map(1, 1, 0, &mut |_, _| {});
        assert_eq!(collect(&m), vec![(0, 10, 1), (2, 12, 2)]);
        assert!(m.find(1).is_none());
        assert_eq!(m.next_from(1).map(|e| e.page), Some(2));
    }
}
