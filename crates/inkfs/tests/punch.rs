//! Hole punching, writes, truncates and unlinks leak no block (issue 17).
//!
//! Random workloads of write/append, punch (often past the end of file and
//! over more pages than the pool's lowest data block numbers), zero-range,
//! fallocate, truncate, unlink of open and closed files, and handles opened
//! and released around each operation as a FUSE client does, in every
//! mode. Checked against a byte model of every file, and for space:
//!
//! - the live allocator's free count equals what a recovery scan of the
//!   same image rebuilds from the logs (a block the DRAM allocator lost, or
//!   holds twice, shows as a difference) every few operations;
//! - after a clean unmount, fsck finds no problem and a remount restores
//!   the same free count and contents;
//! - crash images of a window of operations recover, pass fsck, and (in
//!   strict mode) show the files as they stood between two operations.
//!
//! A second test runs two threads on shared files, releasing handles while
//! the other thread writes, punches and truncates the same inodes.
//!
//! `INKFS_PUNCH_SEEDS` sets the number of seeds (default 24 for the model
//! test, 8 for the threaded one); `INKFS_PUNCH_SEED` the first one (a
//! failure names its seed and mode; run that seed alone to replay it).

use std::collections::BTreeMap;
use std::sync::Mutex;

use inkfs::fsck::{self, FsckOptions, Severity};
use inkfs::pmem::{Pmem, SimPool};
use inkfs::testkit::Rng;
use inkfs::types::*;
use inkfs::{FileHandle, Fs};

const PAGE: u64 = 4096;
/// Small: data block numbers stay below the page counts of large punches,
/// the case where the leak of issue 17 showed.
const POOL: u64 = 8 << 20;
const OPS: usize = 240;
const FILES: usize = 4;
const MODES: [Mode; 3] = [Mode::Strict, Mode::Sync, Mode::Posix];

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn seeds(default_count: u64) -> std::ops::Range<u64> {
    let first = env_u64("INKFS_PUNCH_SEED", 1);
    first..first + env_u64("INKFS_PUNCH_SEEDS", default_count)
}

fn opts(mode: Mode) -> MountOptions {
    MountOptions {
        mode,
        read_only: false,
        ..Default::default()
    }
}

fn fresh(mode: Mode) -> Fs<SimPool> {
    let pm = SimPool::new(POOL);
    Fs::format(
        &pm,
        &FormatOptions {
            lanes: 2,
            ..Default::default()
        },
    )
    .expect("format");
    Fs::mount(pm, opts(mode)).expect("mount a fresh pool")
}

/// fsck finds no error (`notes`: notes allowed, as on a crashed pool), or
/// no problem of any kind.
fn fsck_ok<P: Pmem>(pm: &P, notes: bool, what: &str) {
    let r = fsck::check(pm, &FsckOptions::default())
        .unwrap_or_else(|e| panic!("{what}: fsck failed to run: {e}"));
    let bad: Vec<String> = r
        .problems
        .iter()
        .filter(|p| !notes || p.severity == Severity::Error)
        .map(|p| p.to_string())
        .collect();
    assert!(bad.is_empty(), "{what}: fsck found {bad:#?}");
}

/// Free blocks a recovery scan of the live pool's current image finds
/// (every store made so far, as after a crash with all lines written back).
fn recovered_free(fs: &Fs<SimPool>) -> u64 {
    let img = fs.pmem().current_image();
    let rec = Fs::mount(SimPool::from_image(img), opts(fs.mode())).expect("recovery mount");
    assert!(
        !rec.mount_report().allocator_restored,
        "a live image must be scanned"
    );
    rec.statfs().blocks_free
}

/// The live allocator agrees with the logs. Only meaningful with no open
/// unlinked file (a recovery reclaims those).
fn assert_accounting(fs: &Fs<SimPool>, what: &str) {
    let live = fs.statfs().blocks_free;
    let scanned = recovered_free(fs);
    assert_eq!(
        live,
        scanned,
        "{what}: the live file system counts {live} free blocks, the logs say {scanned} \
         ({} lost)",
        scanned as i64 - live as i64
    );
}

