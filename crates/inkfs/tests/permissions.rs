//! The permission table (tests/common/perm_table.rs) through `inkfs::api`:
//! paths resolved by the engine's own walk, every call made with the
//! caller's credentials. The FUSE mount must give the same answers
//! (crates/inkfs-fuse/tests/permissions.rs).

#[path = "common/perm_table.rs"]
mod perm_table;

use inkfs::api::{
    Credentials, Filesystem, Follow, MountOptions, OpenFlags, Rename, RenameFlags, SetAttr,
    TimeSet, XattrFlags, ROOT_INO,
};
use inkfs::pmem::SimPool;
use inkfs::types::FormatOptions;
use perm_table::*;

type Fs = Filesystem<SimPool>;

fn cred(who: Who) -> Credentials {
    let (uid, gid, groups) = who.ids();
    Credentials {
        uid,
        gid,
        groups,
        umask: UMASK,
    }
}

fn join(base: &str, rel: &str) -> Vec<u8> {
    format!("{base}/{rel}").into_bytes()
}

/// Build `tree` under `/base` as root: contents, an xattr, then owner and
/// mode (mode last: a chown would drop set-id bits).
fn build(fs: &Fs, base: &str, tree: &[Node]) {
    let root = Credentials::root();
    fs.mkdir(&root, ROOT_INO, base.as_bytes(), 0o777).unwrap();
    for n in tree {
        let p = fs
            .resolve_parent(&root, ROOT_INO, &join(base, n.path))
            .unwrap();
        let ino = if n.dir {
            fs.mkdir(&root, p.dir, &p.name, 0o700).unwrap().ino
        } else {
            let flags = OpenFlags::new(libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL);
            let (a, f) = fs.create(&root, p.dir, &p.name, 0o600, flags).unwrap();
            fs.write(&f, 0, CONTENT).unwrap();
            fs.release(f);
            fs.setxattr(&root, a.ino, XATTR.0.as_bytes(), XATTR.1, XattrFlags::Any)
                .unwrap();
            a.ino
        };
        let owner = SetAttr {
            uid: Some(n.uid),
            gid: Some(n.gid),
            ..Default::default()
        };
        fs.setattr(&root, ino, &owner, None).unwrap();
        let mode = SetAttr {
            mode: Some(n.mode),
            ..Default::default()
        };
        fs.setattr(&root, ino, &mode, None).unwrap();
    }
}

