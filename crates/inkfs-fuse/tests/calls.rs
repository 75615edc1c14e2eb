//! Linux calls other file systems answer, through the FUSE mount:
//! renameat2(RENAME_WHITEOUT) (served), fallocate COLLAPSE_RANGE and
//! INSERT_RANGE, FIEMAP and O_TMPFILE (which this kernel's FUSE or fuser
//! do not pass to the server; the tests pin down what a caller sees, so the
//! README's account of them stays true). Root required (mounts, setuid).

mod common;

use std::ffi::CString;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use common::*;

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in test paths")
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// renameat2(2) through libc: 0 or the errno.
fn renameat2(from: &Path, to: &Path, flags: u32) -> i32 {
    let (a, b) = (cpath(from), cpath(to));
    // SAFETY: valid NUL-terminated paths; AT_FDCWD.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        0
    } else {
        last_errno()
    }
}

/// renameat2 in a child process running as `uid`/`gid` (no supplementary
/// groups): 0 or the errno. The child makes system calls only.
fn renameat2_as(uid: u32, gid: u32, from: &Path, to: &Path, flags: u32) -> i32 {
    let (a, b) = (cpath(from), cpath(to));
    // SAFETY: the child calls only async-signal-safe system calls on
    // memory prepared before the fork, then _exit.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let ok = libc::setgroups(0, std::ptr::null()) == 0
                && libc::setresgid(gid, gid, gid) == 0
                && libc::setresuid(uid, uid, uid) == 0;
            if !ok {
                libc::_exit(255);
            }
            let r = libc::renameat2(
                libc::AT_FDCWD,
                a.as_ptr(),
                libc::AT_FDCWD,
                b.as_ptr(),
                flags,
            );
            libc::_exit(if r == 0 { 0 } else { *libc::__errno_location() });
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        assert!(libc::WIFEXITED(status));
        let code = libc::WEXITSTATUS(status);
        assert_ne!(code, 255, "the child could not change its ids");
        code
    }
}

