//! Readahead for sequential readers of the data device: reads that run
//! ahead of the reader, on threads of their own, into the DRAM cache.
//!
//! A reader's miss is one synchronous device read (the disk's latency, a
//! few hundred microseconds); issued one at a time by the reading thread,
//! misses keep the device at a queue depth of one and the reader waits for
//! every one. Here a sequential reader is recognised by where its requests
//! fall on the device (a small table of streams: a request that starts
//! where a stream's last one ended, give or take a few requests that the
//! kernel sent out of order, continues it), and once a stream has read
//! past half of what was read ahead for it, the next window is queued in
//! chunks that [`WORKERS`] threads read at once (a queue depth of up to
//! that many), each into the cache. The reader finds its blocks there, or
//! waits for the read already in flight (`DataCache::wait_load`) instead of
//! issuing its own.
//!
//! Bounded by the cache: the window is at most a quarter of it (blocks
//! read ahead must survive until the reader gets to them), and no readahead
//! runs without a cache. The queue is bounded too: readahead is advice, a
//! full queue drops it. The threads start at the first readahead and stop
//! when the engine goes.
//!
//! Device order is file order for a file written sequentially (its device
//! blocks come in extents of the pool's unit); for a fragmented file the
//! stream is broken at each jump and reading ahead past an extent may read
//! blocks of other files: wasted bandwidth, never wrong data (the cache's
//! stamps keep a fill that raced a write out).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use super::cache::DataCache;
use super::dev::{self, BlockDev};
use crate::format::{BLOCK_SIZE, DEV_BLOCK_BASE};

/// Threads reading ahead (the device's queue depth from readahead): four
/// read a cold file 1.5-2x faster than two on this machine's disk
/// (bench/results-notes/hybrid.md).
pub const WORKERS: usize = 4;
/// Blocks one readahead read covers (512 KiB).
pub const CHUNK_BLOCKS: u64 = 128;
/// Largest window read ahead of a stream, in blocks (8 MiB), before the
/// cache's bound.
pub const WINDOW_MAX_BLOCKS: u64 = 2048;
/// Streams followed at once.
const STREAMS: usize = 8;
/// Blocks a request may start before or past where its stream is, and
/// still continue it (the kernel's readahead sends requests from several
/// threads, a little out of order: a FUSE read of 128 KiB).
const SLACK_BLOCKS: u64 = 32;
/// Requests that continue a stream before it is read ahead (random reads
/// that happen to fall near each other rarely make four in a row).
const HITS_BEFORE_READAHEAD: u32 = 3;
/// Chunks waiting at most; more readahead is dropped.
const QUEUE_MAX: usize = 64;

#[derive(Clone, Copy, Default)]
struct Stream {
    /// Where the stream's requests have got to (the block after the
    /// furthest one).
    next: u64,
    /// Where readahead for it has been queued up to.
    ahead: u64,
    /// Last use, for replacement.
    used: u64,
    /// Requests that continued it.
    hits: u32,
    /// Blocks it reads ahead: four requests' worth at first, doubled at
    /// each readahead up to the window (a stream taken for sequential by
    /// mistake costs little).
    window: u64,
}

/// What the worker threads share.
struct Shared {
    dev: Arc<dyn BlockDev>,
    cache: Arc<DataCache>,
    /// The device's first block past the pool's.
    end_block: u64,
    queue: Mutex<VecDeque<(u64, u64)>>,
    queued: Condvar,
    stop: AtomicBool,
    /// Bytes read by readahead, and by every device read of the store.
    ahead_bytes: AtomicU64,
    bytes_read: Arc<AtomicU64>,
}

