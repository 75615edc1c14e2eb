//! Linux calls other file systems answer, at the engine's API:
//! renameat2(RENAME_WHITEOUT), fallocate COLLAPSE_RANGE and INSERT_RANGE,
//! and FIEMAP. Semantics and errnos as Linux (ext4 for the fallocate
//! modes, tmpfs/ext4 for whiteouts), durability across a crash at return,
//! fsck after each.

mod common;

use common::*;
use inkfs::format::{BLOCK_SIZE, MAX_FILE_BYTES};
use inkfs::fsck::{self, FsckOptions};
use inkfs::pmem::{Pmem, SimPool};
use inkfs::types::*;
use inkfs::{Error, FileHandle, Fs};

type F = Fs<SimPool>;
const R: u64 = 1;
const B: u64 = BLOCK_SIZE;

#[track_caller]
fn errno_of<T: std::fmt::Debug>(r: inkfs::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(Error::Errno(e)) => e,
        Err(e) => panic!("expected an errno, got {e:?}"),
    }
}

const WHITEOUT: RenameFlags = RenameFlags {
    noreplace: false,
    exchange: false,
    whiteout: true,
};

fn modes() -> [Mode; 3] {
    [Mode::Strict, Mode::Sync, Mode::Posix]
}

/// What a crash right now recovers (only what is certainly durable), and
/// fsck of that image finds no error.
fn crash_remount(fs: &F, mode: Mode) -> F {
    let img = fs.pmem().persisted_image();
    let pm = SimPool::from_image(img);
    let report = fsck::check(&pm, &FsckOptions::default()).expect("fsck runs");
    assert_eq!(
        report.errors_found(),
        0,
        "fsck of the crash image: {report:?}"
    );
    Fs::mount(pm, opts(mode)).expect("recovery mount")
}

fn file(fs: &F, dir: u64, name: &[u8], data: &[u8]) -> u64 {
    let (a, fh) = fs.create(dir, name, 0o644, 1000, 1000).unwrap();
    if !data.is_empty() {
        fs.write(&fh, 0, data).unwrap();
    }
    fs.fsync(&fh, false).unwrap();
    fs.release(fh);
    a.ino
}

// ---------------------------------------------------------------- whiteout

#[test]
fn whiteout_rename_leaves_a_whiteout_owned_by_the_caller() {
    for mode in modes() {
        let fs = fresh(mode, 8 << 20);
        let a = fs.mkdir(R, b"a", 0o755, 0, 0).unwrap().ino;
        let f = file(&fs, a, b"f", b"hello");
        fs.rename_as(a, b"f", R, b"g", WHITEOUT, 77, 88).unwrap();
        let check = |fs: &F| {
            assert_eq!(fs.lookup_ino(R, b"g").unwrap(), f);
            let w = fs.lookup(a, b"f").unwrap();
            assert_ne!(w.ino, f);
            assert_eq!(w.kind, FileKind::CharDev);
            assert_eq!(w.mode, libc::S_IFCHR, "a whiteout has mode 0");
            assert_eq!((w.rdev, w.nlink, w.uid, w.gid), (0, 1, 77, 88));
            let mut kinds = Vec::new();
            fs.readdir(a, 0, &mut |e| {
                kinds.push((e.name, e.kind));
                true
            })
            .unwrap();
            assert!(kinds.contains(&(b"f".to_vec(), FileKind::CharDev)));
            snapshot(fs).expect("consistent");
        };
        check(&fs);
        let fs = crash_remount(&fs, mode);
        check(&fs);
        let pm = fs.unmount().unwrap();
        let fs = Fs::mount(pm, opts(mode)).unwrap();
        check(&fs);
        // A whiteout is an ordinary inode: renamed over, then unlinked.
        file(&fs, R, b"x", b"x");
        fs.rename(R, b"x", a, b"f", RenameFlags::default()).unwrap();
        assert_eq!(fs.lookup(a, b"f").unwrap().kind, FileKind::File);
        fs.rename_as(a, b"f", R, b"y", WHITEOUT, 0, 0).unwrap();
        fs.unlink(a, b"f").unwrap();
        assert_eq!(errno_of(fs.lookup(a, b"f")), libc::ENOENT);
        snapshot(&fs).expect("consistent");
    }
}

