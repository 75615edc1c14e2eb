//! `Fs::copy_range` (copy_file_range inside the pool) on a mapped pool,
//! where the source bytes are read straight from the mapping: contents
//! against a model, durability across a remount, the errors and limits.
//! (The crash simulator, which has no mapping, covers the same path through
//! its bounce buffer: `crash_ops/main.rs` `copy_ranges`, and `model/` checks
//! results and errno against the kernel's own copy_file_range on tmpfs.)

use std::path::PathBuf;

use inkfs::file::COPY_MAX;
use inkfs::format::MAX_FILE_BYTES;
use inkfs::pmem::{MappedPool, PoolOpenOptions};
use inkfs::types::*;
use inkfs::{FileHandle, Fs};

/// A pool file in /dev/shm, removed when dropped.
struct PoolPath(PathBuf);

impl PoolPath {
    fn new(tag: &str) -> PoolPath {
        PoolPath(PathBuf::from(format!(
            "/dev/shm/inkfs-test-copy-{tag}-{}.pool",
            std::process::id()
        )))
    }
}

impl Drop for PoolPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn open(path: &PoolPath, create: Option<u64>, mode: Mode, read_only: bool) -> Fs<MappedPool> {
    let pm = MappedPool::open(
        &path.0,
        &PoolOpenOptions {
            create_size_bytes: create,
            read_only,
        },
    )
    .unwrap();
    if create.is_some() {
        Fs::format(&pm, &FormatOptions::default()).unwrap();
    }
    Fs::mount(
        pm,
        MountOptions {
            mode,
            read_only,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Deterministic bytes, different per `seed`.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn contents(fs: &Fs<MappedPool>, fh: &FileHandle) -> Vec<u8> {
    let mut buf = vec![0u8; fs.fgetattr(fh).unwrap().size as usize];
    assert_eq!(fs.read(fh, 0, &mut buf).unwrap(), buf.len());
    buf
}

/// The model of a copy: bytes past the source's end are not copied.
fn model_copy(
    files: &mut [Vec<u8>],
    a: usize,
    from: usize,
    b: usize,
    to: usize,
    len: usize,
) -> u64 {
    let n = len.min(files[a].len().saturating_sub(from));
    let chunk = files[a][from..from + n].to_vec();
    let dst = &mut files[b];
    if dst.len() < to + n {
        dst.resize(to + n, 0);
    }
    dst[to..to + n].copy_from_slice(&chunk);
    n as u64
}

#[test]
fn copies_match_a_model_and_survive_remount() {
    for mode in [Mode::Strict, Mode::Sync, Mode::Posix] {
        let path = PoolPath::new(mode.name());
        let fs = open(&path, Some(64 << 20), mode, false);
        let mut model = vec![Vec::new(), Vec::new()];
        let mut fhs = Vec::new();
        for (i, name) in [b"a", b"b"].iter().enumerate() {
            let (_, fh) = fs.create(1, *name, 0o644, 0, 0).unwrap();
            let data = bytes(i as u64 + 1, 200 * 4096 + 123);
            fs.write(&fh, 0, &data).unwrap();
            model[i] = data;
            fhs.push(fh);
        }
        // Fragment "a" (one-page extents, as strict mode's copy-on-write
        // leaves a file) and punch a hole in it, so copies cross extents,
        // holes and unaligned page boundaries.
        for k in 0..400u64 {
            let page = (k * 37) % 200;
            let d = bytes(1000 + k, 4096);
            fs.write(&fhs[0], page * 4096, &d).unwrap();
            model[0][page as usize * 4096..][..4096].copy_from_slice(&d);
        }
        let punch = FallocFlags {
            keep_size: true,
            punch_hole: true,
            zero_range: false,
            ..Default::default()
        };
        fs.fallocate(&fhs[0], 10 * 4096 + 5, 3 * 4096, punch)
            .unwrap();
        model[0][10 * 4096 + 5..13 * 4096 + 5].fill(0);

        let cases: &[(usize, usize, usize, usize, usize)] = &[
            (0, 0, 1, 0, 50 * 4096),                 // aligned, whole pages
            (0, 4096 * 9 + 17, 1, 333, 20_000),      // unaligned, across the hole
            (0, 100, 0, 150 * 4096 + 1, 7000),       // within one file
            (1, 190 * 4096, 0, 300 * 4096, 1 << 20), // short at EOF, extends with a hole
            (0, 5, 1, 9, 1),                         // one byte
            (1, 10 * 4096, 1, 0, 4096),              // within one file, back
        ];
        for &(a, from, b, to, len) in cases {
            let want = model_copy(&mut model, a, from, b, to, len);
            let got = fs
                .copy_range(&fhs[a], from as u64, &fhs[b], to as u64, len as u64)
                .unwrap();
            assert_eq!(got, want, "{mode:?} copy {a}@{from} -> {b}@{to} len {len}");
            for (i, fh) in fhs.iter().enumerate() {
                assert!(
                    contents(&fs, fh) == model[i],
                    "{mode:?} file {i} after copy {a}@{from} -> {b}@{to}"
                );
            }
        }
        for fh in fhs.drain(..) {
            fs.fsync(&fh, false).unwrap();
            fs.release(fh);
        }
        drop(fs.unmount().unwrap());
        let fs = open(&path, None, mode, false);
        for (i, name) in [b"a", b"b"].iter().enumerate() {
            let ino = fs.lookup(1, *name).unwrap().ino;
            let fh = fs.open(ino).unwrap();
            assert!(
                contents(&fs, &fh) == model[i],
                "{mode:?} file {i} after remount"
            );
            fs.release(fh);
        }
    }
}

#[test]
fn copy_errors_and_limits() {
    let path = PoolPath::new("errors");
    let fs = open(&path, Some(96 << 20), Mode::Strict, false);
    let (_, a) = fs.create(1, b"a", 0o644, 0, 0).unwrap();
    let (_, b) = fs.create(1, b"b", 0o644, 0, 0).unwrap();
    fs.write(&a, 0, &bytes(7, 10_000)).unwrap();

    // Overlapping ranges of one file; touching ranges are fine.
    assert!(matches!(
        fs.copy_range(&a, 0, &a, 4000, 5000),
        Err(inkfs::Error::Errno(libc::EINVAL))
    ));
    assert_eq!(fs.copy_range(&a, 0, &a, 5000, 5000).unwrap(), 5000);
    // At or past the source's end: nothing, and the destination untouched.
    assert_eq!(fs.copy_range(&a, 10_000, &b, 0, 100).unwrap(), 0);
    assert_eq!(fs.copy_range(&a, 1 << 40, &b, 0, 100).unwrap(), 0);
    assert_eq!(fs.fgetattr(&b).unwrap().size, 0);
    // The largest file size.
    assert!(matches!(
        fs.copy_range(&a, 0, &b, MAX_FILE_BYTES, 1),
        Err(inkfs::Error::Errno(libc::EFBIG))
    ));
    assert_eq!(
        fs.copy_range(&a, 0, &b, MAX_FILE_BYTES - 10, 100).unwrap(),
        10
    );
    fs.setattr(
        fs.fgetattr(&b).unwrap().ino,
        &SetAttr {
            size: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    // A directory is not a copy's source or destination.
    let dir = fs.open(1).unwrap();
    assert!(matches!(
        fs.copy_range(&dir, 0, &b, 0, 1),
        Err(inkfs::Error::Errno(libc::EISDIR))
    ));
    assert!(matches!(
        fs.copy_range(&a, 0, &dir, 0, 1),
        Err(inkfs::Error::Errno(libc::EISDIR))
    ));
    fs.release(dir);
    // One call copies COPY_MAX at most (a sparse source: its hole is
    // written as zeros).
    fs.setattr(
        fs.fgetattr(&a).unwrap().ino,
        &SetAttr {
            size: Some(COPY_MAX + (1 << 20)),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(fs.copy_range(&a, 0, &b, 0, u64::MAX).unwrap(), COPY_MAX);
    let mut tail = vec![1u8; 4096];
    fs.read(&b, COPY_MAX - 4096, &mut tail).unwrap();
    assert!(tail.iter().all(|&x| x == 0));
    fs.release(a);
    fs.release(b);
    drop(fs.unmount().unwrap());

    // Read-only mount.
    let fs = open(&path, None, Mode::Strict, true);
    let ino = fs.lookup(1, b"a").unwrap().ino;
    let a = fs.open(ino).unwrap();
    assert!(matches!(
        fs.copy_range(&a, 0, &a, 1 << 30, 10),
        Err(inkfs::Error::Errno(libc::EROFS))
    ));
    fs.release(a);
}

/// A copy that does not fit fails with ENOSPC and changes nothing: strict
/// mode allocates all its blocks before anything is visible.
#[test]
fn copy_enospc_changes_nothing() {
    let path = PoolPath::new("enospc");
    let fs = open(&path, Some(16 << 20), Mode::Strict, false);
    let (_, a) = fs.create(1, b"a", 0o644, 0, 0).unwrap();
    let (_, b) = fs.create(1, b"b", 0o644, 0, 0).unwrap();
    let data = bytes(3, 9 << 20);
    fs.write(&a, 0, &data).unwrap();
    fs.write(&b, 0, b"keep").unwrap();
    let free = fs.statfs().blocks_free;
    assert!(matches!(
        fs.copy_range(&a, 0, &b, 0, 9 << 20),
        Err(inkfs::Error::Errno(libc::ENOSPC))
    ));
    assert_eq!(contents(&fs, &b), b"keep");
    assert_eq!(
        fs.statfs().blocks_free,
        free,
        "a failed copy frees what it took"
    );
    assert!(contents(&fs, &a) == data);
    fs.release(a);
    fs.release(b);
}
