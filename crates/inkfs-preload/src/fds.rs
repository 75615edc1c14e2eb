//! Descriptors: open (every form), close, close_range, closefrom, dup,
//! dup2, dup3 and fcntl's F_DUPFD/F_SETFL.
//!
//! A regular file on a served mount is opened without the kernel when the
//! library can (lazy.rs: a placeholder descriptor; creates through the
//! server's ring). Otherwise opening happens in the kernel first, with
//! the program's arguments: the kernel creates, truncates, checks
//! permissions, follows symlinks and gives the number. Then, if that
//! descriptor is a regular file or directory on a FUSE mount of this
//! process, the library registers it (table.rs): reads need it readable,
//! writes writable (a write-only descriptor is served for writes, lseek,
//! fstat and fsync). An O_PATH descriptor is registered for its fstat and
//! as the directory of relative paths (and `/proc/self/fd/N` of it names
//! its inode); every other call on it is the kernel's (EBADF).
//!
//! `open`, `openat` and `fcntl` are variadic in C. They are defined here
//! with their optional argument as a fixed one (`mode`, `arg`): on x86-64
//! System V a variadic integer or pointer argument travels in the same
//! register as a fixed one in that position, and a caller that passed none
//! leaves a value that is never used (as glibc's own wrappers read it).

use std::ffi::{c_char, c_int, c_uint, c_ulong};
use std::sync::atomic::Ordering;

use libc::mode_t;

use crate::table::MAX_FD;
use crate::{guard, lazy, mounts, path, real, table};

/// Register `fd`, just opened by the kernel from `path` with `flags`, if
/// it is served.
pub fn adopt(fd: c_int, path: &[u8], flags: c_int) {
    if fd < 0 || fd as usize >= MAX_FD {
        return;
    }
    if mounts::all().is_empty() {
        return;
    }
    // An absolute path not under a mount cannot be on one (nor can a
    // symlink there lead into one: the descriptor's device decides below,
    // and such a path is simply not served).
    if path.first() == Some(&b'/') && mounts::locate_abs(path).is_none() {
        return;
    }
    // The type, inode and device: none of them changes, so the kernel's
    // cached attributes do, however old (AT_STATX_DONT_SYNC: no GETATTR
    // request when the kernel's copy expired, as a namespace change
    // through the ring makes the directory's).
    // SAFETY: all-zero is a valid statx; the kernel fills it.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    let flags_sx = libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC;
    let mask = libc::STATX_TYPE | libc::STATX_INO;
    if unsafe { real::statx(fd, c"".as_ptr(), flags_sx, mask, &mut sx) } != 0
        || sx.stx_mask & mask != mask
    {
        return;
    }
    let kind = u32::from(sx.stx_mode) & libc::S_IFMT;
    if kind != libc::S_IFREG && kind != libc::S_IFDIR {
        return;
    }
    let dev = libc::makedev(sx.stx_dev_major, sx.stx_dev_minor);
    let Some((mi, m)) = mounts::by_dev(dev) else {
        return;
    };
    // Attach now (or learn the refusal), and make sure the mount is the
    // one this process attached to: a device number is reused by the next
    // FUSE mount once a mount is gone, and a client of a gone server must
    // not serve a newer mount's files. All clients busy: another thread
    // of this process checked the server a moment ago.
    if let Some(lease) = m.checkout() {
        if !m.alive(&lease) {
            return;
        }
    }
    if m.is_refused() {
        return;
    }
    let idx = table::register(fd, mi, sx.stx_ino, kind, flags, false).map(|(idx, _)| idx);
    if let (Some(idx), true) = (idx, kind == libc::S_IFDIR) {
        // A directory's path: placeholders opened relative to it are
        // materialized by it. The kernel's (its symlinks and `..`
        // resolved), not the one the program gave.
        if let Some(abs) = kernel_path(fd) {
            lazy::keep_path(idx, abs);
        }
    }
}

/// The path the kernel knows descriptor `fd` by (`/proc/self/fd/N`),
/// NUL-terminated; `None` if it cannot say or the file is gone.
fn kernel_path(fd: c_int) -> Option<Box<[u8]>> {
    let link = format!("/proc/self/fd/{fd}\0");
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: a NUL-terminated path and a buffer of the length given.
    let n = unsafe {
        real::readlinkat(
            libc::AT_FDCWD,
            link.as_ptr().cast(),
            buf.as_mut_ptr().cast(),
            buf.len() - 1,
        )
    };
    let n = usize::try_from(n).ok().filter(|&n| n < buf.len() - 1)?;
    buf.truncate(n);
    if buf.first() != Some(&b'/') || buf.ends_with(b" (deleted)") {
        return None;
    }
    buf.push(0);
    Some(buf.into_boxed_slice())
}

