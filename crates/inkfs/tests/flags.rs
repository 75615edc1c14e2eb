//! Inode flags (chattr +i / +a): every operation on an immutable or
//! append-only file or directory gets the errno Linux gives (and changes
//! nothing when refused); only privileged callers change those flags; the
//! flags survive a remount, a crash at any fence of their change (together
//! with its ctime), log compaction, and fsck checks their range.

mod common;

use common::*;
use inkfs::format::*;
use inkfs::fsck::{self, FsckOptions, ProblemKind};
use inkfs::pmem::{read_pod, Pmem, SimPool};
use inkfs::types::inode_flags::{APPEND, IMMUTABLE, NOATIME, NODUMP};
use inkfs::types::*;
use inkfs::{Error, Fs};

const POOL: u64 = 4 << 20;
const SEED: u64 = 0xf1a6_5eed;
const F_LEN: u64 = 5000;

/// The namespace of every table case.
///
/// ```text
/// /d        dir                 /e        dir (holds /e/x)
/// /d/f      file, 5000 bytes,   /g        file, 100 bytes
///           xattr user.x        /d/sub    empty dir
/// ```
struct Env {
    d: u64,
    f: u64,
    e: u64,
    g: u64,
}

fn setup() -> (Fs<SimPool>, Env) {
    let fs = fresh(Mode::Strict, POOL);
    let d = fs.mkdir(1, b"d", 0o755, 0, 0).unwrap().ino;
    let e = fs.mkdir(1, b"e", 0o755, 0, 0).unwrap().ino;
    fs.mkdir(d, b"sub", 0o755, 0, 0).unwrap();
    let mk = |dir: u64, name: &[u8], len: u64, salt: u8| {
        let (a, fh) = fs.create(dir, name, 0o644, 1000, 1000).unwrap();
        fs.write(&fh, 0, &pattern(len as usize, salt)).unwrap();
        fs.release(fh);
        a.ino
    };
    let f = mk(d, b"f", F_LEN, 1);
    let g = mk(1, b"g", 100, 2);
    mk(e, b"x", 10, 3);
    fs.setxattr(f, b"user.x", b"one", XattrFlags::Any).unwrap();
    fs.setxattr(d, b"user.x", b"dir", XattrFlags::Any).unwrap();
    (fs, Env { d, f, e, g })
}

type R = inkfs::Result<()>;
type OpFn = fn(&Fs<SimPool>, &Env) -> R;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Target {
    File,
    Dir,
}

/// One row: the operation, and its errno (0: success) with no flag, with
/// the target immutable, with the target append-only.
struct Row {
    name: &'static str,
    target: Target,
    op: OpFn,
    base: i32,
    immutable: i32,
    append: i32,
}

const EPERM: i32 = libc::EPERM;

fn with_fh(fs: &Fs<SimPool>, ino: u64, f: impl FnOnce(&inkfs::FileHandle) -> R) -> R {
    let fh = fs.open(ino)?;
    let r = f(&fh);
    fs.release(fh);
    r
}

fn open_flags(fs: &Fs<SimPool>, ino: u64, flags: i32) -> R {
    let fh = fs.open_with(ino, flags)?;
    fs.release(fh);
    Ok(())
}

fn set(fs: &Fs<SimPool>, ino: u64, s: SetAttr) -> R {
    fs.setattr(ino, &s).map(|_| ())
}

fn falloc(fs: &Fs<SimPool>, ino: u64, off: u64, len: u64, bits: i32) -> R {
    let f = FallocFlags::from_bits(bits)?;
    with_fh(fs, ino, |fh| fs.fallocate(fh, off, len, f))
}

fn rename(fs: &Fs<SimPool>, a: (u64, &[u8]), b: (u64, &[u8]), flags: RenameFlags) -> R {
    fs.rename(a.0, a.1, b.0, b.1, flags)
}

const PLAIN: RenameFlags = RenameFlags {
    noreplace: false,
    exchange: false,
    whiteout: false,
};
const EXCHANGE: RenameFlags = RenameFlags {
    noreplace: false,
    exchange: true,
    whiteout: false,
};
const NOREPLACE: RenameFlags = RenameFlags {
    noreplace: true,
    exchange: false,
    whiteout: false,
};

