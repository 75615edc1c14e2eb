//! Directory listings: opendir/fdopendir/readdir(64)(_r)/rewinddir/
//! telldir/seekdir/closedir and getdents64, served from the pool.
//!
//! The DIR a program holds is glibc's own (glibc's fdopendir made it, so
//! dirfd and every DIR function the library does not know work on it);
//! the library recognises it by its descriptor. A directory on a served
//! mount is opened without the kernel (a placeholder, lazy.rs), by
//! opendir and by open(2) alike: its DIR is glibc's fdopendir's, made
//! while the number names a real directory (`lazy::fdopendir`). The position is the
//! engine's readdir cookie (what the mount hands the kernel as the
//! directory offset, so telldir/seekdir values mean the same served or
//! not), kept in the shared open-file entry. With no client free the call
//! goes to glibc's readdir after a seekdir to that cookie.

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int, c_long, c_void};
use std::sync::atomic::Ordering;

use inkfs::api::{DirEntry, FileKind};
use libc::{dirent64, size_t, ssize_t, DIR};

use crate::io::{route, Op, Route};
use crate::table::{Ofd, MAX_FD};
use crate::{fds, guard, mounts, path, real, stats, table};

/// The entry readdir returns for each descriptor (valid until the next
/// readdir on that directory, as glibc's).
struct Entries([UnsafeCell<dirent64>; MAX_FD]);
// SAFETY: an entry is written only by readdir on its own descriptor, which
// POSIX does not make thread-safe on one DIR either.
unsafe impl Sync for Entries {}

// SAFETY (zeroed): all-zero bytes are a valid dirent64.
static ENTRIES: Entries =
    Entries([const { UnsafeCell::new(unsafe { std::mem::zeroed() }) }; MAX_FD]);

fn d_type(k: FileKind) -> u8 {
    match k {
        FileKind::File => libc::DT_REG,
        FileKind::Dir => libc::DT_DIR,
        FileKind::Symlink => libc::DT_LNK,
        FileKind::Fifo => libc::DT_FIFO,
        FileKind::Socket => libc::DT_SOCK,
        FileKind::CharDev => libc::DT_CHR,
        FileKind::BlockDev => libc::DT_BLK,
    }
}

/// getdents64's record length for a name.
fn reclen(name: &[u8]) -> usize {
    (std::mem::offset_of!(dirent64, d_name) + name.len() + 1).next_multiple_of(8)
}

fn fill(d: &mut dirent64, e: &DirEntry) {
    let n = e.name.len().min(d.d_name.len() - 1);
    d.d_ino = e.ino;
    d.d_off = e.cookie as i64;
    d.d_reclen = reclen(&e.name[..n]) as u16;
    d.d_type = d_type(e.kind);
    for (dst, src) in d.d_name.iter_mut().zip(&e.name[..n]) {
        *dst = *src as c_char;
    }
    d.d_name[n] = 0;
}

/// The entry after cookie `pos`: `Some(None)` at the end, `None` to take
/// the kernel path.
fn next_entry(idx: usize, ofd: &Ofd, pos: u64) -> Option<Option<DirEntry>> {
    let m = mounts::by_index(ofd.mount.load(Ordering::Relaxed) as usize)?;
    let lease = m.checkout()?;
    lease
        .with_file(idx, ofd, |c, f| {
            let mut got = None;
            c.readdir(f, pos, &mut |e| {
                got = Some(e);
                false
            })
            .ok()
            .map(|()| got)
        })
        .flatten()
}

fn errno() -> c_int {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() }
}

