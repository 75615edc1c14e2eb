//! The crash simulator: a [`Pmem`] that records what a power cut could leave.
//!
//! Model (x86 with ADR, FIELD-NOTES "crash model"):
//! - A cached store (`write`, `write_u64`) makes a new *version* of every
//!   line it touches. The line may be evicted at any moment, so after a
//!   crash it holds its durable content or any version it passed through.
//! - `flush` snapshots the line's latest version; the next `fence` makes
//!   that snapshot durable. Stores after the flush keep the line pending.
//! - `copy_nt`/`zero_nt` need no flush: the new version is durable at the
//!   next fence, and before it the line is old or new.
//! - 8-byte aligned stores are atomic: a line's content is always a whole
//!   version. By default a version is taken per store call and line; with
//!   [`SimPool::set_torn_stores`] one is taken per 8-byte word, so multi-word
//!   stores can also tear (which real hardware allows).
//!
//! A simulated pool may carry a block device behind it ([`SimDevice`], a
//! hybrid pool's data device): its bytes follow the pool's in the same
//! image, so a crash image holds both sides at one instant. A device write
//! is a cached store never written back by the engine's flushes: each of
//! its lines may persist or not, in any order, until the device's own
//! flush makes every pending device line durable (and is a crash point,
//! as a fence is). `sync_all`, the pool's clean-shutdown flush, leaves the
//! device alone.
//!
//! A crash image is the durable image plus, for each pending line, one of
//! its possible contents. Memory is the pool image (twice) plus one 64-byte
//! version per store and line still pending; a trace adds one start image
//! and its event log, never a copy per fence.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{BackendInfo, BackendKind, FlushMethod, Pmem, CACHE_LINE};
use crate::testkit::Rng;

const LINE_BYTES: usize = CACHE_LINE as usize;
type Line = [u8; LINE_BYTES];

/// Bound on the versions kept per pending line. A line stored to more often
/// without a flush (an engine bug, or a hot word) loses middle versions:
/// fewer intermediate states are explored, but never a state that could not
/// occur.
const MAX_VERSIONS_PER_LINE: usize = 64;

// ------------------------------------------------------------ line model

/// A line written since it was last durable.
#[derive(Clone, Debug, Default)]
struct PendingLine {
    /// Contents the line passed through since it was last durable, oldest
    /// first; the last one is the current content.
    versions: Vec<Line>,
    /// How many of `versions` a write-back issued since the last fence
    /// covers: `versions[flushed - 1]` becomes durable at the next fence.
    /// 0: no write-back pending.
    flushed: usize,
}

impl PendingLine {
    /// Forget one intermediate version, keeping the latest and the one a
    /// pending write-back will make durable.
    fn drop_middle_version(&mut self) {
        let mut victim = self.versions.len() / 2;
        if self.flushed == victim + 1 {
            victim -= 1;
        }
        self.versions.remove(victim);
        if victim < self.flushed {
            self.flushed -= 1;
        }
    }
}

/// What is durable, and what each pending line may still become.
#[derive(Clone, Debug)]
struct Media {
    /// Shared with crash-image iterators; copied on write only if one is
    /// still alive when a fence changes it.
    durable: Arc<Vec<u8>>,
    pending: HashMap<u64, PendingLine>,
    /// Lines with a write-back waiting for the next fence.
    flushed: Vec<u64>,
}

impl Media {
    fn new(durable: Vec<u8>) -> Media {
        Media {
            durable: Arc::new(durable),
            pending: HashMap::new(),
            flushed: Vec::new(),
        }
    }

    /// Line `line` now holds `content` (a store or a non-temporal store).
    fn store(&mut self, line: u64, content: &Line, non_temporal: bool) {
        let p = self.pending.entry(line).or_default();
        p.versions.push(*content);
        if p.versions.len() > MAX_VERSIONS_PER_LINE {
            p.drop_middle_version();
        }
        if non_temporal {
            // Streamed data bypasses the cache: it is as if written back at
            // once, durable at the next fence.
            self.flush(line);
        }
    }

    /// Write back `line`; false when it has nothing pending.
    fn flush(&mut self, line: u64) -> bool {
        let Some(p) = self.pending.get_mut(&line) else {
            return false;
        };
        if p.flushed == 0 {
            self.flushed.push(line);
        }
        p.flushed = p.versions.len();
        true
    }

    /// Every write-back issued so far becomes durable.
    fn fence(&mut self) {
        self.fence_from(0);
    }

    /// The write-backs issued so far of lines at or after `first_line`
    /// become durable (a device flush: the pool's lines, written back but
    /// not fenced, stay as they are).
    fn fence_from(&mut self, first_line: u64) {
        if self.flushed.is_empty() {
            return;
        }
        let (done, keep): (Vec<u64>, Vec<u64>) =
            self.flushed.drain(..).partition(|&l| l >= first_line);
        self.flushed = keep;
        let durable = Arc::make_mut(&mut self.durable);
        for line in done {
            let Some(p) = self.pending.get_mut(&line) else {
                unreachable!("flushed line {line} is not pending");
            };
            let start = line as usize * LINE_BYTES;
            durable[start..start + LINE_BYTES].copy_from_slice(&p.versions[p.flushed - 1]);
            p.versions.drain(..p.flushed);
            p.flushed = 0;
            if p.versions.is_empty() {
                self.pending.remove(&line);
            }
        }
    }

