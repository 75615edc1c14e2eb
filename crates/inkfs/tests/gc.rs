//! Log GC (compaction): logs stay bounded under overwrite, attribute, xattr
//! and directory churn; space comes back; contents survive clean and crash
//! remounts; and a crash anywhere inside a compaction shows the operation
//! that triggered it entirely or not at all.
//!
//! Deterministic from a seed printed at the start (`INKFS_GC_SEED` to
//! replay); `INKFS_GC_OPS` sets the number of overwrites of the long run.

use std::collections::BTreeMap;
use std::path::PathBuf;

mod common;

use inkfs::filemap::IndexKind;
use inkfs::pmem::{MappedPool, Pmem, PoolOpenOptions, SimPool};
use inkfs::testkit::Rng;
use inkfs::types::*;
use inkfs::Fs;

const PAGE: u64 = 4096;

fn seed() -> u64 {
    // Every fast GC drop set is replay-checked; tests assert no refusal.
    inkfs::gc::always_check_drops(true);
    let s = std::env::var("INKFS_GC_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("gc test seed: {s} (INKFS_GC_SEED={s} to replay)");
    s
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn strict() -> MountOptions {
    MountOptions {
        mode: Mode::Strict,
        read_only: false,
        ..Default::default()
    }
}

/// A pool file in /dev/shm, removed on drop unless the test failed.
struct ShmPool {
    path: PathBuf,
}
impl ShmPool {
    fn new(tag: &str, size: u64) -> (ShmPool, MappedPool) {
        let path = PathBuf::from(format!(
            "/dev/shm/inkfs-test-{tag}-{}.pool",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let pm = MappedPool::open(
            &path,
            &PoolOpenOptions {
                create_size_bytes: Some(size),
                read_only: false,
            },
        )
        .expect("create pool");
        (ShmPool { path }, pm)
    }
    fn open(&self) -> MappedPool {
        MappedPool::open(&self.path, &PoolOpenOptions::default()).expect("open pool")
    }
}
impl Drop for ShmPool {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("pool kept for inspection: {}", self.path.display());
        } else {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn read_all<P: Pmem>(fs: &Fs<P>, ino: u64) -> Vec<u8> {
    let fh = fs.open(ino).unwrap();
    let size = fs.fgetattr(&fh).unwrap().size as usize;
    let mut buf = vec![0u8; size + 1];
    let n = fs.read(&fh, 0, &mut buf).unwrap();
    fs.release(fh);
    buf.truncate(n);
    buf
}

fn list<P: Pmem>(fs: &Fs<P>, dir: u64) -> BTreeMap<Vec<u8>, u64> {
    let mut out = BTreeMap::new();
    fs.readdir(dir, 0, &mut |e| {
        if e.name != b"." && e.name != b".." {
            out.insert(e.name, e.ino);
        }
        true
    })
    .unwrap();
    out
}

/// Everything the long run checks after a remount.
#[derive(Debug, PartialEq)]
struct Snapshot {
    big: Vec<u8>,
    meta_attr: (u32, u32, u32, i64),
    meta_xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    churn: BTreeMap<Vec<u8>, Vec<u8>>,
    blocks_free: u64,
    files_used: u64,
}

fn snapshot<P: Pmem>(fs: &Fs<P>) -> Snapshot {
    let big = fs.lookup(1, b"big").unwrap().ino;
    let meta = fs.lookup(1, b"meta").unwrap();
    let mut meta_xattrs = BTreeMap::new();
    for name in fs.listxattr(meta.ino).unwrap() {
        let v = fs.getxattr(meta.ino, &name).unwrap();
        meta_xattrs.insert(name, v);
    }
    let churn_dir = fs.lookup(1, b"churn").unwrap().ino;
    let churn = list(fs, churn_dir)
        .into_iter()
        .map(|(name, ino)| (name, read_all(fs, ino)))
        .collect();
    let st = fs.statfs();
    Snapshot {
        big: read_all(fs, big),
        meta_attr: (meta.mode, meta.uid, meta.gid, meta.mtime_ns),
        meta_xattrs,
        churn,
        blocks_free: st.blocks_free,
        files_used: st.files - st.files_free,
    }
}

fn max_log_pages<P: Pmem>(fs: &Fs<P>, max: &mut [u64; 4], inos: [u64; 4]) {
    for (m, ino) in max.iter_mut().zip(inos) {
        *m = (*m).max(fs.log_pages(ino).unwrap());
    }
}

/// 50k random 4 KiB overwrites of a 1 MiB file, with setattr/xattr churn
/// on another inode and create/unlink churn in one directory: every log
/// stays a few pages long, and all space comes back.
#[test]
fn overwrite_churn_keeps_logs_bounded_and_space_returns() {
    let seed = seed();
    let mut rng = Rng::new(seed);
    let ops = env_u64("INKFS_GC_OPS", 50_000);
    let (pool, pm) = ShmPool::new("gc-churn", 64 << 20);
    Fs::format(
        &pm,
        &FormatOptions {
            lanes: 4,
            ..Default::default()
        },
    )
    .unwrap();
    let fs = Fs::mount(pm, strict()).unwrap();
    let free0 = fs.statfs().blocks_free;
    let root_pages0 = fs.log_pages(1).unwrap();

    const BIG: usize = 1 << 20;
    let mut big = vec![0u8; BIG];
    rng.fill(&mut big);
    let (a, bfh) = fs.create(1, b"big", 0o644, 0, 0).unwrap();
    let big_ino = a.ino;
    fs.write(&bfh, 0, &big).unwrap();
    let (m, mfh) = fs.create(1, b"meta", 0o600, 0, 0).unwrap();
    let meta_ino = m.ino;
    fs.release(mfh);
    let churn_ino = fs.mkdir(1, b"churn", 0o755, 0, 0).unwrap().ino;
    let mut churn_live: Vec<Vec<u8>> = Vec::new();
    let mut churn_next = 0u64;
    let mut xattrs: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();

    let mut max = [0u64; 4];
    let inos = [big_ino, meta_ino, churn_ino, 1];
    let mut buf = vec![0u8; PAGE as usize];
    for i in 0..ops {
        // A random 4 KiB overwrite: page-aligned three times in four.
        let off = if rng.below(4) == 0 {
            rng.below(BIG as u64 - PAGE)
        } else {
            rng.below(BIG as u64 / PAGE) * PAGE
        };
        rng.fill(&mut buf);
        fs.write(&bfh, off, &buf).unwrap();
        big[off as usize..off as usize + PAGE as usize].copy_from_slice(&buf);
        match i % 10 {
            0 => {
                fs.setattr(
                    meta_ino,
                    &SetAttr {
                        mode: Some(0o600 | (rng.below(0o100) as u32)),
                        mtime: Some(TimeSet::At(rng.below(1 << 40) as i64)),
                        ..Default::default()
                    },
                )
                .unwrap();
            }
            3 => {
                let name = format!("user.k{}", rng.below(6)).into_bytes();
                if rng.below(3) == 0 && xattrs.contains_key(&name) {
                    fs.removexattr(meta_ino, &name).unwrap();
                    xattrs.remove(&name);
                } else {
                    let mut v = vec![0u8; 1 + rng.below(100) as usize];
                    rng.fill(&mut v);
                    fs.setxattr(meta_ino, &name, &v, XattrFlags::Any).unwrap();
                    xattrs.insert(name, v);
                }
            }
            5 | 8 => {
                let name = format!("c{churn_next}").into_bytes();
                churn_next += 1;
                let (_, fh) = fs.create(churn_ino, &name, 0o644, 0, 0).unwrap();
                fs.write(&fh, 0, &name).unwrap();
                fs.release(fh);
                churn_live.push(name);
                if churn_live.len() > 8 {
                    let victim = churn_live.remove(rng.below(churn_live.len() as u64) as usize);
                    fs.unlink(churn_ino, &victim).unwrap();
                }
            }
            _ => {}
        }
        if i % 97 == 0 {
            max_log_pages(&fs, &mut max, inos);
        }
    }
    max_log_pages(&fs, &mut max, inos);
    fs.release(bfh);
    eprintln!(
        "max log pages after {ops} overwrites: big {}, meta {}, churn dir {}, root {}; {:?}",
        max[0],
        max[1],
        max[2],
        max[3],
        fs.gc_stats()
    );
    // Without compaction the big file's log alone would hold one entry
    // per overwrite (63 per page): ~800 pages for 50k.
    assert_eq!(fs.gc_stats().fast_refused, 0, "seed {seed}");
    assert!(max[0] <= 16, "big file log grew to {} pages", max[0]);
    assert!(max[1] <= 4, "setattr/xattr log grew to {} pages", max[1]);
    assert!(max[2] <= 4, "churn directory log grew to {} pages", max[2]);
    assert!(max[3] <= 2, "root log grew to {} pages", max[3]);

    let before = snapshot(&fs);
    assert_eq!(before.big, big, "seed {seed}");
    assert_eq!(before.meta_xattrs, xattrs, "seed {seed}");
    assert_eq!(before.churn.len(), churn_live.len());

    // Crash remount (no unmount): recovery's recount of free space must
    // match what the running file system believed.
    drop(fs);
    let fs = Fs::mount(pool.open(), strict()).unwrap();
    assert!(!fs.mount_report().was_clean);
    assert!(!fs.mount_report().allocator_restored);
    assert_eq!(snapshot(&fs), before, "after crash remount, seed {seed}");
    for ino in inos {
        assert!(fs.log_pages(ino).unwrap() <= 16);
    }
    // Clean remount: allocator restored, everything identical.
    fs.unmount().unwrap();
    let fs = Fs::mount(pool.open(), strict()).unwrap();
    assert!(fs.mount_report().was_clean);
    assert!(fs.mount_report().allocator_restored);
    assert_eq!(snapshot(&fs), before, "after clean remount, seed {seed}");

    // Delete everything: space returns to within a few blocks (the root
    // directory's log may have grown a page or two).
    for name in list(&fs, churn_ino).keys() {
        fs.unlink(churn_ino, name).unwrap();
    }
    fs.rmdir(1, b"churn").unwrap();
    fs.unlink(1, b"big").unwrap();
    fs.unlink(1, b"meta").unwrap();
    let root_growth = fs.log_pages(1).unwrap() - root_pages0;
    let free_end = fs.statfs().blocks_free;
    eprintln!("blocks free: before {free0}, after deleting everything {free_end}");
    assert_eq!(free0 - free_end, root_growth, "seed {seed}");
    assert!(free0 - free_end <= 3, "seed {seed}");
    // And a recount agrees.
    drop(fs);
    let fs = Fs::mount(pool.open(), strict()).unwrap();
    assert_eq!(fs.statfs().blocks_free, free_end);
    let pm = fs.unmount().unwrap();
    fsck_clean(&pm, "after the churn run");
}

/// `inkfs::fsck` finds no problem (`notes`: notes allowed, as on a
/// crashed pool).
fn fsck_clean<P: Pmem>(pm: &P, what: &str) {
    fsck_check(pm, what, false)
}

fn fsck_check<P: Pmem>(pm: &P, what: &str, notes: bool) {
    let r = inkfs::fsck::check(pm, &inkfs::fsck::FsckOptions::default())
        .unwrap_or_else(|e| panic!("{what}: fsck failed: {e}"));
    let bad: Vec<String> = r
        .problems
        .iter()
        .filter(|p| !notes || p.severity == inkfs::fsck::Severity::Error)
        .map(|p| p.to_string())
        .collect();
    assert!(bad.is_empty(), "{what}: fsck found {bad:#?}");
}

// ---------------------------------------------------------------------------
// Crash inside a compaction (crash simulator)
// ---------------------------------------------------------------------------

/// The file `f` a crash test starts from.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Start {
    /// 6 pages and a bit, written at once: one extent.
    Small,
    /// `FRAGMENTED_PAGES` pages cut by random one-page overwrites until its
    /// DRAM index is a page table (strict mode's steady state under random
    /// writes).
    Fragmented,
}

const FRAGMENTED_PAGES: u64 = 1024;

fn sim_fs(start: Start) -> Fs<SimPool> {
    match start {
        Start::Small => common::fresh(Mode::Strict, 4 << 20),
        Start::Fragmented => common::fresh(Mode::Strict, 12 << 20),
    }
}

/// Random one-page overwrites of `f` until its index is a page table.
fn fragment(fs: &Fs<SimPool>, rng: &mut Rng) {
    let ino = fs.lookup(1, b"f").unwrap().ino;
    let fh = fs.open(ino).unwrap();
    let mut page = vec![0u8; PAGE as usize];
    for _ in 0..4 * FRAGMENTED_PAGES {
        if fs.file_index(ino).unwrap().0 == IndexKind::PageTable {
            break;
        }
        rng.fill(&mut page);
        fs.write(&fh, rng.below(FRAGMENTED_PAGES) * PAGE, &page)
            .unwrap();
    }
    fs.release(fh);
    let (kind, extents) = fs.file_index(ino).unwrap();
    assert_eq!(kind, IndexKind::PageTable, "{extents} extents");
}

/// What a crash image must show: the state before or after the operation.
#[derive(Clone, Debug, PartialEq)]
struct View {
    file: Vec<u8>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    mode: u32,
    dir: BTreeMap<Vec<u8>, Vec<u8>>,
}

fn view<P: Pmem>(fs: &Fs<P>) -> View {
    let f = fs.lookup(1, b"f").unwrap();
    let mut xattrs = BTreeMap::new();
    for name in fs.listxattr(f.ino).unwrap() {
        xattrs.insert(name.clone(), fs.getxattr(f.ino, &name).unwrap());
    }
    let d = fs.lookup(1, b"d").unwrap().ino;
    View {
        file: read_all(fs, f.ino),
        xattrs,
        mode: f.mode,
        dir: list(fs, d)
            .into_iter()
            .map(|(n, ino)| (n, read_all(fs, ino)))
            .collect(),
    }
}

/// Fill an inode's log with ~5 pages of live entries (300 xattrs), so it is
/// too live to compact and GC of later churn is fast GC's.
fn live_prefix<P: Pmem>(fs: &Fs<P>, ino: u64) {
    for i in 0..300u32 {
        let name = format!("user.live{i:03}").into_bytes();
        fs.setxattr(ino, &name, &i.to_le_bytes(), XattrFlags::Create)
            .unwrap();
    }
}

/// Which GC a crash test waits for.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Gc {
    /// Fast GC unlinked pages, and no compaction ran in the same operation.
    Fast,
    /// A compaction ran.
    Thorough,
}

/// Run `op` repeatedly (each with a trace) until one runs GC of `kind`;
/// then mount every crash image of that operation and require the before
/// or the after state.
fn crash_during_gc(what: &str, seed: u64, kind: Gc, op: impl FnMut(&Fs<SimPool>, &mut Rng)) {
    crash_during_gc_from(Start::Small, what, seed, kind, op)
}

fn crash_during_gc_from(
    start: Start,
    what: &str,
    seed: u64,
    kind: Gc,
    mut op: impl FnMut(&Fs<SimPool>, &mut Rng),
) {
    let fs = sim_fs(start);
    let (_, fh) = fs.create(1, b"f", 0o644, 0, 0).unwrap();
    let init_bytes = match start {
        Start::Small => 6 * PAGE as usize + 100,
        Start::Fragmented => (FRAGMENTED_PAGES * PAGE) as usize,
    };
    let mut init = vec![0u8; init_bytes];
    let mut rng = Rng::new(seed);
    rng.fill(&mut init);
    fs.write(&fh, 0, &init).unwrap();
    fs.release(fh);
    if start == Start::Fragmented {
        fragment(&fs, &mut rng);
    }
    fs.mkdir(1, b"d", 0o755, 0, 0).unwrap();
    if kind == Gc::Fast {
        live_prefix(&fs, fs.lookup(1, b"f").unwrap().ino);
    }
    let mut collected = None;
    for i in 0..5000 {
        let gc0 = fs.gc_stats();
        let before = view(&fs);
        fs.pmem().start_trace();
        op(&fs, &mut rng);
        let trace = fs.pmem().stop_trace();
        let gc1 = fs.gc_stats();
        let ran = match kind {
            Gc::Fast => {
                gc1.fast_pages_freed > gc0.fast_pages_freed && gc1.compactions == gc0.compactions
            }
            Gc::Thorough => gc1.compactions > gc0.compactions,
        };
        // An operation that changed nothing visible (a truncate to the
        // same size) cannot tell the before state from the after.
        let after = view(&fs);
        if ran && after != before {
            collected = Some((i, before, after, trace));
            break;
        }
    }
    assert_eq!(fs.gc_stats().fast_refused, 0, "{what}: seed {seed}");
    let (i, before, after, trace) = collected.unwrap_or_else(|| {
        panic!(
            "{what}: no {kind:?} GC in 5000 operations, {:?}",
            fs.gc_stats()
        )
    });
    let mut images = 0;
    let mut rebuilt_as_table = 0;
    let mut saw = [false; 2];
    for point in 0..=trace.fence_count() {
        for img in trace.crash_images(point, 64, seed ^ point as u64) {
            images += 1;
            let desc = img.description.clone();
            let pm = SimPool::from_image(img.image);
            fsck_check(
                &pm,
                &format!("{what}: crash image {desc} (seed {seed})"),
                true,
            );
            let fs = Fs::mount(pm, strict()).unwrap_or_else(|e| {
                panic!("{what}: mount failed at {desc} (op {i}, seed {seed}): {e:?}")
            });
            let got = view(&fs);
            let which = if got == before {
                0
            } else if got == after {
                1
            } else {
                panic!("{what}: crash at {desc} (op {i}, seed {seed}) shows neither state: {got:?}")
            };
            saw[which] = true;
            // Which index a rebuild ends with depends on the order it
            // replays (the switch has hysteresis); count the tables.
            let f = fs.lookup(1, b"f").unwrap().ino;
            if fs.file_index(f).unwrap().0 == IndexKind::PageTable {
                rebuilt_as_table += 1;
            }
            // The rebuilt allocator must agree with the logs: write, crash
            // again, and the recovery scan finds no block used twice.
            let f = fs.lookup(1, b"f").unwrap().ino;
            let fh = fs.open(f).unwrap();
            fs.write(&fh, 0, b"again").unwrap();
            fs.release(fh);
            let img2 = fs.pmem().current_image();
            drop(fs);
            let fs = Fs::mount(SimPool::from_image(img2), strict()).unwrap_or_else(|e| {
                panic!("{what}: second recovery failed after {desc} (seed {seed}): {e:?}")
            });
            assert_eq!(&read_all(&fs, f)[..5], b"again");
        }
    }
    eprintln!(
        "{what}: {kind:?} GC at op {i}, {} fences, {images} crash images ({rebuilt_as_table} rebuilt as a page table; before seen: {}, after seen: {})",
        trace.fence_count(),
        saw[0],
        saw[1]
    );
    assert!(saw[0] && saw[1], "{what}: both outcomes should occur");
    if start == Start::Fragmented {
        assert!(
            rebuilt_as_table > 0,
            "{what}: no crash image rebuilt the file as a page table"
        );
    }
}

#[test]
fn crash_during_file_log_compaction() {
    let seed = seed();
    crash_during_gc("file overwrite", seed, Gc::Thorough, |fs, rng| {
        let ino = fs.lookup(1, b"f").unwrap().ino;
        if rng.below(8) == 0 {
            let name = format!("user.x{}", rng.below(3)).into_bytes();
            let mut v = vec![0u8; 1 + rng.below(40) as usize];
            rng.fill(&mut v);
            fs.setxattr(ino, &name, &v, XattrFlags::Any).unwrap();
            return;
        }
        let fh = fs.open(ino).unwrap();
        let mut buf = vec![0u8; 1 + rng.below(2 * PAGE) as usize];
        rng.fill(&mut buf);
        fs.write(&fh, rng.below(7 * PAGE), &buf).unwrap();
        fs.release(fh);
    });
}

/// The same, for a file whose DRAM index is a page table: overwrites,
/// multi-page writes and punched holes until one compacts the log, then
/// every crash image must rebuild the before or the after state.
#[test]
fn crash_during_compaction_of_a_page_table_file() {
    let seed = seed();
    crash_during_gc_from(
        Start::Fragmented,
        "page-table file churn",
        seed,
        Gc::Thorough,
        |fs, rng| {
            let ino = fs.lookup(1, b"f").unwrap().ino;
            let fh = fs.open(ino).unwrap();
            if rng.below(8) == 0 {
                let flags = FallocFlags {
                    keep_size: true,
                    punch_hole: true,
                    zero_range: false,
                    ..Default::default()
                };
                let pages = 1 + rng.below(3);
                fs.fallocate(
                    &fh,
                    rng.below(FRAGMENTED_PAGES - 3) * PAGE,
                    pages * PAGE,
                    flags,
                )
                .unwrap();
            } else {
                let mut buf = vec![0u8; 1 + rng.below(3 * PAGE) as usize];
                rng.fill(&mut buf);
                fs.write(&fh, rng.below((FRAGMENTED_PAGES - 3) * PAGE), &buf)
                    .unwrap();
            }
            fs.release(fh);
        },
    );
}

#[test]
fn crash_during_directory_log_compaction() {
    let seed = seed();
    let mut n = 0u64;
    let mut live: Vec<Vec<u8>> = Vec::new();
    crash_during_gc("directory churn", seed, Gc::Thorough, |fs, rng| {
        let d = fs.lookup(1, b"d").unwrap().ino;
        if live.len() > 4 {
            let victim = live.remove(rng.below(live.len() as u64) as usize);
            fs.unlink(d, &victim).unwrap();
            return;
        }
        let name = format!("e{n}").into_bytes();
        n += 1;
        let (_, fh) = fs.create(d, &name, 0o644, 0, 0).unwrap();
        fs.release(fh);
        live.push(name);
    });
}

#[test]
fn crash_during_setattr_fast_gc() {
    let seed = seed();
    crash_during_gc("chmod churn", seed, Gc::Fast, |fs, rng| {
        let f = fs.lookup(1, b"f").unwrap();
        fs.setattr(
            f.ino,
            &SetAttr {
                mode: Some((f.mode & 0o777) ^ (1 + rng.below(0o77)) as u32),
                ..Default::default()
            },
        )
        .unwrap();
    });
}

#[test]
fn crash_during_file_overwrite_fast_gc() {
    let seed = seed();
    crash_during_gc("page overwrite", seed, Gc::Fast, |fs, rng| {
        let ino = fs.lookup(1, b"f").unwrap().ino;
        let fh = fs.open(ino).unwrap();
        let mut buf = vec![0u8; PAGE as usize];
        rng.fill(&mut buf);
        // One hot page: each new log page supersedes the one before.
        fs.write(&fh, PAGE, &buf).unwrap();
        fs.release(fh);
    });
}

/// Truncates (shrinking SET_ATTRs) and punched holes are negative entries:
/// fast GC may drop them only once nothing they cancelled survives.
#[test]
fn crash_during_truncate_and_punch_fast_gc() {
    let seed = seed();
    crash_during_gc("truncate/punch/write churn", seed, Gc::Fast, |fs, rng| {
        let ino = fs.lookup(1, b"f").unwrap().ino;
        let fh = fs.open(ino).unwrap();
        match rng.below(4) {
            0 => {
                fs.setattr(
                    ino,
                    &SetAttr {
                        size: Some(rng.below(8 * PAGE)),
                        ..Default::default()
                    },
                )
                .unwrap();
            }
            1 => {
                let off = rng.below(7) * PAGE;
                fs.fallocate(
                    &fh,
                    off,
                    PAGE * (1 + rng.below(2)),
                    FallocFlags {
                        keep_size: true,
                        punch_hole: true,
                        zero_range: false,
                        ..Default::default()
                    },
                )
                .unwrap();
            }
            _ => {
                let mut buf = vec![0u8; 1 + rng.below(2 * PAGE) as usize];
                rng.fill(&mut buf);
                fs.write(&fh, rng.below(7 * PAGE), &buf).unwrap();
            }
        }
        fs.release(fh);
    });
}

#[test]
fn crash_during_xattr_fast_gc() {
    let seed = seed();
    crash_during_gc("xattr set/remove churn", seed, Gc::Fast, |fs, rng| {
        let ino = fs.lookup(1, b"f").unwrap().ino;
        let name = b"user.hot".to_vec();
        if rng.below(3) == 0 {
            match fs.removexattr(ino, &name) {
                Ok(()) | Err(inkfs::Error::Errno(libc::ENODATA)) => {}
                Err(e) => panic!("removexattr: {e:?}"),
            }
        } else {
            let mut v = vec![0u8; 1 + rng.below(30) as usize];
            rng.fill(&mut v);
            fs.setxattr(ino, &name, &v, XattrFlags::Any).unwrap();
        }
    });
}

/// Mount every crash image of `trace` (each checked with fsck first) and
/// hand it to `check`. Returns how many there were.
fn each_recovered(
    trace: &inkfs::pmem::SimTrace,
    mut check: impl FnMut(&str, &Fs<SimPool>),
) -> usize {
    let mut images = 0;
    for point in 0..=trace.fence_count() {
        for img in trace.crash_images(point, 64, point as u64) {
            images += 1;
            let desc = img.description.clone();
            let pm = SimPool::from_image(img.image);
            fsck_check(&pm, &format!("crash image {desc}"), true);
            let fs = Fs::mount(pm, strict()).unwrap_or_else(|e| panic!("{desc}: {e:?}"));
            check(&desc, &fs);
        }
    }
    images
}

/// A page of nothing but DIR_REMOVE entries between live pages: fast GC
/// unlinks it (and the page of the names it removed) without copying, and
/// every crash image of that unlinking shows the same directory.
#[test]
fn fast_gc_drops_a_page_of_removals_between_live_pages() {
    let fs = sim_fs(Start::Small);
    let d = fs.mkdir(1, b"d", 0o755, 0, 0).unwrap().ino;
    // Entries with names this short are one 64-byte unit: 15 in the head
    // chunk, 63 per page. The chunk and two pages of live names (the
    // chunk also holds the mkdir's attributes), a page of names added, a
    // page removing them: five pages, as fast GC's scan schedule wants
    // (its second scan is when the sixth page opens).
    let live: Vec<Vec<u8>> = (0..140).map(|i| format!("y{i:03}").into_bytes()).collect();
    for name in &live {
        let (_, fh) = fs.create(d, name, 0o644, 0, 0).unwrap();
        fs.release(fh);
    }
    for i in 0..63 {
        let (_, fh) = fs
            .create(d, format!("x{i:02}").as_bytes(), 0o644, 0, 0)
            .unwrap();
        fs.release(fh);
    }
    for i in 0..63 {
        fs.unlink(d, format!("x{i:02}").as_bytes()).unwrap();
    }
    assert_eq!(fs.log_pages(d).unwrap(), 5);
    let gc0 = fs.gc_stats();
    // The next entry opens a sixth page, and GC looks at the log.
    fs.pmem().start_trace();
    fs.setattr(
        d,
        &SetAttr {
            mode: Some(0o700),
            ..Default::default()
        },
    )
    .unwrap();
    let trace = fs.pmem().stop_trace();
    let gc1 = fs.gc_stats();
    assert_eq!(gc1.compactions, gc0.compactions, "{gc1:?}");
    assert_eq!(gc1.fast_pages_freed - gc0.fast_pages_freed, 2, "{gc1:?}");
    assert_eq!(fs.log_pages(d).unwrap(), 4);
    let expect: BTreeMap<Vec<u8>, ()> = live.iter().map(|n| (n.clone(), ())).collect();
    let names = |fs: &Fs<SimPool>| -> BTreeMap<Vec<u8>, ()> {
        list(fs, d).into_keys().map(|n| (n, ())).collect()
    };
    assert_eq!(names(&fs), expect);
    let images = each_recovered(&trace, |desc, fs| {
        assert_eq!(names(fs), expect, "crash image {desc}");
        let mode = fs.getattr(d).unwrap().mode & 0o777;
        assert!(mode == 0o755 || mode == 0o700, "{desc}: mode {mode:o}");
    });
    eprintln!("{} fences, {images} crash images", trace.fence_count());
    // Clean remount: the shorter log replays to the same directory.
    let pm = fs.unmount().unwrap();
    fsck_clean(&pm, "after fast GC");
    let fs = Fs::mount(pm, strict()).unwrap();
    assert_eq!(fs.log_pages(d).unwrap(), 4);
    assert_eq!(names(&fs), expect);
    assert_eq!(fs.getattr(d).unwrap().mode & 0o777, 0o700);
}

/// The head dead (a chunk: its attribute snapshot superseded, its writes
/// overwritten) while the log is too live to compact: fast GC moves the
/// inode's head to the next (whole) page with one store and frees the
/// chunk, and every crash image of that shows the operation's before or
/// after state.
#[test]
fn fast_gc_unlinks_the_head_page_crash_safely() {
    let fs = sim_fs(Start::Small);
    let (a, fh) = fs.create(1, b"f", 0o644, 0, 0).unwrap();
    let ino = a.ino;
    let page = |i: u32| vec![i as u8; PAGE as usize];
    // The log's head, a 1 KiB chunk (15 entries): the create's snapshot
    // and 14 writes of one page.
    for i in 0..14 {
        fs.write(&fh, 0, &page(i)).unwrap();
    }
    // Page 2, a whole page: one more write of that page and a newer
    // snapshot, so everything in the head chunk is superseded.
    fs.write(&fh, 0, &page(62)).unwrap();
    fs.setattr(
        ino,
        &SetAttr {
            mode: Some(0o700),
            ..Default::default()
        },
    )
    .unwrap();
    fs.release(fh);
    type Look = (Vec<u8>, BTreeMap<Vec<u8>, Vec<u8>>, u32);
    let look = |fs: &Fs<SimPool>| -> Look {
        let mut x = BTreeMap::new();
        for name in fs.listxattr(ino).unwrap() {
            x.insert(name.clone(), fs.getxattr(ino, &name).unwrap());
        }
        (read_all(fs, ino), x, fs.getattr(ino).unwrap().mode & 0o777)
    };
    // Live xattrs until a GC runs: it must be fast GC, dropping the head.
    let mut found = None;
    for i in 0..400u32 {
        let before = look(&fs);
        let gc0 = fs.gc_stats();
        fs.pmem().start_trace();
        let name = format!("user.live{i:03}").into_bytes();
        fs.setxattr(ino, &name, &i.to_le_bytes(), XattrFlags::Create)
            .unwrap();
        let trace = fs.pmem().stop_trace();
        let gc1 = fs.gc_stats();
        assert_eq!(gc1.compactions, gc0.compactions, "{gc1:?}");
        if gc1.fast_pages_freed > gc0.fast_pages_freed {
            found = Some((
                before,
                look(&fs),
                trace,
                gc1.fast_pages_freed - gc0.fast_pages_freed,
            ));
            break;
        }
    }
    let (before, after, trace, freed) = found.expect("fast GC never ran");
    assert_eq!(freed, 1, "only the head chunk is dead");
    assert_eq!(fs.gc_stats().fast_refused, 0);
    let images = each_recovered(&trace, |desc, fs| {
        let got = look(fs);
        assert!(got == before || got == after, "crash image {desc}");
        assert_eq!(got.0, page(62), "{desc}");
        assert_eq!(got.2, 0o700, "{desc}");
    });
    eprintln!(
        "head unlink: {} fences, {images} crash images",
        trace.fence_count()
    );
    let pm = fs.unmount().unwrap();
    fsck_clean(&pm, "after unlinking the head page");
    let fs = Fs::mount(pm, strict()).unwrap();
    assert_eq!(look(&fs), after);
}

/// Random writes, truncates (shrinking and growing), punched holes,
/// fallocations past EOF and xattr churn on one file, checked against a
/// model after crash remounts: the logs fast GC shortens replay exactly,
/// and its replay check never has to refuse a drop set. In every mode
/// (posix and sync write data in place and defer or skip copy-on-write).
#[test]
fn fast_gc_random_file_ops_replay_exactly() {
    let seed = seed();
    for mode in [Mode::Strict, Mode::Sync, Mode::Posix] {
        random_file_ops(seed, mode);
    }
}

fn random_file_ops(seed: u64, mode: Mode) {
    let opts = MountOptions {
        mode,
        read_only: false,
        ..Default::default()
    };
    let mut rng = Rng::new(seed);
    let mut fs = common::fresh(mode, 4 << 20);
    let (a, fh) = fs.create(1, b"f", 0o644, 0, 0).unwrap();
    fs.release(fh);
    let ino = a.ino;
    live_prefix(&fs, ino);
    let mut model: Vec<u8> = Vec::new();
    let mut xattrs: BTreeMap<Vec<u8>, Vec<u8>> = (0..300u32)
        .map(|i| {
            (
                format!("user.live{i:03}").into_bytes(),
                i.to_le_bytes().to_vec(),
            )
        })
        .collect();
    let (mut freed, mut refused, mut scans) = (0, 0, 0);
    for round in 0..8 {
        for _ in 0..600 {
            let fh = fs.open(ino).unwrap();
            match rng.below(10) {
                0 | 1 => {
                    let size = rng.below(20 * PAGE);
                    fs.setattr(
                        ino,
                        &SetAttr {
                            size: Some(size),
                            ..Default::default()
                        },
                    )
                    .unwrap();
                    model.resize(size as usize, 0);
                }
                2 => {
                    let (off, len) = (rng.below(16 * PAGE), 1 + rng.below(3 * PAGE));
                    let punch = FallocFlags {
                        keep_size: true,
                        punch_hole: true,
                        zero_range: false,
                        ..Default::default()
                    };
                    fs.fallocate(&fh, off, len, punch).unwrap();
                    let end = ((off + len) as usize).min(model.len());
                    if (off as usize) < end {
                        model[off as usize..end].fill(0);
                    }
                }
                3 => {
                    let keep = FallocFlags {
                        keep_size: true,
                        ..Default::default()
                    };
                    fs.fallocate(&fh, rng.below(20 * PAGE), 1 + rng.below(2 * PAGE), keep)
                        .unwrap();
                }
                4 => {
                    let name = format!("user.k{}", rng.below(3)).into_bytes();
                    if rng.below(2) == 0 {
                        let _ = fs.removexattr(ino, &name);
                        xattrs.remove(&name);
                    } else {
                        let v = rng.next_u64().to_le_bytes().to_vec();
                        fs.setxattr(ino, &name, &v, XattrFlags::Any).unwrap();
                        xattrs.insert(name, v);
                    }
                }
                _ => {
                    let off = rng.below(16 * PAGE) as usize;
                    let mut buf = vec![0u8; 1 + rng.below(PAGE + 100) as usize];
                    rng.fill(&mut buf);
                    fs.write(&fh, off as u64, &buf).unwrap();
                    if model.len() < off + buf.len() {
                        model.resize(off + buf.len(), 0);
                    }
                    model[off..off + buf.len()].copy_from_slice(&buf);
                }
            }
            fs.release(fh);
        }
        let g = fs.gc_stats();
        freed += g.fast_pages_freed;
        refused += g.fast_refused;
        scans += g.fast_scans;
        assert_eq!(read_all(&fs, ino), model, "round {round}, seed {seed}");
        // Crash remount: replay of the GC-shortened log.
        let img = fs.pmem().current_image();
        drop(fs);
        let pm = SimPool::from_image(img);
        fsck_check(&pm, &format!("round {round}, seed {seed}"), true);
        fs = Fs::mount(pm, opts.clone()).unwrap();
        assert_eq!(
            read_all(&fs, ino),
            model,
            "after remount {round}, seed {seed}"
        );
        let mut got = BTreeMap::new();
        for name in fs.listxattr(ino).unwrap() {
            got.insert(name.clone(), fs.getxattr(ino, &name).unwrap());
        }
        assert_eq!(got, xattrs, "round {round}, seed {seed}");
    }
    eprintln!("{mode:?}: fast GC: {scans} scans, {freed} pages freed, {refused} refused");
    assert!(freed > 0, "fast GC never freed a page (seed {seed})");
    assert_eq!(refused, 0, "fast GC's replay check refused (seed {seed})");
}

/// Renames and link/unlink pairs append to directory and file logs too
/// (DIR_REMOVE + DIR_ADD, LINK_CHANGE): those logs must stay bounded as
/// well, also in a directory where nothing is ever created.
#[test]
fn rename_and_link_churn_keeps_logs_bounded() {
    let (pool, pm) = ShmPool::new("gc-rename", 32 << 20);
    Fs::format(
        &pm,
        &FormatOptions {
            lanes: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let fs = Fs::mount(pm, strict()).unwrap();
    let d = fs.mkdir(1, b"d", 0o755, 0, 0).unwrap().ino;
    let e = fs.mkdir(1, b"e", 0o755, 0, 0).unwrap().ino;
    let (a, fh) = fs.create(d, b"a", 0o644, 0, 0).unwrap();
    fs.write(&fh, 0, b"payload").unwrap();
    fs.release(fh);
    let sub = fs.mkdir(d, b"sub", 0o755, 0, 0).unwrap().ino;
    let mut max = [0u64; 4];
    for i in 0..5000u32 {
        // Same-directory rename back and forth.
        let (from, to): (&[u8], &[u8]) = if i % 2 == 0 {
            (b"a", b"b")
        } else {
            (b"b", b"a")
        };
        fs.rename(d, from, d, to, RenameFlags::default()).unwrap();
        // A hard link made and removed: LINK_CHANGE entries in the file's log.
        fs.link(a.ino, e, b"l").unwrap();
        fs.unlink(e, b"l").unwrap();
        // A directory moved between parents: its parent pointer changes.
        let (p, q) = if i % 2 == 0 { (d, e) } else { (e, d) };
        fs.rename(p, b"sub", q, b"sub", RenameFlags::default())
            .unwrap();
        if i % 50 == 0 {
            for (m, ino) in max.iter_mut().zip([d, e, a.ino, sub]) {
                *m = (*m).max(fs.log_pages(ino).unwrap());
            }
        }
    }
    eprintln!(
        "max log pages after rename/link churn: d {}, e {}, file {}, moved dir {}",
        max[0], max[1], max[2], max[3]
    );
    for (what, m) in ["dir d", "dir e", "file", "moved dir"].iter().zip(max) {
        assert!(m <= 4, "{what}: log grew to {m} pages");
    }
    drop(fs);
    let fs = Fs::mount(pool.open(), strict()).unwrap();
    assert_eq!(fs.lookup(d, b"a").unwrap().nlink, 1);
    assert_eq!(read_all(&fs, a.ino), b"payload");
    assert_eq!(fs.lookup(d, b"sub").unwrap().ino, sub);
    fs.unmount().unwrap();
}

/// The head of `ino`'s log, from its inode record (a page id: a chunk's
/// is tagged, `inkfs::format::log_page_id`).
fn log_head<P: Pmem>(pm: &P, ino: u64) -> u64 {
    use inkfs::format::*;
    use inkfs::pmem::read_pod;
    let sb: Superblock = read_pod(pm, 0);
    let (lane, slot) = ino_to_lane_slot(ino, sb.lane_count);
    assert!(slot < INODES_PER_TABLE_BLOCK);
    let table = lane_first_block(lane) + LANE_INODE_TABLE_BLOCK;
    let rec: InodeRecord = read_pod(pm, table * PAGE + slot * INODE_RECORD_SIZE);
    rec.log_head
}

fn is_chunk(head: u64) -> bool {
    inkfs::format::log_page_id(head).is_some_and(|(_, c)| c.is_some())
}

/// A new log starts in a chunk; it grows into whole pages; compaction of a
/// log whose live entries fit a chunk gives it a chunk head again (a
/// long-lived small file does not keep its pages), and the pool stays
/// consistent (fsck clean, the same contents after a clean remount and
/// after a crash remount).
#[test]
fn compaction_gives_a_small_log_a_chunk_head() {
    let fs = common::fresh(Mode::Strict, 4 << 20);
    let (a, fh) = fs.create(1, b"f", 0o644, 0, 0).unwrap();
    let ino = a.ino;
    assert!(
        is_chunk(log_head(fs.pmem(), ino)),
        "a new log starts in a chunk"
    );
    let c0 = fs.gc_stats().compactions;
    let mut i = 0u32;
    let mut grew = false;
    while fs.gc_stats().compactions == c0 {
        fs.write(&fh, 0, &[i as u8; 100]).unwrap();
        grew |= fs.log_pages(ino).unwrap() > 1;
        i += 1;
        assert!(i < 1000, "no compaction");
    }
    assert!(grew, "the log outgrew its chunk before compaction");
    assert_eq!(fs.log_pages(ino).unwrap(), 1);
    assert!(is_chunk(log_head(fs.pmem(), ino)), "compacted into a chunk");
    fs.release(fh);
    let data = read_all(&fs, ino);
    let img = fs.pmem().current_image();
    let pm = fs.unmount().unwrap();
    fsck_clean(&pm, "after compaction into a chunk");
    let fs = Fs::mount(pm, strict()).unwrap();
    assert_eq!(read_all(&fs, ino), data);
    drop(fs);
    let pm = SimPool::from_image(img);
    fsck_check(&pm, "crash image after compaction into a chunk", true);
    let fs = Fs::mount(pm, strict()).unwrap();
    assert_eq!(read_all(&fs, ino), data);
}