fn set_errno(e: c_int) {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// One entry of a served directory into `*out`; false at the end. `None`:
/// use glibc's readdir.
fn served_next(idx: usize, ofd: &Ofd, out: &mut dirent64) -> Option<bool> {
    loop {
        let pos = ofd.offset.load(Ordering::Acquire);
        let e = next_entry(idx, ofd, pos)?;
        stats::bump(&stats::DIR_LOCAL);
        let Some(e) = e else { return Some(false) };
        if ofd
            .offset
            .compare_exchange(pos, e.cookie, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            fill(out, &e);
            return Some(true);
        }
    }
}

/// glibc's readdir, from the served position (a placeholder's file
/// opened in the kernel first: glibc reads the DIR's descriptor).
unsafe fn kernel_readdir(d: *mut DIR, ofd: &Ofd) -> *mut dirent64 {
    stats::bump(&stats::DIR_KERNEL);
    // SAFETY: the program's DIR.
    unsafe {
        crate::lazy::kernel(real::dirfd(d));
        // glibc's position is the cookie of the last entry it returned;
        // seek (and drop its buffer) only if the library's differs.
        let pos = ofd.offset.load(Ordering::Acquire) as c_long;
        if real::telldir(d) != pos {
            real::seekdir(d, pos);
        }
        let r = real::readdir64(d);
        if !r.is_null() {
            ofd.offset.store(real::telldir(d) as u64, Ordering::Release);
        }
        r
    }
}

fn served_dir(d: *mut DIR) -> Option<(c_int, usize, &'static Ofd)> {
    if d.is_null() || guard::inside() {
        return None;
    }
    // SAFETY: the program's DIR.
    let fd = unsafe { real::dirfd(d) };
    match route(fd, Op::Dir) {
        Route::Served(idx, ofd) => Some((fd, idx, ofd)),
        Route::Kernel => None,
    }
}

#[no_mangle]
pub unsafe extern "C" fn readdir64(d: *mut DIR) -> *mut dirent64 {
    if let Some((fd, idx, ofd)) = served_dir(d) {
        let saved = errno();
        // SAFETY: the descriptor's own entry (see `Entries`).
        let slot = ENTRIES.0[fd as usize].get();
        match guard::run(|| served_next(idx, ofd, unsafe { &mut *slot })) {
            Some(Some(true)) => {
                set_errno(saved);
                return slot;
            }
            Some(Some(false)) => {
                // The end: NULL with errno unchanged.
                set_errno(saved);
                return std::ptr::null_mut();
            }
            _ => {
                set_errno(saved);
                // SAFETY: the program's DIR.
                return unsafe { kernel_readdir(d, ofd) };
            }
        }
    }
    // SAFETY: as called.
    unsafe { real::readdir64(d) }
}

#[no_mangle]
pub unsafe extern "C" fn readdir(d: *mut DIR) -> *mut dirent64 {
    // SAFETY: as called (one layout on x86-64).
    unsafe { readdir64(d) }
}

#[no_mangle]
pub unsafe extern "C" fn readdir64_r(
    d: *mut DIR,
    e: *mut dirent64,
    res: *mut *mut dirent64,
) -> c_int {
    if !e.is_null() && !res.is_null() {
        if let Some((_, idx, ofd)) = served_dir(d) {
            // SAFETY: the program's entry buffer.
            match guard::run(|| served_next(idx, ofd, unsafe { &mut *e })) {
                Some(Some(more)) => {
                    // SAFETY: the program's result pointer.
                    unsafe { *res = if more { e } else { std::ptr::null_mut() } };
                    return 0;
                }
                _ => {
                    // SAFETY: the program's DIR.
                    let r = unsafe { kernel_readdir(d, ofd) };
                    if r.is_null() {
                        // SAFETY: the program's result pointer.
                        unsafe { *res = std::ptr::null_mut() };
                        return 0;
                    }
                    // SAFETY: glibc's entry, copied into the program's.
                    unsafe {
                        std::ptr::copy_nonoverlapping(r, e, 1);
                        *res = e;
                    }
                    return 0;
                }
            }
        }
    }
    // SAFETY: as called.
    unsafe { real::readdir64_r(d, e, res) }
}

#[no_mangle]
pub unsafe extern "C" fn readdir_r(
    d: *mut DIR,
    e: *mut dirent64,
    res: *mut *mut dirent64,
) -> c_int {
    // SAFETY: as called.
    unsafe { readdir64_r(d, e, res) }
}

#[no_mangle]
pub unsafe extern "C" fn telldir(d: *mut DIR) -> c_long {
    if let Some((_, _, ofd)) = served_dir(d) {
        return ofd.offset.load(Ordering::Acquire) as c_long;
    }
    // SAFETY: as called.
    unsafe { real::telldir(d) }
}

#[no_mangle]
pub unsafe extern "C" fn seekdir(d: *mut DIR, pos: c_long) {
    if let Some((_, _, ofd)) = served_dir(d) {
        ofd.offset.store(pos as u64, Ordering::Release);
        return;
    }
    // SAFETY: as called.
    unsafe { real::seekdir(d, pos) }
}

#[no_mangle]
pub unsafe extern "C" fn rewinddir(d: *mut DIR) {
    if let Some((_, _, ofd)) = served_dir(d) {
        ofd.offset.store(0, Ordering::Release);
    }
    // SAFETY: as called (also resets glibc's own buffer).
    unsafe { real::rewinddir(d) }
}

#[no_mangle]
pub unsafe extern "C" fn closedir(d: *mut DIR) -> c_int {
    if !d.is_null() {
        // glibc closes the descriptor itself (not through close()).
        // SAFETY: the program's DIR.
        table::release(unsafe { real::dirfd(d) });
    }
    // SAFETY: as called.
    unsafe { real::closedir(d) }
}

#[no_mangle]
pub unsafe extern "C" fn opendir(p: *const c_char) -> *mut DIR {
    // A directory on a served mount: a placeholder (lazy.rs), no kernel
    // open; the flags are glibc's own opendir's.
    // SAFETY: the program's path string.
    if let Some(b) = unsafe { path::bytes(p) } {
        let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_DIRECTORY | libc::O_CLOEXEC;
        match guard::run(|| crate::lazy::open(libc::AT_FDCWD, b, flags, 0)) {
            Some(Some(fd)) if fd < 0 => return std::ptr::null_mut(),
            Some(Some(fd)) => {
                if let Some(d) = crate::lazy::fdopendir(fd) {
                    return d;
                }
                // glibc refused the DIR: the kernel's turn.
                table::release(fd);
                // SAFETY: the placeholder just made, ours.
                unsafe { real::close(fd) };
            }
            _ => {}
        }
    }
    // SAFETY: as called.
    let d = unsafe { real::opendir(p) };
    if !d.is_null() {
        let _ = guard::run(|| {
            // SAFETY: the program's path; glibc's new DIR.
            let fd = unsafe { real::dirfd(d) };
            table::release(fd);
            if let Some(b) = unsafe { path::bytes(p) } {
                fds::adopt(fd, b, libc::O_RDONLY | libc::O_DIRECTORY);
            }
        });
    }
    d
}

/// fdopendir: a directory's placeholder gets its DIR through
/// `lazy::fdopendir`; any other descriptor is glibc's (whose own fstat
/// then sees the kernel's directory), a placeholder that could not be
/// given one too, materialized first.
#[no_mangle]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut DIR {
    if let Some(d) = crate::lazy::fdopendir(fd) {
        return d;
    }
    // SAFETY: as called.
    unsafe { real::fdopendir(crate::lazy::kernel(fd)) }
}