#[test]
fn whiteout_over_a_file_a_directory_and_across_directories() {
    let fs = fresh(Mode::Strict, 8 << 20);
    let a = fs.mkdir(R, b"a", 0o755, 0, 0).unwrap().ino;
    let b = fs.mkdir(R, b"b", 0o755, 0, 0).unwrap().ino;
    // Over a file with one link: the victim is freed in the same commit.
    let f = file(&fs, a, b"f", &pattern(9000, 1));
    let victim = file(&fs, b, b"v", &pattern(5000, 2));
    let free_before = fs.statfs().blocks_free;
    fs.rename_as(a, b"f", b, b"v", WHITEOUT, 0, 0).unwrap();
    assert_eq!(fs.lookup_ino(b, b"v").unwrap(), f);
    assert_eq!(errno_of(fs.getattr(victim)), libc::ENOENT);
    assert_eq!(fs.lookup(a, b"f").unwrap().kind, FileKind::CharDev);
    // The victim's two data blocks came back (its log page too; the
    // whiteout and the directory entries cost at most a page or two).
    assert!(fs.statfs().blocks_free + 2 >= free_before);
    // A directory, across directories: link counts follow.
    let d = fs.mkdir(a, b"d", 0o755, 0, 0).unwrap().ino;
    file(&fs, d, b"inner", b"in");
    fs.rename_as(a, b"d", b, b"d2", WHITEOUT, 0, 0).unwrap();
    assert_eq!(fs.lookup(a, b"d").unwrap().kind, FileKind::CharDev);
    assert_eq!(fs.lookup_ino(b, b"d2").unwrap(), d);
    assert_eq!(fs.lookup_ino(d, b"..").unwrap(), b);
    assert_eq!(fs.getattr(a).unwrap().nlink, 2);
    assert_eq!(fs.getattr(b).unwrap().nlink, 3);
    // Over an empty directory; not over a non-empty one.
    fs.mkdir(a, b"e", 0o755, 0, 0).unwrap();
    fs.mkdir(b, b"empty", 0o755, 0, 0).unwrap();
    fs.rename_as(a, b"e", b, b"empty", WHITEOUT, 0, 0).unwrap();
    fs.mkdir(a, b"e2", 0o755, 0, 0).unwrap();
    assert_eq!(
        errno_of(fs.rename_as(a, b"e2", b, b"d2", WHITEOUT, 0, 0)),
        libc::ENOTEMPTY
    );
    // Within one directory.
    file(&fs, a, b"s", b"s");
    fs.rename_as(a, b"s", a, b"t", WHITEOUT, 0, 0).unwrap();
    assert_eq!(fs.lookup(a, b"s").unwrap().kind, FileKind::CharDev);
    assert_eq!(fs.lookup(a, b"t").unwrap().kind, FileKind::File);
    snapshot(&fs).expect("consistent");
    let fs = crash_remount(&fs, Mode::Strict);
    snapshot(&fs).expect("consistent after recovery");
}

#[test]
fn whiteout_flag_rules_are_linuxs() {
    let fs = fresh(Mode::Strict, 8 << 20);
    let a = fs.mkdir(R, b"a", 0o755, 0, 0).unwrap().ino;
    file(&fs, a, b"f", b"1");
    file(&fs, a, b"g", b"2");
    // Bits as renameat2 takes them.
    assert_eq!(
        RenameFlags::from_bits(libc::RENAME_WHITEOUT).unwrap(),
        WHITEOUT
    );
    let wn = RenameFlags::from_bits(libc::RENAME_WHITEOUT | libc::RENAME_NOREPLACE).unwrap();
    assert!(wn.whiteout && wn.noreplace);
    for bad in [
        libc::RENAME_WHITEOUT | libc::RENAME_EXCHANGE,
        libc::RENAME_WHITEOUT | libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE,
        8,
    ] {
        assert_eq!(errno_of(RenameFlags::from_bits(bad)), libc::EINVAL);
    }
    // The same, built by hand, refused by the engine before any lookup.
    let wx = RenameFlags {
        exchange: true,
        ..WHITEOUT
    };
    assert_eq!(
        errno_of(fs.rename_as(a, b"nope", a, b"g", wx, 0, 0)),
        libc::EINVAL
    );
    // WHITEOUT|NOREPLACE: EEXIST over a name, fine to a new one.
    assert_eq!(
        errno_of(fs.rename_as(a, b"f", a, b"g", wn, 0, 0)),
        libc::EEXIST
    );
    fs.rename_as(a, b"f", a, b"h", wn, 0, 0).unwrap();
    assert_eq!(fs.lookup(a, b"f").unwrap().kind, FileKind::CharDev);
    // `rename` has no caller to own a whiteout.
    assert_eq!(
        errno_of(fs.rename(a, b"g", a, b"k", WHITEOUT)),
        libc::EINVAL
    );
    // Two names of one inode: nothing happens (Linux: vfs_rename returns
    // before the file system is called), no whiteout either.
    let g = fs.lookup_ino(a, b"g").unwrap();
    fs.link(g, a, b"g2").unwrap();
    fs.rename_as(a, b"g", a, b"g2", WHITEOUT, 0, 0).unwrap();
    assert_eq!(fs.lookup_ino(a, b"g").unwrap(), g);
    assert_eq!(fs.getattr(g).unwrap().nlink, 2);
    // A missing source.
    assert_eq!(
        errno_of(fs.rename_as(a, b"zz", a, b"k", WHITEOUT, 0, 0)),
        libc::ENOENT
    );
    snapshot(&fs).expect("consistent");
}