/// Run `op` under `/base` as `c`: 0 or the errno.
fn run(fs: &Fs, c: &Credentials, base: &str, op: Op) -> i32 {
    let r = (|| -> inkfs::api::Result<()> {
        let at = |p: &str| fs.resolve(c, ROOT_INO, &join(base, p), Follow::Yes);
        let parent = |p: &str| fs.resolve_parent(c, ROOT_INO, &join(base, p));
        match op {
            Op::Open(p, flags) => {
                let a = at(p)?;
                let f = fs.open(c, a.ino, OpenFlags::new(flags))?;
                fs.release(f);
            }
            Op::Create(p, mode) => {
                let d = parent(p)?;
                let flags = OpenFlags::new(libc::O_CREAT | libc::O_WRONLY | libc::O_EXCL);
                let (_, f) = fs.create(c, d.dir, &d.name, mode, flags)?;
                fs.release(f);
            }
            Op::CreateMasked(p, mode, umask) => {
                let c = &Credentials { umask, ..c.clone() };
                let d = fs.resolve_parent(c, ROOT_INO, &join(base, p))?;
                let flags = OpenFlags::new(libc::O_CREAT | libc::O_WRONLY | libc::O_EXCL);
                let (_, f) = fs.create(c, d.dir, &d.name, mode, flags)?;
                fs.release(f);
            }
            Op::MkdirMasked(p, mode, umask) => {
                let c = &Credentials { umask, ..c.clone() };
                let d = fs.resolve_parent(c, ROOT_INO, &join(base, p))?;
                fs.mkdir(c, d.dir, &d.name, mode)?;
            }
            Op::Stat(p) => {
                at(p)?;
            }
            Op::Access(p, mask) => {
                let a = at(p)?;
                fs.access(c, a.ino, mask)?;
            }
            Op::Unlink(p) => {
                let d = parent(p)?;
                fs.unlink(c, d.dir, &d.name)?;
            }
            Op::Rmdir(p) => {
                let d = parent(p)?;
                fs.rmdir(c, d.dir, &d.name)?;
            }
            Op::Mkdir(p, mode) => {
                let d = parent(p)?;
                fs.mkdir(c, d.dir, &d.name, mode)?;
            }
            Op::Rename(from, to) => {
                let (f, t) = (parent(from)?, parent(to)?);
                let r = Rename {
                    from_dir: f.dir,
                    from: &f.name,
                    to_dir: t.dir,
                    to: &t.name,
                    flags: RenameFlags::default(),
                };
                fs.rename(c, &r)?;
            }
            Op::Link(existing, new) => {
                let a = fs.resolve(c, ROOT_INO, &join(base, existing), Follow::No)?;
                let d = parent(new)?;
                fs.link(c, a.ino, d.dir, &d.name)?;
            }
            Op::Symlink(target, p) => {
                let d = parent(p)?;
                fs.symlink(c, d.dir, &d.name, target.as_bytes())?;
            }
            Op::Mknod(p, mode, rdev) => {
                let d = parent(p)?;
                fs.mknod(c, d.dir, &d.name, mode, rdev)?;
            }
            Op::Chmod(p, mode) => {
                let set = SetAttr {
                    mode: Some(mode),
                    ..Default::default()
                };
                fs.setattr(c, at(p)?.ino, &set, None)?;
            }
            Op::Chown(p, uid, gid) => {
                let set = SetAttr {
                    uid,
                    gid,
                    ..Default::default()
                };
                fs.setattr(c, at(p)?.ino, &set, None)?;
            }
            Op::Utimes(p, explicit) => {
                let t = if explicit {
                    TimeSet::At(1_000_000_000)
                } else {
                    TimeSet::Now
                };
                let set = SetAttr {
                    atime: Some(t),
                    mtime: Some(t),
                    ..Default::default()
                };
                fs.setattr(c, at(p)?.ino, &set, None)?;
            }
            Op::Truncate(p, size) => {
                let set = SetAttr {
                    size: Some(size),
                    ..Default::default()
                };
                fs.setattr(c, at(p)?.ino, &set, None)?;
            }
            Op::SetXattr(p, name) => {
                fs.setxattr(c, at(p)?.ino, name.as_bytes(), b"x", XattrFlags::Any)?;
            }
            Op::GetXattr(p, name) => {
                fs.getxattr(c, at(p)?.ino, name.as_bytes())?;
            }
            Op::RemoveXattr(p, name) => {
                fs.removexattr(c, at(p)?.ino, name.as_bytes())?;
            }
            Op::ReadDir(p) => {
                let d = fs.opendir(c, at(p)?.ino)?;
                let r = fs.readdir(&d, 0, &mut |_| true);
                fs.release(d);
                r?;
            }
            Op::Write(p) => {
                let f = fs.open(c, at(p)?.ino, OpenFlags::new(libc::O_WRONLY))?;
                let r = fs.write(&f, 0, b"x");
                fs.release(f);
                r?;
            }
        }
        Ok(())
    })();
    r.err().map_or(0, |e| e.errno())
}