// ---------------------------------------------------------------------------
// Single thread, against a byte model
// ---------------------------------------------------------------------------

struct File {
    ino: u64,
    /// Its name in the root while linked.
    name: Option<Vec<u8>>,
    data: Vec<u8>,
    handles: Vec<FileHandle>,
}

struct World {
    fs: Fs<SimPool>,
    files: Vec<File>,
    next_name: u64,
    rng: Rng,
    what: String,
}

/// Files by name with their contents: what a crash image must show.
type View = BTreeMap<Vec<u8>, Vec<u8>>;

fn read_all<P: Pmem>(fs: &Fs<P>, ino: u64) -> Vec<u8> {
    let fh = fs.open(ino).expect("open");
    let size = fs.fgetattr(&fh).expect("getattr").size as usize;
    let mut buf = vec![0u8; size];
    let n = fs.read(&fh, 0, &mut buf).expect("read");
    fs.release(fh);
    assert_eq!(n, size);
    buf
}

fn view_of<P: Pmem>(fs: &Fs<P>) -> View {
    let mut names = Vec::new();
    fs.readdir(1, 0, &mut |e| {
        if e.name != b"." && e.name != b".." {
            names.push((e.name, e.ino));
        }
        true
    })
    .expect("readdir");
    names
        .into_iter()
        .map(|(name, ino)| (name, read_all(fs, ino)))
        .collect()
}

impl World {
    fn new(mode: Mode, seed: u64) -> World {
        World {
            fs: fresh(mode),
            files: Vec::new(),
            next_name: 0,
            rng: Rng::new(seed),
            what: format!("seed {seed}, {mode:?}"),
        }
    }

    fn model_view(&self) -> View {
        self.files
            .iter()
            .filter_map(|f| f.name.clone().map(|n| (n, f.data.clone())))
            .collect()
    }

    fn orphans_open(&self) -> bool {
        self.files.iter().any(|f| f.name.is_none())
    }

    /// A handle on file `i`: one it holds, or one opened for this operation
    /// (released after it, as a FUSE client's open/op/close).
    fn with_handle(&mut self, i: usize, f: impl FnOnce(&Fs<SimPool>, &FileHandle)) {
        let held = !self.files[i].handles.is_empty() && self.rng.chance(50);
        if held {
            let k = self.rng.below(self.files[i].handles.len() as u64) as usize;
            f(&self.fs, &self.files[i].handles[k]);
        } else {
            let fh = self.fs.open(self.files[i].ino).expect("open");
            f(&self.fs, &fh);
            self.fs.release(fh);
        }
    }

    /// An offset: mostly inside the file or just past it, in pages or not.
    fn offset(&mut self, size: u64) -> u64 {
        let off = self.rng.below(size + (256 << 10));
        if self.rng.chance(40) {
            off / PAGE * PAGE
        } else {
            off
        }
    }

    /// A punch or zero-range length: short, up to 1 MiB as fsstress's, or
    /// far past the end of file (a hole entry of very many pages).
    fn clear_len(&mut self) -> u64 {
        match self.rng.below(10) {
            0..=3 => 1 + self.rng.below(4 * PAGE),
            4..=7 => 1 + self.rng.below(1 << 20),
            _ => 1 + self.rng.below(1 << 30),
        }
    }

