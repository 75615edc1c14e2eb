//! A mount without extended attributes (`-o noxattr`,
//! crates/inkfs-fuse/src/fs/xattr.rs): every xattr call fails with
//! EOPNOTSUPP, the xattrs already in the pool are kept for the next mount
//! without the option, and the kernel stops asking for
//! `security.capability` before writes and chowns (at most the one
//! GETXATTR answered ENOSYS reaches the server). Root required (FUSE).

mod common;

use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::fchown;
use std::path::Path;

use common::*;

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn count(mnt: &Path, op: &str) -> u64 {
    let s = stats_json(mnt).expect("statistics of the mount");
    s["ops"][op]["count"].as_u64().unwrap_or(0)
}

/// Create `n` files in `dir` of the mount the way tar does (create,
/// write, fchown, close) and return the GETXATTR requests the server
/// received meanwhile.
fn probes_of_creates(m: &Mounted, dir: &str, n: usize) -> u64 {
    fs::create_dir(m.p(dir)).unwrap();
    let before = count(m.path(), "getxattr");
    for i in 0..n {
        let mut f = fs::File::create(m.p(&format!("{dir}/f{i}"))).unwrap();
        f.write_all(&[b'x'; 3000]).unwrap();
        fchown(&f, Some(0), Some(0)).unwrap();
    }
    count(m.path(), "getxattr") - before
}

/// Every xattr call fails with EOPNOTSUPP on a noxattr mount, and the
/// attribute set before is there again on the next mount without it.
#[test]
fn xattr_calls_fail_and_the_pool_keeps_them() {
    let pool = Pool::new("noxattr-calls", 64);
    let m = Mounted::new(&pool, "mode=posix");
    let f = m.p("f");
    fs::write(&f, b"data").unwrap();
    let (path, name) = (cpath(&f), CString::new("user.colour").unwrap());
    // SAFETY: valid C strings and buffer.
    let rc = unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), b"blue".as_ptr().cast(), 4, 0) };
    assert_eq!(rc, 0, "setxattr: errno {}", errno());
    let dir = m.unmount();

    let m = Mounted::at(&pool, dir, "mode=posix,noxattr");
    let s = stats_json(m.path()).unwrap();
    assert_eq!(s["no_xattr"], true, "noxattr is on: {s}");
    let mut buf = [0u8; 64];
    // SAFETY: valid C strings and buffers, lengths as given.
    unsafe {
        let n = libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 64);
        assert_eq!((n, errno()), (-1, libc::EOPNOTSUPP), "getxattr");
        let n = libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), 64);
        assert_eq!((n, errno()), (-1, libc::EOPNOTSUPP), "listxattr");
        let rc = libc::setxattr(path.as_ptr(), name.as_ptr(), b"red".as_ptr().cast(), 3, 0);
        assert_eq!((rc, errno()), (-1, libc::EOPNOTSUPP), "setxattr");
        let rc = libc::removexattr(path.as_ptr(), name.as_ptr());
        assert_eq!((rc, errno()), (-1, libc::EOPNOTSUPP), "removexattr");
    }
    assert_eq!(fs::read(&f).unwrap(), b"data", "the file itself is served");
    let dir = m.unmount();

    let m = Mounted::at(&pool, dir, "mode=posix");
    // SAFETY: as above.
    let n = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 64) };
    assert_eq!(n, 4, "getxattr after the noxattr mount: errno {}", errno());
    assert_eq!(&buf[..4], b"blue", "kept in the pool, unchanged");
    m.unmount();
}

/// The kernel's security.capability probes: one or more per created,
/// written and chowned file on a plain mount (Linux 6.18's rule, which
/// the option exists for), at most one in all with noxattr.
#[test]
fn no_capability_probes_without_xattrs() {
    let pool = Pool::new("noxattr-probes", 64);
    let m = Mounted::new(&pool, "mode=posix");
    let plain = probes_of_creates(&m, "plain", 20);
    assert!(plain >= 20, "{plain} probes for 20 files on a plain mount");
    let dir = m.unmount();

    let m = Mounted::at(&pool, dir, "mode=posix,noxattr");
    let off = probes_of_creates(&m, "off", 20);
    assert!(
        off <= 1,
        "{off} GETXATTR requests for 20 files with noxattr"
    );
    m.unmount();
}