/// A whiteout rename that runs out of space changes nothing: the pool is
/// filled, then whiteout renames go until one fails, and the state and the
/// free space after the failure are those before it.
#[test]
fn whiteout_rename_out_of_space_changes_nothing() {
    let fs = fresh(Mode::Strict, 1 << 20);
    let a = fs.mkdir(R, b"a", 0o755, 0, 0).unwrap().ino;
    let mut n = 0u32;
    // Files until the pool is full.
    loop {
        let name = format!("f{n}");
        match fs.create(a, name.as_bytes(), 0o644, 0, 0) {
            Ok((_, fh)) => {
                let r = fs.write(&fh, 0, &[7u8; 4096]);
                fs.release(fh);
                if r.is_err() {
                    break;
                }
                n += 1;
            }
            Err(_) => break,
        }
    }
    let mut failed = false;
    for i in 0..n {
        let before = snapshot(&fs).unwrap().timeless();
        let free = fs.statfs();
        let r = fs.rename_as(
            a,
            format!("f{i}").as_bytes(),
            R,
            format!("r{i}").as_bytes(),
            WHITEOUT,
            0,
            0,
        );
        if let Err(e) = r {
            assert_eq!(e.errno(), libc::ENOSPC, "{e:?}");
            assert_eq!(snapshot(&fs).unwrap().timeless(), before);
            // Blocks and inode slots: the whiteout's slot went back too.
            assert_eq!(fs.statfs(), free);
            failed = true;
            break;
        }
    }
    assert!(failed, "the pool never filled up ({n} files)");
    let fs = crash_remount(&fs, Mode::Strict);
    snapshot(&fs).expect("consistent after recovery");
}

// ------------------------------------------------------ collapse / insert

fn collapse() -> FallocFlags {
    FallocFlags::from_bits(libc::FALLOC_FL_COLLAPSE_RANGE).unwrap()
}
fn insert() -> FallocFlags {
    FallocFlags::from_bits(libc::FALLOC_FL_INSERT_RANGE).unwrap()
}

fn read_all(fs: &F, fh: &FileHandle) -> Vec<u8> {
    let size = fs.fgetattr(fh).unwrap().size;
    let mut buf = vec![0u8; size as usize];
    assert_eq!(fs.read(fh, 0, &mut buf).unwrap(), size as usize);
    buf
}