/// How many requests of kind `op` the mounted server has answered.
fn op_count(m: &Mounted, op: &str) -> u64 {
    let json = inkfs_fuse::stat_mountpoint(m.path(), true)
        .unwrap()
        .unwrap();
    let key = format!("\"{op}\":{{\"count\":");
    let Some(at) = json.find(&key) else {
        return 0;
    };
    json[at + key.len()..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .unwrap_or_else(|_| panic!("{op} count in {json}"))
}

fn is_whiteout(md: &fs::Metadata) -> bool {
    md.file_type().is_char_device() && md.rdev() == 0 && md.mode() & 0o7777 == 0
}

/// Whiteouts through renameat2, as root and as an unprivileged caller.
fn whiteout_walk(base: &Path) {
    let p = |rel: &str| base.join(rel);
    fs::write(p("f"), b"data").unwrap();
    fs::create_dir(p("d")).unwrap();
    assert_eq!(renameat2(&p("f"), &p("d/g"), libc::RENAME_WHITEOUT), 0);
    let w = fs::symlink_metadata(p("f")).unwrap();
    assert!(is_whiteout(&w), "{w:?}");
    assert_eq!((w.uid(), w.gid(), w.nlink()), (0, 0, 1));
    assert_eq!(fs::read(p("d/g")).unwrap(), b"data");
    // Listed as a character device (overlayfs reads d_type).
    let kinds: Vec<(String, bool)> = fs::read_dir(base)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                e.file_type().unwrap().is_char_device(),
            )
        })
        .collect();
    assert!(kinds.contains(&("f".into(), true)), "{kinds:?}");
    // The kernel checks the flags before the server sees them; the server
    // checks NOREPLACE against the target.
    fs::write(p("h"), b"h").unwrap();
    let wx = libc::RENAME_WHITEOUT | libc::RENAME_EXCHANGE;
    assert_eq!(renameat2(&p("h"), &p("d/g"), wx), libc::EINVAL);
    let wn = libc::RENAME_WHITEOUT | libc::RENAME_NOREPLACE;
    assert_eq!(renameat2(&p("h"), &p("d/g"), wn), libc::EEXIST);
    assert_eq!(renameat2(&p("h"), &p("d/h"), wn), 0);
    assert!(is_whiteout(&fs::symlink_metadata(p("h")).unwrap()));
    // A whiteout over an existing file; and a directory moved with one.
    fs::write(p("x"), b"x").unwrap();
    assert_eq!(renameat2(&p("x"), &p("d/g"), libc::RENAME_WHITEOUT), 0);
    assert_eq!(fs::read(p("d/g")).unwrap(), b"x");
    fs::create_dir(p("sub")).unwrap();
    assert_eq!(renameat2(&p("sub"), &p("d/sub"), libc::RENAME_WHITEOUT), 0);
    assert!(is_whiteout(&fs::symlink_metadata(p("sub")).unwrap()));
    assert!(fs::metadata(p("d/sub")).unwrap().is_dir());

    // Unprivileged (Linux needs no capability for a whiteout since 5.8):
    // owned by the caller, with a set-group-ID directory's group.
    fs::create_dir(p("tmp")).unwrap();
    fs::set_permissions(p("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::create_dir(p("tmp/sg")).unwrap();
    std::os::unix::fs::chown(p("tmp/sg"), Some(65534), Some(4242)).unwrap();
    fs::set_permissions(p("tmp/sg"), fs::Permissions::from_mode(0o2777)).unwrap();
    fs::write(p("tmp/sg/mine"), b"m").unwrap();
    std::os::unix::fs::chown(p("tmp/sg/mine"), Some(65534), Some(65534)).unwrap();
    let r = renameat2_as(
        65534,
        65534,
        &p("tmp/sg/mine"),
        &p("tmp/sg/moved"),
        libc::RENAME_WHITEOUT,
    );
    assert_eq!(r, 0, "{}", std::io::Error::from_raw_os_error(r));
    let w = fs::symlink_metadata(p("tmp/sg/mine")).unwrap();
    assert!(is_whiteout(&w));
    assert_eq!((w.uid(), w.gid()), (65534, 4242));
}

/// The walk above in a child with the library in (returns at once unless
/// started as that child).
#[test]
fn whiteout_child() {
    if let Some(base) = child_arg() {
        whiteout_walk(Path::new(&base));
    }
}

#[test]
fn rename_whiteout_through_the_mount() {
    let pool = Pool::new("whiteout", 64);
    let m = Mounted::new(&pool, "");
    if preloading() {
        // renameat2 and the checks through the library.
        in_preloaded_child("whiteout_child", &m.path().display().to_string());
    } else {
        whiteout_walk(m.path());
    }
    // Everything is on the pool after a remount.
    let dir = m.unmount();
    let m = Mounted::at(&pool, dir, "");
    for p in ["f", "h", "sub", "tmp/sg/mine"] {
        assert!(is_whiteout(&fs::symlink_metadata(m.p(p)).unwrap()), "{p}");
    }
    assert_eq!(fs::read(m.p("d/g")).unwrap(), b"x");
    assert!(fs::metadata(m.p("d/sub")).unwrap().is_dir());
    let dir = m.unmount();
    drop(dir);
    let report = inkfs::fsck::check(
        &inkfs::pmem::MappedPool::open(&pool.path, &Default::default()).unwrap(),
        &Default::default(),
    )
    .unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// fallocate COLLAPSE_RANGE / INSERT_RANGE through the mount. Linux 6.18's
/// FUSE (fuse_file_fallocate) refuses every mode but KEEP_SIZE, PUNCH_HOLE
/// and ZERO_RANGE with EOPNOTSUPP before sending anything, so the server
/// never sees them; should a kernel forward them, they must work as ext4's.
#[test]
fn collapse_and_insert_through_the_mount() {
    let pool = Pool::new("shift", 64);
    let m = Mounted::new(&pool, "");
    let mut data = Vec::new();
    for i in 0..6u8 {
        data.extend(std::iter::repeat_n(b'a' + i, 4096));
    }
    fs::write(m.p("f"), &data).unwrap();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("f"))
        .unwrap();
    let before = op_count(&m, "fallocate");
    let fallocate = |mode: i32, off: i64, len: i64| {
        // SAFETY: a valid descriptor.
        let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, off, len) };
        if r == 0 {
            0
        } else {
            last_errno()
        }
    };
    let r = fallocate(libc::FALLOC_FL_COLLAPSE_RANGE, 4096, 2 * 4096);
    let mut model = data.clone();
    if r == 0 {
        model.drain(4096..3 * 4096);
        assert_eq!(fs::read(m.p("f")).unwrap(), model);
        assert_eq!(fallocate(libc::FALLOC_FL_INSERT_RANGE, 0, 4096), 0);
        model.splice(0..0, vec![0u8; 4096]);
        assert_eq!(fs::read(m.p("f")).unwrap(), model);
    } else {
        assert_eq!(r, libc::EOPNOTSUPP);
        assert_eq!(
            fallocate(libc::FALLOC_FL_INSERT_RANGE, 0, 4096),
            libc::EOPNOTSUPP
        );
        assert_eq!(
            op_count(&m, "fallocate"),
            before,
            "the kernel refused collapse/insert, yet the server got a request"
        );
        assert_eq!(fs::read(m.p("f")).unwrap(), model);
    }
    // The modes the kernel does forward still work.
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    assert_eq!(fallocate(punch, 0, 4096), 0);
    // The server counts a request just after answering it: wait for it.
    let deadline = std::time::Instant::now() + inkfs::testkit::WAIT_LIMIT;
    while op_count(&m, "fallocate") <= before && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(op_count(&m, "fallocate") > before);
}