/// The case's after-check, as root; a description of what is wrong.
fn check(fs: &Fs, who: Who, base: &str, check: Check) -> Option<String> {
    let root = Credentials::root();
    let stat = |p: &str| {
        fs.resolve(&root, ROOT_INO, &join(base, p), Follow::No)
            .unwrap()
    };
    match check {
        Check::None => None,
        Check::Gid(p, gid) => {
            let want = gid.unwrap_or(who.ids().1);
            let got = stat(p).gid;
            (got != want).then(|| format!("{p}: gid {got}, expected {want}"))
        }
        Check::Mode(p, non_root, root_mode) => {
            let want = if who == Who::Root {
                root_mode
            } else {
                non_root
            };
            let got = stat(p).mode & 0o7777;
            (got != want).then(|| format!("{p}: mode {got:o}, expected {want:o}"))
        }
    }
}

#[test]
fn permission_table_through_the_api() {
    let pm = SimPool::new(32 << 20);
    Fs::format(&pm, &FormatOptions::default()).unwrap();
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    let mut wrong = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        for (w, &who) in WHO.iter().enumerate() {
            let base = format!("c{i}-{w}");
            build(&fs, &base, case.tree);
            let got = run(&fs, &cred(who), &base, case.op);
            let want = case.expect[w];
            if got != want {
                wrong.push(format!(
                    "{}: {who:?} got errno {got}, expected {want}",
                    case.name
                ));
            } else if got == 0 {
                if let Some(why) = check(&fs, who, &base, case.check) {
                    wrong.push(format!("{}: {who:?}: {why}", case.name));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // And the pool is consistent after all of it.
    let pm = fs.unmount().unwrap();
    let report = inkfs::fsck::check(&pm, &Default::default()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// A lookup's errors, in the order the walk checks them: a gone
/// directory (ENOENT), the search check on it (ENOTDIR for a file, EACCES
/// without search permission, before a name's length), then the name
/// (ENAMETOOLONG, ENOENT). The check and the lookup run on one load of
/// the directory (namei.rs, `lookup_ino_checked`).
#[test]
fn lookup_errors_come_in_the_walks_order() {
    let pm = SimPool::new(8 << 20);
    Fs::format(&pm, &FormatOptions::default()).unwrap();
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    let root = Credentials::root();
    let other = cred(Who::Other);
    let errno = |r: inkfs::Result<inkfs::api::Attr>| match r {
        Ok(a) => panic!("lookup succeeded: {a:?}"),
        Err(inkfs::Error::Errno(e)) => e,
        Err(e) => panic!("not an errno: {e:?}"),
    };
    let closed = fs.mkdir(&root, ROOT_INO, b"closed", 0o700).unwrap().ino;
    let open = fs.mkdir(&root, ROOT_INO, b"open", 0o711).unwrap().ino;
    let flags = OpenFlags::new(libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL);
    let (f, h) = fs.create(&root, open, b"f", 0o644, flags).unwrap();
    fs.release(h);
    let gone = fs.mkdir(&root, ROOT_INO, b"gone", 0o755).unwrap().ino;
    fs.rmdir(&root, ROOT_INO, b"gone").unwrap();
    let long = vec![b'n'; 256];

    assert_eq!(fs.lookup(&other, open, b"f").unwrap().ino, f.ino);
    assert_eq!(errno(fs.lookup(&other, closed, b"x")), libc::EACCES);
    assert_eq!(errno(fs.lookup(&other, closed, &long)), libc::EACCES);
    assert_eq!(errno(fs.lookup(&root, closed, &long)), libc::ENAMETOOLONG);
    assert_eq!(errno(fs.lookup(&root, closed, b"x")), libc::ENOENT);
    assert_eq!(errno(fs.lookup(&other, f.ino, b"x")), libc::ENOTDIR);
    assert_eq!(errno(fs.lookup(&root, f.ino, &long)), libc::ENOTDIR);
    assert_eq!(errno(fs.lookup(&root, gone, b"x")), libc::ENOENT);
    // "." and ".." are names like others once the check passed.
    assert_eq!(fs.lookup(&other, open, b".").unwrap().ino, open);
    assert_eq!(fs.lookup(&other, open, b"..").unwrap().ino, ROOT_INO);
    assert_eq!(errno(fs.lookup(&other, closed, b".")), libc::EACCES);
}