fn open_at(dirfd: c_int, p: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: the program's path string.
    let bytes = unsafe { path::bytes(p) };
    if let Some(Some(fd)) = guard::run(|| lazy::open(dirfd, bytes?, flags, mode)) {
        return fd;
    }
    // /proc/self/fd/N of a placeholder: its file first.
    if let Some(n) = bytes.and_then(lazy::fd_link) {
        lazy::kernel(n);
    }
    // SAFETY: the program's arguments, passed on.
    let fd = unsafe { real::openat(lazy::kernel(dirfd), p, flags, mode) };
    if fd >= 0 {
        // The kernel just gave this number: whatever the table says of it
        // is stale (a descriptor glibc closed internally).
        table::release(fd);
        let _ = guard::run(|| {
            // SAFETY: the program's path string.
            if let Some(b) = unsafe { path::bytes(p) } {
                adopt(fd, b, flags);
            }
        });
    }
    fd
}

#[no_mangle]
pub unsafe extern "C" fn open(p: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    open_at(libc::AT_FDCWD, p, flags, mode)
}

#[no_mangle]
pub unsafe extern "C" fn open64(p: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    open_at(libc::AT_FDCWD, p, flags, mode)
}

#[no_mangle]
pub unsafe extern "C" fn openat(d: c_int, p: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    open_at(d, p, flags, mode)
}

#[no_mangle]
pub unsafe extern "C" fn openat64(d: c_int, p: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    open_at(d, p, flags, mode)
}

// The fortified forms (no mode: _FORTIFY_SOURCE proved there is no O_CREAT).
#[no_mangle]
pub unsafe extern "C" fn __open_2(p: *const c_char, flags: c_int) -> c_int {
    open_at(libc::AT_FDCWD, p, flags, 0)
}

#[no_mangle]
pub unsafe extern "C" fn __open64_2(p: *const c_char, flags: c_int) -> c_int {
    open_at(libc::AT_FDCWD, p, flags, 0)
}

#[no_mangle]
pub unsafe extern "C" fn __openat_2(d: c_int, p: *const c_char, flags: c_int) -> c_int {
    open_at(d, p, flags, 0)
}

#[no_mangle]
pub unsafe extern "C" fn __openat64_2(d: c_int, p: *const c_char, flags: c_int) -> c_int {
    open_at(d, p, flags, 0)
}

#[no_mangle]
pub unsafe extern "C" fn creat(p: *const c_char, mode: mode_t) -> c_int {
    open_at(
        libc::AT_FDCWD,
        p,
        libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC,
        mode,
    )
}

#[no_mangle]
pub unsafe extern "C" fn creat64(p: *const c_char, mode: mode_t) -> c_int {
    open_at(
        libc::AT_FDCWD,
        p,
        libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC,
        mode,
    )
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    table::release(fd);
    // SAFETY: as called.
    unsafe { real::close(fd) }
}

#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        let end = last.min(MAX_FD as c_uint - 1);
        for fd in first..=end {
            table::release(fd as c_int);
        }
    }
    // SAFETY: as called.
    unsafe { real::close_range(first, last, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn closefrom(low: c_int) {
    for fd in low.max(0)..MAX_FD as c_int {
        table::release(fd);
    }
    // SAFETY: as called.
    unsafe { real::closefrom(low) }
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: as called.
    let r = unsafe { real::dup(fd) };
    if r >= 0 {
        table::dup(fd, r);
    }
    r
}

/// A placeholder dup'ed onto 0, 1 or 2 is handed to the kernel (table.rs):
/// its file first, so the standard descriptor is the file.
fn before_dup(old: c_int, new: c_int) {
    if (0..=2).contains(&new) && lazy::is_lazy(old) {
        lazy::kernel(old);
    }
}

#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    before_dup(old, new);
    // SAFETY: as called.
    let r = unsafe { real::dup2(old, new) };
    if r >= 0 {
        table::dup(old, r);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    before_dup(old, new);
    // SAFETY: as called.
    let r = unsafe { real::dup3(old, new, flags) };
    if r >= 0 {
        table::dup(old, r);
    }
    r
}

/// fcntl commands a placeholder answers itself (the others need the real
/// file: it is materialized first).
fn placeholder_cmd(cmd: c_int) -> bool {
    matches!(
        cmd,
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC | libc::F_GETFD | libc::F_SETFD
    )
}

#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    if lazy::is_lazy(fd) {
        match cmd {
            libc::F_GETFL => {
                if let Some(fl) = lazy::status_flags(fd) {
                    return fl;
                }
            }
            libc::F_SETFL => {
                if let Some(r) = lazy::set_status_flags(fd, arg as c_int) {
                    return r;
                }
            }
            _ => {}
        }
    }
    let kfd = if placeholder_cmd(cmd) {
        fd
    } else {
        lazy::kernel(fd)
    };
    // SAFETY: as called.
    let r = unsafe { real::fcntl(kfd, cmd, arg) };
    if r >= 0 {
        match cmd {
            libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => table::dup(fd, r),
            libc::F_SETFL => {
                if let Some((_, o)) = table::get(fd) {
                    // SAFETY: no memory involved.
                    let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
                    if fl >= 0 {
                        o.flags.store(fl as u32, Ordering::Release);
                    }
                }
            }
            _ => {}
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: as called.
    unsafe { fcntl(fd, cmd, arg) }
}
