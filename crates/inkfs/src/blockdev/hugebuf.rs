//! Read buffers on transparent huge pages, for readahead's device reads.
//!
//! Why: on this project's VM (a virtio disk) an O_DIRECT read costs by the
//! memory segments of its buffer, not by its bytes: a 1 MiB read into
//! ordinary 4 KiB pages (256 segments, split in two by the disk's 254
//! segment limit) reads at ~1.0-1.2 GB/s at any queue depth, the same read
//! into one 2 MiB huge page at 2.7-3.3 GB/s even one at a time
//! (bench/results-notes/hybrid.md, "cold read"). ext4 on a loop device
//! gets the latter for free: its loop device reads into the page cache's
//! large folios. A readahead thread reads into one of these buffers, then
//! copies into the cache.
//!
//! A buffer is a private anonymous mapping of whole, aligned 2 MiB pages
//! with `MADV_HUGEPAGE` (transparent huge pages in `madvise` mode are
//! then used; the reserved hugetlbfs pool is left alone), touched once at
//! creation so no read faults it in. Where the mapping or the advice
//! fails, or the kernel has no huge page to give, the buffer is ordinary
//! pages: slower reads, the same bytes.

use super::dev::{self, Page};
use crate::format::BLOCK_SIZE;

/// A transparent huge page.
pub const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Blocks one huge page holds.
pub const HUGE_PAGE_BLOCKS: usize = HUGE_PAGE_BYTES / BLOCK_SIZE as usize;

enum Backing {
    /// A mapping of `len` bytes at `base`, 2 MiB-aligned, owned.
    Map { base: *mut Page, len: usize },
    /// The fallback: ordinary pages.
    Heap(Vec<Page>),
}

/// See the module documentation.
pub struct HugeBuf {
    backing: Backing,
    pages: usize,
}

// SAFETY: the mapping is owned by this buffer alone (never aliased, freed
// once in Drop), as a Vec's heap memory is: moving it to another thread
// is as sound as moving a Vec<Page>.
unsafe impl Send for HugeBuf {}

impl HugeBuf {
    /// A buffer of `pages` blocks, on huge pages where the kernel gives
    /// them.
    pub fn new(pages: usize) -> HugeBuf {
        let backing = map(pages).unwrap_or_else(|| Backing::Heap(dev::pages(pages)));
        HugeBuf { backing, pages }
    }

    /// Whether the buffer is a huge-page-aligned mapping (the kernel may
    /// still have backed it with small pages: see `AnonHugePages` in
    /// /proc/self/smaps).
    pub fn is_mapped(&self) -> bool {
        matches!(self.backing, Backing::Map { .. })
    }

    pub fn pages(&self) -> &[Page] {
        match &self.backing {
            // SAFETY: `base` is a live mapping of at least `pages` pages,
            // aligned for `Page`, initialised (zeroed by the kernel and
            // touched at creation), and borrowed through `self`.
            Backing::Map { base, .. } => unsafe { std::slice::from_raw_parts(*base, self.pages) },
            Backing::Heap(v) => v,
        }
    }

    pub fn pages_mut(&mut self) -> &mut [Page] {
        match &mut self.backing {
            // SAFETY: as `pages`, borrowed mutably through `self`.
            Backing::Map { base, .. } => unsafe { std::slice::from_raw_parts_mut(*base, self.pages) },
            Backing::Heap(v) => v,
        }
    }
}

impl Drop for HugeBuf {
    fn drop(&mut self) {
        if let Backing::Map { base, len } = self.backing {
            // SAFETY: the mapping was made by `map` with this base and
            // length and is unmapped once, here; no borrow outlives self.
            unsafe { libc::munmap(base.cast(), len) };
        }
    }
}

/// A 2 MiB-aligned anonymous mapping of `pages` blocks rounded up to
/// whole huge pages, advised and touched; None if mmap fails.
fn map(pages: usize) -> Option<Backing> {
    let want = pages.checked_mul(BLOCK_SIZE as usize)?;
    if want == 0 {
        return None;
    }
    let len = want.div_ceil(HUGE_PAGE_BYTES).checked_mul(HUGE_PAGE_BYTES)?;
    // Over-map by one huge page, then trim to an aligned start.
    let over = len.checked_add(HUGE_PAGE_BYTES)?;
    // SAFETY: a new private anonymous mapping; no existing memory is
    // touched.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            over,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    let start = raw as usize;
    let aligned = start.next_multiple_of(HUGE_PAGE_BYTES);
    let head = aligned - start;
    let tail = over - head - len;
    // SAFETY: both ranges lie inside the mapping just made and outside
    // the aligned part kept; unmapping them frees nothing else.
    unsafe {
        if head > 0 {
            libc::munmap(raw, head);
        }
        if tail > 0 {
            libc::munmap((aligned + len) as *mut libc::c_void, tail);
        }
    }
    let base = aligned as *mut libc::c_void;
    // SAFETY: advice on the aligned mapping this function owns; a refusal
    // (no THP in this kernel) leaves ordinary pages, which is fine.
    unsafe { libc::madvise(base, len, libc::MADV_HUGEPAGE) };
    // Fault it in now, one store per huge page (each fault maps a whole
    // huge page, or 4 KiB where none was given: then the reads fault the
    // rest, once).
    for off in (0..len).step_by(HUGE_PAGE_BYTES) {
        // SAFETY: inside the writable mapping.
        unsafe { std::ptr::write_volatile((aligned + off) as *mut u8, 0) };
    }
    debug_assert!(aligned.is_multiple_of(HUGE_PAGE_BYTES));
    Some(Backing::Map {
        base: base.cast(),
        len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_aligned_whole_and_writable() {
        for pages in [1, HUGE_PAGE_BLOCKS, HUGE_PAGE_BLOCKS + 1] {
            let mut b = HugeBuf::new(pages);
            assert!(b.is_mapped(), "mmap of {pages} pages failed");
            assert_eq!(b.pages().len(), pages);
            let at = b.pages().as_ptr() as usize;
            assert!(at.is_multiple_of(HUGE_PAGE_BYTES), "{at:#x}");
            assert!(b.pages().iter().all(|p| p.0.iter().all(|&x| x == 0)));
            for (i, p) in b.pages_mut().iter_mut().enumerate() {
                p.0.fill(i as u8);
            }
            assert!(b.pages().iter().enumerate().all(|(i, p)| p.0.iter().all(|&x| x == i as u8)));
        }
    }
}
