//! Bad input: every error the engine promises, as a table; running out of
//! space and recovering; read-only mounts; corrupt logs met at mount and at
//! first access; garbage pools.

use std::fmt::Debug;
use std::panic::{catch_unwind, AssertUnwindSafe};

use inkfs::format::*;
use inkfs::pmem::{Pmem, SimPool};
use inkfs::types::*;
use inkfs::{Error, Fs};

type F = Fs<SimPool>;

fn fresh_sized(mode: Mode, bytes: u64) -> F {
    let pm = SimPool::new(bytes);
    Fs::format(
        &pm,
        &FormatOptions {
            lanes: 2,
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

fn fresh() -> F {
    fresh_sized(Mode::Strict, 8 << 20)
}

/// The errno of an expected failure.
#[track_caller]
fn en<T: Debug>(r: inkfs::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.errno(),
    }
}

macro_rules! expect_errno {
    ($e:expr, $errno:expr) => {{
        let got = en($e);
        assert_eq!(
            got,
            $errno,
            "{}: expected {} got {}",
            stringify!($e),
            std::io::Error::from_raw_os_error($errno),
            std::io::Error::from_raw_os_error(got)
        );
    }};
}

fn remount(fs: F, mode: Mode) -> F {
    let pm = fs.unmount().unwrap();
    let r = inkfs::fsck::check(
        &pm,
        &inkfs::fsck::FsckOptions {
            repair: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(r.is_clean(), "{:#?}", r.problems);
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

const R: u64 = ROOT_INO;

fn file(fs: &F, parent: u64, name: &[u8]) -> u64 {
    let (a, fh) = fs.create(parent, name, 0o644, 0, 0).unwrap();
    fs.release(fh);
    a.ino
}

// ---------------------------------------------------------------------------
// The errno table
// ---------------------------------------------------------------------------

#[test]
fn enametoolong() {
    let fs = fresh();
    let ok = vec![b'n'; 255];
    let long = vec![b'n'; 256];
    let f = file(&fs, R, b"f");
    expect_errno!(fs.create(R, &long, 0o644, 0, 0), libc::ENAMETOOLONG);
    expect_errno!(fs.mkdir(R, &long, 0o755, 0, 0), libc::ENAMETOOLONG);
    expect_errno!(
        fs.mknod(R, &long, libc::S_IFIFO | 0o644, 0, 0, 0),
        libc::ENAMETOOLONG
    );
    expect_errno!(fs.symlink(R, &long, b"t", 0, 0), libc::ENAMETOOLONG);
    expect_errno!(
        fs.symlink(R, b"s", &vec![b't'; SYMLINK_MAX + 1], 0, 0),
        libc::ENAMETOOLONG
    );
    expect_errno!(fs.link(f, R, &long), libc::ENAMETOOLONG);
    expect_errno!(fs.lookup(R, &long), libc::ENAMETOOLONG);
    expect_errno!(fs.unlink(R, &long), libc::ENAMETOOLONG);
    expect_errno!(fs.rmdir(R, &long), libc::ENAMETOOLONG);
    expect_errno!(
        fs.rename(R, b"f", R, &long, RenameFlags::default()),
        libc::ENAMETOOLONG
    );
    // 255 bytes is fine everywhere, and survives a remount.
    fs.mkdir(R, &ok, 0o755, 0, 0).unwrap();
    fs.rename(
        R,
        b"f",
        R,
        &{
            let mut v = ok.clone();
            v[0] = b'm';
            v
        },
        RenameFlags::default(),
    )
    .unwrap();
    fs.symlink(R, b"s", &vec![b't'; SYMLINK_MAX], 0, 0).unwrap();
    let fs = remount(fs, Mode::Strict);
    assert_eq!(fs.lookup(R, &ok).unwrap().kind, FileKind::Dir);
    let s = fs.lookup_ino(R, b"s").unwrap();
    assert_eq!(fs.readlink(s).unwrap().len(), SYMLINK_MAX);
}

#[test]
fn eexist() {
    let fs = fresh();
    let f = file(&fs, R, b"f");
    fs.mkdir(R, b"d", 0o755, 0, 0).unwrap();
    expect_errno!(fs.create(R, b"f", 0o644, 0, 0), libc::EEXIST);
    expect_errno!(fs.create(R, b"d", 0o644, 0, 0), libc::EEXIST);
    expect_errno!(fs.mkdir(R, b"f", 0o755, 0, 0), libc::EEXIST);
    expect_errno!(fs.mkdir(R, b"d", 0o755, 0, 0), libc::EEXIST);
    expect_errno!(
        fs.mknod(R, b"f", libc::S_IFIFO | 0o644, 0, 0, 0),
        libc::EEXIST
    );
    expect_errno!(fs.symlink(R, b"f", b"x", 0, 0), libc::EEXIST);
    expect_errno!(fs.link(f, R, b"d"), libc::EEXIST);
    expect_errno!(fs.link(f, R, b"f"), libc::EEXIST);
    expect_errno!(fs.mkdir(R, b".", 0o755, 0, 0), libc::EEXIST);
    expect_errno!(fs.mkdir(R, b"..", 0o755, 0, 0), libc::EEXIST);
    let nr = RenameFlags {
        noreplace: true,
        exchange: false,
        ..Default::default()
    };
    expect_errno!(fs.rename(R, b"f", R, b"d", nr), libc::EEXIST);
    // Another name of the same inode exists too (Linux: EEXIST).
    fs.link(f, R, b"g").unwrap();
    expect_errno!(fs.rename(R, b"f", R, b"g", nr), libc::EEXIST);
    // Nothing changed.
    assert_eq!(fs.getattr(f).unwrap().nlink, 2);
}

#[test]
fn enotdir() {
    let fs = fresh();
    let f = file(&fs, R, b"f");
    fs.mkdir(R, b"d", 0o755, 0, 0).unwrap();
    expect_errno!(fs.create(f, b"x", 0o644, 0, 0), libc::ENOTDIR);
    expect_errno!(fs.mkdir(f, b"x", 0o755, 0, 0), libc::ENOTDIR);
    expect_errno!(fs.lookup(f, b"x"), libc::ENOTDIR);
    expect_errno!(fs.unlink(f, b"x"), libc::ENOTDIR);
    expect_errno!(fs.readdir(f, 0, &mut |_| true), libc::ENOTDIR);
    expect_errno!(fs.rmdir(R, b"f"), libc::ENOTDIR);
    expect_errno!(fs.link(f, f, b"x"), libc::ENOTDIR);
    expect_errno!(
        fs.rename(R, b"d", R, b"f", RenameFlags::default()),
        libc::ENOTDIR
    );
    expect_errno!(
        fs.rename(f, b"x", R, b"y", RenameFlags::default()),
        libc::ENOTDIR
    );
    expect_errno!(
        fs.rename(R, b"f", f, b"y", RenameFlags::default()),
        libc::ENOTDIR
    );
}

#[test]
fn eisdir() {
    let fs = fresh();
    let d = fs.mkdir(R, b"d", 0o755, 0, 0).unwrap().ino;
    file(&fs, R, b"f");
    expect_errno!(fs.unlink(R, b"d"), libc::EISDIR);
    let fh = fs.open(d).unwrap();
    expect_errno!(fs.write(&fh, 0, b"x"), libc::EISDIR);
    expect_errno!(fs.read(&fh, 0, &mut [0u8; 4]), libc::EISDIR);
    expect_errno!(fs.append(&fh, b"x"), libc::EISDIR);
    expect_errno!(
        fs.fallocate(&fh, 0, 10, FallocFlags::default()),
        libc::EISDIR
    );
    expect_errno!(fs.seek(&fh, 0, Whence::Data), libc::EISDIR);
    fs.release(fh);
    expect_errno!(
        fs.setattr(
            d,
            &SetAttr {
                size: Some(0),
                ..Default::default()
            }
        ),
        libc::EISDIR
    );
    expect_errno!(
        fs.rename(R, b"f", R, b"d", RenameFlags::default()),
        libc::EISDIR
    );
    // The directory is untouched.
    assert_eq!(fs.getattr(d).unwrap().nlink, 2);
}

#[test]
fn enotempty() {
    let fs = fresh();
    let d = fs.mkdir(R, b"d", 0o755, 0, 0).unwrap().ino;
    let e = fs.mkdir(R, b"e", 0o755, 0, 0).unwrap().ino;
    file(&fs, d, b"x");
    file(&fs, e, b"y");
    expect_errno!(fs.rmdir(R, b"d"), libc::ENOTEMPTY);
    expect_errno!(fs.rmdir(d, b".."), libc::ENOTEMPTY);
    expect_errno!(
        fs.rename(R, b"e", R, b"d", RenameFlags::default()),
        libc::ENOTEMPTY
    );
    // A file of d onto d itself (its own parent): Linux says ENOTEMPTY.
    expect_errno!(
        fs.rename(d, b"x", R, b"d", RenameFlags::default()),
        libc::ENOTEMPTY
    );
    fs.unlink(d, b"x").unwrap();
    fs.rmdir(R, b"d").unwrap();
}

#[test]
fn einval() {
    let fs = fresh();
    let a = fs.mkdir(R, b"a", 0o755, 0, 0).unwrap().ino;
    let b = fs.mkdir(a, b"b", 0o755, 0, 0).unwrap().ino;
    let c = fs.mkdir(b, b"c", 0o755, 0, 0).unwrap().ino;
    let f = file(&fs, R, b"f");
    // A directory into its own descendant, at any depth.
    expect_errno!(
        fs.rename(R, b"a", a, b"x", RenameFlags::default()),
        libc::EINVAL
    );
    expect_errno!(
        fs.rename(R, b"a", c, b"x", RenameFlags::default()),
        libc::EINVAL
    );
    expect_errno!(
        fs.rename(a, b"b", c, b"x", RenameFlags::default()),
        libc::EINVAL
    );
    // Exchange with an ancestor.
    let ex = RenameFlags {
        exchange: true,
        noreplace: false,
        ..Default::default()
    };
    expect_errno!(fs.rename(b, b"c", R, b"a", ex), libc::EINVAL);
    // "." and ".." (the VFS answers EBUSY for rename(2); the engine EINVAL).
    expect_errno!(
        fs.rename(a, b".", R, b"z", RenameFlags::default()),
        libc::EINVAL
    );
    expect_errno!(
        fs.rename(a, b"..", R, b"z", RenameFlags::default()),
        libc::EINVAL
    );
    expect_errno!(
        fs.rename(R, b"f", a, b".", RenameFlags::default()),
        libc::EINVAL
    );
    expect_errno!(fs.rmdir(a, b"."), libc::EINVAL);
    expect_errno!(fs.create(R, b"", 0o644, 0, 0), libc::EINVAL);
    expect_errno!(fs.create(R, b"a/b", 0o644, 0, 0), libc::EINVAL);
    expect_errno!(fs.readlink(f), libc::EINVAL);
    expect_errno!(
        fs.mknod(R, b"l", libc::S_IFLNK | 0o777, 0, 0, 0),
        libc::EINVAL
    );
    expect_errno!(RenameFlags::from_bits(3), libc::EINVAL);
    // RENAME_WHITEOUT with EXCHANGE, and unknown bits (as renameat2(2)).
    expect_errno!(RenameFlags::from_bits(6), libc::EINVAL);
    expect_errno!(RenameFlags::from_bits(7), libc::EINVAL);
    expect_errno!(RenameFlags::from_bits(8), libc::EINVAL);
    expect_errno!(XattrFlags::from_bits(3), libc::EINVAL);
    // Linux 6.18's vfs_fallocate: a punch without KEEP_SIZE is EOPNOTSUPP.
    expect_errno!(
        FallocFlags::from_bits(libc::FALLOC_FL_PUNCH_HOLE),
        libc::EOPNOTSUPP
    );
    expect_errno!(FallocFlags::from_bits(0x40), libc::EOPNOTSUPP);
    let fh = fs.open(f).unwrap();
    expect_errno!(
        fs.fallocate(&fh, 0, 0, FallocFlags::default()),
        libc::EINVAL
    );
    fs.release(fh);
    // The tree is unchanged.
    assert_eq!(fs.lookup_ino(c, b"..").unwrap(), b);
    assert_eq!(fs.lookup_ino(R, b"a").unwrap(), a);
}

#[test]
fn efbig() {
    for mode in [Mode::Strict, Mode::Sync, Mode::Posix] {
        let fs = fresh_sized(mode, 8 << 20);
        let (_, fh) = fs.create(R, b"f", 0o644, 0, 0).unwrap();
        expect_errno!(fs.write(&fh, MAX_FILE_BYTES - 1, b"xy"), libc::EFBIG);
        expect_errno!(fs.write(&fh, MAX_FILE_BYTES, b"x"), libc::EFBIG);
        expect_errno!(fs.write(&fh, u64::MAX - 1, b"xyz"), libc::EFBIG);
        expect_errno!(
            fs.setattr(
                fh.ino(),
                &SetAttr {
                    size: Some(MAX_FILE_BYTES + 1),
                    ..Default::default()
                }
            ),
            libc::EFBIG
        );
        expect_errno!(
            fs.fallocate(&fh, MAX_FILE_BYTES - 10, 20, FallocFlags::default()),
            libc::EFBIG
        );
        expect_errno!(
            fs.fallocate(&fh, u64::MAX - 5, 20, FallocFlags::default()),
            libc::EFBIG
        );
        assert_eq!(fs.fgetattr(&fh).unwrap().size, 0);
        // The last byte is writable; then appends fail.
        fs.write(&fh, MAX_FILE_BYTES - 1, b"z").unwrap();
        assert_eq!(fs.fgetattr(&fh).unwrap().size, MAX_FILE_BYTES);
        expect_errno!(fs.append(&fh, b"more"), libc::EFBIG);
        let mut b = [0u8; 4];
        assert_eq!(fs.read(&fh, MAX_FILE_BYTES - 1, &mut b).unwrap(), 1);
        assert_eq!(b[0], b'z');
        assert_eq!(
            fs.seek(&fh, 0, Whence::Data).unwrap(),
            (MAX_FILE_BYTES - 1) / BLOCK_SIZE * BLOCK_SIZE
        );
        fs.release(fh);
        let fs = remount(fs, mode);
        assert_eq!(fs.lookup(R, b"f").unwrap().size, MAX_FILE_BYTES);
    }
}

#[test]
fn enoent() {
    let fs = fresh();
    let f = file(&fs, R, b"f");
    let d = fs.mkdir(R, b"d", 0o755, 0, 0).unwrap().ino;
    expect_errno!(fs.lookup(R, b"nope"), libc::ENOENT);
    expect_errno!(fs.unlink(R, b"nope"), libc::ENOENT);
    expect_errno!(fs.rmdir(R, b"nope"), libc::ENOENT);
    expect_errno!(
        fs.rename(R, b"nope", R, b"x", RenameFlags::default()),
        libc::ENOENT
    );
    expect_errno!(
        fs.rename(
            R,
            b"f",
            R,
            b"x",
            RenameFlags {
                exchange: true,
                noreplace: false,
                ..Default::default()
            }
        ),
        libc::ENOENT
    );
    expect_errno!(fs.symlink(R, b"s", b"", 0, 0), libc::ENOENT);
    expect_errno!(fs.getattr(999_999), libc::ENOENT);
    expect_errno!(fs.open(999_999), libc::ENOENT);
    // A freed inode and a removed directory.
    fs.unlink(R, b"f").unwrap();
    expect_errno!(fs.getattr(f), libc::ENOENT);
    expect_errno!(fs.open(f), libc::ENOENT);
    expect_errno!(fs.link(f, R, b"again"), libc::ENOENT);
    expect_errno!(
        fs.setxattr(f, b"user.a", b"v", XattrFlags::Any),
        libc::ENOENT
    );
    fs.rmdir(R, b"d").unwrap();
    expect_errno!(fs.create(d, b"x", 0o644, 0, 0), libc::ENOENT);
    expect_errno!(fs.mkdir(d, b"x", 0o755, 0, 0), libc::ENOENT);
    // An unlinked open directory cannot get new entries; an unlinked open
    // file cannot get a new name.
    let e = fs.mkdir(R, b"e", 0o755, 0, 0).unwrap().ino;
    let dh = fs.open(e).unwrap();
    fs.rmdir(R, b"e").unwrap();
    expect_errno!(fs.create(e, b"x", 0o644, 0, 0), libc::ENOENT);
    fs.release(dh);
    let (a, fh) = fs.create(R, b"g", 0o644, 0, 0).unwrap();
    fs.unlink(R, b"g").unwrap();
    expect_errno!(fs.link(a.ino, R, b"g2"), libc::ENOENT);
    fs.write(&fh, 0, b"still writable").unwrap();
    assert_eq!(fs.fgetattr(&fh).unwrap().nlink, 0);
    fs.release(fh);
}

#[test]
fn xattr_errors() {
    let fs = fresh();
    let f = file(&fs, R, b"f");
    let s = fs.symlink(R, b"s", b"t", 0, 0).unwrap().ino;
    fs.setxattr(f, b"user.a", b"1", XattrFlags::Create).unwrap();
    expect_errno!(
        fs.setxattr(f, b"user.a", b"2", XattrFlags::Create),
        libc::EEXIST
    );
    expect_errno!(
        fs.setxattr(f, b"user.b", b"2", XattrFlags::Replace),
        libc::ENODATA
    );
    expect_errno!(fs.getxattr(f, b"user.b"), libc::ENODATA);
    expect_errno!(fs.removexattr(f, b"user.b"), libc::ENODATA);
    let mut long = b"user.".to_vec();
    long.resize(256, b'x');
    expect_errno!(fs.setxattr(f, &long, b"v", XattrFlags::Any), libc::ERANGE);
    expect_errno!(fs.getxattr(f, &long), libc::ERANGE);
    expect_errno!(fs.removexattr(f, &long), libc::ERANGE);
    expect_errno!(fs.setxattr(f, b"", b"v", XattrFlags::Any), libc::ERANGE);
    expect_errno!(
        fs.setxattr(f, b"user.", b"v", XattrFlags::Any),
        libc::EINVAL
    );
    expect_errno!(
        fs.setxattr(f, b"bogus.a", b"v", XattrFlags::Any),
        libc::EOPNOTSUPP
    );
    expect_errno!(
        fs.setxattr(f, b"user.big", &vec![0u8; 65537], XattrFlags::Any),
        libc::E2BIG
    );
    expect_errno!(
        fs.setxattr(
            f,
            b"user.big",
            &vec![0u8; XATTR_VALUE_MAX + 1],
            XattrFlags::Any
        ),
        libc::ENOSPC
    );
    fs.setxattr(f, b"user.big", &vec![7u8; XATTR_VALUE_MAX], XattrFlags::Any)
        .unwrap();
    // user.* only on files and directories (Linux: EPERM).
    expect_errno!(
        fs.setxattr(s, b"user.a", b"v", XattrFlags::Any),
        libc::EPERM
    );
    expect_errno!(fs.removexattr(s, b"user.a"), libc::EPERM);
    expect_errno!(fs.getxattr(s, b"user.a"), libc::ENODATA);
    fs.setxattr(s, b"trusted.a", b"v", XattrFlags::Any).unwrap();
    // 255-byte names work and survive a remount.
    let mut ok = b"user.".to_vec();
    ok.resize(255, b'y');
    fs.setxattr(f, &ok, b"long", XattrFlags::Any).unwrap();
    let fs = remount(fs, Mode::Strict);
    assert_eq!(fs.getxattr(f, &ok).unwrap(), b"long");
    assert_eq!(fs.getxattr(f, b"user.a").unwrap(), b"1");
    assert_eq!(
        fs.getxattr(f, b"user.big").unwrap(),
        vec![7u8; XATTR_VALUE_MAX]
    );
    assert_eq!(fs.getxattr(s, b"trusted.a").unwrap(), b"v");
}

#[test]
fn erofs() {
    let fs = fresh();
    let f = file(&fs, R, b"f");
    let d = fs.mkdir(R, b"d", 0o755, 0, 0).unwrap().ino;
    let fh = fs.open(f).unwrap();
    fs.write(&fh, 0, b"hello").unwrap();
    fs.release(fh);
    fs.setxattr(f, b"user.a", b"1", XattrFlags::Any).unwrap();
    let pm = fs.unmount().unwrap();
    let before = pm.current_image();
    let fs = Fs::mount(
        pm,
        MountOptions {
            mode: Mode::Strict,
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    let e = libc::EROFS;
    expect_errno!(fs.create(R, b"x", 0o644, 0, 0), e);
    expect_errno!(fs.mkdir(R, b"x", 0o755, 0, 0), e);
    expect_errno!(fs.mknod(R, b"x", libc::S_IFIFO | 0o644, 0, 0, 0), e);
    expect_errno!(fs.symlink(R, b"x", b"t", 0, 0), e);
    expect_errno!(fs.link(f, R, b"x"), e);
    expect_errno!(fs.unlink(R, b"f"), e);
    expect_errno!(fs.rmdir(R, b"d"), e);
    expect_errno!(fs.rename(R, b"f", R, b"g", RenameFlags::default()), e);
    expect_errno!(
        fs.setattr(
            f,
            &SetAttr {
                mode: Some(0o600),
                ..Default::default()
            }
        ),
        e
    );
    expect_errno!(
        fs.setattr(
            f,
            &SetAttr {
                size: Some(0),
                ..Default::default()
            }
        ),
        e
    );
    expect_errno!(fs.setxattr(f, b"user.b", b"2", XattrFlags::Any), e);
    expect_errno!(fs.removexattr(f, b"user.a"), e);
    let fh = fs.open(f).unwrap();
    expect_errno!(fs.write(&fh, 0, b"x"), e);
    expect_errno!(fs.append(&fh, b"x"), e);
    expect_errno!(fs.fallocate(&fh, 0, 10, FallocFlags::default()), e);
    // Reads work.
    let mut b = [0u8; 5];
    assert_eq!(fs.read(&fh, 0, &mut b).unwrap(), 5);
    assert_eq!(&b, b"hello");
    fs.fsync(&fh, false).unwrap();
    fs.release(fh);
    assert_eq!(fs.getxattr(f, b"user.a").unwrap(), b"1");
    assert_eq!(fs.lookup_ino(R, b"d").unwrap(), d);
    let pm = fs.unmount().unwrap();
    assert!(
        pm.current_image() == before,
        "a read-only mount changed the pool"
    );
}

// ---------------------------------------------------------------------------
// Running out of space
// ---------------------------------------------------------------------------

fn enospc(mode: Mode) {
    let fs = fresh_sized(mode, 1 << 20);
    let free0 = fs.statfs().blocks_free;
    let data = vec![0x5au8; 3 * BLOCK_SIZE as usize];
    let mut files = Vec::new();
    let mut hit = None;
    for i in 0..10_000u32 {
        let name = format!("f{i}");
        match fs.create(R, name.as_bytes(), 0o644, 0, 0) {
            Ok((_, fh)) => {
                let r = fs.write(&fh, 0, &data);
                let ino = fh.ino();
                fs.release(fh);
                files.push(name);
                if let Err(e) = r {
                    hit = Some(("write", e.errno()));
                    // A failed write changes nothing (strict: atomic; the
                    // others: the size is only committed with the data).
                    if mode == Mode::Strict {
                        assert_eq!(fs.getattr(ino).unwrap().size, 0);
                    }
                    break;
                }
            }
            Err(e) => {
                hit = Some(("create", e.errno()));
                break;
            }
        }
    }
    let (what, errno) = hit.expect("the pool never filled");
    assert_eq!(errno, libc::ENOSPC, "{what} failed with {errno}");
    assert!(
        fs.statfs().blocks_free < 4,
        "full pool still shows free blocks"
    );
    // Everything else keeps failing cleanly, nothing panics.
    expect_errno!(
        fs.mkdir(R, b"more-dirs-until-full", 0o755, 0, 0)
            .and_then(|_| {
                (0..100).try_for_each(|i| {
                    fs.mkdir(R, format!("d{i}").as_bytes(), 0o755, 0, 0)
                        .map(|_| ())
                })
            }),
        libc::ENOSPC
    );
    let f0 = fs.lookup_ino(R, files[0].as_bytes()).unwrap();
    let fh = fs.open(f0).unwrap();
    expect_errno!(fs.write(&fh, 1 << 30, &data), libc::ENOSPC);
    if mode == Mode::Strict {
        // Copy-on-write needs fresh blocks even to overwrite.
        expect_errno!(fs.write(&fh, 0, &data), libc::ENOSPC);
    }
    let mut b = vec![0u8; data.len()];
    assert_eq!(fs.read(&fh, 0, &mut b).unwrap(), data.len());
    assert_eq!(b, data, "contents changed by failed writes");
    fs.release(fh);
    // A clean unmount with a full pool works and fsck agrees.
    let fs = remount(fs, mode);
    // Delete everything: the space comes back.
    for n in &files {
        fs.unlink(R, n.as_bytes()).unwrap();
    }
    let mut i = 0;
    while fs.rmdir(R, format!("d{i}").as_bytes()).is_ok() {
        i += 1;
    }
    let _ = fs.rmdir(R, b"more-dirs-until-full");
    let free1 = fs.statfs().blocks_free;
    // The root directory's log may keep a few pages.
    assert!(
        free1 + 8 >= free0,
        "free blocks {free1} after deleting all, {free0} at start"
    );
    // Usable again.
    let (_, fh) = fs.create(R, b"again", 0o644, 0, 0).unwrap();
    fs.write(&fh, 0, &data).unwrap();
    fs.release(fh);
    let fs = remount(fs, mode);
    let a = fs.lookup(R, b"again").unwrap();
    assert_eq!(a.size, data.len() as u64);
    // After a crash-style rebuild the allocator agrees.
    let free2 = fs.statfs().blocks_free;
    let img = fs.pmem().persisted_image();
    drop(fs);
    let fs = Fs::mount(
        SimPool::from_image(img),
        MountOptions {
            mode,
            read_only: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(fs.statfs().blocks_free, free2);
}

#[test]
fn enospc_strict() {
    enospc(Mode::Strict);
}
#[test]
fn enospc_sync() {
    enospc(Mode::Sync);
}
#[test]
fn enospc_posix() {
    enospc(Mode::Posix);
}

/// statfs's free inodes are what a user can still create, give or take
/// the records and names they also need: an upper bound (every empty file
/// takes at least one 1 KiB log chunk), and not one far below the truth
/// (before, it counted free blocks, a quarter of the chunks they hold).
#[test]
fn statfs_free_inodes_bound_the_files_that_fit() {
    let fs = fresh_sized(Mode::Strict, 4 << 20);
    let before = fs.statfs();
    let mut made = 0u64;
    let errno = loop {
        let name = format!("e{made}");
        match fs.create(R, name.as_bytes(), 0o644, 0, 0) {
            Ok((_, fh)) => fs.release(fh),
            Err(e) => break e.errno(),
        }
        made += 1;
        assert!(
            made <= before.files_free,
            "made {made} files, statfs said {} fit",
            before.files_free
        );
    };
    assert_eq!(errno, libc::ENOSPC);
    assert!(
        made * 2 >= before.files_free,
        "only {made} empty files fit where statfs said {}",
        before.files_free
    );
    let after = fs.statfs();
    assert_eq!(
        after.files - after.files_free,
        before.files - before.files_free + made
    );
    assert!(
        after.files_free < 8,
        "a full pool still shows {} free inodes",
        after.files_free
    );
}

/// Regression: rename, link and unlink never compacted the logs they grow,
/// so a file renamed back and forth ~170k times filled a 32 MiB pool with
/// dead log entries (ENOSPC with one live file).
#[test]
fn namespace_churn_does_not_fill_the_pool() {
    let fs = fresh_sized(Mode::Strict, 1 << 20);
    let a = fs.mkdir(R, b"a", 0o755, 0, 0).unwrap().ino;
    let b = fs.mkdir(R, b"b", 0o755, 0, 0).unwrap().ino;
    let f = file(&fs, a, b"f");
    let free0 = fs.statfs().blocks_free;
    for i in 0..20_000u64 {
        let (x, y) = if i % 2 == 0 { (a, b) } else { (b, a) };
        fs.rename(x, b"f", y, b"f", RenameFlags::default())
            .unwrap_or_else(|e| panic!("rename {i}: {e}"));
    }
    for i in 0..20_000u64 {
        fs.link(f, b, b"g")
            .unwrap_or_else(|e| panic!("link {i}: {e}"));
        fs.unlink(b, b"g")
            .unwrap_or_else(|e| panic!("unlink {i}: {e}"));
    }
    let ex = RenameFlags {
        exchange: true,
        noreplace: false,
        ..Default::default()
    };
    file(&fs, b, b"h");
    for i in 0..20_000u64 {
        fs.rename(a, b"f", b, b"h", ex)
            .unwrap_or_else(|e| panic!("exchange {i}: {e}"));
    }
    assert!(fs.statfs().blocks_free + 8 >= free0);
    remount(fs, Mode::Strict);
}

/// Inode slots run out before blocks when files are empty: the error is
/// ENOSPC, never a panic, and the fs stays consistent.
#[test]
fn enospc_many_empty_files() {
    let fs = fresh_sized(Mode::Strict, 1 << 20);
    let mut n = 0u32;
    loop {
        match fs.create(R, format!("e{n}").as_bytes(), 0o644, 0, 0) {
            Ok((_, fh)) => fs.release(fh),
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                break;
            }
        }
        n += 1;
        assert!(n < 100_000);
    }
    let fs = remount(fs, Mode::Strict);
    let mut count = 0;
    fs.readdir(R, 0, &mut |_| {
        count += 1;
        true
    })
    .unwrap();
    assert_eq!(count, n + 2);
    for i in 0..n {
        fs.unlink(R, format!("e{i}").as_bytes()).unwrap();
    }
    file(&fs, R, b"works");
    remount(fs, Mode::Strict);
}

// ---------------------------------------------------------------------------
// Corrupt media
// ---------------------------------------------------------------------------

/// The pages of `ino`'s log, head first (a chunk, or a whole page), up to
/// the tail: followed from its record's head through the footers.
fn log_pages_of(img: &[u8], ino: u64) -> Vec<LogPageSpan> {
    let sb = Superblock::from_bytes(&img[..256]);
    let (lane, slot) = ino_to_lane_slot(ino, sb.lane_count);
    assert!(slot < INODES_PER_TABLE_BLOCK);
    let table = lane_first_block(lane) + LANE_INODE_TABLE_BLOCK;
    let at = (table * BLOCK_SIZE + slot * INODE_RECORD_SIZE) as usize;
    let rec = InodeRecord::from_bytes(&img[at..at + INODE_RECORD_SIZE as usize]);
    let mut out = vec![LogPageSpan::of(rec.log_head)];
    while !out.last().unwrap().holds(rec.log_tail) {
        let f = out.last().unwrap().footer() as usize;
        let footer = LogPageFooter::from_bytes(&img[f..f + 64]);
        assert_eq!((footer.magic, footer.owner_ino), (LOG_MAGIC, ino));
        out.push(LogPageSpan::of(footer.next_block));
    }
    out
}

/// A pool with a file "victim" (data, xattr), a bystander file and a
/// directory, cleanly unmounted. Returns (image, victim ino).
fn victim_pool() -> (Vec<u8>, u64) {
    let fs = fresh();
    let (a, fh) = fs.create(R, b"victim", 0o644, 0, 0).unwrap();
    fs.write(&fh, 0, &vec![1u8; 10_000]).unwrap();
    fs.write(&fh, 1 << 20, b"far").unwrap();
    fs.release(fh);
    fs.setxattr(a.ino, b"user.k", b"v", XattrFlags::Any)
        .unwrap();
    let (_, fh) = fs.create(R, b"bystander", 0o644, 0, 0).unwrap();
    fs.write(&fh, 0, b"fine").unwrap();
    fs.release(fh);
    fs.mkdir(R, b"dir", 0o755, 0, 0).unwrap();
    let pm = fs.unmount().unwrap();
    (pm.current_image(), a.ino)
}

fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{what}: the engine panicked instead of reporting an error: {msg}");
        }
    }
}

/// Accessing the corrupted inode is an error; the rest still works (with
/// errors=continue: the default, remount-ro, refuses every later write with
/// EROFS; tests/runtime_errors.rs checks that policy).
fn check_lazy_detection(img: Vec<u8>, victim: u64, what: &str) {
    no_panic(what, || {
        let fs = Fs::mount(
            SimPool::from_image(img.clone()),
            MountOptions {
                errors: ErrorsPolicy::Continue,
                ..Default::default()
            },
        )
        .expect("a clean mount does not read every log");
        let r = fs.getattr(victim);
        match &r {
            Err(Error::Corrupt(m)) => {
                assert!(m.contains(&victim.to_string()), "{what}: message {m}")
            }
            other => panic!("{what}: getattr of the damaged inode gave {other:?}"),
        }
        assert_eq!(r.unwrap_err().errno(), libc::EIO);
        assert_eq!(en(fs.lookup(R, b"victim")), libc::EIO);
        assert_eq!(en(fs.open(victim)), libc::EIO);
        assert_eq!(
            en(fs.setxattr(victim, b"user.x", b"1", XattrFlags::Any)),
            libc::EIO
        );
        assert_eq!(en(fs.unlink(R, b"victim")), libc::EIO);
        // Asking again does not panic either (the failure is not cached as a
        // half-loaded inode).
        assert_eq!(en(fs.getattr(victim)), libc::EIO);
        // The bystander is fine.
        let b = fs.lookup(R, b"bystander").unwrap();
        let fh = fs.open(b.ino).unwrap();
        let mut buf = [0u8; 4];
        fs.read(&fh, 0, &mut buf).unwrap();
        assert_eq!(&buf, b"fine");
        fs.release(fh);
        let mut names = Vec::new();
        fs.readdir(R, 0, &mut |e| {
            names.push(e.name);
            true
        })
        .unwrap();
        assert_eq!(names.len(), 5);
        // Every failure above went through the errors= path.
        assert_eq!(fs.error_stats().count, 6, "{what}");
        assert!(!fs.is_read_only());
        drop(fs);
        // A crash-mode mount (state MOUNTED: drop without unmount above)
        // scans every log and must refuse with Corrupt.
        let mut sb_img = img.clone();
        let fs = Fs::mount(
            SimPool::from_image(std::mem::take(&mut sb_img)),
            MountOptions::default(),
        )
        .unwrap();
        let crashed = fs.pmem().current_image();
        drop(fs);
        match Fs::mount(SimPool::from_image(crashed), MountOptions::default()) {
            Err(Error::Corrupt(m)) => assert!(!m.is_empty()),
            Err(e) => panic!("{what}: crash mount gave {e:?}, expected Corrupt"),
            Ok(_) => panic!("{what}: crash mount accepted a damaged log"),
        }
    });
}

#[test]
fn corrupt_log_entry_checksum() {
    let (mut img, victim) = victim_pool();
    let pages = log_pages_of(&img, victim);
    assert!(!pages.is_empty());
    // Flip bytes inside the first entry (the creation SET_ATTR) of the head.
    let at = pages[0].base as usize;
    img[at + 20] ^= 0xff;
    img[at + 21] ^= 0x0f;
    check_lazy_detection(img, victim, "flipped bytes");
}

#[test]
fn corrupt_every_entry_of_the_log() {
    // Damage each entry of the victim's log in turn (only entries below the
    // tail count; damage past it must be ignored).
    let (img0, victim) = victim_pool();
    let pages = log_pages_of(&img0, victim);
    let page = pages[0].base as usize;
    let mut pos = 0usize;
    let mut tried = 0;
    while pos < pages[0].payload as usize {
        let hdr = EntryHeader::from_bytes(&img0[page + pos..page + pos + 8]);
        if hdr.kind == entry_type::INVALID || hdr.units == 0 {
            break;
        }
        let mut img = img0.clone();
        img[page + pos + 9] ^= 0x55;
        check_lazy_detection(img, victim, &format!("entry at {pos} (kind {})", hdr.kind));
        tried += 1;
        pos += hdr.units as usize * ENTRY_UNIT as usize;
    }
    assert!(tried >= 4, "only {tried} entries found");
}

/// An entry with a valid checksum but a block number outside the pool:
/// bounds are checked, not trusted (the pool would panic on the access).
#[test]
fn corrupt_log_entry_valid_checksum_bad_block() {
    let (mut img, victim) = victim_pool();
    let pages = log_pages_of(&img, victim);
    let page = pages[0].base as usize;
    let total_blocks = (img.len() as u64) / BLOCK_SIZE;
    let mut pos = 0usize;
    let mut done = false;
    while pos < pages[0].payload as usize {
        let hdr = EntryHeader::from_bytes(&img[page + pos..page + pos + 8]);
        if hdr.kind == entry_type::INVALID || hdr.units == 0 {
            break;
        }
        let len = hdr.units as usize * ENTRY_UNIT as usize;
        if hdr.kind == entry_type::FILE_WRITE {
            let e = &mut img[page + pos..page + pos + len];
            let mut w = WriteEntry::from_bytes(e);
            w.block = total_blocks + 100;
            e[..64].copy_from_slice(w.as_bytes_ref());
            seal_entry(e);
            assert!(entry_checksum_ok(e));
            done = true;
            break;
        }
        pos += len;
    }
    assert!(done, "no FILE_WRITE entry in the victim's log");
    check_lazy_detection(img, victim, "block out of range");
}

/// The root directory's log is read at mount: damage there fails the mount
/// with Corrupt (clean and crash mounts alike).
#[test]
fn corrupt_root_log() {
    let (mut img, _) = victim_pool();
    let pages = log_pages_of(&img, ROOT_INO);
    let at = pages[0].base as usize + 64 + 12;
    img[at] ^= 0xa5;
    no_panic("root log", || {
        match Fs::mount(SimPool::from_image(img), MountOptions::default()) {
            Err(Error::Corrupt(_)) => {}
            Err(e) => panic!("expected Corrupt, got {e:?}"),
            Ok(_) => panic!("mounted with a damaged root log"),
        }
    });
}

/// A log whose footer chain points back at itself (a cycle) is refused.
#[test]
fn corrupt_log_chain_cycle() {
    let fs = fresh();
    let (a, fh) = fs.create(R, b"victim", 0o644, 0, 0).unwrap();
    // Enough entries to need whole pages past the head chunk, every one
    // live (pages apart, so no two extents merge and nothing compacts).
    for i in 0..200u64 {
        fs.write(&fh, 2 * i * BLOCK_SIZE, b"x").unwrap();
    }
    fs.release(fh);
    let (_, fh) = fs.create(R, b"bystander", 0o644, 0, 0).unwrap();
    fs.write(&fh, 0, b"fine").unwrap();
    fs.release(fh);
    fs.mkdir(R, b"dir", 0o755, 0, 0).unwrap();
    let mut img = fs.unmount().unwrap().current_image();
    let pages = log_pages_of(&img, a.ino);
    assert!(pages.len() >= 3, "log has {} pages", pages.len());
    // Point every linked whole page's footer at itself (the head, a
    // chunk, keeps its link to the first whole page).
    for p in &pages {
        if p.payload != LOG_PAGE_PAYLOAD {
            continue;
        }
        let f = p.footer() as usize;
        let mut footer = LogPageFooter::from_bytes(&img[f..f + 64]);
        if footer.next_block != 0 {
            footer.next_block = p.base / BLOCK_SIZE;
            img[f..f + 64].copy_from_slice(footer.as_bytes_ref());
        }
    }
    check_lazy_detection(img, a.ino, "cycle");
}

// ---------------------------------------------------------------------------
// Garbage pools
// ---------------------------------------------------------------------------

fn expect_bad_pool(img: Vec<u8>, what: &str) {
    no_panic(what, || {
        match Fs::mount(SimPool::from_image(img), MountOptions::default()) {
            Err(Error::BadPool(m)) => assert!(!m.is_empty()),
            Err(e) => panic!("{what}: expected BadPool, got {e:?}"),
            Ok(_) => panic!("{what}: mounted"),
        }
    });
}

#[test]
fn garbage_pools() {
    expect_bad_pool(vec![0u8; 1 << 20], "zero pool");
    let mut x = 0x1234_5678_9abc_def0u64;
    let random: Vec<u8> = (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    expect_bad_pool(random, "random pool");
    expect_bad_pool(vec![0xffu8; 1 << 20], "all-ones pool");
    // A real pool cut short, and one grown (the superblock's size no longer
    // matches).
    let (img, _) = victim_pool();
    expect_bad_pool(img[..img.len() / 2].to_vec(), "truncated pool");
    expect_bad_pool(
        img[..BLOCK_SIZE as usize * 2].to_vec(),
        "only the superblocks",
    );
    let mut grown = img.clone();
    grown.resize(img.len() * 2, 0);
    expect_bad_pool(grown, "grown pool");
    // Both superblocks damaged.
    let mut both = img.clone();
    both[16] ^= 1;
    both[BLOCK_SIZE as usize + 16] ^= 1;
    expect_bad_pool(both, "both superblocks damaged");
    // The wrong magic in both.
    let mut magic = img.clone();
    magic[0] = b'X';
    magic[BLOCK_SIZE as usize] = b'X';
    expect_bad_pool(magic, "bad magic");
    // One damaged superblock: the backup is used.
    let mut primary = img.clone();
    primary[40] ^= 0x80;
    let fs = no_panic("primary damaged", || {
        Fs::mount(SimPool::from_image(primary), MountOptions::default())
    })
    .expect("the backup superblock rescues the mount");
    assert!(fs.mount_report().used_backup_superblock);
    assert!(fs.lookup(R, b"bystander").is_ok());
}

/// A pool smaller than the fixed areas cannot be formatted.
#[test]
fn format_too_small() {
    let pm = SimPool::new(64 * 1024);
    assert!(matches!(
        Fs::<SimPool>::format(
            &pm,
            &FormatOptions {
                lanes: 2,
                ..Default::default()
            }
        ),
        Err(Error::BadPool(_))
    ));
    let pm = SimPool::new(8 << 20);
    assert!(matches!(
        Fs::<SimPool>::format(
            &pm,
            &FormatOptions {
                lanes: LANES_MAX + 1,
                ..Default::default()
            }
        ),
        Err(Error::BadPool(_))
    ));
}

trait AsBytesRef {
    fn as_bytes_ref(&self) -> &[u8];
}
impl<T: Pod> AsBytesRef for T {
    fn as_bytes_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

#[allow(dead_code)]
fn _pmem_is_used<P: Pmem>(_: &P) {}
