//! Namespace calls by path, made by the server through the client's
//! request ring (docs/KERNEL-FREE.md, "Stage 4"): mkdir, mknod, symlink,
//! link, unlink, rmdir, rename (renameat2's flags too). Attribute changes
//! are attrs.rs's.
//!
//! The library resolves the path's directory in the pool (path.rs: the
//! plain cases only), and the client asks the server to change the name
//! there with this process's credentials (effective ids, groups, umask);
//! the server answers once the kernel's caches show the change. Anything
//! the library does not resolve itself (a symlink on the way, `..` above
//! the start, a path it may not search, a trailing slash where it
//! matters, two mounts, a request that does not fit a line, no client)
//! goes to the kernel, whose answer is then the authoritative one. An
//! error the server answers (EEXIST, ENOTEMPTY, EACCES, the sticky
//! directory's EPERM...) is the engine's, which follows Linux errno for
//! errno.

use std::ffi::{c_char, c_int, c_uint};
use std::sync::atomic::{AtomicBool, Ordering};

use inkfs::api::client::Client;
use inkfs::api::ns::{Done, Op};
use inkfs::api::{Credentials, Result};
use libc::mode_t;
use std::rc::Rc;

use crate::creds::{self, Ids};
use crate::mounts::Mount;
use crate::path::{self, CwdBuf, Target};
use crate::{guard, real, stats};

/// `INKFS_PRELOAD_DIR_LEASE=1`: creates ask for their directory's lease
/// by the client's adaptive rule and are made in the process under it;
/// unset or `0`, every create goes to the server. Off by default: the
/// FUSE suite passes with it on, but untar and fileserver ran slower
/// (their attribute changes and unlinks in a leased directory recall its
/// lease; docs/KERNEL-FREE.md, "Built: the library asks for directory
/// leases", "Built: the library's ask, checked").
pub const DIR_LEASE_ENV: &str = "INKFS_PRELOAD_DIR_LEASE";
static DIR_LEASE: AtomicBool = AtomicBool::new(false);

/// At load.
pub fn init() {
    if std::env::var_os(DIR_LEASE_ENV).is_some_and(|v| v == "1") {
        DIR_LEASE.store(true, Ordering::Relaxed);
    }
}

/// Namespace change `op` by client `c`: asked of the server, or made by
/// the client in a directory whose lease it holds, the lease asked for
/// by the client's adaptive rule (docs/KERNEL-FREE.md, "Built: the
/// library asks for directory leases") unless turned off.
pub(crate) fn ns(c: &Client, cred: &Credentials, op: Op) -> Result<Done> {
    if DIR_LEASE.load(Ordering::Relaxed) {
        c.ns_adaptive(cred, op)
    } else {
        c.ns(cred, op)
    }
}

/// The credentials a creation is made with: the effective ids, the
/// groups, the umask. `None` if the umask is unknown.
pub(crate) fn creator() -> Option<Rc<Credentials>> {
    creds::get(Ids::Creator)
}