    fn step(&mut self, op: usize) {
        let linked = self.files.iter().filter(|f| f.name.is_some()).count();
        let pick = self.rng.below(100);
        if self.files.is_empty() || (pick < 6 && linked < FILES) {
            return self.create();
        }
        let i = self.rng.below(self.files.len() as u64) as usize;
        let size = self.files[i].data.len() as u64;
        match pick {
            0..=5 => self.create(),
            6..=30 => {
                let off = if self.rng.chance(30) {
                    size
                } else {
                    self.offset(size)
                };
                let most = if self.rng.chance(80) {
                    16 << 10
                } else {
                    256 << 10
                };
                let len = 1 + self.rng.below(most);
                let byte = (op % 251) as u8 + 1;
                let buf = vec![byte; len as usize];
                self.with_handle(i, |fs, fh| {
                    fs.write(fh, off, &buf).expect("write");
                });
                let data = &mut self.files[i].data;
                let end = (off + len) as usize;
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[off as usize..end].fill(byte);
            }
            31..=58 => {
                let off = self.offset(size);
                let len = self.clear_len();
                let flags = FallocFlags {
                    keep_size: true,
                    punch_hole: true,
                    zero_range: false,
                    ..Default::default()
                };
                self.with_handle(i, |fs, fh| {
                    fs.fallocate(fh, off, len, flags).expect("punch");
                });
                let data = &mut self.files[i].data;
                let end = (off + len).min(data.len() as u64) as usize;
                if (off as usize) < end {
                    data[off as usize..end].fill(0);
                }
            }
            59..=66 => {
                let off = self.offset(size);
                let keep_size = self.rng.chance(50);
                // Zero-range allocates: bounded unless the size stays.
                let len = if keep_size {
                    self.clear_len()
                        .min((size + PAGE).saturating_sub(off).max(1))
                } else {
                    1 + self.rng.below(256 << 10)
                };
                let flags = FallocFlags {
                    keep_size,
                    punch_hole: false,
                    zero_range: true,
                    ..Default::default()
                };
                self.with_handle(i, |fs, fh| {
                    fs.fallocate(fh, off, len, flags).expect("zero range");
                });
                self.clear_model(i, off, len, keep_size);
            }
            67..=72 => {
                let off = self.offset(size);
                let len = 1 + self.rng.below(256 << 10);
                let keep_size = self.rng.chance(50);
                let flags = FallocFlags {
                    keep_size,
                    ..Default::default()
                };
                self.with_handle(i, |fs, fh| {
                    fs.fallocate(fh, off, len, flags).expect("fallocate");
                });
                if !keep_size {
                    let data = &mut self.files[i].data;
                    let end = (off + len) as usize;
                    if data.len() < end {
                        data.resize(end, 0);
                    }
                }
            }
            73..=82 => {
                let new = match self.rng.below(4) {
                    0 => 0,
                    1 => self.rng.below(size + 1),
                    2 => self.rng.below(size + 1) / PAGE * PAGE,
                    _ => size + self.rng.below(128 << 10),
                };
                let set = SetAttr {
                    size: Some(new),
                    ..Default::default()
                };
                if self.rng.chance(50) {
                    self.fs.setattr(self.files[i].ino, &set).expect("truncate");
                } else {
                    // ftruncate through a handle, as a FUSE SETATTR with fh.
                    let ino = self.files[i].ino;
                    self.with_handle(i, |fs, _| {
                        fs.setattr(ino, &set).expect("ftruncate");
                    });
                }
                self.files[i].data.resize(new as usize, 0);
            }
            83..=87 => {
                if self.files[i].handles.len() < 3 {
                    let fh = self.fs.open(self.files[i].ino).expect("open");
                    self.files[i].handles.push(fh);
                }
            }
            88..=93 => self.release_one(i),
            94..=97 => self.unlink(i),
            _ => {
                self.with_handle(i, |fs, fh| fs.fsync(fh, false).expect("fsync"));
            }
        }
    }

    fn clear_model(&mut self, i: usize, off: u64, len: u64, keep_size: bool) {
        let data = &mut self.files[i].data;
        let end = off + len;
        if !keep_size && (data.len() as u64) < end {
            data.resize(end as usize, 0);
        }
        let stop = end.min(data.len() as u64) as usize;
        if (off as usize) < stop {
            data[off as usize..stop].fill(0);
        }
    }

    fn create(&mut self) {
        let name = format!("f{}", self.next_name).into_bytes();
        self.next_name += 1;
        let (attr, fh) = self.fs.create(1, &name, 0o644, 0, 0).expect("create");
        let mut handles = Vec::new();
        if self.rng.chance(50) {
            handles.push(fh);
        } else {
            self.fs.release(fh);
        }
        self.files.push(File {
            ino: attr.ino,
            name: Some(name),
            data: Vec::new(),
            handles,
        });
    }

