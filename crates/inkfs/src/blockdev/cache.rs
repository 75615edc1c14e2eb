//! A bounded DRAM cache of data-device blocks (the data device is opened
//! with O_DIRECT, so nothing else caches them): CLOCK replacement in
//! shards, each shard a fixed set of page slots allocated as they fill.
//!
//! Coherence: every write to the device goes through the engine, which
//! writes the device first and then puts the new contents here (`put`).
//! A reader that missed reads the device and offers what it read
//! (`end_load`), which is kept only if nothing wrote to that block's shard
//! since the reader claimed it (`begin_load` notes the shard's stamp): a
//! read racing with a write of the same block
//! (possible only for readahead past the reader's own file, whose blocks
//! another file may be writing) can never leave old contents behind.
//!
//! Device reads into the cache claim their blocks first (`begin_load`):
//! a block being read (by a reader's miss, or the readahead of
//! `readahead.rs`) is read once, and a reader that wants it waits for that
//! read (`wait_load`) instead of issuing its own.
//!
//! Writes this engine did not make (an attached client's, under a write
//! lease: docs/KERNEL-FREE.md) reach the device without passing here: the
//! server drops the blocks such a client could have written (`forget`)
//! when it reserves them for the client and when the lease comes back,
//! before anyone reads the file through the server again. `forget` moves
//! the stamp too, so a fill that read the device before the client's
//! write and arrives after the forget is dropped.
//!
//! Once the pool is shared with other processes (the server's first
//! client, or this engine is a client), every process announces its device
//! writes in the shared write stamps (`stamps.rs`), and this cache checks
//! them: a block is kept under the stamp its bucket showed before the
//! device read (nothing kept while a write of the bucket is in flight),
//! and served only while the bucket shows it still. That is what keeps a
//! client's cache coherent with the server's and other clients' in-place
//! overwrites and reuse of freed blocks (a posix overwrite in place logs
//! nothing a reader could see); the server's `forget` at lease changes
//! stays as well. A client's cache (`DataCache::for_client`) keeps nothing
//! until it has the stamps.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::dev::Page;
use super::stamps::WriteStamps;
use crate::epoch::SharedTable;
use crate::format::BLOCK_SIZE;

const SHARDS: usize = 16;
/// Consecutive blocks share a shard, so a sequential read takes few locks.
const RUN_SHIFT: u32 = 4;
/// A slot whose block was forgotten (no block number is this large).
const NO_BLOCK: u64 = u64::MAX;
/// A load begun while a write of its bucket was in flight: not kept.
const NO_STAMP: u64 = u64::MAX;

// The cache's runs are the stamps' buckets' runs: one stamp per run.
const _: () = assert!(RUN_SHIFT == super::stamps::RUN_SHIFT);

// Block numbers are the engine's own: no SipHash for them.
type BlockMap<V> = crate::inthash::IntMap<V>;

struct Slot {
    block: u64,
    referenced: bool,
    /// The write stamp the contents were read or written under.
    stamp: u64,
}

struct Shard {
    map: BlockMap<u32>,
    slots: Vec<Slot>,
    pages: Vec<Page>,
    capacity: usize,
    hand: usize,
    /// Bumped by every `put` (a write).
    stamp: u64,
    /// Blocks a device read is filling now (`begin_load`), with the write
    /// stamp taken before it (`NO_STAMP`: not to be kept).
    loading: BlockMap<u64>,
}

impl Shard {
    /// A slot for `block` (not present): a free one while the shard fills,
    /// else the CLOCK victim.
    fn slot_for(&mut self, block: u64) -> usize {
        if self.slots.len() < self.capacity {
            self.slots.push(Slot {
                block,
                referenced: false,
                stamp: 0,
            });
            self.pages.push(Page::zeroed());
            return self.slots.len() - 1;
        }
        loop {
            let i = self.hand;
            self.hand = (self.hand + 1) % self.slots.len();
            if std::mem::take(&mut self.slots[i].referenced) {
                continue;
            }
            self.map.remove(&self.slots[i].block);
            self.slots[i].block = block;
            return i;
        }
    }