/// getdents64 on a served directory: whole records while they fit.
fn served_getdents(idx: usize, ofd: &Ofd, buf: *mut u8, n: usize) -> Option<ssize_t> {
    let m = mounts::by_index(ofd.mount.load(Ordering::Relaxed) as usize)?;
    let lease = m.checkout()?;
    let pos = ofd.offset.load(Ordering::Acquire);
    let (used, newpos, too_small) = lease
        .with_file(idx, ofd, |c, f| {
            let mut used = 0usize;
            let mut newpos = pos;
            let mut too_small = false;
            c.readdir(f, pos, &mut |e| {
                let len = reclen(&e.name);
                if used + len > n || e.name.len() > 255 {
                    too_small = used == 0;
                    return false;
                }
                // SAFETY: the program's buffer has `n` bytes; the record
                // fits in what is left; dirent64 is 8-aligned in it as
                // every record length is a multiple of 8 (the kernel
                // assumes the same alignment of the buffer).
                unsafe {
                    let d = buf.add(used).cast::<dirent64>();
                    std::ptr::write_unaligned(std::ptr::addr_of_mut!((*d).d_ino), e.ino);
                    std::ptr::write_unaligned(std::ptr::addr_of_mut!((*d).d_off), e.cookie as i64);
                    std::ptr::write_unaligned(std::ptr::addr_of_mut!((*d).d_reclen), len as u16);
                    std::ptr::write_unaligned(std::ptr::addr_of_mut!((*d).d_type), d_type(e.kind));
                    let name = std::ptr::addr_of_mut!((*d).d_name).cast::<u8>();
                    std::ptr::copy_nonoverlapping(e.name.as_ptr(), name, e.name.len());
                    // NUL and padding.
                    let after = std::mem::offset_of!(dirent64, d_name) + e.name.len();
                    std::ptr::write_bytes(name.add(e.name.len()), 0, len - after);
                }
                used += len;
                newpos = e.cookie;
                true
            })
            .ok()
            .map(|()| (used, newpos, too_small))
        })
        .flatten()?;
    if too_small {
        return Some(-(libc::EINVAL as ssize_t));
    }
    stats::bump(&stats::DIR_LOCAL);
    let _ = ofd
        .offset
        .compare_exchange(pos, newpos, Ordering::AcqRel, Ordering::Acquire);
    Some(used as ssize_t)
}

#[no_mangle]
pub unsafe extern "C" fn getdents64(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if let (Route::Served(idx, ofd), false) = (route(fd, Op::Dir), buf.is_null()) {
        match guard::run(|| served_getdents(idx, ofd, buf.cast(), n)) {
            Some(Some(r)) if r < 0 => {
                set_errno(-r as c_int);
                return -1;
            }
            Some(Some(r)) => return r,
            _ => {
                stats::bump(&stats::DIR_KERNEL);
                let fd = crate::lazy::kernel(fd);
                // SAFETY: the program's buffer; the kernel's position is
                // put where the library's is, and taken back.
                unsafe {
                    real::lseek64(
                        fd,
                        ofd.offset.load(Ordering::Acquire) as i64,
                        libc::SEEK_SET,
                    );
                    let r = real::getdents64(fd, buf, n);
                    if r >= 0 {
                        let k = real::lseek64(fd, 0, libc::SEEK_CUR);
                        if k >= 0 {
                            ofd.offset.store(k as u64, Ordering::Release);
                        }
                    }
                    return r;
                }
            }
        }
    }
    // SAFETY: as called.
    unsafe { real::getdents64(crate::lazy::kernel(fd), buf, n) }
}
