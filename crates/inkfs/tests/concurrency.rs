//! Concurrency: 2–4 threads on independent and on conflicting objects.
//!
//! Every test runs under a watchdog (a deadlock fails the test instead of
//! hanging it). After the threads join, a checker walks the namespace:
//! every name resolves, readdir agrees with lookup and getattr, ".." is the
//! parent, nlink equals the number of names (directories: 2 + subdirs), the
//! inodes in use are exactly the reachable ones, and after a clean remount
//! and after a crash remount (only what was durable) all of it holds again
//! with the same tree and the same free-block count.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use inkfs::format::{FileKind, BLOCK_SIZE, ROOT_INO};
use inkfs::pmem::SimPool;
use inkfs::testkit::Rng;
use inkfs::types::*;
use inkfs::Fs;

type F = Fs<SimPool>;

const WATCHDOG: Duration = Duration::from_secs(60);
/// Operations the namespace storm makes at least, renames that succeed in
/// the rename cycles at least: each runs for its time and until it has
/// made these, so a slow machine gets the same coverage, later.
const STORM_OPS_MIN: u64 = 1000;
const CYCLE_RENAMES_MIN: u64 = 100;

fn fresh(mode: Mode, bytes: u64) -> F {
    let pm = SimPool::new(bytes);
    Fs::format(
        &pm,
        &FormatOptions {
            lanes: 4,
            ..Default::default()
        },
    )
    .unwrap();
    Fs::mount(
        pm,
        MountOptions {
            mode,
            read_only: false,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Run `body` on its own thread; fail if it does not finish in time.
fn with_watchdog<T: Send + 'static>(name: &str, body: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let t = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
            let _ = tx.send(r);
        })
        .unwrap();
    match rx.recv_timeout(WATCHDOG) {
        Ok(Ok(v)) => {
            t.join().unwrap();
            v
        }
        Ok(Err(p)) => std::panic::resume_unwind(p),
        Err(_) => panic!("{name}: no progress in {WATCHDOG:?}: deadlock or livelock"),
    }
}

fn name(i: u64) -> Vec<u8> {
    format!("n{i}").into_bytes()
}

// ---------------------------------------------------------------------------
// The checker
// ---------------------------------------------------------------------------

#[derive(Debug, PartialEq, Eq)]
enum Shape {
    Dir(BTreeMap<Vec<u8>, Shape>),
    File {
        ino: u64,
        size: u64,
        nlink: u32,
        data_crc: u32,
    },
    Other {
        ino: u64,
        kind: FileKind,
        nlink: u32,
    },
}

/// Walk the whole namespace, check its invariants, return its shape.
fn check(fs: &F, open_handles: u64) -> Shape {
    let mut names: HashMap<u64, u32> = HashMap::new();
    let mut nlinks: HashMap<u64, u32> = HashMap::new();
    let shape = walk(fs, ROOT_INO, ROOT_INO, &mut names, &mut nlinks);
    for (ino, n) in &names {
        assert_eq!(
            nlinks[ino], *n,
            "inode {ino}: nlink {} but {n} names",
            nlinks[ino]
        );
    }
    let st = fs.statfs();
    let used = st.files - st.files_free;
    // The root plus every reachable inode plus the open orphans.
    let reachable = names.len() as u64 + 1;
    assert!(
        used >= reachable && used <= reachable + open_handles,
        "inodes in use {used}, reachable {reachable}, open handles {open_handles}"
    );
    shape
}