    /// Close one handle of file `i`; the last one of an unlinked file
    /// frees it.
    fn release_one(&mut self, i: usize) {
        if let Some(fh) = self.files[i].handles.pop() {
            self.fs.release(fh);
        }
        if self.files[i].name.is_none() && self.files[i].handles.is_empty() {
            self.files.remove(i);
        }
    }

    fn unlink(&mut self, i: usize) {
        let Some(name) = self.files[i].name.take() else {
            return self.release_one(i);
        };
        self.fs.unlink(1, &name).expect("unlink");
        if self.files[i].handles.is_empty() {
            self.files.remove(i);
        }
    }

    fn check_contents(&self, when: &str) {
        for f in &self.files {
            let got = read_all(&self.fs, f.ino);
            if got != f.data {
                let at = got
                    .iter()
                    .zip(&f.data)
                    .position(|(a, b)| a != b)
                    .unwrap_or(got.len().min(f.data.len()));
                panic!(
                    "{}, {when}: inode {} reads {} bytes, model {}; first difference at byte {at}",
                    self.what,
                    f.ino,
                    got.len(),
                    f.data.len()
                );
            }
        }
    }

    fn release_all(&mut self) {
        for f in &mut self.files {
            for fh in f.handles.drain(..) {
                self.fs.release(fh);
            }
        }
        self.files.retain(|f| f.name.is_some());
    }
}

/// Mount every crash image of `trace` (a few per fence): each passes fsck
/// (notes allowed), recovers, passes fsck again after a clean unmount with
/// nothing to note, remounts with the same free count, and in strict mode
/// shows one of `views` (the files between two operations of the window).
fn check_crash_images(trace: &inkfs::pmem::SimTrace, mode: Mode, views: &[View], what: &str) {
    for point in 0..=trace.fence_count() {
        for img in trace.crash_images(point, 4, point as u64) {
            let desc = format!("{what}: crash image {}", img.description);
            let pm = SimPool::from_image(img.image);
            fsck_ok(&pm, true, &desc);
            let fs = Fs::mount(pm, opts(mode))
                .unwrap_or_else(|e| panic!("{desc}: recovery failed: {e:?}"));
            let free = fs.statfs().blocks_free;
            if mode == Mode::Strict {
                let got = view_of(&fs);
                assert!(
                    views.contains(&got),
                    "{desc}: recovered files are no state between two operations"
                );
            }
            let pm = fs.unmount().expect("unmount after recovery");
            fsck_ok(&pm, false, &format!("{desc}, after recovery and unmount"));
            let fs = Fs::mount(pm, opts(mode)).expect("remount");
            assert!(fs.mount_report().allocator_restored, "{desc}");
            assert_eq!(
                fs.statfs().blocks_free,
                free,
                "{desc}: free count after remount"
            );
        }
    }
}

fn run_model(seed: u64, mode: Mode) {
    let mut w = World::new(mode, seed);
    // A window of operations traced for crash images, in the second half.
    let window_at = OPS / 2 + w.rng.below(OPS as u64 / 2 - 8) as usize;
    let mut window: Option<Vec<View>> = None;
    for op in 0..OPS {
        if op == window_at {
            w.fs.pmem().start_trace();
            window = Some(vec![w.model_view()]);
        }
        w.step(op);
        if let Some(views) = window.as_mut() {
            views.push(w.model_view());
            if views.len() == 5 {
                let trace = w.fs.pmem().stop_trace();
                let views = window.take().expect("window");
                check_crash_images(
                    &trace,
                    mode,
                    &views,
                    &format!("{}, ops {window_at}..", w.what),
                );
            }
        }
        if op % 20 == 19 {
            w.check_contents(&format!("after op {op}"));
            if !w.orphans_open() {
                assert_accounting(&w.fs, &format!("{}, after op {op}", w.what));
            }
        }
    }
    w.release_all();
    w.check_contents("at the end");
    assert_accounting(&w.fs, &format!("{}, at the end", w.what));
    let free = w.fs.statfs().blocks_free;
    let expect = w.model_view();
    let World { fs, what, .. } = w;
    let pm = fs.unmount().expect("unmount");
    fsck_ok(&pm, false, &format!("{what}: after a clean unmount"));
    let fs = Fs::mount(pm, opts(mode)).expect("remount");
    assert!(fs.mount_report().allocator_restored);
    assert_eq!(
        fs.statfs().blocks_free,
        free,
        "{what}: free count after remount"
    );
    assert_eq!(view_of(&fs), expect, "{what}: contents after remount");
}

