//! FUSE file handles (`fh`, a u64 the kernel echoes back) → engine handles.
//!
//! A sharded table rather than `Box::into_raw` pointers: a stale or bogus
//! `fh` then answers EBADF instead of being undefined behaviour, and no
//! `unsafe` is needed. The read/write path holds one shard's read lock for
//! the request (no global mutex; shards keep two threads working on
//! different files from sharing a lock word).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

const SHARDS: usize = 64;

/// For integer keys that no user chooses (`fh` values from our own
/// counter, the engine's inode numbers): a multiply spreads them over a
/// table. (The default SipHash cost ~20 ns a request for a protection
/// against chosen keys that cannot occur here.)
#[derive(Default)]
pub(crate) struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type Shard<H> = RwLock<HashMap<u64, Arc<H>, BuildHasherDefault<IntHasher>>>;

pub struct HandleTable<H> {
    shards: Vec<Shard<H>>,
    next: AtomicU64,
}

impl<H> Default for HandleTable<H> {
    fn default() -> Self {
        HandleTable {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            next: AtomicU64::new(1),
        }
    }
}

impl<H> HandleTable<H> {
    fn shard(&self, fh: u64) -> &Shard<H> {
        &self.shards[(fh % SHARDS as u64) as usize]
    }

    pub fn insert(&self, handle: H) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        let open = Arc::new(handle);
        // A poisoned shard only means another request panicked mid-insert;
        // the map itself is still consistent.
        self.shard(fh)
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(fh, open);
        fh
    }

    pub fn get(&self, fh: u64) -> Option<Arc<H>> {
        self.shard(fh)
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fh)
            .cloned()
    }

    /// Run `f` on `fh`'s handle, under its shard's read lock (so no RELEASE
    /// can take it meanwhile, without the two atomic reference-count
    /// updates of `get`). `f` must not use the table.
    pub fn with<T>(&self, fh: u64, f: impl FnOnce(&H) -> T) -> Option<T> {
        let shard = self.shard(fh).read().unwrap_or_else(|p| p.into_inner());
        shard.get(&fh).map(|open| f(open))
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
                Ok(o) => return Some(o),
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
                    out.push(o);
                }
            }
        }
        out
    }
}