fn walk(
    fs: &F,
    dir: u64,
    parent: u64,
    names: &mut HashMap<u64, u32>,
    nlinks: &mut HashMap<u64, u32>,
) -> Shape {
    let mut ents = Vec::new();
    fs.readdir(dir, 0, &mut |e| {
        ents.push(e);
        true
    })
    .unwrap();
    assert_eq!(ents[0].name, b".");
    assert_eq!(ents[1].name, b"..");
    assert_eq!(ents[0].ino, dir);
    assert_eq!(ents[1].ino, parent, "'..' of {dir}");
    let mut out = BTreeMap::new();
    let mut subdirs = 0;
    for e in &ents[2..] {
        assert_eq!(
            fs.lookup_ino(dir, &e.name).unwrap(),
            e.ino,
            "lookup vs readdir"
        );
        let a = fs
            .getattr(e.ino)
            .unwrap_or_else(|x| panic!("{:?} -> {}: {x}", e.name, e.ino));
        assert_eq!(a.kind, e.kind);
        let s = match a.kind {
            FileKind::Dir => {
                subdirs += 1;
                assert!(
                    names.insert(e.ino, 1).is_none(),
                    "directory {} has two names",
                    e.ino
                );
                nlinks.insert(e.ino, 1);
                walk(fs, e.ino, dir, names, nlinks)
            }
            FileKind::File => {
                *names.entry(e.ino).or_default() += 1;
                nlinks.insert(e.ino, a.nlink);
                Shape::File {
                    ino: e.ino,
                    size: a.size,
                    nlink: a.nlink,
                    data_crc: file_crc(fs, e.ino, a.size),
                }
            }
            k => {
                *names.entry(e.ino).or_default() += 1;
                nlinks.insert(e.ino, a.nlink);
                Shape::Other {
                    ino: e.ino,
                    kind: k,
                    nlink: a.nlink,
                }
            }
        };
        out.insert(e.name.clone(), s);
    }
    let a = fs.getattr(dir).unwrap();
    assert_eq!(a.nlink, 2 + subdirs, "directory {dir} nlink");
    Shape::Dir(out)
}

fn file_crc(fs: &F, ino: u64, size: u64) -> u32 {
    let fh = fs.open(ino).unwrap();
    let mut buf = vec![0u8; size.min(4 << 20) as usize];
    let n = fs.read(&fh, 0, &mut buf).unwrap();
    assert_eq!(n, buf.len());
    fs.release(fh);
    crc32(&buf)
}

fn crc32(b: &[u8]) -> u32 {
    let mut h: u32 = 0x811C_9DC5;
    for &x in b {
        h = (h ^ x as u32).wrapping_mul(0x0100_0193);
    }
    h
}

/// Check, remount cleanly, check again (same shape, same free blocks);
/// then crash (drop with the durable image only), recover, check again.
fn check_and_remount(fs: F, mode: Mode) -> F {
    let before = check(&fs, 0);
    let free = fs.statfs().blocks_free;
    let pm = fs.unmount().unwrap();
    let report = inkfs::fsck::check(
        &pm,
        &inkfs::fsck::FsckOptions {
            repair: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        report.is_clean(),
        "fsck after unmount: {:#?}",
        report.problems
    );
    let fs = Fs::mount(
        pm,
        MountOptions {
            mode,
            read_only: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(fs.mount_report().allocator_restored);
    assert_eq!(
        check(&fs, 0),
        before,
        "shape changed across a clean remount"
    );
    assert_eq!(
        fs.statfs().blocks_free,
        free,
        "free blocks changed across a clean remount"
    );
    if mode == Mode::Posix {
        fs.sync().unwrap();
    }
    let image = fs.pmem().persisted_image();
    drop(fs);
    let fs = Fs::mount(
        SimPool::from_image(image),
        MountOptions {
            mode,
            read_only: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!fs.mount_report().was_clean);
    assert_eq!(
        check(&fs, 0),
        before,
        "shape changed across a crash remount"
    );
    assert_eq!(
        fs.statfs().blocks_free,
        free,
        "the recovery scan and the running allocator disagree on free blocks"
    );
    fs
}

// ---------------------------------------------------------------------------
// Independent work: each thread in its own directory
// ---------------------------------------------------------------------------

fn independent(mode: Mode) {
    with_watchdog("independent", move || {
        let fs = Arc::new(fresh(mode, 64 << 20));
        let threads = 4u64;
        let barrier = Arc::new(Barrier::new(threads as usize));
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let fs = fs.clone();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    let d = fs.mkdir(ROOT_INO, &name(t), 0o755, 0, 0).unwrap().ino;
                    barrier.wait();
                    let mut rng = Rng::new(t + 1);
                    // The expected contents of this thread's directory.
                    let mut expect: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
                    for i in 0..300u64 {
                        let n = name(rng.below(6));
                        match rng.below(5) {
                            0 | 1 => {
                                let data: Vec<u8> = (0..rng.below(9000) + 1)
                                    .map(|j| (j as u8) ^ (i as u8) | 1)
                                    .collect();
                                let ino = match fs.lookup_ino(d, &n) {
                                    Ok(ino) => ino,
                                    Err(_) => fs
                                        .create(d, &n, 0o644, 0, 0)
                                        .map(|(a, fh)| {
                                            fs.release(fh);
                                            a.ino
                                        })
                                        .unwrap(),
                                };
                                let fh = fs.open(ino).unwrap();
                                fs.setattr(
                                    ino,
                                    &SetAttr {
                                        size: Some(0),
                                        ..Default::default()
                                    },
                                )
                                .unwrap();
                                fs.write(&fh, 0, &data).unwrap();
                                fs.release(fh);
                                expect.insert(n, data);
                            }
                            2 => {
                                let to = name(rng.below(6));
                                let r = fs.rename(d, &n, d, &to, RenameFlags::default());
                                match expect.remove(&n) {
                                    Some(v) => {
                                        r.unwrap();
                                        expect.insert(to, v);
                                    }
                                    None => assert_eq!(r.unwrap_err().errno(), libc::ENOENT),
                                }
                            }
                            3 => {
                                let r = fs.unlink(d, &n);
                                assert_eq!(r.is_ok(), expect.remove(&n).is_some());
                            }
                            _ => {
                                let r =
                                    fs.setxattr(d, b"user.t", &i.to_le_bytes(), XattrFlags::Any);
                                r.unwrap();
                            }
                        }
                    }
                    (d, expect)
                })
            })
            .collect();
        let results: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        let fs = Arc::try_unwrap(fs).ok().unwrap();
        let verify = |fs: &F| {
            for (d, expect) in &results {
                let mut got = BTreeMap::new();
                fs.readdir(*d, 0, &mut |e| {
                    if e.name != b"." && e.name != b".." {
                        got.insert(e.name, e.ino);
                    }
                    true
                })
                .unwrap();
                assert_eq!(
                    got.keys().collect::<Vec<_>>(),
                    expect.keys().collect::<Vec<_>>()
                );
                for (n, data) in expect {
                    let fh = fs.open(got[n]).unwrap();
                    let mut buf = vec![0u8; data.len() + 10];
                    let k = fs.read(&fh, 0, &mut buf).unwrap();
                    assert_eq!(&buf[..k], &data[..]);
                    fs.release(fh);
                }
            }
        };
        verify(&fs);
        let fs = check_and_remount(fs, mode);
        verify(&fs);
    });
}

