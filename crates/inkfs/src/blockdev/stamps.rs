//! Write stamps of the data device, shared by every process that writes
//! or caches it (the server and its clients: docs/KERNEL-FREE.md,
//! "Built: readahead in the library").
//!
//! A DRAM cache of device blocks in one process must never serve bytes
//! another process has since overwritten (sync and posix overwrite device
//! blocks in place; a freed block is reused by another file). Nothing in
//! the pool says so: a posix overwrite in place logs nothing. So every
//! device write of every process is announced here, in memory all of them
//! map (the epoch table, epoch.rs): a bucket of 16 consecutive blocks
//! hashed to one of [`BUCKETS`] pairs of counters, `started` bumped before
//! the write and `finished` after it.
//!
//! A cache keeps what a device read returned only with the bucket's stamp
//! taken before the read, and only when no write was in flight then
//! (`started == finished`); it serves a cached block only while the
//! bucket still shows that stamp with nothing in flight. So a write that
//! returned before a read began is never hidden by a cached copy: it
//! moved `started` before it wrote, and either the cached copy was read
//! after that (then the stamp was taken with the write in flight and
//! nothing was kept, or after it finished and the copy is the new bytes),
//! or the copy's stamp is older than `started` now.
//!
//! A writer killed between its two bumps leaves its buckets with
//! `started > finished` for the life of the table (the mount): blocks of
//! those buckets are then never cached, always read from the device.
//! Correct, and slower for 1/[`BUCKETS`] of the device per such bucket.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

/// Pairs of counters. Buckets of different runs collide; a collision
/// only costs a cached copy that another run's write made look stale.
pub const BUCKETS: usize = 8192;
/// Consecutive blocks share a bucket: a sequential read checks one pair
/// per run, a 1 MiB write bumps 16.
pub const RUN_SHIFT: u32 = 4;

/// See the module documentation. Atomics only, all-zero valid: it lives
/// in the shared epoch table.
#[repr(C)]
pub struct WriteStamps {
    started: [AtomicU64; BUCKETS],
    finished: [AtomicU64; BUCKETS],
}

impl Default for WriteStamps {
    fn default() -> Self {
        WriteStamps {
            started: std::array::from_fn(|_| AtomicU64::new(0)),
            finished: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

fn bucket(block: u64) -> usize {
    (block >> RUN_SHIFT) as usize % BUCKETS
}

/// The buckets of blocks `[start, start + len)`, each once (a range of
/// more than `BUCKETS` runs wraps: then every bucket).
fn buckets(start: u64, len: u64) -> impl Iterator<Item = usize> {
    let first = start >> RUN_SHIFT;
    let last = (start + len.max(1) - 1) >> RUN_SHIFT;
    let runs = (last - first + 1).min(BUCKETS as u64);
    (0..runs).map(move |i| ((first + i) as usize) % BUCKETS)
}

impl WriteStamps {
    /// Before writing blocks `[start, start + len)` of the device.
    pub fn begin_write(&self, start: u64, len: u64) {
        for b in buckets(start, len) {
            self.started[b].fetch_add(1, SeqCst);
        }
    }

    /// After the write `begin_write` announced returned.
    pub fn end_write(&self, start: u64, len: u64) {
        for b in buckets(start, len) {
            let was = self.finished[b].fetch_add(1, SeqCst);
            debug_assert!(was < self.started[b].load(SeqCst), "a write ended twice");
        }
    }

    /// `block`'s stamp now, or None while a write of its bucket is in
    /// flight (or was left so by a writer that died): a device read
    /// begun now may be kept in a cache under this stamp.
    pub fn stamp(&self, block: u64) -> Option<u64> {
        let b = bucket(block);
        // `finished` first: a write that ends between the two loads makes
        // them differ (`started` >= that write's bump), never agree on a
        // stamp the write is not under.
        let finished = self.finished[b].load(SeqCst);
        let started = self.started[b].load(SeqCst);
        (started == finished).then_some(started)
    }

    /// Whether a copy of `block` kept under `stamp` is still the device's
    /// contents (nothing written to its bucket since).
    pub fn current(&self, block: u64, stamp: u64) -> bool {
        self.stamp(block) == Some(stamp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamps() -> Box<WriteStamps> {
        Box::default()
    }

    #[test]
    fn a_write_outdates_copies_of_its_buckets_only() {
        let s = stamps();
        let a = s.stamp(100).unwrap();
        let far = s.stamp(100 + 16 * 3).unwrap();
        s.begin_write(96, 20); // blocks 96..116: runs 6 and 7
        assert_eq!(s.stamp(100), None, "in flight: nothing may be kept");
        s.end_write(96, 20);
        assert!(!s.current(100, a));
        assert!(!s.current(113, a));
        assert!(s.current(100 + 16 * 3, far), "another run's copy stays");
        let b = s.stamp(100).unwrap();
        assert!(s.current(100, b));
    }

    #[test]
    fn a_writer_that_never_ended_leaves_its_bucket_uncacheable() {
        let s = stamps();
        s.begin_write(0, 1);
        assert_eq!(s.stamp(0), None);
        s.begin_write(0, 1);
        s.end_write(0, 1);
        assert_eq!(s.stamp(5), None, "still one write open");
        assert!(s.stamp(16).is_some());
    }

    #[test]
    fn a_range_wider_than_the_table_bumps_each_bucket_once() {
        let s = stamps();
        let len = (BUCKETS as u64 + 5) << RUN_SHIFT;
        s.begin_write(0, len);
        s.end_write(0, len);
        assert_eq!(s.stamp(0), Some(1));
        assert_eq!(s.stamp(7 << RUN_SHIFT), Some(1));
    }
}
