//! stat, statx, access and readlink, by descriptor or by path, answered
//! from the pool. Any case the library does not resolve itself (see
//! path.rs), and any error but two, is asked of the kernel: a served
//! answer is a success the kernel would give, or ENOENT for a name the
//! walk found no directory to hold (path.rs, `Stop::Absent`), or
//! readlink's EINVAL for a served name that is not a symlink.

use std::ffi::{c_char, c_int, c_uint};
use std::sync::atomic::Ordering;

use inkfs::api::{Attr, FileKind};
use libc::{size_t, ssize_t};

use crate::io::{route, Op, Route};
use crate::mounts::{self, Mount};
use crate::path::{self, CwdBuf, Stop};
use crate::table::Ofd;
use crate::{attr, guard, real, stats};

/// The attributes of what `path` (relative to `dirfd`) names, from the
/// pool; `Err(Stop::Absent)`: no such name (ENOENT, path.rs);
/// `Err(Stop::Kernel)`: ask the kernel. `real_ids`: check with the real
/// ids.
fn path_attr(
    dirfd: c_int,
    path: *const c_char,
    follow: bool,
    real_ids: bool,
) -> Result<(Attr, &'static Mount), Stop> {
    // SAFETY: the program's path string.
    let p = unsafe { path::bytes(path) }.ok_or(Stop::Kernel)?;
    if let Some(n) = crate::lazy::fd_link(p) {
        // `/proc/self/fd/N` of a placeholder names /dev/null until its
        // file is opened in the kernel: then the kernel answers.
        crate::lazy::kernel(n);
        return Err(Stop::Kernel);
    }
    let mut cwd = CwdBuf::new();
    let t = path::locate(dirfd, p, &mut cwd).ok_or(Stop::Kernel)?;
    let got = (|| {
        let lease = t.mount.checkout().ok_or(Stop::Kernel)?;
        // A server gone: the kernel's answer (what is under the mount
        // point now), a miss included.
        if !t.mount.serving(&lease) {
            return Err(Stop::Kernel);
        }
        let cred = crate::creds::get(if real_ids {
            crate::creds::Ids::Real
        } else {
            crate::creds::Ids::Effective
        })
        .ok_or(Stop::Kernel)?;
        lease
            .client()
            .call(|fs| path::walk_or_absent(fs, &cred, &t, follow))
    })();
    stats::bump(match got {
        Ok(_) => &stats::STAT_LOCAL,
        Err(Stop::Absent) => &stats::STAT_ABSENT,
        Err(Stop::Kernel) => &stats::STAT_KERNEL,
    });
    got.map(|a| (a, t.mount))
}

/// The libc return of a served miss: -1 with ENOENT.
fn absent<T: From<i8>>() -> T {
    crate::names::set_errno(libc::ENOENT);
    T::from(-1)
}

/// The attributes of a served open file, from the pool.
fn fd_attr(ofd: &Ofd) -> Option<(Attr, &'static Mount)> {
    let got = (|| {
        let m = mounts::by_index(ofd.mount.load(Ordering::Relaxed) as usize)?;
        let lease = m.checkout()?;
        let a = lease
            .client()
            .getattr(ofd.ino.load(Ordering::Relaxed))
            .ok()?;
        Some((a, m))
    })();
    stats::bump(if got.is_some() {
        &stats::STAT_LOCAL
    } else {
        &stats::STAT_KERNEL
    });
    got
}

fn empty(path: *const c_char) -> bool {
    // SAFETY: the program's path string (or null).
    unsafe { path::bytes(path) }.is_some_and(|b| b.is_empty())
}

#[no_mangle]
pub unsafe extern "C" fn fstat64(fd: c_int, st: *mut libc::stat64) -> c_int {
    if let (Route::Served(_, ofd), false) = (route(fd, Op::Stat), st.is_null()) {
        if let Some(Some((a, m))) = guard::run(|| fd_attr(ofd)) {
            // SAFETY: the program's stat buffer.
            attr::to_stat(&a, m, unsafe { &mut *st });
            return 0;
        }
    }
    // SAFETY: as called.
    unsafe { real::fstat64(crate::lazy::kernel(fd), st) }
}