/// FIEMAP and O_TMPFILE: what a caller of the mount gets (README: the
/// engine has `Fs::fiemap`; O_TMPFILE waits for a front end that can
/// deliver FUSE_TMPFILE, which fuser 0.18 does not parse).
#[test]
fn fiemap_and_o_tmpfile_are_not_offered_by_the_mount() {
    let pool = Pool::new("fiemap", 64);
    let m = Mounted::new(&pool, "");
    if preloading() {
        // The same answers to a program under the library.
        in_preloaded_child("fiemap_child", &m.path().display().to_string());
    } else {
        fiemap_and_tmpfile(m.path());
    }
}

/// The test above in a child with the library in.
#[test]
fn fiemap_child() {
    if let Some(base) = child_arg() {
        fiemap_and_tmpfile(Path::new(&base));
    }
}

fn fiemap_and_tmpfile(base: &Path) {
    fs::write(base.join("f"), vec![7u8; 3 * 4096]).unwrap();
    let f = fs::File::open(base.join("f")).unwrap();
    // struct fiemap with room for no extent: the kernel's FIEMAP answers
    // before any FUSE request (fs/ioctl.c, FUSE has no ->fiemap).
    let mut buf = [0u64; 4];
    buf[1] = u64::MAX; // fm_length
    const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
    // SAFETY: `buf` is a 32-byte struct fiemap with fm_extent_count 0.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_FIEMAP, buf.as_mut_ptr()) };
    assert_eq!((r, last_errno()), (-1, libc::EOPNOTSUPP));
    let dir = cpath(base);
    // SAFETY: a valid path; the descriptor is closed if one is returned.
    let fd = unsafe { libc::open(dir.as_ptr(), libc::O_TMPFILE | libc::O_RDWR, 0o600) };
    let e = last_errno();
    if fd >= 0 {
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
    }
    assert_eq!((fd, e), (-1, libc::EOPNOTSUPP));
}