    fn pending_sorted(&self) -> Vec<u64> {
        let mut lines: Vec<u64> = self.pending.keys().copied().collect();
        lines.sort_unstable();
        lines
    }

    /// The durable image and every pending line's versions, for crash images.
    fn crash_base(&self) -> CrashBase {
        let pending = self
            .pending_sorted()
            .into_iter()
            .map(|line| (line, self.pending[&line].versions.clone()))
            .collect();
        CrashBase {
            durable: Arc::clone(&self.durable),
            pending,
        }
    }
}

// ------------------------------------------------------------- the pool

/// One recorded step of a trace.
#[derive(Clone, Copy, Debug)]
enum Event {
    /// `line` took content `contents[content]`.
    Store {
        line: u64,
        content: usize,
        non_temporal: bool,
    },
    Flush {
        line: u64,
    },
    Fence,
    /// A device flush: lines from `first_line` on become durable.
    DeviceFlush {
        first_line: u64,
    },
}

/// A trace being recorded.
struct Recorder {
    start: Media,
    events: Vec<Event>,
    contents: Vec<Line>,
    /// Index in `events` of each fence.
    fence_events: Vec<usize>,
}

struct SimState {
    /// What loads see (all stores): the pool, then the device's bytes.
    current: Vec<u8>,
    /// The device's first line (the pool's line count).
    dev_first_line: u64,
    media: Media,
    fences: u64,
    torn_stores: bool,
    trace: Option<Recorder>,
}

/// An in-memory pool that knows which bytes are durable.
pub struct SimPool {
    size_bytes: u64,
    dev_bytes: u64,
    state: Arc<Mutex<SimState>>,
    /// This handle's kill switch ([`SimPool::kill_after_stores`]): stores
    /// it may still make, [`ALIVE`] when off, [`DEAD`] once it fired.
    kill_left: AtomicU64,
}

/// [`SimPool::kill_after_stores`] is off.
const ALIVE: u64 = u64::MAX;
/// The handle's process was killed: its stores, flushes and fences no
/// longer reach the media.
const DEAD: u64 = u64::MAX - 1;

/// The payload a handle unwinds with when its kill switch fires
/// ([`SimPool::kill_after_stores`]).
#[derive(Debug)]
pub struct Killed;

/// The block device behind a [`SimPool`] (see the module documentation):
/// a hybrid pool's data device under the crash model of
/// `blockdev::BlockDev`.
pub struct SimDevice {
    pool_bytes: u64,
    dev_bytes: u64,
    state: Arc<Mutex<SimState>>,
}

impl std::fmt::Debug for SimDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimDevice({} bytes)", self.dev_bytes)
    }
}

impl SimPool {
    /// A second handle on this pool's simulated memory, as another
    /// process maps the same pool (a client of the kernel-free path): its
    /// stores, flushes and fences go to the same media and the same trace.
    pub fn share(&self) -> SimPool {
        SimPool {
            size_bytes: self.size_bytes,
            dev_bytes: self.dev_bytes,
            state: self.state.clone(),
            kill_left: AtomicU64::new(ALIVE),
        }
    }

    /// Kill this handle's process after its next `stores` stores (a
    /// client SIGKILLed at any instruction, docs/CRASHTEST.md "A client
    /// killed"): the store, flush or fence after them unwinds with
    /// [`Killed`] instead (`std::panic::resume_unwind`: no panic hook, no
    /// message), and from then on this handle's stores, flushes and fences
    /// are dropped (what its destructors would do never happens). Other
    /// handles of the pool are unaffected; what the killed one stored
    /// stays as a store left it (visible, durable only if written back and
    /// fenced).
    pub fn kill_after_stores(&self, stores: u64) {
        debug_assert!(stores < DEAD);
        self.kill_left
            .store(stores.min(DEAD - 1), Ordering::Relaxed);
    }

    /// Kill this handle's process now, between two of its calls: from
    /// now on its stores, flushes and fences are dropped.
    pub fn kill(&self) {
        self.kill_left.store(DEAD, Ordering::Relaxed);
    }

    /// Whether this handle's kill switch fired.
    pub fn killed(&self) -> bool {
        self.kill_left.load(Ordering::Relaxed) == DEAD
    }

    /// Before a store (`store`) or a flush or fence of this handle: false
    /// if it must be dropped (the process is dead); unwinds when the kill
    /// switch fires now.
    fn alive(&self, store: bool) -> bool {
        match self.kill_left.load(Ordering::Relaxed) {
            ALIVE => true,
            DEAD => false,
            0 => {
                self.kill_left.store(DEAD, Ordering::Relaxed);
                std::panic::resume_unwind(Box::new(Killed))
            }
            left => {
                if store {
                    self.kill_left.store(left - 1, Ordering::Relaxed);
                }
                true
            }
        }
    }