#[test]
fn random_punch_write_truncate_unlink_leaks_nothing() {
    for seed in seeds(24) {
        for mode in MODES {
            run_model(seed, mode);
        }
    }
}

// ---------------------------------------------------------------------------
// Two threads on shared files: releases concurrent with writes
// ---------------------------------------------------------------------------

const SHARED: usize = 3;

/// One thread's operations on the shared files `inos` (never unlinked
/// here; each is opened, used and released, or held across operations and
/// released while the other thread works on the same inode).
fn churn(fs: &Fs<SimPool>, inos: &[u64], seed: u64, ops: usize) {
    let mut rng = Rng::new(seed);
    let mut held: Vec<FileHandle> = Vec::new();
    for _ in 0..ops {
        let ino = inos[rng.below(inos.len() as u64) as usize];
        let fh = fs.open(ino).expect("open");
        let size = fs.fgetattr(&fh).expect("getattr").size;
        let off = rng.below(size + (128 << 10));
        match rng.below(10) {
            0..=2 => {
                let len = 1 + rng.below(32 << 10);
                fs.write(&fh, off, &vec![0x5a; len as usize])
                    .expect("write");
            }
            3..=4 => {
                fs.append(&fh, &vec![0xa5; 1 + rng.below(16 << 10) as usize])
                    .expect("append");
            }
            5..=7 => {
                let most = if rng.chance(80) { 1 << 20 } else { 1 << 30 };
                let len = 1 + rng.below(most);
                let flags = FallocFlags {
                    keep_size: true,
                    punch_hole: true,
                    zero_range: false,
                    ..Default::default()
                };
                fs.fallocate(&fh, off, len, flags).expect("punch");
            }
            8 => {
                let set = SetAttr {
                    size: Some(rng.below(size + (64 << 10))),
                    ..Default::default()
                };
                fs.setattr(ino, &set).expect("truncate");
            }
            _ => {
                let flags = FallocFlags {
                    keep_size: rng.chance(50),
                    punch_hole: false,
                    zero_range: true,
                    ..Default::default()
                };
                let len = 1 + rng.below(64 << 10);
                fs.fallocate(&fh, off, len, flags).expect("zero range");
            }
        }
        if rng.chance(30) {
            held.push(fh);
        } else {
            fs.release(fh);
        }
        if held.len() > 2 || (!held.is_empty() && rng.chance(40)) {
            let k = rng.below(held.len() as u64) as usize;
            fs.release(held.swap_remove(k));
        }
    }
    for fh in held {
        fs.release(fh);
    }
}