/// copy_file_range of 50 bytes from `src` at `src_off` to `dst` at `dst_off`.
fn copy(fs: &Fs<SimPool>, src: u64, src_off: u64, dst: u64, dst_off: u64) -> R {
    let from = fs.open(src)?;
    let r = with_fh(fs, dst, |to| {
        fs.copy_range(&from, src_off, to, dst_off, 50).map(|_| ())
    });
    fs.release(from);
    r
}

/// The table, one operation per line (left unformatted to stay a table).
#[rustfmt::skip]
fn rows() -> Vec<Row> {
    use Target::*;
    let row = |name, target, op: OpFn, base, immutable, append| Row { name, target, op, base, immutable, append };
    vec![
        // ---- a file: its data
        row("write at 0", File, |fs, e| with_fh(fs, e.f, |h| fs.write(h, 0, b"x").map(|_| ())), 0, EPERM, EPERM),
        row("write at end", File, |fs, e| with_fh(fs, e.f, |h| fs.write(h, F_LEN, b"x").map(|_| ())), 0, EPERM, 0),
        row("write past end", File, |fs, e| with_fh(fs, e.f, |h| fs.write(h, F_LEN + 1, b"x").map(|_| ())), 0, EPERM, EPERM),
        row("append", File, |fs, e| with_fh(fs, e.f, |h| fs.append(h, b"x").map(|_| ())), 0, EPERM, 0),
        row("copy into, at end", File, |fs, e| copy(fs, e.g, 0, e.f, F_LEN), 0, EPERM, 0),
        row("copy into, at 0", File, |fs, e| copy(fs, e.g, 0, e.f, 0), 0, EPERM, EPERM),
        row("copy out of", File, |fs, e| copy(fs, e.f, 0, e.g, 0), 0, 0, 0),
        row("read", File, |fs, e| with_fh(fs, e.f, |h| fs.read(h, 0, &mut [0; 100]).map(|_| ())), 0, 0, 0),
        row("truncate shrink", File, |fs, e| set(fs, e.f, SetAttr { size: Some(100), ..Default::default() }), 0, EPERM, EPERM),
        row("truncate grow", File, |fs, e| set(fs, e.f, SetAttr { size: Some(9000), ..Default::default() }), 0, EPERM, EPERM),
        row("truncate to its size", File, |fs, e| set(fs, e.f, SetAttr { size: Some(F_LEN), ..Default::default() }), 0, EPERM, EPERM),
        row("fallocate", File, |fs, e| falloc(fs, e.f, F_LEN, 4096, 0), 0, EPERM, 0),
        row("fallocate keep size", File, |fs, e| falloc(fs, e.f, 0, 16384, libc::FALLOC_FL_KEEP_SIZE), 0, EPERM, 0),
        row("fallocate punch hole", File, |fs, e| falloc(fs, e.f, 0, 4096, libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE), 0, EPERM, EPERM),
        row("fallocate zero range", File, |fs, e| falloc(fs, e.f, 0, 100, libc::FALLOC_FL_ZERO_RANGE), 0, EPERM, EPERM),
        row("fsync", File, |fs, e| with_fh(fs, e.f, |h| fs.fsync(h, false)), 0, 0, 0),
        // ---- a file: its attributes and xattrs
        row("chmod", File, |fs, e| set(fs, e.f, SetAttr { mode: Some(0o600), ..Default::default() }), 0, EPERM, EPERM),
        row("chown", File, |fs, e| set(fs, e.f, SetAttr { uid: Some(7), gid: Some(7), ..Default::default() }), 0, EPERM, EPERM),
        row("utimes to a time", File, |fs, e| set(fs, e.f, SetAttr { mtime: Some(TimeSet::At(5)), ..Default::default() }), 0, EPERM, EPERM),
        row("utimes to now", File, |fs, e| set(fs, e.f, SetAttr { atime: Some(TimeSet::Now), mtime: Some(TimeSet::Now), ..Default::default() }), 0, EPERM, 0),
        row("setxattr", File, |fs, e| fs.setxattr(e.f, b"user.y", b"v", XattrFlags::Any), 0, EPERM, EPERM),
        row("setxattr replace", File, |fs, e| fs.setxattr(e.f, b"user.x", b"two", XattrFlags::Replace), 0, EPERM, EPERM),
        row("setxattr, unknown namespace", File, |fs, e| fs.setxattr(e.f, b"foo.y", b"v", XattrFlags::Any), libc::EOPNOTSUPP, EPERM, EPERM),
        row("removexattr", File, |fs, e| fs.removexattr(e.f, b"user.x"), 0, EPERM, EPERM),
        row("removexattr, absent", File, |fs, e| fs.removexattr(e.f, b"user.none"), libc::ENODATA, EPERM, EPERM),
        row("getxattr", File, |fs, e| fs.getxattr(e.f, b"user.x").map(|_| ()), 0, 0, 0),
        row("chattr +d (privileged)", File, |fs, e| fs.set_flags(e.f, fs.get_flags(e.f)? | NODUMP, true), 0, EPERM, 0),
        // ---- a file: its names
        row("link", File, |fs, e| fs.link(e.f, e.e, b"l").map(|_| ()), 0, EPERM, EPERM),
        row("unlink", File, |fs, e| fs.unlink(e.d, b"f"), 0, EPERM, EPERM),
        row("rename in its directory", File, |fs, e| rename(fs, (e.d, b"f"), (e.d, b"f2"), PLAIN), 0, EPERM, EPERM),
        row("rename to another directory", File, |fs, e| rename(fs, (e.d, b"f"), (e.e, b"f"), PLAIN), 0, EPERM, EPERM),
        row("rename over another file", File, |fs, e| rename(fs, (e.d, b"f"), (1, b"g"), PLAIN), 0, EPERM, EPERM),
        row("rename another file over it", File, |fs, e| rename(fs, (1, b"g"), (e.d, b"f"), PLAIN), 0, EPERM, EPERM),
        row("exchange with another file", File, |fs, e| rename(fs, (1, b"g"), (e.d, b"f"), EXCHANGE), 0, EPERM, EPERM),
        row("rename over a directory", File, |fs, e| rename(fs, (e.d, b"f"), (e.d, b"sub"), PLAIN), libc::EISDIR, EPERM, EPERM),
        row("rename noreplace onto a name", File, |fs, e| rename(fs, (e.d, b"f"), (1, b"g"), NOREPLACE), libc::EEXIST, libc::EEXIST, libc::EEXIST),
        row("create over its name", File, |fs, e| fs.create(e.d, b"f", 0o644, 0, 0).map(|(_, h)| fs.release(h)), libc::EEXIST, libc::EEXIST, libc::EEXIST),
        // ---- a file: open(2)
        row("open O_RDONLY", File, |fs, e| open_flags(fs, e.f, libc::O_RDONLY), 0, 0, 0),
        row("open O_WRONLY", File, |fs, e| open_flags(fs, e.f, libc::O_WRONLY), 0, EPERM, EPERM),
        row("open O_RDWR", File, |fs, e| open_flags(fs, e.f, libc::O_RDWR), 0, EPERM, EPERM),
        row("open O_WRONLY|O_APPEND", File, |fs, e| open_flags(fs, e.f, libc::O_WRONLY | libc::O_APPEND), 0, EPERM, 0),
        row("open O_RDWR|O_APPEND", File, |fs, e| open_flags(fs, e.f, libc::O_RDWR | libc::O_APPEND), 0, EPERM, 0),
        row("open O_RDONLY|O_TRUNC", File, |fs, e| open_flags(fs, e.f, libc::O_RDONLY | libc::O_TRUNC), 0, EPERM, EPERM),
        row("open O_WRONLY|O_APPEND|O_TRUNC", File, |fs, e| open_flags(fs, e.f, libc::O_WRONLY | libc::O_APPEND | libc::O_TRUNC), 0, EPERM, EPERM),
        // ---- a directory: its entries
        row("create in it", Dir, |fs, e| fs.create(e.d, b"new", 0o644, 0, 0).map(|(_, h)| fs.release(h)), 0, EPERM, 0),
        row("create over a name in it", Dir, |fs, e| fs.create(e.d, b"f", 0o644, 0, 0).map(|(_, h)| fs.release(h)), libc::EEXIST, libc::EEXIST, libc::EEXIST),
        row("mkdir in it", Dir, |fs, e| fs.mkdir(e.d, b"nd", 0o755, 0, 0).map(|_| ()), 0, EPERM, 0),
        row("mknod in it", Dir, |fs, e| fs.mknod(e.d, b"p", libc::S_IFIFO | 0o644, 0, 0, 0).map(|_| ()), 0, EPERM, 0),
        row("symlink in it", Dir, |fs, e| fs.symlink(e.d, b"s", b"f", 0, 0).map(|_| ()), 0, EPERM, 0),
        row("link into it", Dir, |fs, e| fs.link(e.g, e.d, b"l").map(|_| ()), 0, EPERM, 0),
        row("unlink in it", Dir, |fs, e| fs.unlink(e.d, b"f"), 0, EPERM, EPERM),
        row("unlink an absent name", Dir, |fs, e| fs.unlink(e.d, b"none"), libc::ENOENT, libc::ENOENT, libc::ENOENT),
        row("unlink a directory in it", Dir, |fs, e| fs.unlink(e.d, b"sub"), libc::EISDIR, EPERM, EPERM),
        row("rmdir in it", Dir, |fs, e| fs.rmdir(e.d, b"sub"), 0, EPERM, EPERM),
        row("rmdir a file in it", Dir, |fs, e| fs.rmdir(e.d, b"f"), libc::ENOTDIR, EPERM, EPERM),
        row("rename within it", Dir, |fs, e| rename(fs, (e.d, b"f"), (e.d, b"f2"), PLAIN), 0, EPERM, EPERM),
        row("rename out of it", Dir, |fs, e| rename(fs, (e.d, b"f"), (e.e, b"f"), PLAIN), 0, EPERM, EPERM),
        row("rename into it", Dir, |fs, e| rename(fs, (1, b"g"), (e.d, b"g"), PLAIN), 0, EPERM, 0),
        row("rename into it over a name", Dir, |fs, e| rename(fs, (1, b"g"), (e.d, b"f"), PLAIN), 0, EPERM, EPERM),
        row("exchange into it", Dir, |fs, e| rename(fs, (1, b"g"), (e.d, b"f"), EXCHANGE), 0, EPERM, EPERM),
        row("write a file in it", Dir, |fs, e| with_fh(fs, e.f, |h| fs.write(h, 0, b"x").map(|_| ())), 0, 0, 0),
        row("chmod a file in it", Dir, |fs, e| set(fs, e.f, SetAttr { mode: Some(0o600), ..Default::default() }), 0, 0, 0),
        row("readdir", Dir, |fs, e| fs.readdir(e.d, 0, &mut |_| true), 0, 0, 0),
        row("lookup", Dir, |fs, e| fs.lookup(e.d, b"f").map(|_| ()), 0, 0, 0),
        row("open O_RDONLY|O_DIRECTORY", Dir, |fs, e| open_flags(fs, e.d, libc::O_RDONLY | libc::O_DIRECTORY), 0, 0, 0),
        // ---- a directory: itself
        row("rmdir it, not empty", Dir, |fs, _| fs.rmdir(1, b"d"), libc::ENOTEMPTY, EPERM, EPERM),
        row("rename it", Dir, |fs, e| rename(fs, (1, b"d"), (e.e, b"d"), PLAIN), 0, EPERM, EPERM),
        row("rename a directory over it", Dir, |fs, _| rename(fs, (1, b"e"), (1, b"d"), PLAIN), libc::ENOTEMPTY, EPERM, EPERM),
        row("chmod it", Dir, |fs, e| set(fs, e.d, SetAttr { mode: Some(0o700), ..Default::default() }), 0, EPERM, EPERM),
        row("utimes it to now", Dir, |fs, e| set(fs, e.d, SetAttr { mtime: Some(TimeSet::Now), ..Default::default() }), 0, EPERM, 0),
        row("truncate it", Dir, |fs, e| set(fs, e.d, SetAttr { size: Some(0), ..Default::default() }), libc::EISDIR, libc::EISDIR, libc::EISDIR),
        row("setxattr on it", Dir, |fs, e| fs.setxattr(e.d, b"user.y", b"v", XattrFlags::Any), 0, EPERM, EPERM),
        row("removexattr on it", Dir, |fs, e| fs.removexattr(e.d, b"user.x"), 0, EPERM, EPERM),
        row("link it", Dir, |fs, e| fs.link(e.d, e.e, b"dl").map(|_| ()), EPERM, EPERM, EPERM),
    ]
}