    /// A zero-filled pool, all of it durable. `size_bytes` must be a
    /// multiple of the cache line.
    pub fn new(size_bytes: u64) -> SimPool {
        let len = usize::try_from(size_bytes).expect("simulated pool larger than memory");
        SimPool::from_image(vec![0; len])
    }

    /// A pool holding `image`, all of it durable (e.g. a crash image, to
    /// run recovery on).
    pub fn from_image(image: Vec<u8>) -> SimPool {
        let n = image.len() as u64;
        SimPool::from_combined(image, n)
    }

    /// A pool of `pool_image` with a simulated block device holding
    /// `dev_image` behind it, all durable.
    pub fn with_device(pool_image: Vec<u8>, dev_image: &[u8]) -> SimPool {
        let n = pool_image.len() as u64;
        let mut image = pool_image;
        image.extend_from_slice(dev_image);
        SimPool::from_combined(image, n)
    }

    /// A pool whose first `pool_bytes` bytes of `image` are the pool and
    /// the rest its device (a crash image of a pool with a device).
    pub fn from_combined(image: Vec<u8>, pool_bytes: u64) -> SimPool {
        assert!(
            image.len() & (LINE_BYTES - 1) == 0 && pool_bytes.is_multiple_of(CACHE_LINE),
            "simulated pool size {} is not a multiple of the cache line",
            image.len()
        );
        assert!(pool_bytes <= image.len() as u64);
        SimPool {
            size_bytes: pool_bytes,
            dev_bytes: image.len() as u64 - pool_bytes,
            state: Arc::new(Mutex::new(SimState {
                current: image.clone(),
                dev_first_line: pool_bytes / CACHE_LINE,
                media: Media::new(image),
                fences: 0,
                torn_stores: false,
                trace: None,
            })),
            kill_left: AtomicU64::new(ALIVE),
        }
    }

    /// The block device behind the pool, if it has one (bytes on it are
    /// in every image after the pool's).
    pub fn device(&self) -> Option<Arc<SimDevice>> {
        (self.dev_bytes > 0).then(|| {
            Arc::new(SimDevice {
                pool_bytes: self.size_bytes,
                dev_bytes: self.dev_bytes,
                state: Arc::clone(&self.state),
            })
        })
    }

    /// Bytes of the device behind the pool (0: none).
    pub fn device_bytes(&self) -> u64 {
        self.dev_bytes
    }

    /// Record a version after every 8-byte word of a store instead of one
    /// per store call, so crash images also contain torn multi-word stores
    /// (aligned 8-byte words stay atomic).
    pub fn set_torn_stores(&self, on: bool) {
        self.lock().torn_stores = on;
    }

    /// What a clean shutdown leaves: every store (the device's bytes
    /// follow the pool's, if it has one).
    pub fn current_image(&self) -> Vec<u8> {
        self.lock().current.clone()
    }

    /// Only what is certainly durable.
    pub fn persisted_image(&self) -> Vec<u8> {
        self.lock().media.durable.as_ref().clone()
    }

    /// Fences since creation (`sync_all` counts as one).
    pub fn fence_count(&self) -> u64 {
        self.lock().fences
    }

    /// Lines that a crash now could leave in more than one state.
    pub fn pending_lines_now(&self) -> usize {
        self.lock().media.pending.len()
    }

    /// The images a crash right now could leave (see [`SimTrace::crash_images`]).
    pub fn crash_images_now(&self, max_images: usize, seed: u64) -> CrashImages {
        let state = self.lock();
        CrashImages::new(
            state.media.crash_base(),
            state.fences as usize,
            max_images,
            seed,
        )
    }

    /// Start recording from the current state, pending lines included.
    /// Restarts the recording if one is running.
    pub fn start_trace(&self) {
        let mut state = self.lock();
        state.trace = Some(Recorder {
            start: state.media.clone(),
            events: Vec::new(),
            contents: Vec::new(),
            fence_events: Vec::new(),
        });
    }

