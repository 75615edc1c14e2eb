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
//! chunks read into the cache with several reads in flight: by
//! [`WORKERS`] threads, one read each (`data_readahead=threads`, the
//! default), or by one thread keeping up to [`URING_DEPTH`] reads in
//! flight through io_uring (`data_readahead=uring`; threads where io_uring
//! or the device's descriptor is not available). The reader finds its blocks there, or
//! waits for the read already in flight (`DataCache::wait_load`) instead of
//! issuing its own.
//!
//! Chunks are 2 MiB ([`CHUNK_BLOCKS`]) and each is read into a buffer of
//! one huge page (`hugebuf.rs`), then copied into the cache: this
//! project's virtio disk reads 2.5-3x faster into huge pages than into
//! 4 KiB ones, whatever the request size or depth. A window is queued in
//! whole chunks (rounded up, within the reader's file).
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
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use super::cache::DataCache;
use super::dev::{BlockDev, Page};
use super::hugebuf::{HugeBuf, HUGE_PAGE_BLOCKS};
use crate::format::{BLOCK_SIZE, DEV_BLOCK_BASE};
use crate::types::ReadaheadMode;

/// Threads reading ahead (the device's queue depth from readahead): in an
/// interactive comparison on this project's VM, four read a cold file at
/// about 1.0-1.2 GB/s where two read 0.5-0.7 (bench/results-notes/
/// hybrid.md, "Choosing the thread count"; noisy, not a bench run).
pub const WORKERS: usize = 4;
/// Reads the io_uring thread keeps in flight.
pub const URING_DEPTH: usize = 4;
/// Blocks one readahead read covers at most (2 MiB: one huge page of a
/// worker's buffer, `hugebuf.rs`). On this project's virtio disk a read
/// costs by its buffer's memory segments: 2 MiB into one huge page reads
/// at 2.5-3.3 GB/s where 512 KiB into 4 KiB pages read at 1.0-1.2
/// (bench/results-notes/hybrid.md, "cold read").
pub const CHUNK_BLOCKS: u64 = HUGE_PAGE_BLOCKS as u64;
/// The smallest window readahead runs with (512 KiB); a smaller cache
/// reads nothing ahead. A window smaller than a chunk is read in one.
const WINDOW_MIN_BLOCKS: u64 = 128;
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
    /// The io_uring thread runs (`data_readahead=uring` got its ring).
    uring: AtomicBool,
}