#[test]
fn collapse_and_insert_errnos_are_ext4s() {
    let fs = fresh(Mode::Strict, 8 << 20);
    let (_, fh) = fs.create(R, b"f", 0o644, 0, 0).unwrap();
    fs.write(&fh, 0, &pattern(3 * 4096 + 100, 1)).unwrap();
    let size = 3 * B + 100;
    let cases: &[(FallocFlags, u64, u64, i32)] = &[
        // Alignment.
        (collapse(), 100, B, libc::EINVAL),
        (collapse(), 0, 100, libc::EINVAL),
        (insert(), B, 100, libc::EINVAL),
        // Collapse may not reach the end of file.
        (collapse(), B, size - B, libc::EINVAL),
        (collapse(), B, 3 * B, libc::EINVAL),
        (collapse(), 4 * B, B, libc::EINVAL),
        // Insert must start inside the file, and the file must stay within
        // the largest size.
        (insert(), 4 * B, B, libc::EINVAL),
        (insert(), 0, MAX_FILE_BYTES - B, libc::EFBIG),
        // Generic fallocate checks first.
        (collapse(), 0, 0, libc::EINVAL),
        (insert(), MAX_FILE_BYTES, B, libc::EFBIG),
        (collapse(), u64::MAX - B + 1, B, libc::EFBIG),
    ];
    for &(f, off, len, e) in cases {
        assert_eq!(
            errno_of(fs.fallocate(&fh, off, len, f)),
            e,
            "{f:?} off {off} len {len}"
        );
    }
    // Mode bits as vfs_fallocate (6.18) checks them.
    use libc::{
        FALLOC_FL_COLLAPSE_RANGE as C, FALLOC_FL_INSERT_RANGE as I, FALLOC_FL_KEEP_SIZE as K,
        FALLOC_FL_PUNCH_HOLE as P, FALLOC_FL_ZERO_RANGE as Z,
    };
    for bits in [
        C | K,
        I | K,
        C | I,
        C | P | K,
        I | Z,
        P,
        Z | P | K,
        0x40,
        0x80,
    ] {
        assert_eq!(
            errno_of(FallocFlags::from_bits(bits)),
            libc::EOPNOTSUPP,
            "bits {bits:#x}"
        );
    }
    let ck = FallocFlags {
        keep_size: true,
        ..collapse()
    };
    assert_eq!(errno_of(fs.fallocate(&fh, 0, B, ck)), libc::EOPNOTSUPP);
    // Nothing above changed the file.
    assert_eq!(read_all(&fs, &fh), pattern(size as usize, 1));
    // Directories: EISDIR.
    let d = fs.mkdir(R, b"d", 0o755, 0, 0).unwrap().ino;
    let dh = fs.open(d).unwrap();
    assert_eq!(errno_of(fs.fallocate(&dh, 0, B, collapse())), libc::EISDIR);
    fs.release(dh);
    fs.release(fh);
    // Read-only mount: EROFS.
    let pm = fs.unmount().unwrap();
    let ro = Fs::mount(
        pm,
        MountOptions {
            mode: Mode::Strict,
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    let fh = ro.open(ro.lookup_ino(R, b"f").unwrap()).unwrap();
    assert_eq!(errno_of(ro.fallocate(&fh, 0, B, collapse())), libc::EROFS);
    ro.release(fh);
}

#[test]
fn collapse_and_insert_move_pages_without_copying() {
    for mode in modes() {
        let fs = fresh(mode, 8 << 20);
        let (attr, fh) = fs.create(R, b"f", 0o644, 0, 0).unwrap();
        let data = pattern(10 * 4096 + 123, 3);
        fs.write(&fh, 0, &data).unwrap();
        fs.fsync(&fh, false).unwrap();
        let before = fs.fiemap(attr.ino, 0, u64::MAX).unwrap();
        let phys = |ext: &[FiemapExtent], off: u64| {
            ext.iter()
                .find(|e| e.logical <= off && off < e.logical + e.length)
                .map(|e| e.physical + (off - e.logical))
        };
        // Collapse pages 2..5: page 5 moves to 2, its block with it.
        fs.fallocate(&fh, 2 * B, 3 * B, collapse()).unwrap();
        let mut model = data.clone();
        model.drain(2 * B as usize..5 * B as usize);
        assert_eq!(read_all(&fs, &fh), model, "{mode:?}");
        let after = fs.fiemap(attr.ino, 0, u64::MAX).unwrap();
        assert_eq!(phys(&after, 2 * B), phys(&before, 5 * B));
        assert_eq!(phys(&after, 6 * B), phys(&before, 9 * B));
        assert_eq!(fs.fgetattr(&fh).unwrap().blocks, 8 * 8);
        // Insert 4 pages at page 1: a hole there, page 1 moves to 5.
        fs.fallocate(&fh, B, 4 * B, insert()).unwrap();
        model.splice(B as usize..B as usize, vec![0u8; 4 * B as usize]);
        assert_eq!(read_all(&fs, &fh), model, "{mode:?}");
        let after2 = fs.fiemap(attr.ino, 0, u64::MAX).unwrap();
        assert_eq!(phys(&after2, 5 * B), phys(&after, B));
        assert_eq!(phys(&after2, 2 * B), None, "the inserted range is a hole");
        assert_eq!(
            fs.seek(&fh, B, Whence::Data).unwrap(),
            5 * B,
            "SEEK_DATA skips the inserted hole"
        );
        // Durable on return, in every mode; and again after a clean remount.
        let crashed = crash_remount(&fs, mode);
        let fh2 = crashed.open(attr.ino).unwrap();
        assert_eq!(read_all(&crashed, &fh2), model, "{mode:?} after a crash");
        crashed.release(fh2);
        drop(crashed);
        fs.release(fh);
        let pm = fs.unmount().unwrap();
        let fs = Fs::mount(pm, opts(mode)).unwrap();
        let fh = fs.open(attr.ino).unwrap();
        assert_eq!(read_all(&fs, &fh), model, "{mode:?} after a remount");
        fs.release(fh);
    }
}

#[test]
fn collapse_frees_the_removed_blocks_and_moves_blocks_past_eof() {
    let fs = fresh(Mode::Strict, 8 << 20);
    let (attr, fh) = fs.create(R, b"f", 0o644, 0, 0).unwrap();
    fs.write(&fh, 0, &pattern(6 * 4096, 4)).unwrap();
    // Two blocks kept past the end of file, a hole at page 3.
    fs.fallocate(
        &fh,
        6 * B,
        2 * B,
        FallocFlags {
            keep_size: true,
            ..Default::default()
        },
    )
    .unwrap();
    fs.fallocate(
        &fh,
        3 * B,
        B,
        FallocFlags::from_bits(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE).unwrap(),
    )
    .unwrap();
    fs.release(fh);
    let fh = fs.open(attr.ino).unwrap();
    let before = fs.fiemap(attr.ino, 0, u64::MAX).unwrap();
    let mapped = |e: &[FiemapExtent]| e.iter().map(|x| x.length / B).sum::<u64>();
    assert_eq!(mapped(&before), 7);
    let free = fs.statfs().blocks_free;
    // Collapse pages 1..3 (two mapped blocks go).
    fs.fallocate(&fh, B, 2 * B, collapse()).unwrap();
    let after = fs.fiemap(attr.ino, 0, u64::MAX).unwrap();
    assert_eq!(mapped(&after), 5);
    assert_eq!(fs.fgetattr(&fh).unwrap().size, 4 * B);
    // The blocks past the end of file moved with the rest (ext4 does the
    // same) and are still the file's last extent.
    let last = after.last().unwrap();
    assert!(last.flags.last);
    assert_eq!(last.logical + last.length, 6 * B);
    // Two data blocks returned; the commit's log entries may have taken a
    // log page.
    assert!(fs.statfs().blocks_free + 1 >= free + 2);
    fs.release(fh);
    let fs = crash_remount(&fs, Mode::Strict);
    assert_eq!(fs.fiemap(attr.ino, 0, u64::MAX).unwrap(), after);
}

/// Random writes, punches, preallocations, collapses and inserts on a few
/// files against a byte model; after each step the content matches, and
/// at the end a crash image and a clean remount replay to the same files.
/// Logs grow long enough for both kinds of log GC, whose drop sets are all
/// checked by replay (`gc::always_check_drops`).
#[test]
fn collapse_and_insert_match_a_model() {
    inkfs::gc::always_check_drops(true);
    for mode in modes() {
        let fs = fresh(mode, 16 << 20);
        let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ mode as u64;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut files = Vec::new();
        for i in 0..3u8 {
            let (a, fh) = fs.create(R, &[b'f', b'0' + i], 0o644, 0, 0).unwrap();
            files.push((a.ino, fh, Vec::<u8>::new()));
        }
        for step in 0..1500 {
            let (_, fh, model) = &mut files[next(3) as usize];
            let size = model.len() as u64;
            let pages = size.div_ceil(B);
            match next(6) {
                0 | 1 => {
                    let off = next(24 * B);
                    let len = 1 + next(3 * B);
                    let data = pattern(len as usize, step as u8);
                    fs.write(fh, off, &data).unwrap();
                    let end = (off + len) as usize;
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[off as usize..end].copy_from_slice(&data);
                }
                2 if pages > 0 => {
                    let off = next(size);
                    let len = 1 + next(2 * B);
                    let flags = if next(2) == 0 {
                        FallocFlags::from_bits(
                            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                        )
                        .unwrap()
                    } else {
                        FallocFlags {
                            keep_size: true,
                            ..Default::default()
                        }
                    };
                    fs.fallocate(fh, off, len, flags).unwrap();
                    if flags.punch_hole {
                        let end = (off + len).min(size) as usize;
                        model[off as usize..end].fill(0);
                    }
                }
                3 | 4 if pages > 1 => {
                    // Collapse whole pages strictly inside the file.
                    let first = next(pages - 1);
                    let max = (size - 1) / B - first;
                    if max == 0 {
                        continue;
                    }
                    let n = 1 + next(max);
                    fs.fallocate(fh, first * B, n * B, collapse()).unwrap();
                    model.drain((first * B) as usize..((first + n) * B) as usize);
                }
                5 if pages > 0 => {
                    let first = next(pages);
                    let n = 1 + next(4);
                    fs.fallocate(fh, first * B, n * B, insert()).unwrap();
                    let at = (first * B) as usize;
                    model.splice(at..at, vec![0u8; (n * B) as usize]);
                }
                _ => {}
            }
            assert_eq!(&read_all(&fs, fh), model, "{mode:?} step {step}");
        }
        for (_, fh, _) in &files {
            fs.fsync(fh, false).unwrap();
        }
        let gc = fs.gc_stats();
        assert_eq!(gc.fast_refused, 0, "{mode:?}: {gc:?}");
        assert!(gc.compactions > 0, "{mode:?}: {gc:?}");
        let check = |fs: &F, how: &str| {
            for (ino, _, model) in &files {
                let fh = fs.open(*ino).unwrap();
                assert_eq!(&read_all(fs, &fh), model, "{mode:?} {how}");
                fs.release(fh);
            }
        };
        let crashed = crash_remount(&fs, mode);
        check(&crashed, "after a crash");
        drop(crashed);
        let models: Vec<(u64, Vec<u8>)> = files
            .into_iter()
            .map(|(ino, fh, model)| {
                fs.release(fh);
                (ino, model)
            })
            .collect();
        let pm = fs.unmount().unwrap();
        let fs = Fs::mount(pm, opts(mode)).unwrap();
        for (ino, model) in &models {
            let fh = fs.open(*ino).unwrap();
            assert_eq!(&read_all(&fs, &fh), model, "{mode:?} after a remount");
            fs.release(fh);
        }
    }
}

/// Fast log GC over a mostly live log whose dead entries are collapses'
/// and inserts' (which lower and raise the size with FILE_WRITE entries):
/// every drop set is checked by replay and none may be refused, and the
/// file reads the same after a crash and a remount.
#[test]
fn fast_gc_over_collapse_and_insert_entries() {
    inkfs::gc::always_check_drops(true);
    for mode in modes() {
        let fs = fresh(mode, 16 << 20);
        let (attr, fh) = fs.create(R, b"f", 0o644, 0, 0).unwrap();
        // 400 one-page extents with holes between: 400 live entries.
        let mut model = Vec::new();
        for k in 0..400u64 {
            let data = pattern(4096, k as u8);
            fs.write(&fh, 2 * k * B, &data).unwrap();
            model.resize((2 * k * B) as usize, 0);
            model.extend_from_slice(&data);
        }
        // Short extents: the file is indexed by a page table, which the
        // shifts below remap (the other tests' files use the extent tree).
        assert_eq!(
            fs.file_index(attr.ino).unwrap().0,
            inkfs::filemap::IndexKind::PageTable
        );
        // Then churn at the end of the file: insert a page before the last
        // one and collapse it again.
        let last = 2 * 399 * B;
        for i in 0..300u64 {
            let n = 1 + i % 3;
            fs.fallocate(&fh, last, n * B, insert()).unwrap();
            fs.fallocate(&fh, last, n * B, collapse()).unwrap();
        }
        fs.fsync(&fh, false).unwrap();
        assert_eq!(read_all(&fs, &fh), model, "{mode:?}");
        // FIEMAP over a page-table file: 400 one-page extents.
        let ext = fs.fiemap(attr.ino, 0, u64::MAX).unwrap();
        assert_eq!(ext.len(), 400);
        for (k, e) in ext.iter().enumerate() {
            assert_eq!((e.logical, e.length), (2 * k as u64 * B, B));
            assert_eq!(e.flags.last, k == 399);
        }
        let gc = fs.gc_stats();
        assert!(gc.fast_pages_freed > 0, "{mode:?}: {gc:?}");
        assert_eq!(gc.fast_refused, 0, "{mode:?}: {gc:?}");
        let crashed = crash_remount(&fs, mode);
        let fh2 = crashed.open(attr.ino).unwrap();
        assert_eq!(read_all(&crashed, &fh2), model, "{mode:?} after a crash");
        crashed.release(fh2);
        drop(crashed);
        fs.release(fh);
        let pm = fs.unmount().unwrap();
        let fs = Fs::mount(pm, opts(mode)).unwrap();
        let fh = fs.open(attr.ino).unwrap();
        assert_eq!(read_all(&fs, &fh), model, "{mode:?} after a remount");
        fs.release(fh);
    }
}

// ------------------------------------------------------------------ FIEMAP

#[test]
fn fiemap_reports_extents_as_linux_does() {
    let fs = fresh(Mode::Strict, 8 << 20);
    let (attr, fh) = fs.create(R, b"f", 0o644, 0, 0).unwrap();
    let ino = attr.ino;
    assert_eq!(fs.fiemap(ino, 0, u64::MAX).unwrap(), vec![]);
    // Pages 0..4 (one run), a hole 4..8, 8..10, then 2 blocks past EOF.
    let data = pattern(4 * 4096, 5);
    fs.write(&fh, 0, &data).unwrap();
    fs.write(&fh, 8 * B, &pattern(2 * 4096, 6)).unwrap();
    fs.fallocate(
        &fh,
        10 * B,
        2 * B,
        FallocFlags {
            keep_size: true,
            ..Default::default()
        },
    )
    .unwrap();
    let all = fs.fiemap(ino, 0, u64::MAX).unwrap();
    let logical: Vec<(u64, u64)> = all.iter().map(|e| (e.logical / B, e.length / B)).collect();
    // Runs on consecutive blocks merge; 8..10 and the preallocation may
    // or may not be contiguous in the pool.
    assert_eq!(logical[0], (0, 4));
    assert_eq!(logical.iter().map(|x| x.1).sum::<u64>(), 8);
    assert!(logical[1..].iter().all(|&(p, _)| p >= 8));
    assert_eq!(all.iter().filter(|e| e.flags.last).count(), 1);
    assert!(all.last().unwrap().flags.last);
    assert_eq!(all.last().unwrap().flags.bits(), 1);
    // The physical offsets hold the file's bytes.
    let mut buf = vec![0u8; data.len()];
    fs.pmem().read(all[0].physical, &mut buf);
    assert_eq!(buf, data);
    // A range: whole overlapping extents only, LAST only if it is the
    // file's last.
    let mid = fs.fiemap(ino, 2 * B + 5, 10).unwrap();
    assert_eq!(mid.len(), 1);
    assert_eq!((mid[0].logical, mid[0].length), (0, 4 * B));
    assert!(!mid[0].flags.last);
    assert_eq!(fs.fiemap(ino, 5 * B, B).unwrap(), vec![]);
    // fiemap_prep's errors.
    assert_eq!(errno_of(fs.fiemap(ino, 0, 0)), libc::EINVAL);
    assert_eq!(errno_of(fs.fiemap(ino, MAX_FILE_BYTES, 1)), libc::EFBIG);
    // No data extents in other kinds of inode.
    let d = fs.mkdir(R, b"d", 0o755, 0, 0).unwrap().ino;
    assert_eq!(fs.fiemap(d, 0, u64::MAX).unwrap(), vec![]);
    assert_eq!(errno_of(fs.fiemap(12345, 0, 1)), libc::ENOENT);
    fs.release(fh);
}

/// statfs's available blocks (df's "Avail", `f_bavail`) leave out the
/// server's keep, which no reservation of the kernel-free path is granted
/// (alloc::grant): a library writer meets ENOSPC there. The free count
/// still holds it.
#[test]
fn available_blocks_leave_out_the_servers_keep() {
    let fs = fresh(Mode::Strict, 64 << 20);
    let st = fs.statfs();
    let keep = inkfs::alloc::grant::server_keep_blocks(st.blocks);
    assert!(keep >= inkfs::alloc::grant::SERVER_KEEP_MIN_BLOCKS.min(st.blocks / 2));
    assert_eq!(st.blocks_avail, st.blocks_free - keep, "{st:?}");
    // Space taken comes off both alike.
    file(&fs, R, b"f", &pattern(64 << 10, 3));
    let after = fs.statfs();
    assert!(after.blocks_free < st.blocks_free);
    assert_eq!(after.blocks_avail, after.blocks_free - keep, "{after:?}");
}