    /// Stop recording and return the trace (an empty one starting now if
    /// no recording was running).
    pub fn stop_trace(&self) -> SimTrace {
        let mut state = self.lock();
        let recorder = state.trace.take().unwrap_or_else(|| Recorder {
            start: state.media.clone(),
            events: Vec::new(),
            contents: Vec::new(),
            fence_events: Vec::new(),
        });
        SimTrace {
            start: recorder.start,
            events: recorder.events,
            contents: recorder.contents,
            fence_events: recorder.fence_events,
            cache: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SimState> {
        lock_state(&self.state)
    }

    fn check(&self, off: u64, len: u64) {
        assert!(
            off.checked_add(len)
                .is_some_and(|end| end <= self.size_bytes),
            "pmem access out of range: off {off} len {len} size {}",
            self.size_bytes
        );
    }
}

fn lock_state(state: &Mutex<SimState>) -> MutexGuard<'_, SimState> {
    // A test that panicked while holding the lock left a consistent state
    // (every mutation completes under the lock): keep going.
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl SimState {
    /// Store `data` at `off`, one version per line touched (per word when
    /// tearing).
    fn store(&mut self, off: u64, data: &[u8], non_temporal: bool) {
        let piece_max = if self.torn_stores { 8 } else { LINE_BYTES };
        let mut done = 0;
        while done < data.len() {
            let at = off as usize + done;
            let n = (piece_max - at % piece_max).min(data.len() - done);
            self.current[at..at + n].copy_from_slice(&data[done..done + n]);
            self.record_version((at / LINE_BYTES) as u64, non_temporal);
            done += n;
        }
    }

    /// The current content of `line` is a new version.
    fn record_version(&mut self, line: u64, non_temporal: bool) {
        let start = line as usize * LINE_BYTES;
        let mut content = [0u8; LINE_BYTES];
        content.copy_from_slice(&self.current[start..start + LINE_BYTES]);
        self.media.store(line, &content, non_temporal);
        if let Some(trace) = &mut self.trace {
            trace.events.push(Event::Store {
                line,
                content: trace.contents.len(),
                non_temporal,
            });
            trace.contents.push(content);
        }
    }

    fn flush(&mut self, line: u64) {
        if self.media.flush(line) {
            if let Some(trace) = &mut self.trace {
                trace.events.push(Event::Flush { line });
            }
        }
    }

    fn fence(&mut self) {
        self.media.fence();
        self.fences += 1;
        if let Some(trace) = &mut self.trace {
            trace.fence_events.push(trace.events.len());
            trace.events.push(Event::Fence);
        }
    }

    /// A device flush: every pending device line written back and made
    /// durable; a crash point like a fence (counted among the fences).
    fn device_flush(&mut self) {
        let first = self.dev_first_line;
        let lines: Vec<u64> = self
            .media
            .pending_sorted()
            .into_iter()
            .filter(|&l| l >= first)
            .collect();
        for line in lines {
            self.flush(line);
        }
        self.media.fence_from(first);
        self.fences += 1;
        if let Some(trace) = &mut self.trace {
            trace.fence_events.push(trace.events.len());
            trace.events.push(Event::DeviceFlush { first_line: first });
        }
    }
}

impl Pmem for SimPool {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn info(&self) -> BackendInfo {
        BackendInfo {
            kind: BackendKind::Simulated,
            flush: FlushMethod::None,
            size_bytes: self.size_bytes,
        }
    }

    fn read(&self, off: u64, buf: &mut [u8]) {
        self.check(off, buf.len() as u64);
        let state = self.lock();
        buf.copy_from_slice(&state.current[off as usize..off as usize + buf.len()]);
    }

    fn read_u64(&self, off: u64) -> u64 {
        assert!(off & 7 == 0, "unaligned read_u64 at {off}");
        let mut bytes = [0u8; 8];
        self.read(off, &mut bytes);
        u64::from_le_bytes(bytes)
    }

    fn write(&self, off: u64, data: &[u8]) {
        self.check(off, data.len() as u64);
        if self.alive(true) {
            self.lock().store(off, data, false);
        }
    }

    fn write_u64(&self, off: u64, value: u64) {
        assert!(off & 7 == 0, "unaligned write_u64 at {off}");
        self.write(off, &value.to_le_bytes());
    }

    fn copy_nt(&self, off: u64, data: &[u8]) {
        self.check(off, data.len() as u64);
        if self.alive(true) {
            self.lock().store(off, data, true);
        }
    }

    fn zero_nt(&self, off: u64, len: u64) {
        static ZEROS: [u8; 4096] = [0; 4096];
        self.check(off, len);
        if !self.alive(true) {
            return;
        }
        let mut state = self.lock();
        let mut done = 0;
        while done < len {
            let n = (len - done).min(ZEROS.len() as u64);
            state.store(off + done, &ZEROS[..n as usize], true);
            done += n;
        }
    }

    fn flush(&self, off: u64, len: u64) {
        self.check(off, len);
        if len == 0 || !self.alive(false) {
            return;
        }
        let mut state = self.lock();
        for line in off / CACHE_LINE..=(off + len - 1) / CACHE_LINE {
            state.flush(line);
        }
    }

    fn fence(&self) {
        if self.alive(false) {
            self.lock().fence();
        }
    }

    /// Like msync + fence: every pending line of the pool (not of its
    /// device) is written back, then fenced.
    fn sync_all(&self) -> std::io::Result<()> {
        if !self.alive(false) {
            return Ok(());
        }
        let mut state = self.lock();
        let first_dev = state.dev_first_line;
        for line in state.media.pending_sorted() {
            if line < first_dev {
                state.flush(line);
            }
        }
        state.fence();
        Ok(())
    }
}

impl SimDevice {
    fn check(&self, off: u64, len: u64) -> std::io::Result<()> {
        match off.checked_add(len) {
            Some(end) if end <= self.dev_bytes && off.is_multiple_of(crate::format::BLOCK_SIZE) => {
                Ok(())
            }
            _ => Err(std::io::Error::from_raw_os_error(libc::EIO)),
        }
    }
}

impl crate::blockdev::BlockDev for SimDevice {
    fn size_bytes(&self) -> u64 {
        self.dev_bytes
    }

    fn read_at(&self, off: u64, buf: &mut [crate::blockdev::Page]) -> std::io::Result<()> {
        let out = crate::blockdev::dev::as_bytes_mut(buf);
        self.check(off, out.len() as u64)?;
        let at = (self.pool_bytes + off) as usize;
        out.copy_from_slice(&lock_state(&self.state).current[at..at + out.len()]);
        Ok(())
    }

    /// A cached store of every line: pending until `flush`.
    fn write_at(&self, off: u64, data: &[crate::blockdev::Page]) -> std::io::Result<()> {
        let data = crate::blockdev::dev::as_bytes(data);
        self.check(off, data.len() as u64)?;
        lock_state(&self.state).store(self.pool_bytes + off, data, false);
        Ok(())
    }

    fn flush(&self) -> std::io::Result<()> {
        lock_state(&self.state).device_flush();
        Ok(())
    }

    fn describe(&self) -> String {
        "crash simulator device".into()
    }
}

// ----------------------------------------------------------------- traces

/// A recording of stores, flushes and fences, from which the crash images
/// at every fence can be rebuilt.
pub struct SimTrace {
    start: Media,
    events: Vec<Event>,
    contents: Vec<Line>,
    fence_events: Vec<usize>,
    /// The media replayed up to some event, so that walking the crash
    /// points in order replays each event once.
    cache: Mutex<Option<(usize, Media)>>,
}

impl SimTrace {
    /// Fences recorded.
    pub fn fence_count(&self) -> usize {
        self.fence_events.len()
    }

    /// The images a crash at `point` could leave. Point k < fence_count() is
    /// just before the trace's k-th fence (0-based); fence_count() is the
    /// end of the trace.
    ///
    /// Exhaustive when the pending lines allow at most `max_images` images;
    /// otherwise `max_images` samples drawn from `seed`, the first two being
    /// the extremes (no pending line persisted, every one at its latest).
    /// `max_images` is taken as at least 2.
    pub fn crash_images(&self, point: usize, max_images: usize, seed: u64) -> CrashImages {
        let base = self.with_media_at(point, Media::crash_base);
        CrashImages::new(base, point, max_images, seed)
    }

    /// Image `index` of `crash_images(point, max_images, seed)`, rebuilt on
    /// its own to reproduce a failure.
    pub fn crash_image(
        &self,
        point: usize,
        max_images: usize,
        seed: u64,
        index: u64,
    ) -> CrashImage {
        let images = self.crash_images(point, max_images, seed);
        assert!(
            index < images.plan.total,
            "crash image {index} of {} requested",
            images.plan.total
        );
        images.base.image(&images.plan, index)
    }

    /// Lines pending (possibly not durable) at `point`.
    pub fn pending_lines(&self, point: usize) -> usize {
        self.with_media_at(point, |media| media.pending.len())
    }

    /// Run `f` on the media as they were at `point`.
    fn with_media_at<T>(&self, point: usize, f: impl FnOnce(&Media) -> T) -> T {
        assert!(
            point <= self.fence_count(),
            "crash point {point} beyond the trace's {} fences",
            self.fence_count()
        );
        let end = self
            .fence_events
            .get(point)
            .copied()
            .unwrap_or(self.events.len());
        let mut cache = self
            .cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (mut applied, mut media) = match cache.take() {
            Some((applied, media)) if applied <= end => (applied, media),
            _ => (0, self.start.clone()),
        };
        for event in &self.events[applied..end] {
            match *event {
                Event::Store {
                    line,
                    content,
                    non_temporal,
                } => media.store(line, &self.contents[content], non_temporal),
                Event::Flush { line } => {
                    media.flush(line);
                }
                Event::Fence => media.fence(),
                Event::DeviceFlush { first_line } => media.fence_from(first_line),
            }
        }
        applied = end;
        let result = f(&media);
        *cache = Some((applied, media));
        result
    }
}

// ----------------------------------------------------------- crash images

/// One image a power cut could leave.
#[derive(Clone, Debug)]
pub struct CrashImage {
    pub image: Vec<u8>,
    pub seed: u64,
    pub index: u64,
    /// e.g. "point 3, 5 pending lines, image 17 of 32 (exhaustive, seed 0x2a)".
    pub description: String,
}

/// The durable image at a crash point and each pending line's versions.
struct CrashBase {
    durable: Arc<Vec<u8>>,
    /// Sorted by line, so image numbering is deterministic.
    pending: Vec<(u64, Vec<Line>)>,
}

/// How the images of one crash point are numbered.
#[derive(Clone, Copy, Debug)]
struct Plan {
    point: usize,
    seed: u64,
    total: u64,
    exhaustive: bool,
}

/// The crash images of one point (see [`SimTrace::crash_images`]).
pub struct CrashImages {
    base: CrashBase,
    plan: Plan,
    next: u64,
}

impl CrashImages {
    fn new(base: CrashBase, point: usize, max_images: usize, seed: u64) -> CrashImages {
        let max_images = max_images.max(2) as u64;
        // Each line is either untouched (its durable content) or one of its
        // versions.
        let combinations = base
            .pending
            .iter()
            .try_fold(1u64, |product, (_, versions)| {
                product.checked_mul(versions.len() as u64 + 1)
            });
        let (total, exhaustive) = match combinations {
            Some(n) if n <= max_images => (n, true),
            _ => (max_images, false),
        };
        CrashImages {
            base,
            plan: Plan {
                point,
                seed,
                total,
                exhaustive,
            },
            next: 0,
        }
    }

    /// Images this iterator yields in all.
    pub fn total(&self) -> u64 {
        self.plan.total
    }

    /// Whether the images are every possible one (not a sample).
    pub fn is_exhaustive(&self) -> bool {
        self.plan.exhaustive
    }

    /// Lines pending at this crash point.
    pub fn pending_lines(&self) -> usize {
        self.base.pending.len()
    }
}

impl Iterator for CrashImages {
    type Item = CrashImage;

    fn next(&mut self) -> Option<CrashImage> {
        if self.next >= self.plan.total {
            return None;
        }
        let image = self.base.image(&self.plan, self.next);
        self.next += 1;
        Some(image)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.plan.total - self.next) as usize;
        (left, Some(left))
    }
}

impl ExactSizeIterator for CrashImages {}

impl CrashBase {
    fn image(&self, plan: &Plan, index: u64) -> CrashImage {
        let mut image = self.durable.as_ref().clone();
        let mut choose = Chooser::new(plan, index);
        for (line, versions) in &self.pending {
            // 0: the line never got written back; k: it holds version k.
            let choice = choose.next(versions.len());
            if choice > 0 {
                let start = *line as usize * LINE_BYTES;
                image[start..start + LINE_BYTES].copy_from_slice(&versions[choice - 1]);
            }
        }
        let kind = if plan.exhaustive {
            "exhaustive"
        } else {
            "sampled"
        };
        CrashImage {
            image,
            seed: plan.seed,
            index,
            description: format!(
                "point {}, {} pending lines, image {index} of {} ({kind}, seed {:#x})",
                plan.point,
                self.pending.len(),
                plan.total,
                plan.seed
            ),
        }
    }
}

/// Picks each pending line's state for one image number.
enum Chooser {
    /// Image number read as a mixed-radix number, one digit per line.
    Exhaustive { rest: u64 },
    /// Nothing pending persisted.
    Oldest,
    /// Every pending line at its latest version.
    Latest,
    /// Each line persisted with probability 1/2, then a uniform version.
    Random(Rng),
}

impl Chooser {
    fn new(plan: &Plan, index: u64) -> Chooser {
        match (plan.exhaustive, index) {
            (true, rest) => Chooser::Exhaustive { rest },
            (false, 0) => Chooser::Oldest,
            (false, 1) => Chooser::Latest,
            (false, _) => Chooser::Random(image_rng(plan.seed, plan.point, index)),
        }
    }