/// See the module documentation.
pub struct Readahead {
    shared: Arc<Shared>,
    streams: Mutex<([Stream; STREAMS], u64)>,
    window_blocks: u64,
    /// Blocks a queued job covers: `CHUNK_BLOCKS`, or the window if less.
    chunk_blocks: u64,
    mode: ReadaheadMode,
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
        mode: ReadaheadMode,
    ) -> Option<Readahead> {
        let window_blocks = (cache.capacity_bytes() / BLOCK_SIZE / 4).min(WINDOW_MAX_BLOCKS);
        if window_blocks < WINDOW_MIN_BLOCKS {
            return None;
        }
        let chunk_blocks = CHUNK_BLOCKS.min(window_blocks);
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
                uring: AtomicBool::new(false),
            }),
            streams: Mutex::new(([Stream::default(); STREAMS], 0)),
            window_blocks,
            chunk_blocks,
            mode,
            workers: OnceLock::new(),
        })
    }

    /// Bytes read ahead so far.
    pub fn ahead_bytes(&self) -> u64 {
        self.shared.ahead_bytes.load(Ordering::Relaxed)
    }

    /// Whether reads ahead go through io_uring (once started).
    pub fn uses_uring(&self) -> bool {
        self.shared.uring.load(Ordering::Relaxed)
    }

    /// A reader asks for blocks `[start, end)`: follow its stream, and
    /// queue the next window once it has read past half of the last one,
    /// never at or past block `limit` (the end of what the reader's file
    /// holds on the device there: `Fs::read`'s bound; `u64::MAX` for none).
    ///
    /// A request at the start of its file (`file_start`) is taken for
    /// sequential at once, as the kernel's page cache takes a read at
    /// offset 0: a file read whole from the start would otherwise make
    /// its first four requests the reader's own device reads, one at a
    /// time (a quarter of a 4 MiB file). Bounded by `limit` as any other:
    /// a reader of only a file's head wastes at most four requests' worth
    /// of that file.
    pub fn note(&self, start: u64, end: u64, limit: u64, file_start: bool) {
        let Some((from, to)) = self.advance(start, end, limit, file_start) else {
            return;
        };
        debug_assert!(to <= limit, "readahead past its bound: {from}..{to}, limit {limit}");
        let to = to.min(self.shared.end_block);
        if from >= to {
            return;
        }
        self.start_workers();
        let mut q = lock(&self.shared.queue);
        let mut at = from;
        while at < to && q.len() < QUEUE_MAX {
            let n = (to - at).min(self.chunk_blocks);
            q.push_back((at, n));
            at += n;
        }
        drop(q);
        self.shared.queued.notify_all();
    }

    /// The stream table's part of `note`: the range to read ahead, if any,
    /// ending at `limit` at most. A stream held back by its limit has
    /// queued nothing past it: its next request (in the next file, say)
    /// reads ahead from there.
    fn advance(&self, start: u64, end: u64, limit: u64, file_start: bool) -> Option<(u64, u64)> {
        // Advice only: a reader never waits for the table (a reader
        // running at the same moment holds it for a few loads). Its
        // stream still moves on at its next request.
        let mut guard = match self.streams.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        let (streams, clock) = &mut *guard;
        *clock += 1;
        let found = streams
            .iter()
            .position(|s| s.next != 0 && start + SLACK_BLOCKS >= s.next && start <= s.next + SLACK_BLOCKS);
        let s = match found {
            Some(i) => {
                let s = &mut streams[i];
                s.hits = s.hits.saturating_add(1);
                s.next = s.next.max(end);
                s.ahead = s.ahead.max(s.next);
                s
            }
            None => {
                // A new stream (or a random read): nothing ahead yet; its
                // next request, if it continues this one, starts the
                // readahead. A file's first request starts it now.
                let victim = streams
                    .iter_mut()
                    .min_by_key(|s| s.used)
                    .expect("a table of streams");
                *victim = Stream {
                    next: end,
                    ahead: end,
                    used: *clock,
                    hits: if file_start { HITS_BEFORE_READAHEAD } else { 0 },
                    window: 0,
                };
                if !file_start {
                    return None;
                }
                victim
            }
        };
        s.used = *clock;
        if s.hits < HITS_BEFORE_READAHEAD || (s.window > 0 && s.ahead - s.next >= s.window / 2) {
            return None;
        }
        let window = if s.window == 0 {
            (4 * (end - start)).clamp(self.chunk_blocks, self.window_blocks)
        } else {
            (s.window * 2).min(self.window_blocks)
        };
        let from = s.ahead;
        // Whole chunks from `from` (the device reads best in them): up to
        // a chunk past the window, still within the cache's half.
        let to = from + (s.next + window).saturating_sub(from).next_multiple_of(self.chunk_blocks);
        let to = to.min(limit);
        if to <= from {
            // Nothing of the file left to read ahead: the window stays as
            // it was, for the stream's next file.
            return None;
        }
        s.window = window;
        s.ahead = to;
        Some((from, to))
    }

    fn start_workers(&self) {
        self.workers.get_or_init(|| {
            let threads = match self.mode {
                ReadaheadMode::Uring => 1,
                _ => WORKERS,
            };
            let uring = self.mode == ReadaheadMode::Uring;
            (0..threads)
                .filter_map(|i| {
                    let shared = self.shared.clone();
                    std::thread::Builder::new()
                        .name(format!("inkfs-ra{i}"))
                        .spawn(move || {
                            if !uring || !work_uring(&shared) {
                                work(&shared)
                            }
                        })
                        .ok()
                })
                .collect()
        });
    }
}

impl Drop for Readahead {
    fn drop(&mut self) {
        {
            // Under the queue's lock: a worker between its look at `stop`
            // and its wait would otherwise miss the wake-up and never
            // return (a crash-exploration run hung in this join).
            let _queue = lock(&self.shared.queue);
            self.shared.stop.store(true, Ordering::SeqCst);
        }
        self.shared.queued.notify_all();
        if let Some(workers) = self.workers.take() {
            for w in workers {
                let _ = w.join();
            }
        }
    }
}

