//! FUSE file handles (`fh`, a u64 the kernel echoes back) → engine handles.
//!
//! A sharded table rather than `Box::into_raw` pointers: a stale or bogus
//! `fh` then answers EBADF instead of being undefined behaviour, and no
//! `unsafe` is needed. The read/write path takes one shard's read lock just
//! long enough to clone an `Arc` (no global mutex; shards keep two threads
//! working on different files from sharing a lock word).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

const SHARDS: usize = 64;

pub struct Open<H> {
    pub handle: H,
    /// Open flags (O_APPEND, O_ACCMODE ...) as the kernel passed them.
    pub flags: i32,
}

pub struct HandleTable<H> {
    shards: Vec<RwLock<HashMap<u64, Arc<Open<H>>>>>,
    next: AtomicU64,
}

impl<H> Default for HandleTable<H> {
    fn default() -> Self {
        HandleTable {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
            next: AtomicU64::new(1),
        }
    }
}

impl<H> HandleTable<H> {
    fn shard(&self, fh: u64) -> &RwLock<HashMap<u64, Arc<Open<H>>>> {
        &self.shards[(fh % SHARDS as u64) as usize]
    }

    pub fn insert(&self, handle: H, flags: i32) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        let open = Arc::new(Open { handle, flags });
        // A poisoned shard only means another request panicked mid-insert;
        // the map itself is still consistent.
        self.shard(fh)
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(fh, open);
        fh
    }

    pub fn get(&self, fh: u64) -> Option<Arc<Open<H>>> {
        self.shard(fh)
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fh)
            .cloned()
    }

    /// Remove `fh` and hand back the engine handle once no request still
    /// uses it (the kernel sends RELEASE after every request on the file has
    /// been answered, so the wait is at most a few instructions long).
    pub fn remove(&self, fh: u64) -> Option<H> {
        let mut open = self
            .shard(fh)
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh)?;
        for _ in 0..1_000_000 {
            match Arc::try_unwrap(open) {
                Ok(o) => return Some(o.handle),
                Err(again) => {
                    open = again;
                    std::thread::yield_now();
                }
            }
        }
        None
    }

    /// Every handle still open (teardown after the kernel went away).
    pub fn drain(&self) -> Vec<H> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let taken: Vec<_> = shard
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .drain()
                .collect();
            for (_, open) in taken {
                if let Ok(o) = Arc::try_unwrap(open) {
                    out.push(o.handle);
                }
            }
        }
        out
    }
}