    /// The state (0..=versions) of the next line.
    fn next(&mut self, versions: usize) -> usize {
        match self {
            Chooser::Exhaustive { rest } => {
                let radix = versions as u64 + 1;
                let digit = *rest % radix;
                *rest /= radix;
                digit as usize
            }
            Chooser::Oldest => 0,
            Chooser::Latest => versions,
            Chooser::Random(rng) => {
                if rng.next_u64() & 1 == 0 {
                    0
                } else {
                    1 + (rng.next_u64() % versions as u64) as usize
                }
            }
        }
    }
}

/// The generator that picks which lines image `index` of crash point
/// `point` persisted: SplitMix64 (tiny, fast, and good enough here), its
/// seed mixed from the run's seed, the point and the image number, so the
/// same seed gives the same images on every machine.
fn image_rng(seed: u64, point: usize, index: u64) -> Rng {
    let a = Rng::new(seed).next_u64();
    let b = Rng::new(a ^ (point as u64).wrapping_mul(0xD1B5_4A32_D192_ED03)).next_u64();
    Rng::new(b ^ index.wrapping_mul(0x8CB9_2BA7_2F3D_8DD7))
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOL_BYTES: u64 = 64 * 1024;

    fn word(image: &[u8], off: u64) -> u64 {
        let off = off as usize;
        u64::from_le_bytes(image[off..off + 8].try_into().expect("8 bytes"))
    }

    /// The values the u64 at `off` takes across the images.
    fn values(images: CrashImages, off: u64) -> Vec<u64> {
        let mut seen: Vec<u64> = images.map(|c| word(&c.image, off)).collect();
        seen.sort_unstable();
        seen.dedup();
        seen
    }

    #[test]
    fn flushed_and_fenced_store_survives_every_image() {
        let pool = SimPool::new(POOL_BYTES);
        pool.start_trace();
        pool.write_u64(128, 7);
        pool.persist(128, 8);
        pool.write_u64(4096, 9); // pending, to make several images
        pool.write_u64(8192, 9);
        let trace = pool.stop_trace();
        assert_eq!(trace.fence_count(), 1);
        assert_eq!(values(trace.crash_images(0, 100, 1), 128), vec![0, 7]);
        assert_eq!(values(trace.crash_images(1, 100, 1), 128), vec![7]);
        assert_eq!(trace.crash_images(1, 100, 1).count(), 4);
        assert_eq!(word(&pool.persisted_image(), 128), 7);
    }

    #[test]
    fn unflushed_store_may_or_may_not_persist() {
        let pool = SimPool::new(POOL_BYTES);
        pool.write_u64(64, 5);
        pool.fence();
        assert_eq!(values(pool.crash_images_now(100, 0), 64), vec![0, 5]);
        assert_eq!(word(&pool.persisted_image(), 64), 0);
        assert_eq!(word(&pool.current_image(), 64), 5);
    }

    #[test]
    fn flushed_but_unfenced_store_may_or_may_not_persist() {
        let pool = SimPool::new(POOL_BYTES);
        pool.start_trace();
        pool.write_u64(64, 5);
        pool.flush(64, 8);
        let trace = pool.stop_trace();
        assert_eq!(values(trace.crash_images(0, 100, 0), 64), vec![0, 5]);
        pool.fence();
        assert_eq!(values(pool.crash_images_now(100, 0), 64), vec![5]);
    }

    #[test]
    fn non_temporal_copy_is_durable_at_the_fence_without_flush() {
        let pool = SimPool::new(POOL_BYTES);
        let page = [0x5au8; 4096];
        pool.copy_nt(4096, &page);
        let before = pool.crash_images_now(64, 3);
        assert!(!before.is_exhaustive()); // 64 lines: 2^64 subsets
        let firsts: Vec<u8> = before.map(|c| c.image[4096]).collect();
        assert!(firsts.contains(&0) && firsts.contains(&0x5a));
        pool.fence();
        assert_eq!(pool.pending_lines_now(), 0);
        for crash in pool.crash_images_now(16, 3) {
            assert!(crash.image[4096..8192].iter().all(|&b| b == 0x5a));
        }
        pool.zero_nt(4096 + 10, 100);
        pool.fence();
        let durable = pool.persisted_image();
        assert!(durable[4106..4206].iter().all(|&b| b == 0));
        assert_eq!(durable[4105], 0x5a);
        assert_eq!(durable[4206], 0x5a);
    }

    #[test]
    fn aligned_u64_never_tears() {
        let pool = SimPool::new(POOL_BYTES);
        pool.set_torn_stores(true);
        let written = [u64::MAX, 0x1111_1111_1111_1111, 0x2222_2222_2222_2222];
        for value in written {
            pool.write_u64(256, value);
        }
        // A 64-byte store torn at word granularity, around the word.
        pool.write(192, &[0x33u8; 64]);
        for crash in pool.crash_images_now(1 << 16, 9) {
            let value = word(&crash.image, 256);
            assert!(value == 0 || written.contains(&value), "torn: {value:#x}");
            for off in (192..256).step_by(8) {
                let value = word(&crash.image, off);
                assert!(
                    value == 0 || value == 0x3333_3333_3333_3333,
                    "torn: {value:#x}"
                );
            }
        }
    }

    #[test]
    fn torn_stores_expose_partial_multi_word_writes() {
        let pool = SimPool::new(POOL_BYTES);
        pool.set_torn_stores(true);
        pool.write(0, &[0xffu8; 16]);
        let images: Vec<(u64, u64)> = pool
            .crash_images_now(100, 0)
            .map(|c| (word(&c.image, 0), word(&c.image, 8)))
            .collect();
        assert!(images.contains(&(u64::MAX, 0)), "first word alone");
        assert!(images.contains(&(u64::MAX, u64::MAX)));
        assert!(images.contains(&(0, 0)));
        // Without tearing, a store within a line is one version.
        let pool = SimPool::new(POOL_BYTES);
        pool.write(0, &[0xffu8; 16]);
        assert_eq!(pool.crash_images_now(100, 0).count(), 2);
    }

    #[test]
    fn exhaustive_count_is_two_to_the_pending_lines() {
        let pool = SimPool::new(POOL_BYTES);
        for line in 0..6u64 {
            pool.write_u64(line * 64 * 3, line + 1);
        }
        let images = pool.crash_images_now(64, 0);
        assert!(images.is_exhaustive());
        assert_eq!(images.pending_lines(), 6);
        let all: Vec<Vec<u8>> = images.map(|c| c.image).collect();
        assert_eq!(all.len(), 64);
        let mut distinct = all.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 64);
        // One fewer allowed: sampled instead, extremes first.
        let sampled: Vec<CrashImage> = pool.crash_images_now(63, 0).collect();
        assert_eq!(sampled.len(), 63);
        assert_eq!(sampled[0].image, pool.persisted_image());
        assert_eq!(sampled[1].image, pool.current_image());
    }