#[test]
fn independent_strict() {
    independent(Mode::Strict);
}
#[test]
fn independent_posix() {
    independent(Mode::Posix);
}

// ---------------------------------------------------------------------------
// One shared directory: create/unlink/rename/link/mkdir/rmdir storms
// ---------------------------------------------------------------------------

fn namespace_storm(mode: Mode, seed: u64) {
    with_watchdog("namespace_storm", move || {
        let fs = Arc::new(fresh(mode, 64 << 20));
        let a = fs.mkdir(ROOT_INO, b"A", 0o755, 0, 0).unwrap().ino;
        let b = fs.mkdir(ROOT_INO, b"B", 0o755, 0, 0).unwrap().ino;
        let dirs = [ROOT_INO, a, b];
        let ops = Arc::new(AtomicU64::new(0));
        let deadline = Instant::now() + Duration::from_millis(1500);
        let hs: Vec<_> = (0..4u64)
            .map(|t| {
                let fs = fs.clone();
                let ops = ops.clone();
                std::thread::spawn(move || {
                    let mut rng = Rng::new(seed * 31 + t);
                    let ok = |r: inkfs::Result<()>, allowed: &[i32]| {
                        if let Err(e) = r {
                            assert!(
                                allowed.contains(&e.errno()),
                                "unexpected error {e} (errno {})",
                                e.errno()
                            );
                        }
                    };
                    use libc::*;
                    // For the time, and for enough operations however
                    // slow the machine (1000 in 1.5 s is a speed claim).
                    while Instant::now() < deadline || ops.load(Ordering::Relaxed) < STORM_OPS_MIN {
                        ops.fetch_add(1, Ordering::Relaxed);
                        let d1 = dirs[rng.below(3) as usize];
                        let d2 = dirs[rng.below(3) as usize];
                        let n1 = name(rng.below(6));
                        let n2 = name(rng.below(6));
                        match rng.below(10) {
                            0 | 1 => ok(
                                fs.create(d1, &n1, 0o644, 0, 0).map(|(_, fh)| {
                                    let _ = fs.append(&fh, &[t as u8 + 1; 100]);
                                    fs.release(fh)
                                }),
                                &[EEXIST],
                            ),
                            2 => ok(fs.mkdir(d1, &n1, 0o755, 0, 0).map(|_| ()), &[EEXIST]),
                            3 => ok(fs.unlink(d1, &n1), &[ENOENT, EISDIR]),
                            4 => ok(fs.rmdir(d1, &n1), &[ENOENT, ENOTDIR, ENOTEMPTY]),
                            5 | 6 => ok(
                                fs.rename(d1, &n1, d2, &n2, RenameFlags::default()),
                                &[ENOENT, EISDIR, ENOTDIR, ENOTEMPTY, EINVAL],
                            ),
                            7 => ok(
                                fs.rename(
                                    d1,
                                    &n1,
                                    d2,
                                    &n2,
                                    RenameFlags {
                                        exchange: true,
                                        noreplace: false,
                                        ..Default::default()
                                    },
                                ),
                                &[ENOENT, EINVAL],
                            ),
                            8 => ok(
                                fs.rename(
                                    d1,
                                    &n1,
                                    d2,
                                    &n2,
                                    RenameFlags {
                                        exchange: false,
                                        noreplace: true,
                                        ..Default::default()
                                    },
                                ),
                                &[ENOENT, EEXIST, EINVAL],
                            ),
                            _ => {
                                let r = fs
                                    .lookup_ino(d1, &n1)
                                    .and_then(|ino| fs.link(ino, d2, &n2).map(|_| ()));
                                ok(r, &[ENOENT, EEXIST, EPERM])
                            }
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!(ops.load(Ordering::Relaxed) >= STORM_OPS_MIN);
        let fs = Arc::try_unwrap(fs).ok().unwrap();
        check_and_remount(fs, mode);
    });
}

#[test]
fn namespace_storm_strict() {
    namespace_storm(Mode::Strict, 1);
}
#[test]
fn namespace_storm_sync() {
    namespace_storm(Mode::Sync, 2);
}
#[test]
fn namespace_storm_posix() {
    namespace_storm(Mode::Posix, 3);
}

// ---------------------------------------------------------------------------
// Directory rename cycles: A/x -> B/x and B/y -> A/y, dirs into each other
// ---------------------------------------------------------------------------

#[test]
fn rename_cycles() {
    with_watchdog("rename_cycles", || {
        let mode = Mode::Strict;
        let fs = Arc::new(fresh(mode, 32 << 20));
        let a = fs.mkdir(ROOT_INO, b"a", 0o755, 0, 0).unwrap().ino;
        let b = fs.mkdir(ROOT_INO, b"b", 0o755, 0, 0).unwrap().ino;
        // a/d and b/e are directories that threads try to move into each other.
        fs.mkdir(a, b"d", 0o755, 0, 0).unwrap();
        fs.mkdir(b, b"e", 0o755, 0, 0).unwrap();
        let (_, fh) = fs.create(a, b"f", 0o644, 0, 0).unwrap();
        fs.release(fh);
        let (_, fh) = fs.create(b, b"g", 0o644, 0, 0).unwrap();
        fs.release(fh);
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(AtomicU64::new(0));
        let mut hs = Vec::new();
        // Thread 0: a/b <-> b/a style cycle on the whole top-level dirs.
        for t in 0..4u64 {
            let fs = fs.clone();
            let stop = stop.clone();
            let counts = counts.clone();
            hs.push(std::thread::spawn(move || {
                let mut rng = Rng::new(t + 100);
                use libc::*;
                while !stop.load(Ordering::Relaxed) {
                    // Current locations: look the directories up afresh.
                    let a = fs.lookup_ino(ROOT_INO, b"a").unwrap();
                    let b = fs.lookup_ino(ROOT_INO, b"b").unwrap();
                    let (x, y) = if rng.below(2) == 0 { (a, b) } else { (b, a) };
                    let r = match t {
                        0 => fs.rename(x, b"f", y, b"f", RenameFlags::default()),
                        1 => fs.rename(x, b"g", y, b"g", RenameFlags::default()),
                        2 => {
                            // Move a directory into the other directory's subdirectory
                            // and back: some attempts would form a cycle (EINVAL).
                            let (src, n) = if rng.below(2) == 0 {
                                (x, &b"d"[..])
                            } else {
                                (x, &b"e"[..])
                            };
                            let other = if n == b"d" { &b"e"[..] } else { &b"d"[..] };
                            match fs.lookup_ino(y, other) {
                                Ok(into) => fs.rename(src, n, into, n, RenameFlags::default()),
                                Err(e) => Err(e),
                            }
                        }
                        _ => fs.rename(
                            x,
                            b"f",
                            y,
                            b"g",
                            RenameFlags {
                                exchange: true,
                                noreplace: false,
                                ..Default::default()
                            },
                        ),
                    };
                    if let Err(e) = r {
                        assert!(
                            [ENOENT, EINVAL, ENOTDIR].contains(&e.errno()),
                            "thread {t}: {e}"
                        );
                    } else {
                        counts.fetch_add(1, Ordering::Relaxed);
                    }
                    // Pull d and e back to the top when they nest deeply.
                    if t == 2 && rng.below(8) == 0 {
                        for top in [a, b] {
                            for n in [&b"d"[..], b"e"] {
                                if let Ok(inner) =
                                    fs.lookup_ino(top, if n == b"d" { b"e" } else { b"d" })
                                {
                                    let _ = fs.rename(inner, n, top, n, RenameFlags::default());
                                }
                            }
                        }
                    }
                }
            }));
        }
        // For the time, and for enough renames however slow the machine
        // (the watchdog catches a hang).
        std::thread::sleep(Duration::from_millis(1500));
        while counts.load(Ordering::Relaxed) <= CYCLE_RENAMES_MIN
            && !hs.iter().any(|h| h.is_finished())
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
        for h in hs {
            h.join().unwrap();
        }
        assert!(counts.load(Ordering::Relaxed) > CYCLE_RENAMES_MIN);
        let fs = Arc::try_unwrap(fs).ok().unwrap();
        let shape = check(&fs, 0);
        // f, g, d and e each exist exactly once.
        let mut found = BTreeMap::new();
        fn collect(s: &Shape, out: &mut BTreeMap<Vec<u8>, u32>) {
            if let Shape::Dir(m) = s {
                for (n, c) in m {
                    *out.entry(n.clone()).or_default() += 1;
                    collect(c, out);
                }
            }
        }
        collect(&shape, &mut found);
        for n in [&b"a"[..], b"b", b"d", b"e", b"f", b"g"] {
            assert_eq!(
                found.get(n),
                Some(&1),
                "{:?} in {shape:?}",
                String::from_utf8_lossy(n)
            );
        }
        check_and_remount(fs, mode);
    });
}

// ---------------------------------------------------------------------------
// One shared file: pwrite of distinct and overlapping page ranges, truncates
// ---------------------------------------------------------------------------

/// Whole-page writes, each page filled with one byte value that names the
/// write. Strict mode: every page must be uniform (a write is atomic, no
/// page mixes two writes) and hold a value written to it, or zero.
/// Sync/posix overwrite in place: every byte must be a value written there.
fn shared_file(mode: Mode) {
    with_watchdog("shared_file", move || {
        let fs = Arc::new(fresh(mode, 64 << 20));
        let (attr, fh) = fs.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap();
        fs.release(fh);
        let ino = attr.ino;
        const PAGES: u64 = 32;
        // written[page] = set of values written to it (bit set over u8).
        let written: Arc<Vec<std::sync::Mutex<[bool; 256]>>> = Arc::new(
            (0..PAGES)
                .map(|_| std::sync::Mutex::new([false; 256]))
                .collect(),
        );
        let deadline = Instant::now() + Duration::from_millis(1200);
        let hs: Vec<_> = (0..4u64)
            .map(|t| {
                let fs = fs.clone();
                let written = written.clone();
                std::thread::spawn(move || {
                    let fh = fs.open(ino).unwrap();
                    let mut rng = Rng::new(t + 7);
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        i += 1;
                        if t == 3 && i.is_multiple_of(16) {
                            // Page-aligned truncates, shrinking and growing.
                            let size = rng.below(PAGES + 1) * BLOCK_SIZE;
                            fs.setattr(
                                ino,
                                &SetAttr {
                                    size: Some(size),
                                    ..Default::default()
                                },
                            )
                            .unwrap();
                            continue;
                        }
                        // Thread t writes values t*60+1 ..= t*60+60 (never 0).
                        let v = (t * 60 + 1 + rng.below(60)) as u8;
                        let (first, n) = if t == 0 {
                            // distinct: thread 0 alone owns pages 0..8
                            (rng.below(8), 1)
                        } else {
                            let first = 8 + rng.below(PAGES - 8);
                            (first, 1 + rng.below((PAGES - first).min(5)))
                        };
                        for p in first..first + n {
                            written[p as usize].lock().unwrap()[v as usize] = true;
                        }
                        let data = vec![v; (n * BLOCK_SIZE) as usize];
                        fs.write(&fh, first * BLOCK_SIZE, &data).unwrap();
                        if t == 2 && i.is_multiple_of(8) {
                            fs.fsync(&fh, false).unwrap();
                        }
                    }
                    fs.release(fh);
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let fs = Arc::try_unwrap(fs).ok().unwrap();
        let verify = |fs: &F| {
            let fh = fs.open(ino).unwrap();
            let size = fs.fgetattr(&fh).unwrap().size;
            assert_eq!(size % BLOCK_SIZE, 0);
            let mut buf = vec![0u8; BLOCK_SIZE as usize];
            for p in 0..size / BLOCK_SIZE {
                fs.read(&fh, p * BLOCK_SIZE, &mut buf).unwrap();
                let w = written[p as usize].lock().unwrap();
                if mode == Mode::Strict {
                    assert!(
                        buf.iter().all(|&x| x == buf[0]),
                        "page {p} is torn: {:?}",
                        &buf[..16]
                    );
                }
                for &x in buf.iter() {
                    assert!(
                        x == 0 || w[x as usize],
                        "page {p} holds {x}, never written there"
                    );
                }
            }
            fs.release(fh);
        };
        verify(&fs);
        let fs = check_and_remount(fs, mode);
        verify(&fs);
    });
}

#[test]
fn shared_file_strict() {
    shared_file(Mode::Strict);
}
#[test]
fn shared_file_sync() {
    shared_file(Mode::Sync);
}
#[test]
fn shared_file_posix() {
    shared_file(Mode::Posix);
}

// ---------------------------------------------------------------------------
// Appends from several threads never lose or overlap bytes
// ---------------------------------------------------------------------------

/// Each record: [thread, seq lo, seq hi, len lo, len hi] then `len` bytes of
/// (thread ^ seq) | 0x80. Parsed back in file order, every record of every
/// thread must appear exactly once and in its thread's order.
fn appends(mode: Mode) {
    with_watchdog("appends", move || {
        let fs = Arc::new(fresh(mode, 64 << 20));
        let (attr, fh) = fs.create(ROOT_INO, b"log", 0o644, 0, 0).unwrap();
        fs.release(fh);
        let ino = attr.ino;
        let deadline = Instant::now() + Duration::from_millis(1000);
        let hs: Vec<_> = (0..4u8)
            .map(|t| {
                let fs = fs.clone();
                std::thread::spawn(move || {
                    let fh = fs.open(ino).unwrap();
                    let mut rng = Rng::new(t as u64 + 50);
                    let mut total = 0u64;
                    let mut seq = 0u16;
                    while Instant::now() < deadline && seq < 3000 {
                        let len = rng.below(6000) as u16 + 1;
                        let mut rec =
                            vec![t, seq as u8, (seq >> 8) as u8, len as u8, (len >> 8) as u8];
                        rec.extend(std::iter::repeat_n((t ^ seq as u8) | 0x80, len as usize));
                        let (off, n) = fs.append(&fh, &rec).unwrap();
                        assert_eq!(n, rec.len());
                        assert!(off + n as u64 <= fs.handle_size(&fh));
                        total += rec.len() as u64;
                        seq += 1;
                    }
                    fs.release(fh);
                    (total, seq)
                })
            })
            .collect();
        let results: Vec<(u64, u16)> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        let fs = Arc::try_unwrap(fs).ok().unwrap();
        let expect: u64 = results.iter().map(|r| r.0).sum();
        let verify = |fs: &F| {
            let fh = fs.open(ino).unwrap();
            let size = fs.fgetattr(&fh).unwrap().size;
            assert_eq!(size, expect, "appended bytes lost or duplicated");
            let mut buf = vec![0u8; size as usize];
            assert_eq!(fs.read(&fh, 0, &mut buf).unwrap(), buf.len());
            fs.release(fh);
            let mut next = [0u16; 4];
            let mut at = 0usize;
            while at < buf.len() {
                let t = buf[at] as usize;
                assert!(t < 4, "garbage record header at {at}");
                let seq = buf[at + 1] as u16 | (buf[at + 2] as u16) << 8;
                let len = buf[at + 3] as usize | (buf[at + 4] as usize) << 8;
                assert_eq!(seq, next[t], "thread {t} record out of order at {at}");
                next[t] += 1;
                let body = &buf[at + 5..at + 5 + len];
                let v = (t as u8 ^ seq as u8) | 0x80;
                assert!(body.iter().all(|&x| x == v), "record body torn at {at}");
                at += 5 + len;
            }
            for t in 0..4 {
                assert_eq!(next[t], results[t].1, "thread {t} records");
            }
        };
        verify(&fs);
        let fs = check_and_remount(fs, mode);
        verify(&fs);
    });
}

#[test]
fn appends_strict() {
    appends(Mode::Strict);
}
#[test]
fn appends_sync() {
    appends(Mode::Sync);
}
#[test]
fn appends_posix() {
    appends(Mode::Posix);
}

// ---------------------------------------------------------------------------
// Unlink while others hold the file open and write to it
// ---------------------------------------------------------------------------

#[test]
fn unlink_while_open() {
    with_watchdog("unlink_while_open", || {
        let mode = Mode::Strict;
        let fs = Arc::new(fresh(mode, 64 << 20));
        let deadline = Instant::now() + Duration::from_millis(1000);
        let hs: Vec<_> = (0..3u64)
            .map(|t| {
                let fs = fs.clone();
                std::thread::spawn(move || {
                    let mut rng = Rng::new(t + 9);
                    while Instant::now() < deadline {
                        let n = name(rng.below(3));
                        match rng.below(3) {
                            0 => {
                                if let Ok((_, fh)) = fs.create(ROOT_INO, &n, 0o644, 0, 0) {
                                    // The same bytes the openers write: an opener
                                    // may have this new file open already (it
                                    // looked the name up), so any other value
                                    // could legitimately show in its read-back.
                                    fs.write(&fh, 0, &[2u8; 5000]).unwrap();
                                    fs.release(fh);
                                }
                            }
                            1 => {
                                let _ = fs.unlink(ROOT_INO, &n);
                            }
                            _ => {
                                // Open, maybe get unlinked under us, keep writing.
                                if let Ok(ino) = fs.lookup_ino(ROOT_INO, &n) {
                                    if let Ok(fh) = fs.open(ino) {
                                        for k in 0..4u64 {
                                            fs.write(&fh, k * 3000, &[2u8; 3000]).unwrap();
                                            let mut b = [0u8; 3000];
                                            fs.read(&fh, k * 3000, &mut b).unwrap();
                                            assert!(b.iter().all(|&x| x == 2));
                                        }
                                        fs.release(fh);
                                    }
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let fs = Arc::try_unwrap(fs).ok().unwrap();
        check_and_remount(fs, mode);
    });
}

/// Regression: `create` used to count its handle only after the new name
/// was visible, so an unlink in that window freed the inode and the
/// handle's first write failed with ENOENT.
#[test]
fn create_unlink_race() {
    with_watchdog("create_unlink_race", || {
        let fs = Arc::new(fresh(Mode::Strict, 32 << 20));
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..3)
            .map(|t| {
                let (fs, stop) = (fs.clone(), stop.clone());
                std::thread::spawn(move || {
                    let deadline = Instant::now() + Duration::from_millis(1500);
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        // Each thread both creates and unlinks the same name.
                        if let Ok((_, fh)) = fs.create(ROOT_INO, b"x", 0o644, 0, 0) {
                            let r = fs.write(&fh, 0, b"data");
                            fs.release(fh);
                            if let Err(e) = r {
                                stop.store(true, Ordering::Relaxed);
                                panic!("thread {t}: write through a freshly created handle: {e}");
                            }
                        }
                        let _ = fs.unlink(ROOT_INO, b"x");
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let fs = Arc::try_unwrap(fs).ok().unwrap();
        check_and_remount(fs, Mode::Strict);
    });
}