/// See the module documentation.
pub struct Readahead {
    shared: Arc<Shared>,
    streams: Mutex<([Stream; STREAMS], u64)>,
    window_blocks: u64,
    workers: OnceLock<Vec<std::thread::JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Readahead {
    /// Readahead into `cache` from `dev` (whose pool uses `dev_blocks`
    /// blocks); `bytes_read` counts every device read. None without a
    /// cache to read into.
    pub fn new(
        dev: Arc<dyn BlockDev>,
        cache: Arc<DataCache>,
        dev_blocks: u64,
        bytes_read: Arc<AtomicU64>,
    ) -> Option<Readahead> {
        let window_blocks = (cache.capacity_bytes() / BLOCK_SIZE / 4).min(WINDOW_MAX_BLOCKS);
        if window_blocks < CHUNK_BLOCKS {
            return None;
        }
        Some(Readahead {
            shared: Arc::new(Shared {
                dev,
                cache,
                end_block: DEV_BLOCK_BASE + dev_blocks,
                queue: Mutex::new(VecDeque::new()),
                queued: Condvar::new(),
                stop: AtomicBool::new(false),
                ahead_bytes: AtomicU64::new(0),
                bytes_read,
            }),
            streams: Mutex::new(([Stream::default(); STREAMS], 0)),
            window_blocks,
            workers: OnceLock::new(),
        })
    }

    /// Bytes read ahead so far.
    pub fn ahead_bytes(&self) -> u64 {
        self.shared.ahead_bytes.load(Ordering::Relaxed)
    }

    /// A reader asks for blocks `[start, end)`: follow its stream, and
    /// queue the next window once it has read past half of the last one.
    pub fn note(&self, start: u64, end: u64) {
        let Some((from, to)) = self.advance(start, end) else {
            return;
        };
        let to = to.min(self.shared.end_block);
        if from >= to {
            return;
        }
        self.start_workers();
        let mut q = lock(&self.shared.queue);
        let mut at = from;
        while at < to && q.len() < QUEUE_MAX {
            let n = (to - at).min(CHUNK_BLOCKS);
            q.push_back((at, n));
            at += n;
        }
        drop(q);
        self.shared.queued.notify_all();
    }

    /// The stream table's part of `note`: the range to read ahead, if any.
    fn advance(&self, start: u64, end: u64) -> Option<(u64, u64)> {
        let mut guard = lock(&self.streams);
        let (streams, clock) = &mut *guard;
        *clock += 1;
        let found = streams
            .iter_mut()
            .find(|s| s.next != 0 && start + SLACK_BLOCKS >= s.next && start <= s.next + SLACK_BLOCKS);
        let Some(s) = found else {
            // A new stream (or a random read): nothing ahead yet; its next
            // request, if it continues this one, starts the readahead.
            let victim = streams
                .iter_mut()
                .min_by_key(|s| s.used)
                .expect("a table of streams");
            *victim = Stream {
                next: end,
                ahead: end,
                used: *clock,
                hits: 0,
                window: 0,
            };
            return None;
        };
        s.used = *clock;
        s.hits = s.hits.saturating_add(1);
        s.next = s.next.max(end);
        s.ahead = s.ahead.max(s.next);
        if s.hits < HITS_BEFORE_READAHEAD || (s.window > 0 && s.ahead - s.next >= s.window / 2) {
            return None;
        }
        s.window = if s.window == 0 {
            (4 * (end - start)).clamp(CHUNK_BLOCKS, self.window_blocks)
        } else {
            (s.window * 2).min(self.window_blocks)
        };
        let from = s.ahead;
        s.ahead = s.next + s.window;
        Some((from, s.ahead))
    }

    fn start_workers(&self) {
        self.workers.get_or_init(|| {
            (0..WORKERS)
                .filter_map(|i| {
                    let shared = self.shared.clone();
                    std::thread::Builder::new()
                        .name(format!("inkfs-ra{i}"))
                        .spawn(move || work(&shared))
                        .ok()
                })
                .collect()
        });
    }
}

impl Drop for Readahead {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.queued.notify_all();
        if let Some(workers) = self.workers.take() {
            for w in workers {
                let _ = w.join();
            }
        }
    }
}