    #[test]
    fn sampling_is_reproducible_from_the_seed() {
        let pool = SimPool::new(POOL_BYTES);
        pool.start_trace();
        for i in 0..40u64 {
            pool.write_u64(i * 64, i + 1);
        }
        pool.fence();
        let trace = pool.stop_trace();
        let a: Vec<CrashImage> = trace.crash_images(0, 20, 42).collect();
        let b: Vec<CrashImage> = trace.crash_images(0, 20, 42).collect();
        let c: Vec<CrashImage> = trace.crash_images(0, 20, 43).collect();
        assert_eq!(a.len(), 20);
        assert!(a.iter().zip(&b).all(|(x, y)| x.image == y.image));
        assert!(a.iter().zip(&c).skip(2).any(|(x, y)| x.image != y.image));
        for (i, expect) in a.iter().enumerate() {
            let again = trace.crash_image(0, 20, 42, i as u64);
            assert_eq!(again.image, expect.image);
            assert_eq!(again.description, expect.description);
        }
        assert!(a[7]
            .description
            .contains("point 0, 40 pending lines, image 7 of 20 (sampled, seed 0x2a)"));
    }

    #[test]
    fn store_after_flush_before_fence_keeps_line_pending() {
        let pool = SimPool::new(POOL_BYTES);
        pool.write_u64(0, 1);
        pool.flush(0, 8);
        pool.write_u64(8, 2); // same line, after the flush
        pool.fence();
        assert_eq!(pool.pending_lines_now(), 1);
        let durable = pool.persisted_image();
        assert_eq!((word(&durable, 0), word(&durable, 8)), (1, 0));
        let seen: Vec<(u64, u64)> = pool
            .crash_images_now(100, 0)
            .map(|c| (word(&c.image, 0), word(&c.image, 8)))
            .collect();
        assert_eq!(seen, vec![(1, 0), (1, 2)]);
        pool.persist(0, 64);
        assert_eq!(pool.pending_lines_now(), 0);
    }

