//! Calls that need the kernel's file of a descriptor, which the library
//! does not serve: a placeholder (lazy.rs) is materialized first, then the
//! real call runs on it (fchdir, which does too, is cwd.rs's): flock,
//! lockf, ioctl,
//! fallocate/posix_fallocate, readahead, syncfs, xattrs by descriptor.
//! posix_fadvise of a placeholder is answered 0 (advice: the pool needs
//! none), and fstatfs/fstatvfs of one by the same call on its mount's
//! root (one file system, one answer: the server's STATFS, without
//! opening the file in the kernel, as fts asks of every directory it
//! enters). On any other descriptor these are libc's, untouched.

use std::ffi::{c_char, c_int, c_ulong, c_void};

use libc::{off64_t, size_t, ssize_t};

use crate::lazy;

/// `real!(name(fd, args...) -> ret, fail)`: the interposer, with the first
/// argument (the descriptor) materialized, and the next definition.
macro_rules! on_kernel_file {
    ($( $name:ident ( $fd:ident : c_int $(, $a:ident : $t:ty)* ) -> $r:ty , $fail:expr; )*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name($fd: c_int $(, $a: $t)*) -> $r {
            static CACHE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let mut p = CACHE.load(std::sync::atomic::Ordering::Relaxed);
            if p == 0 {
                // SAFETY: a NUL-terminated name; dlsym has no other
                // precondition.
                p = unsafe {
                    libc::dlsym(libc::RTLD_NEXT, concat!(stringify!($name), "\0").as_ptr().cast())
                } as usize;
                CACHE.store(p, std::sync::atomic::Ordering::Relaxed);
            }
            if p == 0 {
                // SAFETY: this thread's errno.
                unsafe { *libc::__errno_location() = libc::ENOSYS };
                return $fail;
            }
            // SAFETY: the symbol is libc's function of this signature.
            let f: unsafe extern "C" fn(c_int $(, $t)*) -> $r = unsafe { std::mem::transmute(p) };
            // SAFETY: the program's arguments, on the kernel's file.
            unsafe { f(lazy::kernel($fd) $(, $a)*) }
        }
    )*};
}

on_kernel_file! {
    flock(fd: c_int, op: c_int) -> c_int, -1;
    lockf(fd: c_int, cmd: c_int, len: libc::off_t) -> c_int, -1;
    lockf64(fd: c_int, cmd: c_int, len: off64_t) -> c_int, -1;
    ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int, -1;
    fallocate(fd: c_int, mode: c_int, off: libc::off_t, len: libc::off_t) -> c_int, -1;
    fallocate64(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int, -1;
    posix_fallocate(fd: c_int, off: libc::off_t, len: libc::off_t) -> c_int, libc::ENOSYS;
    posix_fallocate64(fd: c_int, off: off64_t, len: off64_t) -> c_int, libc::ENOSYS;
    readahead(fd: c_int, off: off64_t, n: size_t) -> ssize_t, -1;
    syncfs(fd: c_int) -> c_int, -1;
    fgetxattr(fd: c_int, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t, -1;
    fsetxattr(fd: c_int, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int, -1;
    flistxattr(fd: c_int, list: *mut c_char, size: size_t) -> ssize_t, -1;
    fremovexattr(fd: c_int, name: *const c_char) -> c_int, -1;
}

/// truncate by path: `/proc/self/fd/N` of a placeholder is materialized
/// first (else it names /dev/null); any other path is the kernel's.
#[no_mangle]
pub unsafe extern "C" fn truncate64(p: *const c_char, len: off64_t) -> c_int {
    // SAFETY: the program's path string (or null: the kernel's EFAULT).
    if let Some(n) = unsafe { crate::path::bytes(p) }.and_then(lazy::fd_link) {
        lazy::kernel(n);
    }
    // SAFETY: as called.
    unsafe { crate::real::truncate64(p, len) }
}

#[no_mangle]
pub unsafe extern "C" fn truncate(p: *const c_char, len: off64_t) -> c_int {
    // SAFETY: as called.
    unsafe { truncate64(p, len) }
}

/// posix_fadvise: advice about a placeholder's file needs no kernel file
/// (the pool is memory); any other descriptor's is the kernel's.
#[no_mangle]
pub unsafe extern "C" fn posix_fadvise64(
    fd: c_int,
    off: off64_t,
    len: off64_t,
    advice: c_int,
) -> c_int {
    if lazy::is_lazy(fd) {
        return 0;
    }
    // SAFETY: no memory involved.
    unsafe { crate::real::posix_fadvise64(fd, off, len, advice) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_fadvise(
    fd: c_int,
    off: off64_t,
    len: off64_t,
    advice: c_int,
) -> c_int {
    // SAFETY: as called.
    unsafe { posix_fadvise64(fd, off, len, advice) }
}

/// The mount root of placeholder `fd`, NUL-terminated in `buf`.
fn placeholder_root(fd: c_int, buf: &mut [u8; libc::PATH_MAX as usize]) -> bool {
    if !lazy::is_lazy(fd) {
        return false;
    }
    let Some((_, o)) = crate::table::get(fd) else {
        return false;
    };
    let Some(m) =
        crate::mounts::by_index(o.mount.load(std::sync::atomic::Ordering::Relaxed) as usize)
    else {
        return false;
    };
    if m.path.len() >= buf.len() {
        return false;
    }
    buf[..m.path.len()].copy_from_slice(&m.path);
    buf[m.path.len()] = 0;
    true
}

/// `statfs`-like calls: on a placeholder, `by_path` on its mount's root;
/// else `by_fd` on the descriptor.
macro_rules! on_file_system {
    ($( $name:ident ( $t:ty ) = $by_fd:ident, $by_path:ident; )*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, out: *mut $t) -> c_int {
            let mut root = [0u8; libc::PATH_MAX as usize];
            if placeholder_root(fd, &mut root) {
                // SAFETY: a NUL-terminated path; the program's buffer
                // (libc's function: the library defines no statfs).
                return unsafe { libc::$by_path(root.as_ptr().cast(), out) };
            }
            // SAFETY: the program's arguments, to libc's function.
            unsafe { crate::real::$by_fd(fd, out) }
        }
    )*};
}

on_file_system! {
    fstatfs(libc::statfs) = fstatfs, statfs;
    fstatfs64(libc::statfs64) = fstatfs64, statfs64;
    fstatvfs(libc::statvfs) = fstatvfs, statvfs;
    fstatvfs64(libc::statvfs64) = fstatvfs64, statvfs64;
}