#[test]
fn releases_concurrent_with_writes_and_punches_leak_nothing() {
    for seed in seeds(8) {
        for mode in MODES {
            let what = format!("seed {seed}, {mode:?}, two threads");
            let fs = fresh(mode);
            let inos: Vec<u64> = (0..SHARED)
                .map(|i| {
                    let (a, fh) = fs
                        .create(1, format!("s{i}").as_bytes(), 0o644, 0, 0)
                        .expect("create");
                    fs.release(fh);
                    a.ino
                })
                .collect();
            // A failing thread's panic message, reported by the test.
            let failed = Mutex::new(None);
            std::thread::scope(|s| {
                for t in 0..2u64 {
                    let (fs, inos, failed) = (&fs, &inos, &failed);
                    s.spawn(move || {
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            churn(fs, inos, seed * 2 + t, 150)
                        }));
                        if let Err(e) = r {
                            let msg = e
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
                            *failed.lock().unwrap() = Some(msg.unwrap_or_default());
                        }
                    });
                }
            });
            if let Some(msg) = failed.into_inner().unwrap() {
                panic!("{what}: a worker failed: {msg}");
            }
            assert_accounting(&fs, &what);
            let free = fs.statfs().blocks_free;
            let pm = fs.unmount().expect("unmount");
            fsck_ok(&pm, false, &format!("{what}: after a clean unmount"));
            let fs = Fs::mount(pm, opts(mode)).expect("remount");
            assert_eq!(
                fs.statfs().blocks_free,
                free,
                "{what}: free count after remount"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Punches far past the end of file
// ---------------------------------------------------------------------------

/// A punch logs hole entries only over the pages it unmaps: one of 1 TiB
/// past the end of a file cut into one-page extents (a page table in
/// DRAM), and one up to the largest file size past the end of a short
/// file, add at most one log page and run no log GC; punches over the
/// same ranges from inside the files read, recover and check as expected.
/// (Each hole entry covers at most 4 GiB: the 64 TiB punch logged 16,384
/// of them, 1 MiB of log, and a 1 TiB one over a page table walked 2^28
/// slots.)
#[test]
fn a_punch_far_past_the_end_logs_only_what_it_unmaps() {
    let fs = fresh(Mode::Strict);
    let punch = FallocFlags {
        keep_size: true,
        punch_hole: true,
        zero_range: false,
        ..Default::default()
    };
    let pages = 512u64;
    let (a, t) = fs.create(1, b"t", 0o644, 0, 0).expect("create");
    let mut model = vec![1u8; (pages * PAGE) as usize];
    fs.write(&t, 0, &model).expect("write");
    let mut rng = Rng::new(7);
    for i in 0..2 * pages {
        let p = rng.below(pages);
        let byte = (i % 250) as u8 + 2;
        fs.write(&t, p * PAGE, &[byte; PAGE as usize])
            .expect("overwrite");
        model[(p * PAGE) as usize..((p + 1) * PAGE) as usize].fill(byte);
    }
    assert_eq!(
        fs.file_index(a.ino).expect("index").0,
        inkfs::filemap::IndexKind::PageTable
    );
    // Past the end (as fsstress's punches often are): nothing to unmap,
    // so no hole entry; a SET_ATTR at most. (Compaction would hide a long
    // append: it must not have run either.)
    let quiet = |fh: &FileHandle, ino: u64, off: u64, len: u64, what: &str| {
        let (before, gc) = (fs.log_pages(ino).expect("log"), fs.gc_stats());
        fs.fallocate(fh, off, len, punch).expect("punch");
        let after = fs.log_pages(ino).expect("log");
        assert_eq!(fs.gc_stats(), gc, "{what} ran log GC");
        assert!(
            after <= before + 1,
            "{what} took the log from {before} to {after} pages"
        );
    };
    quiet(
        &t,
        a.ino,
        pages * PAGE,
        1 << 40,
        "a 1 TiB punch past a page table's end",
    );
    let half = pages / 2 * PAGE;
    fs.fallocate(&t, half, 1 << 40, punch).expect("punch 1 TiB");
    model[half as usize..].fill(0);

    let (b, u) = fs.create(1, b"u", 0o644, 0, 0).expect("create");
    fs.write(&u, 0, &[9u8; 65536]).expect("write");
    let max = inkfs::format::MAX_FILE_BYTES;
    quiet(
        &u,
        b.ino,
        65536,
        max - 65536,
        "a punch to the largest size past the end",
    );
    fs.fallocate(&u, 0, max, punch).expect("punch everything");
    fs.release(t);
    fs.release(u);

    let expect: View = [(b"t".to_vec(), model), (b"u".to_vec(), vec![0u8; 65536])].into();
    assert_eq!(view_of(&fs), expect);
    assert_accounting(&fs, "far punches");
    let img = fs.pmem().current_image();
    let rec = Fs::mount(SimPool::from_image(img), opts(Mode::Strict)).expect("recovery");
    assert_eq!(view_of(&rec), expect, "after recovery");
    let pm = fs.unmount().expect("unmount");
    fsck_ok(&pm, false, "far punches");
}