fn errno_of(r: R) -> i32 {
    match r {
        Ok(()) => 0,
        Err(Error::Errno(e)) => e,
        Err(other) => panic!("not an errno: {other:?}"),
    }
}

/// What a refused operation must leave untouched: the whole namespace
/// (contents, xattrs, flags, atime and mtime) and every inode's ctime.
fn state(fs: &Fs<SimPool>) -> (Snap, Vec<(String, i64)>) {
    let snap = snapshot(fs).expect("consistent");
    let ctimes = snap
        .nodes
        .iter()
        .map(|(p, n)| (p.clone(), fs.getattr(n.ino).unwrap().ctime_ns))
        .collect();
    (snap, ctimes)
}

#[test]
fn every_operation_on_flagged_inodes_gets_the_linux_errno() {
    let mut failures = Vec::new();
    for row in rows() {
        for (flag, want) in [
            (0, row.base),
            (IMMUTABLE, row.immutable),
            (APPEND, row.append),
        ] {
            let (fs, env) = setup();
            let target = match row.target {
                Target::File => env.f,
                Target::Dir => env.d,
            };
            if flag != 0 {
                fs.set_flags(target, flag, true).unwrap();
            }
            let before = state(&fs);
            let got = errno_of((row.op)(&fs, &env));
            if got != want {
                failures.push(format!(
                    "{} on a {:?} with flags {flag:#x}: errno {got}, Linux gives {want}",
                    row.name, row.target
                ));
                continue;
            }
            if got != 0 {
                let after = state(&fs);
                if after != before {
                    failures.push(format!(
                        "{} on a {:?} with flags {flag:#x} failed with {got} but changed the state:\n{}",
                        row.name,
                        row.target,
                        diff(&before.0, &after.0)
                    ));
                }
            }
            // The flags stay as set whatever the operation did (unless it
            // removed the target's last name).
            let expect_flags = if row.name.starts_with("chattr") && got == 0 {
                flag | NODUMP
            } else {
                flag
            };
            if let Ok(flags) = fs.get_flags(target) {
                assert_eq!(flags, expect_flags, "{}", row.name);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn only_privileged_callers_change_immutable_and_append_only() {
    let (fs, env) = setup();
    let f = env.f;
    for bits in [IMMUTABLE, APPEND, IMMUTABLE | APPEND] {
        assert_eq!(errno_of(fs.set_flags(f, bits, false)), EPERM, "{bits:#x}");
    }
    // Other flags are the owner's to change (the engine does not know the
    // caller yet; the FUSE kernel checks ownership before asking).
    fs.set_flags(f, NODUMP | NOATIME, false).unwrap();
    assert_eq!(fs.get_flags(f).unwrap(), NODUMP | NOATIME);
    fs.set_flags(f, APPEND | NODUMP, true).unwrap();
    // Clearing needs privilege as much as setting.
    assert_eq!(errno_of(fs.set_flags(f, NODUMP, false)), EPERM);
    // Unchanged privileged bits need none.
    fs.set_flags(f, APPEND, false).unwrap();
    assert_eq!(fs.get_flags(f).unwrap(), APPEND);
    fs.set_flags(f, 0, true).unwrap();
    assert_eq!(fs.get_flags(f).unwrap(), 0);
}

#[test]
fn set_flags_refuses_what_inkfs_cannot_store_or_the_kind_cannot_carry() {
    let (fs, env) = setup();
    // FS_SECRM_FL, FS_SYNC_FL, FS_EXTENT_FL: not stored.
    for bit in [0x1u32, 0x8, 0x80000, 0x4000_0000] {
        assert_eq!(
            errno_of(fs.set_flags(env.f, bit, true)),
            libc::EOPNOTSUPP,
            "{bit:#x}"
        );
    }
    // An unprivileged caller asking for +i and an unknown bit: EPERM first
    // (the capability check precedes the file system's, as in Linux).
    assert_eq!(errno_of(fs.set_flags(env.f, IMMUTABLE | 0x1, false)), EPERM);
    // As ext4: only files and directories may be immutable or append-only.
    let sl = fs.symlink(1, b"sl", b"g", 0, 0).unwrap().ino;
    let fifo = fs
        .mknod(1, b"p", libc::S_IFIFO | 0o644, 0, 0, 0)
        .unwrap()
        .ino;
    for ino in [sl, fifo] {
        assert_eq!(
            errno_of(fs.set_flags(ino, IMMUTABLE, true)),
            libc::EOPNOTSUPP
        );
        assert_eq!(errno_of(fs.set_flags(ino, APPEND, true)), libc::EOPNOTSUPP);
        fs.set_flags(ino, NODUMP, true).unwrap();
        assert_eq!(fs.get_flags(ino).unwrap(), NODUMP);
    }
    // As ext4: an immutable inode that stays immutable changes no other flag.
    fs.set_flags(env.f, IMMUTABLE, true).unwrap();
    assert_eq!(
        errno_of(fs.set_flags(env.f, IMMUTABLE | NODUMP, true)),
        EPERM
    );
    assert_eq!(
        errno_of(fs.set_flags(env.f, IMMUTABLE | APPEND, true)),
        EPERM
    );
    fs.set_flags(env.f, IMMUTABLE, true).unwrap(); // the same flags: allowed
    fs.set_flags(env.f, NODUMP, true).unwrap(); // clearing +i with others: allowed
    assert_eq!(fs.get_flags(env.f).unwrap(), NODUMP);
    assert_eq!(errno_of(fs.get_flags(999_999).map(|_| ())), libc::ENOENT);
}

#[test]
fn set_flags_changes_ctime_only() {
    let (fs, env) = setup();
    let before = fs.getattr(env.f).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2));
    fs.set_flags(env.f, APPEND, true).unwrap();
    let after = fs.getattr(env.f).unwrap();
    assert!(after.ctime_ns > before.ctime_ns);
    assert_eq!(
        (after.mtime_ns, after.atime_ns, after.size, after.mode),
        (before.mtime_ns, before.atime_ns, before.size, before.mode)
    );
}

#[test]
fn read_only_mounts_report_flags_and_refuse_changes() {
    let (fs, env) = setup();
    fs.set_flags(env.f, APPEND | NODUMP, true).unwrap();
    let pm = fs.unmount().unwrap();
    let fs = Fs::mount(
        pm,
        MountOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(fs.get_flags(env.f).unwrap(), APPEND | NODUMP);
    assert_eq!(errno_of(fs.set_flags(env.f, 0, true)), libc::EROFS);
}

#[test]
fn new_inodes_inherit_nodump_and_noatime_only() {
    let (fs, env) = setup();
    fs.set_flags(env.d, APPEND | NODUMP | NOATIME, true)
        .unwrap();
    let (a, fh) = fs.create(env.d, b"c", 0o644, 0, 0).unwrap();
    fs.release(fh);
    let sub = fs.mkdir(env.d, b"c2", 0o755, 0, 0).unwrap().ino;
    let sl = fs.symlink(env.d, b"c3", b"c", 0, 0).unwrap().ino;
    assert_eq!(fs.get_flags(a.ino).unwrap(), NODUMP | NOATIME);
    assert_eq!(fs.get_flags(sub).unwrap(), NODUMP | NOATIME);
    assert_eq!(fs.get_flags(sl).unwrap(), NODUMP | NOATIME);
    // And keep them across a remount (they are in the record from the start).
    let pm = fs.unmount().unwrap();
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    assert_eq!(fs.get_flags(a.ino).unwrap(), NODUMP | NOATIME);
    assert_eq!(fs.get_flags(env.d).unwrap(), APPEND | NODUMP | NOATIME);
    // A recycled inode slot starts without the previous inode's flags.
    fs.set_flags(env.g, NODUMP, true).unwrap();
    fs.unlink(1, b"g").unwrap();
    let mut fresh_inos = Vec::new();
    for i in 0..8 {
        let (a, fh) = fs
            .create(1, format!("n{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
        fs.release(fh);
        fresh_inos.push(a.ino);
    }
    assert!(fresh_inos.contains(&env.g), "the slot was reused");
    for ino in fresh_inos {
        assert_eq!(fs.get_flags(ino).unwrap(), 0);
    }
}

#[test]
fn flags_survive_remount_and_crash_recovery() {
    for mode in [Mode::Strict, Mode::Sync, Mode::Posix] {
        let fs = fresh(mode, POOL);
        let d = fs.mkdir(1, b"d", 0o755, 0, 0).unwrap().ino;
        let (a, fh) = fs.create(d, b"f", 0o644, 0, 0).unwrap();
        fs.write(&fh, 0, b"data").unwrap();
        fs.release(fh);
        fs.set_flags(a.ino, IMMUTABLE | NODUMP, true).unwrap();
        fs.set_flags(d, APPEND, true).unwrap();
        // Crash (no unmount): recovery scans the logs and must keep them.
        let crashed = SimPool::from_image(fs.pmem().persisted_image());
        drop(fs);
        let fs = Fs::mount(crashed, opts(mode)).unwrap();
        assert!(!fs.mount_report().was_clean);
        assert_eq!(fs.get_flags(a.ino).unwrap(), IMMUTABLE | NODUMP);
        assert_eq!(fs.get_flags(d).unwrap(), APPEND);
        assert_eq!(errno_of(fs.unlink(d, b"f")), EPERM);
        // Clean remount: the same.
        let pm = fs.unmount().unwrap();
        let r = fsck::check(&pm, &FsckOptions::default()).unwrap();
        assert!(r.problems.is_empty(), "{:#?}", r.problems);
        let fs = Fs::mount(pm, opts(mode)).unwrap();
        assert!(fs.mount_report().allocator_restored);
        assert_eq!(fs.get_flags(a.ino).unwrap(), IMMUTABLE | NODUMP);
        assert_eq!(fs.get_flags(d).unwrap(), APPEND);
        let fh = fs.open(a.ino).unwrap();
        assert_eq!(errno_of(fs.append(&fh, b"x").map(|_| ())), EPERM);
        fs.release(fh);
    }
}

/// Every crash image taken while flags change (over enough changes that
/// the SET_ATTR entries cross log pages) recovers to a state the live file
/// system was in, with each inode's flags and ctime from the same change:
/// never the new flags with the old ctime or the reverse.
#[test]
fn a_crash_at_any_fence_of_a_flag_change_keeps_flags_and_ctime_together() {
    for mode in [Mode::Strict, Mode::Sync, Mode::Posix] {
        let fs = fresh(mode, 1 << 20);
        let d = fs.mkdir(1, b"d", 0o755, 0, 0).unwrap().ino;
        let (a, fh) = fs.create(d, b"f", 0o644, 0, 0).unwrap();
        fs.write(&fh, 0, &pattern(5000, 4)).unwrap();
        fs.fsync(&fh, false).unwrap();
        fs.release(fh);
        let f = a.ino;
        let pair = |fs: &Fs<SimPool>, ino| {
            (
                fs.get_flags(ino).unwrap(),
                fs.getattr(ino).unwrap().ctime_ns,
            )
        };
        let mut states = vec![snapshot(&fs).unwrap()];
        let mut free = vec![free_blocks(&fs)];
        let mut pairs = vec![(pair(&fs, f), pair(&fs, d))];
        let gc0 = fs.gc_stats().fast_pages_freed;
        fs.pmem().start_trace();
        let steps: Vec<(u64, u32)> = (0..110)
            .map(|i| match i % 5 {
                0 => (f, IMMUTABLE),
                1 => (f, NODUMP),
                2 => (d, APPEND | NOATIME),
                3 => (f, APPEND),
                _ => (d, 0),
            })
            .collect();
        for &(ino, flags) in &steps {
            fs.set_flags(ino, flags, true).unwrap();
            states.push(snapshot(&fs).unwrap());
            free.push(free_blocks(&fs));
            pairs.push((pair(&fs, f), pair(&fs, d)));
        }
        let trace = fs.pmem().stop_trace();
        assert!(
            fs.log_pages(f).unwrap() > 1,
            "the test must cross a log page"
        );
        let ctx = Ctx {
            mode,
            states: &states,
            expect: Expect::Exact,
            free: &free,
            free_slack: fs.gc_stats().fast_pages_freed - gc0,
            check_free_matches_state: true,
            final_durable: true,
        };
        let sw = sweep(&trace, &ctx, 3, SEED);
        let fail: Vec<String> = sw
            .failures
            .iter()
            .take(3)
            .map(|x| format!("point {} image {}: {}", x.point, x.index, x.why))
            .collect();
        assert!(fail.is_empty(), "{}: {}", mode.name(), fail.join("\n"));
        // Flags and ctime: from one change, at every point.
        let points = trace.fence_count();
        for point in 0..=points {
            for img in trace.crash_images(point, 3, SEED) {
                let fs = Fs::mount(SimPool::from_image(img.image), opts(mode)).unwrap();
                let got = (pair(&fs, f), pair(&fs, d));
                let ok = if point == points {
                    got == pairs[pairs.len() - 1]
                } else {
                    pairs.contains(&got)
                };
                assert!(
                    ok,
                    "{}: point {point} image {}: flags/ctime {got:?} in no state",
                    mode.name(),
                    img.index
                );
            }
        }
    }
}

/// Compaction rewrites the log from DRAM and switches head and tail; the
/// flags, in the record, must come through it (and through a remount).
#[test]
fn flags_survive_log_compaction() {
    let (fs, env) = setup();
    fs.set_flags(env.d, NOATIME, true).unwrap();
    let c0 = fs.gc_stats().compactions;
    for i in 0..400 {
        let flags = if i % 2 == 0 { APPEND | NODUMP } else { APPEND };
        fs.set_flags(env.f, flags, true).unwrap();
        let fh = fs.open(env.f).unwrap();
        fs.append(&fh, b"more").unwrap();
        fs.release(fh);
    }
    assert!(fs.gc_stats().compactions > c0, "the log was compacted");
    assert_eq!(fs.get_flags(env.f).unwrap(), APPEND);
    let size = fs.getattr(env.f).unwrap().size;
    assert_eq!(size, F_LEN + 400 * 4);
    let pm = fs.unmount().unwrap();
    let r = fsck::check(&pm, &FsckOptions::default()).unwrap();
    assert!(r.problems.is_empty(), "{:#?}", r.problems);
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    assert_eq!(fs.get_flags(env.f).unwrap(), APPEND);
    assert_eq!(fs.get_flags(env.d).unwrap(), NOATIME);
    assert_eq!(fs.getattr(env.f).unwrap().size, size);
}

/// Byte offset of `ino`'s record in a 2-lane pool whose lanes have one
/// table block each (the tests here create few inodes).
fn rec_off(pm: &SimPool, ino: u64) -> u64 {
    let sb: Superblock = read_pod(pm, 0);
    let (lane, slot) = ino_to_lane_slot(ino, sb.lane_count);
    assert!(slot < INODES_PER_TABLE_BLOCK);
    (lane_first_block(lane) + LANE_INODE_TABLE_BLOCK) * BLOCK_SIZE + slot * INODE_RECORD_SIZE
}

#[test]
fn unknown_flag_bits_are_refused_by_the_mount_and_cleared_by_fsck() {
    let (fs, env) = setup();
    fs.set_flags(env.f, APPEND, true).unwrap();
    let pm = fs.unmount().unwrap();
    let off = rec_off(&pm, env.f) + INODE_FLAGS_FIELD;
    assert_eq!(pm.read_u64(off), APPEND as u64);
    pm.write_u64(off, APPEND as u64 | 0x1_0000_0000 | 0x4);
    pm.persist(off, 8);

    let r = fsck::check(&pm, &FsckOptions::default()).unwrap();
    let bad: Vec<_> = r.errors().collect();
    assert_eq!(bad.len(), 1, "{:#?}", r.problems);
    assert_eq!(bad[0].kind, ProblemKind::InodeRecord);
    assert_eq!(bad[0].ino, Some(env.f));
    assert!(
        bad[0].message.contains("unknown inode flags"),
        "{}",
        bad[0].message
    );
    // The mount refuses to read the inode (it could not enforce the flags).
    let fs = Fs::mount(
        SimPool::from_image(pm.current_image()),
        MountOptions::default(),
    )
    .unwrap();
    match fs.getattr(env.f) {
        Err(Error::Corrupt(m)) => assert!(m.contains("unknown inode flags"), "{m}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    drop(fs);

    let r = fsck::check(
        &pm,
        &FsckOptions {
            repair: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(r.errors_fixed(), 1, "{:#?}", r.problems);
    assert_eq!(r.errors_remaining, 0);
    assert_eq!(pm.read_u64(off), APPEND as u64, "the known bit stays");
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    assert_eq!(fs.get_flags(env.f).unwrap(), APPEND);
}

/// fsck reads a pending journal's flags record as the mount will apply it.
#[test]
fn fsck_sees_a_committed_flag_change_through_the_journal() {
    let fs = fresh(Mode::Strict, POOL);
    let (a, fh) = fs.create(1, b"f", 0o644, 0, 0).unwrap();
    fs.release(fh);
    fs.pmem().sync_all().unwrap();
    fs.pmem().start_trace();
    fs.set_flags(a.ino, IMMUTABLE, true).unwrap();
    let trace = fs.pmem().stop_trace();
    // Every crash image: fsck clean (notes allowed), and the flags fsck
    // would see are the ones the mount then reports.
    for point in 0..=trace.fence_count() {
        for img in trace.crash_images(point, 8, SEED) {
            let pm = SimPool::from_image(img.image);
            let r = fsck::check(&pm, &FsckOptions::default()).unwrap();
            assert!(r.is_clean(), "point {point}: {:#?}", r.problems);
            let fs = Fs::mount(pm, MountOptions::default()).unwrap();
            let flags = fs.get_flags(a.ino).unwrap();
            assert!(flags == 0 || flags == IMMUTABLE, "{flags:#x}");
        }
    }
}