/// A worker: read each queued chunk's blocks that are neither cached nor
/// being read, into the cache.
fn work(shared: &Shared) {
    // One buffer per worker, for its life.
    let mut buf = dev::pages(CHUNK_BLOCKS as usize);
    let mut stamps = [0u64; CHUNK_BLOCKS as usize];
    loop {
        let (start, n) = {
            let mut q = lock(&shared.queue);
            loop {
                if shared.stop.load(Ordering::SeqCst) {
                    return;
                }
                if let Some(job) = q.pop_front() {
                    break job;
                }
                q = shared
                    .queued
                    .wait(q)
                    .unwrap_or_else(|e| e.into_inner());
            }
        };
        let end = start + n;
        let mut b = start;
        while b < end {
            let claimed = shared
                .cache
                .begin_load(b, &mut stamps[..(end - b) as usize]);
            if claimed == 0 {
                b += 1; // cached already, or another read has it
                continue;
            }
            let pages = &mut buf[..claimed];
            let off = (b - DEV_BLOCK_BASE) * BLOCK_SIZE;
            let read = shared.dev.read_at(off, pages);
            shared
                .cache
                .end_load(b, read.is_ok().then_some(&*pages), &stamps[..claimed]);
            if read.is_ok() {
                let bytes = claimed as u64 * BLOCK_SIZE;
                shared.ahead_bytes.fetch_add(bytes, Ordering::Relaxed);
                shared.bytes_read.fetch_add(bytes, Ordering::Relaxed);
            }
            b += claimed as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blockdev::MemDev;

    fn readahead(cache_pages: u64) -> (Readahead, Arc<DataCache>) {
        let dev = Arc::new(MemDev::new(8192 * BLOCK_SIZE));
        let cache = Arc::new(DataCache::new(cache_pages * BLOCK_SIZE));
        let ra = Readahead::new(dev, cache.clone(), 8192, Default::default()).unwrap();
        (ra, cache)
    }

    #[test]
    fn a_sequential_stream_is_read_ahead_a_random_one_is_not() {
        let (ra, cache) = readahead(4096);
        let w = ra.window_blocks;
        assert_eq!(w, 1024, "a quarter of the cache");
        let b0 = DEV_BLOCK_BASE + 100;
        let req = |i: u64| (b0 + 32 * i, b0 + 32 * i + 32);
        for i in 0..3 {
            assert_eq!(ra.advance(req(i).0, req(i).1), None, "request {i}");
        }
        // The fourth in a row: four requests ahead.
        assert_eq!(ra.advance(req(3).0, req(3).1), Some((req(4).0, req(4).0 + 128)));
        // Within the first half of that: nothing more.
        assert_eq!(ra.advance(req(4).0, req(4).1), None);
        // Out of order by a request: still the stream.
        assert_eq!(ra.advance(req(6).0, req(6).1), Some((req(4).0 + 128, req(7).0 + 256)));
        assert_eq!(ra.advance(req(5).0, req(5).1), None);
        // The window doubles up to a quarter of the cache.
        let mut last = 256;
        for i in 7..200u64 {
            if let Some((from, to)) = ra.advance(req(i).0, req(i).1) {
                assert!(to - req(i).1 > last || to - req(i).1 == w, "request {i}: {from}..{to}");
                last = to - req(i).1;
            }
        }
        assert_eq!(last, w);
        // Random requests never start one (a fixed sequence over 1 GiB).
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = DEV_BLOCK_BASE + x % (1 << 18);
            assert_eq!(ra.advance(b, b + 32), None, "random {i}");
        }
        // The workers fill the cache.
        let b1 = DEV_BLOCK_BASE + 5000;
        for i in 0..4 {
            ra.note(b1 + i * 32, b1 + i * 32 + 32);
        }
        let t = std::time::Instant::now();
        while !cache.contains(b1 + 128 + 127) && t.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(cache.contains(b1 + 128 + 127));
        assert_eq!(ra.ahead_bytes(), 128 * BLOCK_SIZE);
    }

    #[test]
    fn no_readahead_without_room_in_the_cache() {
        let dev = Arc::new(MemDev::new(64 * BLOCK_SIZE));
        let cache = Arc::new(DataCache::new(64 * BLOCK_SIZE));
        assert!(Readahead::new(dev, cache, 64, Default::default()).is_none());
    }
}