/// The next job, waiting for one (None: stop). With `busy`, does not
/// wait: None when the queue is empty.
fn next_job(shared: &Shared, busy: bool) -> Option<(u64, u64)> {
    let mut q = lock(&shared.queue);
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return None;
        }
        if let Some(job) = q.pop_front() {
            return Some(job);
        }
        if busy {
            return None;
        }
        q = shared
            .queued
            .wait(q)
            .unwrap_or_else(|e| e.into_inner());
    }
}

/// The next run of blocks of job `[*at, end)` to read: claimed in the
/// cache (`stamps` filled), as (start, count); None when the job is done.
/// Blocks cached or being read by another read are skipped.
fn claim_run(shared: &Shared, at: &mut u64, end: u64, stamps: &mut [u64]) -> Option<(u64, usize)> {
    while *at < end {
        let b = *at;
        let claimed = shared
            .cache
            .begin_load(b, &mut stamps[..(end - b) as usize]);
        if claimed == 0 {
            *at += 1;
            continue;
        }
        *at += claimed as u64;
        return Some((b, claimed));
    }
    None
}

/// A run read (or not): into the cache, counted.
fn finish(shared: &Shared, start: u64, pages: Option<&[Page]>, stamps: &[u64]) {
    shared.cache.end_load(start, pages, stamps);
    if pages.is_some() {
        let bytes = stamps.len() as u64 * BLOCK_SIZE;
        shared.ahead_bytes.fetch_add(bytes, Ordering::Relaxed);
        shared.bytes_read.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// A worker thread: read each queued chunk's blocks that are neither
/// cached nor being read, into the cache, one read at a time.
fn work(shared: &Shared) {
    // One buffer per worker, for its life, on a huge page.
    let mut buf = HugeBuf::new(CHUNK_BLOCKS as usize);
    let mut stamps = [0u64; CHUNK_BLOCKS as usize];
    while let Some((start, n)) = next_job(shared, false) {
        let mut at = start;
        while let Some((b, claimed)) = claim_run(shared, &mut at, start + n, &mut stamps) {
            let pages = &mut buf.pages_mut()[..claimed];
            let read = shared
                .dev
                .read_at((b - DEV_BLOCK_BASE) * BLOCK_SIZE, pages);
            finish(shared, b, read.is_ok().then_some(&*pages), &stamps[..claimed]);
        }
    }
}

/// One read in flight through io_uring: its run and its buffer.
struct InFlight {
    start: u64,
    stamps: [u64; CHUNK_BLOCKS as usize],
    claimed: usize,
}

/// The io_uring worker: one thread keeping up to [`URING_DEPTH`] reads in
/// flight. False (nothing done) if io_uring or the device's descriptor is
/// not available; the caller then runs `work`.
fn work_uring(shared: &Shared) -> bool {
    use io_uring::{opcode, types, IoUring};
    let Some(fd) = shared.dev.shared_fd().map(|f| f.as_raw_fd()) else {
        return false;
    };
    let Ok(mut ring) = IoUring::new(URING_DEPTH as u32) else {
        return false;
    };
    shared.uring.store(true, Ordering::Relaxed);
    // One buffer per slot, for the thread's life; a slot's buffer is not
    // touched while its read is in flight, and the thread does not return
    // before every read has completed.
    let mut bufs: Vec<HugeBuf> = (0..URING_DEPTH)
        .map(|_| HugeBuf::new(CHUNK_BLOCKS as usize))
        .collect();
    let mut slots: Vec<Option<InFlight>> = (0..URING_DEPTH).map(|_| None).collect();
    let mut job: Option<(u64, u64)> = None;
    let mut in_flight = 0usize;
    let mut stopping = false;
    loop {
        // Fill the free slots.
        while !stopping && in_flight < URING_DEPTH {
            let (at, end) = match job.as_mut() {
                Some(j) => (&mut j.0, j.1),
                None => match next_job(shared, in_flight > 0) {
                    Some((start, n)) => {
                        job = Some((start, start + n));
                        continue;
                    }
                    None => {
                        stopping = shared.stop.load(Ordering::SeqCst);
                        break;
                    }
                },
            };
            let mut stamps = [0u64; CHUNK_BLOCKS as usize];
            let Some((start, claimed)) = claim_run(shared, at, end, &mut stamps) else {
                job = None;
                continue;
            };
            let Some(i) = slots.iter().position(|s| s.is_none()) else {
                // Cannot happen (in_flight < depth): give the claim back.
                finish(shared, start, None, &stamps[..claimed]);
                break;
            };
            let len = claimed as u64 * BLOCK_SIZE;
            let read = opcode::Read::new(types::Fd(fd), bufs[i].pages_mut().as_mut_ptr().cast::<u8>(), len as u32)
                .offset((start - DEV_BLOCK_BASE) * BLOCK_SIZE)
                .build()
                .user_data(i as u64);
            // SAFETY: the buffer (slot i's, `len` bytes of it) stays alive
            // and untouched until this read's completion is reaped below
            // (the loop never ends with reads in flight), and the device's
            // descriptor stays open while `shared.dev` lives.
            if unsafe { ring.submission().push(&read) }.is_err() {
                finish(shared, start, None, &stamps[..claimed]);
                break;
            }
            slots[i] = Some(InFlight {
                start,
                stamps,
                claimed,
            });
            in_flight += 1;
        }
        if in_flight == 0 {
            if stopping || shared.stop.load(Ordering::SeqCst) {
                return true;
            }
            continue;
        }
        if let Err(e) = ring.submit_and_wait(1) {
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            // The ring broke: wait for nothing more from it; the claims of
            // reads that may still complete stay until they are reaped
            // (never, then: the blocks are read by the readers instead).
            eprintln!("inkfs: readahead: io_uring: {e}");
            return true;
        }
        for c in ring.completion() {
            let (i, result) = (c.user_data() as usize, c.result());
            let Some(f) = slots.get_mut(i).and_then(Option::take) else {
                continue;
            };
            in_flight -= 1;
            let whole = result >= 0 && result as u64 == f.claimed as u64 * BLOCK_SIZE;
            let pages = &bufs[i].pages()[..f.claimed];
            finish(shared, f.start, whole.then_some(pages), &f.stamps[..f.claimed]);
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
        let ra = Readahead::new(dev, cache.clone(), 8192, Default::default(), ReadaheadMode::Threads)
            .unwrap();
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
            assert_eq!(ra.advance(req(i).0, req(i).1, u64::MAX, false), None, "request {i}");
        }
        // The fourth in a row: a chunk ahead (four requests' worth is less).
        assert_eq!(ra.chunk_blocks, CHUNK_BLOCKS);
        assert_eq!(ra.advance(req(3).0, req(3).1, u64::MAX, false), Some((req(4).0, req(4).0 + CHUNK_BLOCKS)));
        // Within the first half of that: nothing more, out of order by a
        // request or not.
        for i in [4, 6, 5, 7, 8, 9, 10, 11] {
            assert_eq!(ra.advance(req(i).0, req(i).1, u64::MAX, false), None, "request {i}");
        }
        // Past half: the window doubles, queued from where the last ended
        // in whole chunks (up to a chunk past the window).
        let whole = |i: u64, window: u64, (from, to): (u64, u64)| {
            assert_eq!((to - from) % CHUNK_BLOCKS, 0, "request {i}: {from}..{to}");
            assert!(to >= req(i).1 + window && to < req(i).1 + window + CHUNK_BLOCKS, "request {i}: {from}..{to}");
        };
        let r = ra.advance(req(12).0, req(12).1, u64::MAX, false).expect("request 12");
        assert_eq!(r.0, req(4).0 + CHUNK_BLOCKS);
        whole(12, 2 * CHUNK_BLOCKS, r);
        // Up to a quarter of the cache, where it stays.
        let mut queued = 0;
        for i in 13..200u64 {
            if let Some(r) = ra.advance(req(i).0, req(i).1, u64::MAX, false) {
                whole(i, w, r);
                queued += 1;
            }
        }
        assert!(queued > 3, "{queued}");
        // Random requests never start one (a fixed sequence over 1 GiB).
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = DEV_BLOCK_BASE + x % (1 << 18);
            assert_eq!(ra.advance(b, b + 32, u64::MAX, false), None, "random {i}");
        }
        // The workers fill the cache.
        let b1 = DEV_BLOCK_BASE + 5000;
        for i in 0..4 {
            ra.note(b1 + i * 32, b1 + i * 32 + 32, u64::MAX, false);
        }
        // A worker fills the cache, then counts the read: wait for the
        // count (the cache alone raced it under load), then the blocks
        // must be there.
        let last = b1 + 128 + CHUNK_BLOCKS - 1;
        crate::testkit::wait_until("a chunk read ahead", || ra.ahead_bytes() >= CHUNK_BLOCKS * BLOCK_SIZE);
        assert!(cache.contains(last));
        assert_eq!(ra.ahead_bytes(), CHUNK_BLOCKS * BLOCK_SIZE);
    }

    /// Both ways of reading ahead, on a real file (io_uring needs a
    /// descriptor): the blocks land in the cache with the file's bytes.
    #[test]
    fn threads_and_io_uring_read_ahead_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let blocks = 2048u64;
        let file = crate::blockdev::FileDev::create(&dir.path().join("d"), blocks * BLOCK_SIZE).unwrap();
        let mut pages = crate::blockdev::dev::pages(blocks as usize);
        for (i, p) in pages.iter_mut().enumerate() {
            p.0.fill((i % 251) as u8);
            p.0[..8].copy_from_slice(&(i as u64).to_le_bytes());
        }
        file.write_at(0, &pages).unwrap();
        let dev: Arc<dyn BlockDev> = Arc::new(file);
        for mode in [ReadaheadMode::Threads, ReadaheadMode::Uring] {
            let cache = Arc::new(DataCache::new(8 << 20));
            let ra = Readahead::new(dev.clone(), cache.clone(), blocks, Default::default(), mode).unwrap();
            let b0 = DEV_BLOCK_BASE;
            for i in 0..4 {
                ra.note(b0 + i * 32, b0 + i * 32 + 32, u64::MAX, false);
            }
            // A chunk ahead (the window: a quarter of the cache).
            let ahead = CHUNK_BLOCKS.min(512);
            crate::testkit::wait_until("a chunk read ahead", || ra.ahead_bytes() >= ahead * BLOCK_SIZE);
            assert_eq!(ra.ahead_bytes(), ahead * BLOCK_SIZE, "{mode:?}");
            assert_eq!(ra.uses_uring(), mode == ReadaheadMode::Uring);
            let mut out = [0u8; BLOCK_SIZE as usize];
            for b in 128..128 + ahead {
                assert!(cache.get(b0 + b, 0, &mut out), "{mode:?}: block {b}");
                assert_eq!(out[..8], b.to_le_bytes(), "{mode:?}: block {b}");
                assert!(out[8..].iter().all(|&x| x == (b % 251) as u8));
            }
            drop(ra); // the threads stop, with nothing in flight
        }
    }

    #[test]
    fn a_stream_is_read_ahead_up_to_its_limit_and_on_past_it_later() {
        let (ra, _cache) = readahead(4096);
        let b0 = DEV_BLOCK_BASE + 100;
        let req = |i: u64| (b0 + 32 * i, b0 + 32 * i + 32);
        // The file ends 40 blocks past the fourth request.
        let limit = req(3).1 + 40;
        for i in 0..3 {
            assert_eq!(ra.advance(req(i).0, req(i).1, limit, false), None);
        }
        assert_eq!(ra.advance(req(3).0, req(3).1, limit, false), Some((req(3).1, limit)));
        // Up to the limit already: nothing, however far the stream goes.
        assert_eq!(ra.advance(req(4).0, req(4).1, limit, false), None);
        assert_eq!(ra.advance(req(5).0, limit, limit, false), None);
        // The next file's blocks follow: read ahead from past its first
        // request on.
        let next = ra.advance(limit, limit + 32, u64::MAX, false).expect("the stream goes on");
        assert_eq!(next.0, limit + 32);
        assert!(next.1 > limit + 32);
        // A reader of a file whose end it is at queues nothing at all.
        let (ra, _cache) = readahead(4096);
        for i in 0..8 {
            assert_eq!(ra.advance(req(i).0, req(i).1, req(i).1, false), None, "request {i}");
        }
    }

    #[test]
    fn a_files_first_request_is_read_ahead_at_once() {
        let (ra, _cache) = readahead(4096);
        let b0 = DEV_BLOCK_BASE + 100;
        // A chunk, bounded by the file.
        assert_eq!(ra.advance(b0, b0 + 32, b0 + 1000, true), Some((b0 + 32, b0 + 32 + CHUNK_BLOCKS)));
        let (ra2, _cache) = readahead(4096);
        assert_eq!(ra2.advance(b0, b0 + 32, b0 + 300, true), Some((b0 + 32, b0 + 300)));
        // Its next request is the stream's; within the first half: nothing.
        assert_eq!(ra.advance(b0 + 32, b0 + 64, b0 + 1000, false), None);
        // A file no larger than its first request: nothing to read ahead.
        let b1 = DEV_BLOCK_BASE + 5000;
        assert_eq!(ra.advance(b1, b1 + 32, b1 + 32, true), None);
        // Not at the start of a file: a new stream waits for three more.
        let b2 = DEV_BLOCK_BASE + 9000;
        assert_eq!(ra.advance(b2, b2 + 32, u64::MAX, false), None);
    }

    /// A memory device that records the length of every read.
    #[derive(Debug)]
    struct Recording(MemDev, Mutex<Vec<usize>>);

    impl BlockDev for Recording {
        fn size_bytes(&self) -> u64 {
            self.0.size_bytes()
        }
        fn read_at(&self, off: u64, buf: &mut [Page]) -> std::io::Result<()> {
            lock(&self.1).push(buf.len());
            self.0.read_at(off, buf)
        }
        fn write_at(&self, off: u64, data: &[Page]) -> std::io::Result<()> {
            self.0.write_at(off, data)
        }
        fn flush(&self) -> std::io::Result<()> {
            self.0.flush()
        }
        fn describe(&self) -> String {
            "recording".into()
        }
    }

    /// The device sees readahead in reads of a whole chunk (2 MiB, one
    /// huge page), however small the reader's requests; a cache whose
    /// window is smaller reads its window in one read.
    #[test]
    fn readahead_reads_the_device_in_whole_chunks() {
        for (cache_pages, read_blocks) in [(16384u64, CHUNK_BLOCKS), (1024, 256)] {
            let dev = Arc::new(Recording(MemDev::new(8192 * BLOCK_SIZE), Mutex::new(Vec::new())));
            let cache = Arc::new(DataCache::new(cache_pages * BLOCK_SIZE));
            let ra = Readahead::new(dev.clone(), cache, 8192, Default::default(), ReadaheadMode::Threads).unwrap();
            let b0 = DEV_BLOCK_BASE;
            // A file read from its start in 128 KiB requests, up to 6 MiB.
            for i in 0..48 {
                ra.note(b0 + 32 * i, b0 + 32 * i + 32, u64::MAX, i == 0);
            }
            // At least three reads, then let any in flight finish.
            crate::testkit::wait_until("three reads ahead", || ra.ahead_bytes() >= 3 * read_blocks * BLOCK_SIZE);
            std::thread::sleep(std::time::Duration::from_millis(100));
            let reads = lock(&dev.1).clone();
            assert!(reads.len() >= 3, "{cache_pages}: {reads:?}");
            // Every read but those cut short by blocks already cached or
            // claimed (none here: one reader, read once) is a whole chunk.
            assert!(reads.iter().all(|&n| n as u64 == read_blocks), "{cache_pages}: {reads:?}");
        }
    }

    #[test]
    fn no_readahead_without_room_in_the_cache() {
        let dev = Arc::new(MemDev::new(64 * BLOCK_SIZE));
        let cache = Arc::new(DataCache::new(64 * BLOCK_SIZE));
        assert!(Readahead::new(dev, cache, 64, Default::default(), ReadaheadMode::Threads).is_none());
    }
}
