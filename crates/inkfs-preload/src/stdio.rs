//! stdio: glibc's FILE reads and writes through its own internal
//! functions, never the public `read`, so a FILE on a served descriptor is
//! made with `fopencookie` over this library's read/write/lseek/close.
//!
//! fopen opens through the library's open (so the descriptor is a real
//! one, registered if served); a served descriptor gets a cookie FILE,
//! any other a plain one (`fdopen`). fdopen of a served descriptor gets a
//! cookie FILE too. The cookie FILE's `_fileno` is set to the descriptor,
//! so `fileno()` answers as for any FILE (fstat, fsync on it are the
//! library's, fadvise the kernel descriptor's). Not served: freopen (glibc reopens with its
//! internal open; the library forgets the old and new numbers), wide-
//! character `,ccs=` modes. fclose forgets the descriptor before glibc
//! closes it.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicU8, Ordering};

use libc::{off64_t, size_t, ssize_t, FILE};

use crate::real::{self, CookieFunctions};
use crate::{fds, guard, io, mounts, path, table};

/// Where glibc's `struct _IO_FILE` keeps the descriptor (`_fileno`) on
/// x86-64: after the flags word and 13 pointers. Checked once at run time
/// against a real FILE before it is written (`fileno_offset_ok`).
const FILENO_OFFSET: usize = 112;

unsafe extern "C" fn ck_read(c: *mut c_void, buf: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: glibc's buffer for the read.
    unsafe { io::read(c as usize as c_int, buf.cast(), n) }
}

unsafe extern "C" fn ck_write(c: *mut c_void, buf: *const c_char, n: size_t) -> ssize_t {
    // SAFETY: glibc's buffer to write.
    unsafe { io::write(c as usize as c_int, buf.cast(), n) }
}

unsafe extern "C" fn ck_seek(c: *mut c_void, pos: *mut off64_t, whence: c_int) -> c_int {
    // SAFETY: glibc's position argument.
    unsafe {
        let r = io::lseek64(c as usize as c_int, *pos, whence);
        if r < 0 {
            return -1;
        }
        *pos = r;
    }
    0
}

unsafe extern "C" fn ck_close(c: *mut c_void) -> c_int {
    // SAFETY: the cookie's descriptor, closed once by fclose.
    unsafe { fds::close(c as usize as c_int) }
}

const COOKIE: CookieFunctions = CookieFunctions {
    read: Some(ck_read),
    write: Some(ck_write),
    seek: Some(ck_seek),
    close: Some(ck_close),
};

/// Whether `_fileno` is where [`FILENO_OFFSET`] says (0 unknown, 1 yes, 2 no).
static FILENO_OK: AtomicU8 = AtomicU8::new(0);

fn fileno_offset_ok() -> bool {
    match FILENO_OK.load(Ordering::Relaxed) {
        1 => return true,
        2 => return false,
        _ => {}
    }
    // SAFETY: a FILE of our own on /dev/null, read and closed here.
    let ok = unsafe {
        let f = real::fopen64(c"/dev/null".as_ptr(), c"r".as_ptr());
        if f.is_null() {
            false
        } else {
            let fd = libc::fileno(f);
            let at = *(f.cast::<u8>().add(FILENO_OFFSET).cast::<c_int>());
            real::fclose(f);
            fd >= 0 && at == fd
        }
    };
    FILENO_OK.store(if ok { 1 } else { 2 }, Ordering::Relaxed);
    ok
}

/// `mode`'s open flags, and the mode to hand glibc (`r`, `w`, `a` and
/// `+` only: the flags already did the rest). `None`: not a mode served.
fn parse_mode(mode: &[u8]) -> Option<(c_int, [u8; 3])> {
    if mode.contains(&b',') {
        return None;
    }
    let plus = mode.contains(&b'+');
    let (acc, extra) = match mode.first()? {
        b'r' => (libc::O_RDONLY, 0),
        b'w' => (libc::O_WRONLY, libc::O_CREAT | libc::O_TRUNC),
        b'a' => (libc::O_WRONLY, libc::O_CREAT | libc::O_APPEND),
        _ => return None,
    };
    let acc = if plus { libc::O_RDWR } else { acc };
    let mut flags = acc | extra;
    if mode.contains(&b'x') {
        flags |= libc::O_EXCL;
    }
    if mode.contains(&b'e') {
        flags |= libc::O_CLOEXEC;
    }
    let short = [mode[0], if plus { b'+' } else { 0 }, 0];
    Some((flags, short))
}

/// A cookie FILE over served descriptor `fd`.
fn cookie_file(fd: c_int, short: &[u8; 3]) -> *mut FILE {
    // SAFETY: a valid mode string; the cookie is the descriptor number.
    let f = unsafe { real::fopencookie(fd as usize as *mut c_void, short.as_ptr().cast(), COOKIE) };
    if !f.is_null() {
        // SAFETY: checked layout (see FILENO_OFFSET).
        unsafe { *(f.cast::<u8>().add(FILENO_OFFSET).cast::<c_int>()) = fd };
    }
    f
}