#[no_mangle]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    if !st.is_null() && !guard::inside() {
        if flags & libc::AT_EMPTY_PATH != 0 && empty(path) {
            // SAFETY: as called.
            return unsafe { fstat64(dirfd, st) };
        }
        let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
        match guard::run(|| path_attr(dirfd, path, follow, false)) {
            Some(Ok((a, m))) => {
                // SAFETY: the program's stat buffer.
                attr::to_stat(&a, m, unsafe { &mut *st });
                return 0;
            }
            Some(Err(Stop::Absent)) => return absent(),
            _ => {}
        }
    }
    // SAFETY: as called.
    unsafe { real::fstatat64(crate::lazy::kernel(dirfd), path, st, flags) }
}

macro_rules! stat_aliases {
    ($($name:ident ( $($a:ident : $t:ty),* ) => $body:expr;)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            // SAFETY: as called.
            unsafe { $body }
        }
    )*};
}

stat_aliases! {
    fstat(fd: c_int, st: *mut libc::stat64) => fstat64(fd, st);
    fstatat(d: c_int, p: *const c_char, st: *mut libc::stat64, f: c_int) => fstatat64(d, p, st, f);
    stat(p: *const c_char, st: *mut libc::stat64) => fstatat64(libc::AT_FDCWD, p, st, 0);
    stat64(p: *const c_char, st: *mut libc::stat64) => fstatat64(libc::AT_FDCWD, p, st, 0);
    lstat(p: *const c_char, st: *mut libc::stat64) => fstatat64(libc::AT_FDCWD, p, st, libc::AT_SYMLINK_NOFOLLOW);
    lstat64(p: *const c_char, st: *mut libc::stat64) => fstatat64(libc::AT_FDCWD, p, st, libc::AT_SYMLINK_NOFOLLOW);
    // The glibc < 2.33 entry points older binaries call (the version
    // argument is _STAT_VER, one layout on x86-64).
    __xstat(_v: c_int, p: *const c_char, st: *mut libc::stat64) => fstatat64(libc::AT_FDCWD, p, st, 0);
    __xstat64(_v: c_int, p: *const c_char, st: *mut libc::stat64) => fstatat64(libc::AT_FDCWD, p, st, 0);
    __lxstat(_v: c_int, p: *const c_char, st: *mut libc::stat64) => fstatat64(libc::AT_FDCWD, p, st, libc::AT_SYMLINK_NOFOLLOW);
    __lxstat64(_v: c_int, p: *const c_char, st: *mut libc::stat64) => fstatat64(libc::AT_FDCWD, p, st, libc::AT_SYMLINK_NOFOLLOW);
    __fxstat(_v: c_int, fd: c_int, st: *mut libc::stat64) => fstat64(fd, st);
    __fxstat64(_v: c_int, fd: c_int, st: *mut libc::stat64) => fstat64(fd, st);
    __fxstatat(_v: c_int, d: c_int, p: *const c_char, st: *mut libc::stat64, f: c_int) => fstatat64(d, p, st, f);
    __fxstatat64(_v: c_int, d: c_int, p: *const c_char, st: *mut libc::stat64, f: c_int) => fstatat64(d, p, st, f);
}

/// The kernel's statx of the mount's root (mask, attributes, mount id),
/// asked once; `None` if the mount's statx reports a field the pool
/// answer cannot fill (a birth time).
fn root_statx(m: &Mount) -> Option<&libc::statx> {
    m.root_statx
        .get_or_init(|| {
            let mut path = m.path.clone();
            path.push(0);
            // SAFETY: all-zero is a valid statx; NUL-terminated path.
            let mut sx: libc::statx = unsafe { std::mem::zeroed() };
            let mask = libc::STATX_BASIC_STATS | libc::STATX_BTIME | libc::STATX_MNT_ID;
            let r = unsafe { real::statx(libc::AT_FDCWD, path.as_ptr().cast(), 0, mask, &mut sx) };
            (r == 0 && sx.stx_mask & libc::STATX_BTIME == 0).then_some(sx)
        })
        .as_ref()
}

