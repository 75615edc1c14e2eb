//! chattr/lsattr on an inkfs mount, as on ext4: `chattr +i` and `+a` are
//! enforced by the engine (the kernel never learns a FUSE inode's flags),
//! only root changes them, they survive a remount, and lsattr (and the
//! FS_IOC_FSGETXATTR/FSSETXATTR pair) reads them back. Root required; needs
//! e2fsprogs (chattr, lsattr) and util-linux (setpriv).

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::Output;

use common::*;

fn tools() {
    require_tool("chattr", "e2fsprogs");
    require_tool("lsattr", "e2fsprogs");
    require_tool("setpriv", "util-linux");
    require_tool("setfattr", "attr");
}

fn errno<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.raw_os_error().unwrap_or(0),
    }
}

/// `sh -c script`, as root or as another user; not asserted.
fn shell(script: &str, uid: Option<u32>) -> Output {
    let mut c = match uid {
        None => tool("sh"),
        Some(uid) => {
            let mut c = tool("setpriv");
            c.args([
                &format!("--reuid={uid}"),
                &format!("--regid={uid}"),
                "--clear-groups",
                "sh",
            ]);
            c
        }
    };
    c.arg("-c").arg(script).output().expect("run sh")
}

fn ok(script: &str) {
    let out = shell(script, None);
    assert!(
        out.status.success(),
        "`{script}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `script` fails with "Operation not permitted" (EPERM).
fn eperm(script: &str) {
    eperm_as(script, None)
}

fn eperm_as(script: &str, uid: Option<u32>) {
    let out = shell(script, uid);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("Operation not permitted"),
        "`{script}` as {uid:?}: expected EPERM, got status {} stderr {err:?}",
        out.status
    );
}

/// The attribute letters lsattr shows for `path` (dashes dropped).
fn lsattr(path: &Path) -> String {
    let out = run(tool("lsattr").arg("-d").arg(path));
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    line.split_whitespace()
        .next()
        .unwrap_or("")
        .chars()
        .filter(|&c| c != '-')
        .collect()
}

#[test]
fn chattr_immutable_file() {
    tools();
    let pool = Pool::new("flags-i", 64);
    // The server's open refuses writers (not so with kernel_open, which
    // gives that up: docs/MODES.md).
    let m = Mounted::new(&pool, "nokernel_open");
    let f = m.p("f");
    fs::write(&f, b"kept\n").unwrap();
    let q = |p: &Path| p.display().to_string();
    ok(&format!("chattr +i {}", q(&f)));
    assert_eq!(lsattr(&f), "i");

    eperm(&format!("echo x >> {}", q(&f)));
    eperm(&format!("echo x > {}", q(&f)));
    eperm(&format!("rm -f {}", q(&f)));
    eperm(&format!("mv {} {}", q(&f), q(&m.p("g"))));
    eperm(&format!("ln {} {}", q(&f), q(&m.p("l"))));
    eperm(&format!("chmod 600 {}", q(&f)));
    eperm(&format!("chown 1:1 {}", q(&f)));
    eperm(&format!("touch {}", q(&f)));
    eperm(&format!("truncate -s 0 {}", q(&f)));
    eperm(&format!("setfattr -n user.a -v 1 {}", q(&f)));
    // Root too, and through every path the kernel has: open for writing,
    // fallocate on a descriptor opened before.
    let e = fs::OpenOptions::new().write(true).open(&f);
    assert_eq!(errno(e), libc::EPERM);
    assert_eq!(fs::read(&f).unwrap(), b"kept\n", "reading is allowed");

    ok(&format!("chattr -i {}", q(&f)));
    assert_eq!(lsattr(&f), "");
    ok(&format!("echo x >> {}", q(&f)));
    assert_eq!(fs::read(&f).unwrap(), b"kept\nx\n");
    ok(&format!("rm {}", q(&f)));
}

#[test]
fn chattr_append_only_file() {
    tools();
    let pool = Pool::new("flags-a", 64);
    let m = Mounted::new(&pool, "nokernel_open");
    let f = m.p("log");
    fs::write(&f, b"one\n").unwrap();
    let q = f.display().to_string();
    // A descriptor opened for writing before the flag was set: its writes
    // are checked at each call (only at the end of file now).
    let mut early = fs::OpenOptions::new().write(true).open(&f).unwrap();
    ok(&format!("chattr +a {q}"));
    assert_eq!(lsattr(&f), "a");

    ok(&format!("echo two >> {q}"));
    eperm(&format!("echo three > {q}"));
    eperm(&format!("rm -f {q}"));
    eperm(&format!("truncate -s 0 {q}"));
    eperm(&format!("chmod 600 {q}"));
    eperm(&format!("mv {q} {q}2"));
    eperm(&format!("setfattr -n user.a -v 1 {q}"));
    ok(&format!("touch {q}")); // times to "now": allowed
    assert_eq!(
        errno(fs::OpenOptions::new().write(true).open(&f)),
        libc::EPERM
    );
    // At offset 0 (the descriptor's position): refused. Under posix mode's
    // writeback cache the kernel takes the write into its page cache (it
    // does not know the flag): its write-back is refused, reported by
    // fsync, and the pages that could not be written are dropped.
    if writeback_cache(m.path()) {
        early.write_all(b"X").unwrap();
        assert_eq!(errno(early.sync_all()), libc::EPERM);
    } else {
        assert_eq!(errno(early.write(b"X")), libc::EPERM);
    }
    let mut a = fs::OpenOptions::new().append(true).open(&f).unwrap();
    a.write_all(b"four\n").unwrap();
    // fallocate: plain allocation yes, punching a hole no.
    // SAFETY: plain syscalls on an open descriptor.
    let r = unsafe { libc::fallocate(a.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, 8192) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    let r = unsafe {
        libc::fallocate(
            a.as_raw_fd(),
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE,
            0,
            4096,
        )
    };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EPERM)
    );
    drop((a, early));
    assert_eq!(fs::read(&f).unwrap(), b"one\ntwo\nfour\n");

    ok(&format!("chattr -a {q}"));
    ok(&format!("echo five > {q}"));
    assert_eq!(fs::read(&f).unwrap(), b"five\n");
}