pub(crate) fn set_errno(e: c_int) {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// The server's answer as a libc return: 0, or -1 with errno.
pub(crate) fn answer(errno: i32) -> c_int {
    stats::bump(&stats::NS_LOCAL);
    if errno == 0 {
        return 0;
    }
    set_errno(errno);
    -1
}

/// Ask the server to make the change `op` names, with `cred`, through a
/// client of `m`: the libc return, or `None` to take the kernel path.
pub(crate) fn ask(m: &Mount, cred: &Credentials, op: Op) -> Option<c_int> {
    let lease = m.checkout()?;
    let done = ns(lease.client(), cred, op).ok()?;
    Some(answer(done.errno))
}

/// Serve a change of one name: `path` (relative to `dirfd`) located and
/// its directory resolved in the pool, then `op(dir, name)` asked of the
/// server. `None`: the kernel does it.
fn one_name(
    dirfd: c_int,
    p: *const c_char,
    slash_ok: bool,
    cred: impl FnOnce() -> Option<Rc<Credentials>>,
    op: impl FnOnce(u64, Vec<u8>) -> Op,
) -> Option<c_int> {
    if guard::inside() {
        return None;
    }
    let r = guard::run(|| {
        // SAFETY: the program's path string.
        let bytes = unsafe { path::bytes(p) }?;
        let mut cwd = CwdBuf::new();
        let t = path::locate(dirfd, bytes, &mut cwd)?;
        let cred = cred()?;
        let (dir, name) = parent_of(&t, &cred, slash_ok)?;
        ask(t.mount, &cred, op(dir, name))
    })
    .flatten();
    if r.is_none() {
        stats::bump(&stats::NS_KERNEL);
    }
    r
}

/// The directory holding `t`'s last name, and the name.
fn parent_of(t: &Target<'_>, cred: &Credentials, slash_ok: bool) -> Option<(u64, Vec<u8>)> {
    let lease = t.mount.checkout()?;
    lease
        .client()
        .call(|fs| path::walk_parent(fs, cred, t, slash_ok).map(|(dir, name)| (dir, name.to_vec())))
}

/// The inode `t` names, resolved in the pool.
pub(crate) fn inode_of(
    t: &Target<'_>,
    cred: &Credentials,
    follow: bool,
) -> Option<inkfs::api::Attr> {
    let lease = t.mount.checkout()?;
    lease.client().call(|fs| path::walk(fs, cred, t, follow))
}

#[no_mangle]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, p: *const c_char, mode: mode_t) -> c_int {
    let served = one_name(dirfd, p, true, creator, |dir, name| Op::Mkdir {
        dir,
        name,
        mode: mode & 0o7777,
    });
    if let Some(r) = served {
        return r;
    }
    // SAFETY: as called.
    unsafe { real::mkdirat(crate::lazy::kernel(dirfd), p, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn mkdir(p: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: as called.
    unsafe { mkdirat(libc::AT_FDCWD, p, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn mknodat(
    dirfd: c_int,
    p: *const c_char,
    mode: mode_t,
    dev: libc::dev_t,
) -> c_int {
    // Regular files, FIFOs and sockets (a device node needs privilege,
    // which the engine checks as CAP_MKNOD; its number the kernel's
    // 32-bit encoding, as FUSE carries it).
    let kind = mode & libc::S_IFMT;
    let plain = matches!(kind, 0 | libc::S_IFREG | libc::S_IFIFO | libc::S_IFSOCK);
    if plain {
        let mode = if kind == 0 {
            mode | libc::S_IFREG
        } else {
            mode
        };
        let served = one_name(dirfd, p, false, creator, |dir, name| Op::Mknod {
            dir,
            name,
            mode,
            rdev: 0,
        });
        if let Some(r) = served {
            return r;
        }
    }
    // SAFETY: as called.
    unsafe { real::mknodat(crate::lazy::kernel(dirfd), p, mode, dev) }
}

#[no_mangle]
pub unsafe extern "C" fn mknod(p: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int {
    // SAFETY: as called.
    unsafe { mknodat(libc::AT_FDCWD, p, mode, dev) }
}

#[no_mangle]
pub unsafe extern "C" fn mkfifoat(dirfd: c_int, p: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: as called.
    unsafe { mknodat(dirfd, p, libc::S_IFIFO | (mode & 0o7777), 0) }
}

#[no_mangle]
pub unsafe extern "C" fn mkfifo(p: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: as called.
    unsafe { mkfifoat(libc::AT_FDCWD, p, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn symlinkat(target: *const c_char, dirfd: c_int, p: *const c_char) -> c_int {
    // SAFETY: the program's target string (or null: the kernel's EFAULT).
    if let Some(tgt) = unsafe { path::bytes(target) }.filter(|t| !t.is_empty()) {
        let tgt = tgt.to_vec();
        let served = one_name(dirfd, p, false, creator, |dir, name| Op::Symlink {
            dir,
            name,
            target: tgt,
        });
        if let Some(r) = served {
            return r;
        }
    }
    // SAFETY: as called.
    unsafe { real::symlinkat(target, crate::lazy::kernel(dirfd), p) }
}

#[no_mangle]
pub unsafe extern "C" fn symlink(target: *const c_char, p: *const c_char) -> c_int {
    // SAFETY: as called.
    unsafe { symlinkat(target, libc::AT_FDCWD, p) }
}

#[no_mangle]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, p: *const c_char, flags: c_int) -> c_int {
    let rmdir = flags & libc::AT_REMOVEDIR != 0;
    if flags & !libc::AT_REMOVEDIR == 0 {
        let served = one_name(
            dirfd,
            p,
            rmdir,
            || creds::get(Ids::Effective),
            |dir, name| {
                if rmdir {
                    Op::Rmdir { dir, name }
                } else {
                    Op::Unlink { dir, name }
                }
            },
        );
        if let Some(r) = served {
            return r;
        }
    }
    // SAFETY: as called.
    unsafe { real::unlinkat(crate::lazy::kernel(dirfd), p, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn unlink(p: *const c_char) -> c_int {
    // SAFETY: as called.
    unsafe { unlinkat(libc::AT_FDCWD, p, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn rmdir(p: *const c_char) -> c_int {
    // SAFETY: as called.
    unsafe { unlinkat(libc::AT_FDCWD, p, libc::AT_REMOVEDIR) }
}

/// A name and the directory inode holding it.
type NameAt = (u64, Vec<u8>);

/// Two names on one mount, each resolved to its directory: the mount and
/// both. `None`: the kernel (which gives EXDEV across mounts).
fn two_names(
    d1: c_int,
    p1: *const c_char,
    d2: c_int,
    p2: *const c_char,
    cred: &Credentials,
) -> Option<(&'static Mount, NameAt, NameAt)> {
    // SAFETY: the program's path strings.
    let (b1, b2) = unsafe { (path::bytes(p1)?, path::bytes(p2)?) };
    let (mut c1, mut c2) = (CwdBuf::new(), CwdBuf::new());
    let t1 = path::locate(d1, b1, &mut c1)?;
    let t2 = path::locate(d2, b2, &mut c2)?;
    if !std::ptr::eq(t1.mount, t2.mount) {
        return None;
    }
    let a = parent_of(&t1, cred, false)?;
    let b = parent_of(&t2, cred, false)?;
    Some((t1.mount, a, b))
}

#[no_mangle]
pub unsafe extern "C" fn renameat2(
    d1: c_int,
    p1: *const c_char,
    d2: c_int,
    p2: *const c_char,
    flags: c_uint,
) -> c_int {
    if !guard::inside() {
        let served = guard::run(|| {
            let cred = creds::get(Ids::Effective)?;
            let (m, (dir, name), (to_dir, to)) = two_names(d1, p1, d2, p2, &cred)?;
            let op = Op::Rename {
                dir,
                name,
                to_dir,
                to,
                flags,
            };
            ask(m, &cred, op)
        })
        .flatten();
        match served {
            Some(r) => return r,
            None => stats::bump(&stats::NS_KERNEL),
        }
    }
    // SAFETY: as called.
    unsafe {
        real::renameat2(
            crate::lazy::kernel(d1),
            p1,
            crate::lazy::kernel(d2),
            p2,
            flags,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn renameat(
    d1: c_int,
    p1: *const c_char,
    d2: c_int,
    p2: *const c_char,
) -> c_int {
    // SAFETY: as called.
    unsafe { renameat2(d1, p1, d2, p2, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn rename(p1: *const c_char, p2: *const c_char) -> c_int {
    // SAFETY: as called.
    unsafe { renameat2(libc::AT_FDCWD, p1, libc::AT_FDCWD, p2, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn linkat(
    d1: c_int,
    p1: *const c_char,
    d2: c_int,
    p2: *const c_char,
    flags: c_int,
) -> c_int {
    if flags & !libc::AT_SYMLINK_FOLLOW == 0 && !guard::inside() {
        let follow = flags & libc::AT_SYMLINK_FOLLOW != 0;
        let served = guard::run(|| {
            let cred = creds::get(Ids::Effective)?;
            // SAFETY: the program's path strings.
            let (b1, b2) = unsafe { (path::bytes(p1)?, path::bytes(p2)?) };
            let (mut c1, mut c2) = (CwdBuf::new(), CwdBuf::new());
            let t1 = path::locate(d1, b1, &mut c1)?;
            let t2 = path::locate(d2, b2, &mut c2)?;
            if !std::ptr::eq(t1.mount, t2.mount) {
                return None;
            }
            let a = inode_of(&t1, &cred, follow)?;
            let (dir, name) = parent_of(&t2, &cred, false)?;
            ask(
                t1.mount,
                &cred,
                Op::Link {
                    ino: a.ino,
                    dir,
                    name,
                },
            )
        })
        .flatten();
        match served {
            Some(r) => return r,
            None => stats::bump(&stats::NS_KERNEL),
        }
    }
    // SAFETY: as called.
    unsafe {
        real::linkat(
            crate::lazy::kernel(d1),
            p1,
            crate::lazy::kernel(d2),
            p2,
            flags,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn link(p1: *const c_char, p2: *const c_char) -> c_int {
    // SAFETY: as called.
    unsafe { linkat(libc::AT_FDCWD, p1, libc::AT_FDCWD, p2, 0) }
}

/// stdio's remove(3): glibc unlinks, then removes a directory, with its
/// internal calls.
#[no_mangle]
pub unsafe extern "C" fn remove(p: *const c_char) -> c_int {
    // SAFETY: as called.
    let r = unsafe { unlink(p) };
    if r == 0 {
        return 0;
    }
    // SAFETY: this thread's errno.
    let e = unsafe { *libc::__errno_location() };
    if e != libc::EISDIR {
        return r;
    }
    // SAFETY: as called.
    unsafe { rmdir(p) }
}
