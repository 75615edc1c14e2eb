//! Bounce buffers for device reads that bypass the DRAM cache: a data
//! device opened with O_DIRECT reads only into page-aligned memory, and a
//! caller's buffer (a FUSE reply, a program's `read` under the preload
//! library) rarely is. A few buffers are made once per engine, each on
//! first use, and lent out for one read at a time: no allocation on the
//! read path.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::dev::{self, Page};

/// See the module documentation.
pub struct BouncePool {
    bufs: Box<[Mutex<Vec<Page>>]>,
    pages: usize,
    /// Where the next borrower starts looking (spreads threads out).
    next: AtomicUsize,
}

impl BouncePool {
    /// `count` buffers of `pages` pages each (none allocated yet).
    pub fn new(count: usize, pages: usize) -> BouncePool {
        debug_assert!(count > 0 && pages > 0);
        BouncePool {
            bufs: (0..count.max(1)).map(|_| Mutex::new(Vec::new())).collect(),
            pages: pages.max(1),
            next: AtomicUsize::new(0),
        }
    }

    /// Pages in each buffer.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Run `f` with a buffer of [`BouncePool::pages`] pages: an idle one,
    /// else the first to come free. `f` must not borrow another buffer of
    /// this pool (two threads doing so could wait for each other).
    pub fn with<R>(&self, f: impl FnOnce(&mut [Page]) -> R) -> R {
        let n = self.bufs.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let mut guard = (0..n)
            .find_map(|i| self.bufs[(start + i) % n].try_lock().ok())
            .unwrap_or_else(|| lock(&self.bufs[start]));
        if guard.is_empty() {
            // Once per buffer for the engine's life.
            *guard = dev::pages(self.pages);
        }
        f(&mut guard)
    }
}

fn lock(m: &Mutex<Vec<Page>>) -> MutexGuard<'_, Vec<Page>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_made_once_and_lent_out() {
        let pool = BouncePool::new(2, 3);
        let first = pool.with(|b| {
            assert_eq!(b.len(), 3);
            b[0].0[0] = 9;
            b.as_ptr() as usize
        });
        // Two at once: the other buffer.
        pool.with(|a| {
            pool.with(|b| assert_ne!(a.as_ptr(), b.as_ptr()));
        });
        // The same memory again later, not a new allocation.
        let again: Vec<usize> = (0..4).map(|_| pool.with(|b| b.as_ptr() as usize)).collect();
        assert!(again.contains(&first));
        assert!(again.iter().all(|p| p % 4096 == 0));
    }
}