#[test]
fn chattr_on_directories() {
    tools();
    let pool = Pool::new("flags-d", 64);
    let m = Mounted::new(&pool, "");
    let d = m.p("d");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("f"), b"x").unwrap();
    let q = d.display().to_string();

    ok(&format!("chattr +i {q}"));
    assert_eq!(lsattr(&d), "i");
    eperm(&format!("touch {q}/new"));
    eperm(&format!("mkdir {q}/sub"));
    eperm(&format!("rm {q}/f"));
    eperm(&format!("mv {q}/f {q}/g"));
    ok(&format!("echo y >> {q}/f")); // the file itself is not immutable
    ok(&format!("ls {q}"));

    ok(&format!("chattr -i {q} && chattr +a {q}"));
    assert_eq!(lsattr(&d), "a");
    ok(&format!("touch {q}/new && mkdir {q}/sub"));
    eperm(&format!("rm {q}/new"));
    eperm(&format!("rmdir {q}/sub"));
    eperm(&format!("mv {q}/new {}", m.p("out").display()));
    eperm(&format!("rm -r {q}"));
    ok(&format!("chattr -a {q} && rm -r {q}"));
}

#[test]
fn only_root_changes_immutable_and_append_only() {
    tools();
    let pool = Pool::new("flags-u", 64);
    let m = Mounted::new(&pool, "");
    fs::set_permissions(m.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let f = m.p("mine");
    // Owned by nobody: ownership is not what refuses.
    let out = shell(&format!("echo x > {}", f.display()), Some(65534));
    assert!(out.status.success(), "{out:?}");
    let q = f.display().to_string();
    eperm_as(&format!("chattr +i {q}"), Some(65534));
    eperm_as(&format!("chattr +a {q}"), Some(65534));
    assert_eq!(lsattr(&f), "");
    // Flags that need no privilege: the owner's to set.
    let out = shell(&format!("chattr +d {q}"), Some(65534));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(lsattr(&f), "d");
    // Once root made it append-only, its owner cannot undo that.
    ok(&format!("chattr +a {q}"));
    eperm_as(&format!("chattr -a {q}"), Some(65534));
    eperm_as(&format!("echo y > {q}"), Some(65534));
    let out = shell(&format!("echo y >> {q}"), Some(65534));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(lsattr(&f), "ad");
    // Somebody else's file: refused whatever the flag.
    eperm_as(&format!("chattr +d {}", m.path().display()), Some(65534));
}

#[test]
fn flags_survive_a_remount_and_read_through_fsgetxattr() {
    tools();
    let pool = Pool::new("flags-r", 64);
    let m = Mounted::new(&pool, "");
    fs::write(m.p("f"), b"x").unwrap();
    fs::create_dir(m.p("d")).unwrap();
    ok(&format!(
        "chattr +i {} && chattr +aA {} && chattr +d {}",
        m.p("f").display(),
        m.p("d").display(),
        m.p("d").display()
    ));
    let dir = m.unmount();
    let m = Mounted::at(&pool, dir, "");
    assert_eq!(lsattr(&m.p("f")), "i");
    assert_eq!(lsattr(&m.p("d")), "adA");
    eperm(&format!("rm {}", m.p("f").display()));

    // FS_IOC_FSGETXATTR / FSSETXATTR (lsattr -p, xfs_io chattr).
    let fd = fs::File::open(m.p("f")).unwrap();
    let mut x = [0u32; 7]; // struct fsxattr
                           // SAFETY: `x` is 28 bytes, the size the command carries.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), 0x801c_581f, x.as_mut_ptr()) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    assert_eq!(x[0], 0x8, "FS_XFLAG_IMMUTABLE");
    x[0] = 0x80; // FS_XFLAG_NODUMP only: clears immutable
                 // SAFETY: as above.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), 0x401c_5820, x.as_ptr()) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    assert_eq!(lsattr(&m.p("f")), "d");
    x[0] = 0x20; // FS_XFLAG_SYNC: not stored
                 // SAFETY: as above.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), 0x401c_5820, x.as_ptr()) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EOPNOTSUPP)
    );
    // chattr of a flag inkfs does not keep (+S, synchronous updates).
    let out = shell(&format!("chattr +S {}", m.p("f").display()), None);
    assert!(!out.status.success());
    assert_eq!(lsattr(&m.p("f")), "d");
}