fn open_file(p: *const c_char, flags: c_int, short: &[u8; 3]) -> *mut FILE {
    // The program's own open: through the interposer, which registers it.
    // SAFETY: the program's path.
    let fd = unsafe { fds::open(p, flags, 0o666) };
    if fd < 0 {
        return std::ptr::null_mut();
    }
    let f = if table::local(fd).is_some() {
        cookie_file(fd, short)
    } else {
        // SAFETY: our fresh descriptor.
        unsafe { real::fdopen(fd, short.as_ptr().cast()) }
    };
    if f.is_null() {
        // SAFETY: errno kept across the close of our descriptor.
        unsafe {
            let e = *libc::__errno_location();
            fds::close(fd);
            *libc::__errno_location() = e;
        }
    }
    f
}

#[no_mangle]
pub unsafe extern "C" fn fopen64(p: *const c_char, mode: *const c_char) -> *mut FILE {
    if !guard::inside() {
        if let Some(Some((flags, short))) = guard::run(|| decide(p, mode)) {
            return open_file(p, flags, &short);
        }
    }
    // SAFETY: as called.
    unsafe { real::fopen64(p, mode) }
}

/// Whether fopen takes the library's path, with the flags and short mode.
fn decide(p: *const c_char, mode: *const c_char) -> Option<(c_int, [u8; 3])> {
    // SAFETY: the program's strings.
    let (pb, mb) = unsafe { (path::bytes(p)?, path::bytes(mode)?) };
    let (flags, short) = parse_mode(mb)?;
    if flags & libc::O_ACCMODE == libc::O_WRONLY || mounts::all().is_empty() {
        return None;
    }
    if pb.first() == Some(&b'/') && mounts::locate_abs(pb).is_none() {
        return None;
    }
    fileno_offset_ok().then_some((flags, short))
}

#[no_mangle]
pub unsafe extern "C" fn fopen(p: *const c_char, mode: *const c_char) -> *mut FILE {
    // SAFETY: as called.
    unsafe { fopen64(p, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE {
    if !guard::inside() && table::local(fd).is_some() && !mode.is_null() {
        // SAFETY: the program's mode string.
        let mb = unsafe { CStr::from_ptr(mode) }.to_bytes();
        let got = guard::run(|| parse_mode(mb).filter(|_| fileno_offset_ok()));
        if let Some(Some((_, short))) = got {
            return cookie_file(fd, &short);
        }
    }
    // SAFETY: as called.
    unsafe { real::fdopen(fd, mode) }
}

/// fclose closes the descriptor inside glibc: a cookie FILE's (a served
/// descriptor) through this library's close, after its buffer is written
/// through the library (a placeholder has no kernel file to take it); any
/// other FILE's not: forget that one first, so the table never keeps a
/// number the kernel will hand out again.
#[no_mangle]
pub unsafe extern "C" fn fclose(f: *mut FILE) -> c_int {
    if !f.is_null() {
        // SAFETY: the program's open FILE.
        let fd = unsafe { libc::fileno(f) };
        if table::local(fd).is_none() {
            table::release(fd);
        }
    }
    // SAFETY: as called.
    unsafe { real::fclose(f) }
}

/// freopen closes the stream's descriptor inside glibc and opens the new
/// file with glibc's own open (not served): forget both numbers.
#[no_mangle]
pub unsafe extern "C" fn freopen64(
    p: *const c_char,
    mode: *const c_char,
    f: *mut FILE,
) -> *mut FILE {
    if !f.is_null() {
        // SAFETY: the program's open FILE.
        let fd = unsafe { libc::fileno(f) };
        // A cookie FILE is flushed and closed through this library.
        if table::local(fd).is_none() {
            table::release(fd);
        }
    }
    // SAFETY: as called.
    let r = unsafe { real::freopen64(p, mode, f) };
    if !r.is_null() {
        // SAFETY: the reopened FILE.
        table::release(unsafe { libc::fileno(r) });
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn freopen(p: *const c_char, mode: *const c_char, f: *mut FILE) -> *mut FILE {
    // SAFETY: as called.
    unsafe { freopen64(p, mode, f) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(parse_mode(b"r").map(|m| m.0), Some(libc::O_RDONLY));
        assert_eq!(
            parse_mode(b"rb+e").map(|m| m.0),
            Some(libc::O_RDWR | libc::O_CLOEXEC)
        );
        assert_eq!(
            parse_mode(b"a+").map(|m| m.0),
            Some(libc::O_RDWR | libc::O_CREAT | libc::O_APPEND)
        );
        assert_eq!(parse_mode(b"r+").map(|m| m.1), Some(*b"r+\0"));
        assert!(parse_mode(b"r,ccs=UTF-8").is_none());
        assert!(parse_mode(b"q").is_none());
    }
}