    #[test]
    fn sync_all_makes_everything_durable() {
        let pool = SimPool::new(POOL_BYTES);
        pool.write(100, &[9u8; 1000]);
        pool.copy_nt(5000, &[8u8; 300]);
        pool.sync_all().expect("sync_all");
        assert_eq!(pool.pending_lines_now(), 0);
        assert_eq!(pool.persisted_image(), pool.current_image());
        assert_eq!(pool.fence_count(), 1);
    }

    #[test]
    fn a_hot_line_keeps_a_bounded_history() {
        let pool = SimPool::new(POOL_BYTES);
        pool.write_u64(0, 1);
        pool.flush(0, 8);
        for i in 2..1000u64 {
            pool.write_u64(0, i);
        }
        let images = pool.crash_images_now(1000, 0);
        assert_eq!(images.total(), MAX_VERSIONS_PER_LINE as u64 + 1);
        pool.fence();
        assert_eq!(
            word(&pool.persisted_image(), 0),
            1,
            "the flushed version survives the cap"
        );
        assert_eq!(word(&pool.current_image(), 0), 999);
    }

    /// Replaying a trace gives, at every point, the durable and current
    /// images the live pool had there (the two extreme crash images).
    #[test]
    fn trace_replay_matches_the_live_pool() {
        let pool = SimPool::new(POOL_BYTES);
        pool.write_u64(0, 77); // pending before the trace starts
        pool.start_trace();
        let mut rng = Rng::new(12345);
        let mut expected = Vec::new();
        for _ in 0..3000 {
            let off = rng.next_u64() % (POOL_BYTES - 512);
            match rng.next_u64() % 6 {
                0 => pool.write(off, &[rng.next_u64() as u8; 100]),
                1 => pool.write_u64(off & !7, rng.next_u64()),
                2 => pool.copy_nt(off, &[rng.next_u64() as u8; 300]),
                3 => pool.flush(off, rng.next_u64() % 512),
                4 => {
                    expected.push((pool.persisted_image(), pool.current_image()));
                    pool.fence();
                }
                _ => pool.zero_nt(off, 200),
            }
        }
        expected.push((pool.persisted_image(), pool.current_image()));
        let trace = pool.stop_trace();
        assert_eq!(trace.fence_count() + 1, expected.len());
        let check = |point: usize| {
            let (durable, current) = &expected[point];
            let extremes: Vec<CrashImage> = trace.crash_images(point, 2, 0).take(2).collect();
            let oldest = &extremes[0].image;
            let latest = extremes.get(1).map_or(oldest, |c| &c.image);
            assert!(oldest == durable, "durable image differs at point {point}");
            assert!(latest == current, "current image differs at point {point}");
        };
        for point in 0..expected.len() {
            check(point);
        }
        // Random access backwards restarts the replay.
        check(3);
        check(expected.len() / 2);
        check(0);
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn out_of_range_store_panics() {
        SimPool::new(POOL_BYTES).write(POOL_BYTES - 4, &[0; 8]);
    }

    #[test]
    fn info_says_simulated() {
        let info = SimPool::new(POOL_BYTES).info();
        assert_eq!(info.kind, BackendKind::Simulated);
        assert_eq!(info.flush, FlushMethod::None);
        assert_eq!(info.size_bytes, POOL_BYTES);
    }
}