    fn store(&mut self, block: u64, data: &[u8], stamp: u64) {
        debug_assert_ne!(stamp, NO_STAMP);
        let i = match self.map.get(&block) {
            Some(&i) => i as usize,
            None => {
                let i = self.slot_for(block);
                self.map.insert(block, i as u32);
                i
            }
        };
        self.pages[i].0.copy_from_slice(data);
        self.slots[i].referenced = true;
        self.slots[i].stamp = stamp;
    }

    /// Drop `block` if cached; its slot is the next victim's to reuse.
    fn forget(&mut self, block: u64) {
        if let Some(i) = self.map.remove(&block) {
            let slot = &mut self.slots[i as usize];
            slot.block = NO_BLOCK;
            slot.referenced = false;
        }
    }
}

/// The cache. A capacity of 0 disables it (every read goes to the device).
pub struct DataCache {
    shards: Box<[Mutex<Shard>]>,
    /// Per shard: a load ended (`end_load`).
    loaded: Box<[Condvar]>,
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    capacity_pages: u64,
    /// The shared write stamps, once other processes share the device.
    stamps: OnceLock<SharedTable>,
    /// Keep nothing until `stamps` is set (a client's cache).
    needs_stamps: bool,
}

impl DataCache {
    pub fn new(bytes: u64) -> DataCache {
        let pages = bytes / BLOCK_SIZE;
        let per_shard = pages.div_ceil(SHARDS as u64) as usize;
        DataCache {
            shards: (0..SHARDS)
                .map(|_| {
                    // Room reserved for every page (address space only,
                    // untouched until a slot fills): a shard that grew by
                    // doubling copied all its pages at each growth, which
                    // cost a first pass over a 256 MiB cache a third of
                    // its speed. The map and the slots are small: they
                    // grow (a mount that reads little initializes little).
                    Mutex::new(Shard {
                        map: BlockMap::default(),
                        slots: Vec::new(),
                        pages: Vec::with_capacity(per_shard),
                        capacity: per_shard,
                        hand: 0,
                        stamp: 0,
                        loading: BlockMap::default(),
                    })
                })
                .collect(),
            loaded: (0..SHARDS).map(|_| Condvar::new()).collect(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            capacity_pages: per_shard as u64 * SHARDS as u64,
            stamps: OnceLock::new(),
            needs_stamps: false,
        }
    }

    /// A cache in a client of the kernel-free path: it keeps and serves
    /// nothing until `use_stamps` (other processes write the device).
    pub fn for_client(bytes: u64) -> DataCache {
        DataCache {
            needs_stamps: true,
            ..DataCache::new(bytes)
        }
    }

    /// Check the shared write stamps from now on (the first table given
    /// stays). Copies kept before were read when no other process wrote
    /// the device (a server before its first client) or not kept at all
    /// (a client's cache), so they stand under stamp 0, which a fresh
    /// table shows until the first write.
    pub fn use_stamps(&self, table: SharedTable) {
        let _ = self.stamps.set(table);
    }

    /// Whether a device read may be kept here now: a cache, and the
    /// stamps when it needs them (a client's before `use_stamps` keeps
    /// nothing, so its reads bypass it and nothing is read ahead).
    pub fn keeps(&self) -> bool {
        self.capacity_pages != 0 && (!self.needs_stamps || self.stamps.get().is_some())
    }

    /// The shared write stamps, if in use.
    pub fn write_stamps(&self) -> Option<&WriteStamps> {
        self.stamps.get().map(|t| (**t).as_ref().dev_writes())
    }

    /// The stamp a device read of `block` begun now is kept under:
    /// `NO_STAMP` while a write is in flight, or when the stamps are
    /// needed and not yet given.
    fn stamp_now(&self, block: u64) -> u64 {
        match self.write_stamps() {
            Some(w) => w.stamp(block).unwrap_or(NO_STAMP),
            None if self.needs_stamps => NO_STAMP,
            None => 0,
        }
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_pages * BLOCK_SIZE
    }

    fn shard_index(block: u64) -> usize {
        (block >> RUN_SHIFT) as usize % SHARDS
    }

    fn shard(&self, block: u64) -> MutexGuard<'_, Shard> {
        self.shards[Self::shard_index(block)]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Claim up to `stamps.len()` consecutive blocks from `start` for a
    /// device read: each neither cached nor being loaded, its stamp noted
    /// in `stamps`. The count claimed (0: `start` itself is cached or
    /// being loaded). Every claimed block must be ended with `end_load`.
    pub fn begin_load(&self, start: u64, stamps: &mut [u64]) -> usize {
        if self.capacity_pages == 0 {
            return 0;
        }
        let mut n = 0;
        while n < stamps.len() {
            let b = start + n as u64;
            let mut s = self.shard(b);
            // The rest of this shard's run under one lock.
            let run_end = (((b >> RUN_SHIFT) + 1) << RUN_SHIFT).min(start + stamps.len() as u64);
            // Before the device read: one bucket per run.
            let dev_stamp = self.stamp_now(b);
            for x in b..run_end {
                if s.map.contains_key(&x) || s.loading.contains_key(&x) {
                    return n;
                }
                s.loading.insert(x, dev_stamp);
                stamps[n] = s.stamp;
                n += 1;
            }
        }
        n
    }

    /// The device read of the blocks `begin_load` claimed from `start`
    /// (one stamp each) ended: `pages` holds what it read (None: it
    /// failed). Each block is kept unless written since its stamp; waiters
    /// are woken.
    pub fn end_load(&self, start: u64, pages: Option<&[Page]>, stamps: &[u64]) {
        let mut i = 0;
        while i < stamps.len() {
            let b = start + i as u64;
            let shard = Self::shard_index(b);
            let mut s = self.shard(b);
            let run_end = (((b >> RUN_SHIFT) + 1) << RUN_SHIFT).min(start + stamps.len() as u64);
            for x in b..run_end {
                let k = (x - start) as usize;
                let dev_stamp = s.loading.remove(&x).unwrap_or(NO_STAMP);
                if let Some(p) = pages {
                    if s.stamp == stamps[k] && dev_stamp != NO_STAMP && !s.map.contains_key(&x) {
                        s.store(x, &p[k].0, dev_stamp);
                    }
                }
            }
            drop(s);
            self.loaded[shard].notify_all();
            i = (run_end - start) as usize;
        }
    }

    /// Wait (at most `limit`) until no device read is loading `block`;
    /// true if one was.
    pub fn wait_load(&self, block: u64, limit: Duration) -> bool {
        let shard = Self::shard_index(block);
        let mut s = self.shard(block);
        if !s.loading.contains_key(&block) {
            return false;
        }
        let end = Instant::now() + limit;
        while s.loading.contains_key(&block) {
            let now = Instant::now();
            if now >= end {
                break;
            }
            s = self.loaded[shard]
                .wait_timeout(s, end - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// Bytes `[at, at + out.len())` of `block` (within the block) into
    /// `out`, if cached.
    pub fn get(&self, block: u64, at: usize, out: &mut [u8]) -> bool {
        if self.capacity_pages == 0 {
            return false;
        }
        let stamps = self.write_stamps();
        let mut s = self.shard(block);
        let hit = match s.map.get(&block) {
            // Another process wrote the block's bucket since: drop it.
            Some(&i) if stamps.is_some_and(|w| !w.current(block, s.slots[i as usize].stamp)) => {
                s.forget(block);
                false
            }
            Some(&i) => {
                let i = i as usize;
                out.copy_from_slice(&s.pages[i].0[at..at + out.len()]);
                s.slots[i].referenced = true;
                true
            }
            None => false,
        };
        drop(s);
        let counter = if hit { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        hit
    }

    /// Whether `block` is cached (and current: see `get`).
    pub fn contains(&self, block: u64) -> bool {
        if self.capacity_pages == 0 {
            return false;
        }
        let stamps = self.write_stamps();
        let s = self.shard(block);
        s.map.get(&block).is_some_and(|&i| {
            stamps.is_none_or(|w| w.current(block, s.slots[i as usize].stamp))
        })
    }


    /// `block` now holds `data` on the device (written, and the write
    /// ended in the stamps): cache it, unless another write of its bucket
    /// is in flight (then drop any copy).
    pub fn put(&self, block: u64, data: &Page) {
        if self.capacity_pages == 0 {
            return;
        }
        let dev_stamp = self.stamp_now(block);
        let mut s = self.shard(block);
        s.stamp += 1;
        if dev_stamp == NO_STAMP {
            s.forget(block);
        } else {
            s.store(block, &data.0, dev_stamp);
        }
    }

    /// Drop every block of `ranges` (start, len) from the cache, and move
    /// the stamps of their shards (see the module comment). Block by block
    /// when the ranges are no larger than the cache, else by a walk of
    /// every cached block.
    pub fn forget(&self, ranges: &[(u64, u64)]) {
        if self.capacity_pages == 0 || ranges.is_empty() {
            return;
        }
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        if total <= self.capacity_pages {
            for &(start, len) in ranges {
                let mut b = start;
                while b < start + len {
                    // Blocks of one run share a shard: one lock for each.
                    let run_end = (((b >> RUN_SHIFT) + 1) << RUN_SHIFT).min(start + len);
                    let mut s = self.shard(b);
                    s.stamp += 1;
                    for x in b..run_end {
                        s.forget(x);
                    }
                    b = run_end;
                }
            }
            return;
        }
        let mut sorted = ranges.to_vec();
        sorted.sort_unstable();
        let inside = |b: u64| {
            let i = sorted.partition_point(|r| r.0 <= b);
            i > 0 && b < sorted[i - 1].0 + sorted[i - 1].1
        };
        for shard in self.shards.iter() {
            let mut s = shard.lock().unwrap_or_else(|p| p.into_inner());
            s.stamp += 1;
            let doomed: Vec<u64> = s.map.keys().copied().filter(|&b| inside(b)).collect();
            for b in doomed {
                s.forget(b);
            }
        }
    }

}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(v: u8) -> Page {
        Page([v; BLOCK_SIZE as usize])
    }

    #[test]
    fn put_get_and_eviction_stay_bounded() {
        let c = DataCache::new(SHARDS as u64 * 2 * BLOCK_SIZE);
        let mut out = [0u8; 8];
        for b in 0..1000u64 {
            c.put(b, &page(b as u8));
        }
        let cached = (0..1000).filter(|&b| c.contains(b)).count();
        assert_eq!(cached, SHARDS * 2);
        assert!(c.get(999, 100, &mut out));
        assert_eq!(out, [999u64 as u8; 8]);
        assert!(!c.get(0, 0, &mut out));
    }

    #[test]
    fn a_load_racing_a_write_is_dropped() {
        let c = DataCache::new(1 << 20);
        let mut st = [0u64; 1];
        assert_eq!(c.begin_load(7, &mut st), 1);
        c.put(7, &page(2)); // a write lands after the reader looked
        c.end_load(7, Some(&[page(1)]), &st); // the reader's older copy
        let mut out = [0u8; 1];
        assert!(c.get(7, 0, &mut out));
        assert_eq!(out[0], 2);
        // Evicted meanwhile: still dropped, the stamp moved.
        let c = DataCache::new(1 << 20);
        assert_eq!(c.begin_load(9, &mut st), 1);
        c.put((SHARDS as u64) << RUN_SHIFT, &page(3)); // block 9's shard
        c.end_load(9, Some(&[page(1)]), &st);
        assert!(!c.contains(9));
        assert_eq!(c.begin_load(9, &mut st), 1);
        c.end_load(9, Some(&[page(1)]), &st);
        assert!(c.contains(9));
    }

    #[test]
    fn forgotten_blocks_are_gone_and_their_slots_reused() {
        for cap_pages in [4 * SHARDS as u64, 4096] {
            let c = DataCache::new(cap_pages * BLOCK_SIZE);
            for b in 0..64u64 {
                c.put(b, &page(b as u8));
            }
            let cached: Vec<u64> = (0..64).filter(|&b| c.contains(b)).collect();
            // Small ranges block by block, a range larger than the cache
            // by the walk.
            c.forget(&[(3, 2), (1000, 1)]);
            assert!(!c.contains(3) && !c.contains(4));
            c.forget(&[(40, 1 << 20)]);
            for b in cached {
                let gone = (3..5).contains(&b) || b >= 40;
                assert_eq!(c.contains(b), !gone, "block {b}");
            }
            // A load that looked before the forget is dropped.
            let mut st = [0u64; 1];
            assert_eq!(c.begin_load(50, &mut st), 1);
            c.forget(&[(50, 1)]);
            c.end_load(50, Some(&[page(1)]), &st);
            assert!(!c.contains(50));
            // Forgotten slots take new blocks, and evicting them later
            // unmaps nothing else.
            for b in 100..200u64 {
                c.put(b, &page(b as u8));
            }
            let mut out = [0u8; 1];
            for b in 100..200u64 {
                if c.get(b, 0, &mut out) {
                    assert_eq!(out[0], b as u8);
                }
            }
            assert!(c.contains(199));
        }
    }

    #[test]
    fn a_load_is_claimed_once_and_waited_for() {
        let c = std::sync::Arc::new(DataCache::new(1 << 20));
        c.put(5, &page(5));
        let mut stamps = [0u64; 8];
        // Claimed up to the cached block.
        assert_eq!(c.begin_load(1, &mut stamps), 4);
        // Claimed already: nobody else reads them.
        assert_eq!(c.begin_load(2, &mut stamps[..2]), 0);
        let claimed = stamps;
        let waiter = {
            let c = c.clone();
            std::thread::spawn(move || {
                let waited = c.wait_load(3, Duration::from_secs(10));
                let mut out = [0u8; 1];
                (waited, c.get(3, 0, &mut out), out[0])
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        let pages: Vec<Page> = (1..5).map(|v| page(v as u8 * 10)).collect();
        c.end_load(1, Some(&pages), &claimed[..4]);
        assert_eq!(waiter.join().unwrap(), (true, true, 30));
        // A write while a block loads: the load's older contents are
        // dropped (the stamp is per shard: its neighbours' too).
        let mut st = [0u64; 2];
        assert_eq!(c.begin_load(6, &mut st), 2);
        c.put(7, &page(99));
        c.end_load(6, Some(&pages[..2]), &st);
        let mut out = [0u8; 1];
        assert!(c.get(7, 0, &mut out) && out[0] == 99);
        assert!(!c.contains(6));
        // A failed load leaves nothing, and frees the claim.
        let mut st = [0u64; 2];
        assert_eq!(c.begin_load(20, &mut st), 2);
        c.end_load(20, None, &st);
        assert!(!c.contains(20));
        assert!(!c.wait_load(20, Duration::from_secs(1)));
        assert_eq!(c.begin_load(20, &mut st), 2);
        c.end_load(20, None, &st);
    }

    #[test]
    fn disabled_cache_holds_nothing() {
        let c = DataCache::new(0);
        c.put(1, &page(1));
        let mut out = [0u8; 1];
        assert!(!c.get(1, 0, &mut out));
    }
}