#[no_mangle]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    sx: *mut libc::statx,
) -> c_int {
    let servable =
        !sx.is_null() && !guard::inside() && mask & !(attr::STATX_SERVED | libc::STATX_BTIME) == 0;
    if servable {
        let by_fd = match (
            flags & libc::AT_EMPTY_PATH != 0 && empty(path),
            route(dirfd, Op::Stat),
        ) {
            (true, Route::Served(_, ofd)) => Some(Some(ofd)),
            (true, Route::Kernel) => Some(None),
            (false, _) => None,
        };
        let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
        let got = guard::run(|| {
            let (a, m) = if let Some(ofd) = by_fd {
                ofd.and_then(fd_attr).ok_or(Stop::Kernel)?
            } else {
                path_attr(dirfd, path, follow, false)?
            };
            Ok((a, m, *root_statx(m).ok_or(Stop::Kernel)?))
        });
        match got {
            Some(Ok((a, m, root))) => {
                // SAFETY: the program's statx buffer.
                attr::to_statx(&a, m, &root, unsafe { &mut *sx });
                return 0;
            }
            Some(Err(Stop::Absent)) => return absent(),
            _ => {}
        }
    }
    // SAFETY: as called.
    unsafe { real::statx(crate::lazy::kernel(dirfd), path, flags, mask, sx) }
}

#[no_mangle]
pub unsafe extern "C" fn faccessat(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> c_int {
    // Write access depends on the mount's flags and the file's (EROFS,
    // ETXTBSY...): the kernel answers it.
    if mode & libc::W_OK == 0 && !guard::inside() {
        let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
        let real_ids = flags & libc::AT_EACCESS == 0;
        let ok = guard::run(|| {
            let (a, m) = path_attr(dirfd, path, follow, real_ids)?;
            if mode & libc::X_OK != 0 && m.noexec {
                return Err(Stop::Kernel);
            }
            if mode == libc::F_OK {
                return Ok(());
            }
            let cred = crate::creds::get(if real_ids {
                crate::creds::Ids::Real
            } else {
                crate::creds::Ids::Effective
            })
            .ok_or(Stop::Kernel)?;
            let lease = m.checkout().ok_or(Stop::Kernel)?;
            lease
                .client()
                .call(|fs| fs.access(&cred, a.ino, (mode & 7) as u32))
                .map_err(|_| Stop::Kernel)
        });
        match ok {
            Some(Ok(())) => return 0,
            // No such name, whatever the mode asked (the kernel's walk
            // fails before any permission of the file is looked at).
            Some(Err(Stop::Absent)) => return absent(),
            _ => {}
        }
    }
    // SAFETY: as called.
    unsafe { real::faccessat(crate::lazy::kernel(dirfd), path, mode, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: as called.
    unsafe { faccessat(libc::AT_FDCWD, path, mode, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn readlinkat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    n: size_t,
) -> ssize_t {
    // /proc/self/fd/N of a placeholder: its file first (the link then
    // names the file, not /dev/null).
    // SAFETY: the program's path string.
    if let Some(n) = unsafe { path::bytes(path) }.and_then(crate::lazy::fd_link) {
        crate::lazy::kernel(n);
    }
    if n > 0 && !buf.is_null() && !guard::inside() {
        let got = guard::run(|| {
            let (a, m) = path_attr(dirfd, path, false, false)?;
            if a.kind != FileKind::Symlink {
                // A served name that is not a symlink (git asks it of
                // its index): EINVAL, as the kernel's.
                return Ok(None);
            }
            let lease = m.checkout().ok_or(Stop::Kernel)?;
            lease
                .client()
                .readlink(a.ino)
                .map(Some)
                .map_err(|_| Stop::Kernel)
        });
        match got {
            Some(Ok(Some(target))) => {
                let k = target.len().min(n);
                // SAFETY: the program's buffer of `n` bytes.
                unsafe { std::ptr::copy_nonoverlapping(target.as_ptr(), buf.cast(), k) };
                return k as ssize_t;
            }
            Some(Ok(None)) => {
                crate::names::set_errno(libc::EINVAL);
                return -1;
            }
            Some(Err(Stop::Absent)) => return absent(),
            _ => {}
        }
    }
    // SAFETY: as called.
    unsafe { real::readlinkat(crate::lazy::kernel(dirfd), path, buf, n) }
}

#[no_mangle]
pub unsafe extern "C" fn readlink(path: *const c_char, buf: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: as called.
    unsafe { readlinkat(libc::AT_FDCWD, path, buf, n) }
}
