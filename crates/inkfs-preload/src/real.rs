//! The real libc functions behind the interposers: the next definition of
//! each symbol after this library (`dlsym(RTLD_NEXT)`), looked up at first
//! use and cached in an atomic. Calling these never recurses into the
//! interposers.

use std::ffi::{c_char, c_int, c_long, c_uint, c_ulong, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{dirent64, mode_t, off64_t, pid_t, size_t, ssize_t, DIR, FILE};

/// The address of the next definition of `name` (NUL-terminated), 0 if
/// there is none.
fn next(cache: &AtomicUsize, name: &'static str) -> usize {
    let p = cache.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    debug_assert!(name.ends_with('\0'));
    // SAFETY: `name` is NUL-terminated; dlsym has no other precondition.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) } as usize;
    cache.store(p, Ordering::Relaxed);
    p
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// `real!(name(args) -> ret, fail)`: `real::name(args)` calls the next
/// definition, or sets ENOSYS and returns `fail` if there is none.
macro_rules! real {
    ($( $name:ident ( $($a:ident : $t:ty),* $(; ...)? ) -> $r:ty , $fail:expr; )*) => {$(
        #[allow(clippy::missing_safety_doc)]
        pub unsafe fn $name($($a: $t),*) -> $r {
            static CACHE: AtomicUsize = AtomicUsize::new(0);
            let p = next(&CACHE, concat!(stringify!($name), "\0"));
            if p == 0 {
                set_errno(libc::ENOSYS);
                return $fail;
            }
            // SAFETY: the symbol is libc's function of this signature.
            let f: unsafe extern "C" fn($($t),*) -> $r = unsafe { std::mem::transmute(p) };
            unsafe { f($($a),*) }
        }
    )*};
}

#[allow(clippy::unused_unit)]
mod fns {
    use super::*;
    real! {
        read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t, -1;
        pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t, -1;
        readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t, -1;
        preadv64(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t) -> ssize_t, -1;
        preadv64v2(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t, flags: c_int) -> ssize_t, -1;
        write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t, -1;
        pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t, -1;
        writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t, -1;
        pwritev64(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t) -> ssize_t, -1;
        pwritev64v2(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t, flags: c_int) -> ssize_t, -1;
        lseek64(fd: c_int, off: off64_t, whence: c_int) -> off64_t, -1;
        ftruncate64(fd: c_int, len: off64_t) -> c_int, -1;
        fsync(fd: c_int) -> c_int, -1;
        fdatasync(fd: c_int) -> c_int, -1;
        sync_file_range(fd: c_int, off: off64_t, n: off64_t, flags: c_uint) -> c_int, -1;
        mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off64_t) -> *mut c_void, libc::MAP_FAILED;
        close(fd: c_int) -> c_int, -1;
        close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int, -1;
        closefrom(low: c_int) -> (), ();
        dup(fd: c_int) -> c_int, -1;
        dup2(old: c_int, new: c_int) -> c_int, -1;
        dup3(old: c_int, new: c_int, flags: c_int) -> c_int, -1;
        fstat64(fd: c_int, st: *mut libc::stat64) -> c_int, -1;
        fstatat64(dirfd: c_int, path: *const c_char, st: *mut libc::stat64, flags: c_int) -> c_int, -1;
        statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, st: *mut libc::statx) -> c_int, -1;
        faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int, -1;
        readlinkat(dirfd: c_int, path: *const c_char, buf: *mut c_char, n: size_t) -> ssize_t, -1;
        getdents64(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t, -1;
        opendir(path: *const c_char) -> *mut DIR, std::ptr::null_mut();
        fdopendir(fd: c_int) -> *mut DIR, std::ptr::null_mut();
        readdir64(d: *mut DIR) -> *mut dirent64, std::ptr::null_mut();
        readdir64_r(d: *mut DIR, e: *mut dirent64, r: *mut *mut dirent64) -> c_int, libc::ENOSYS;
        closedir(d: *mut DIR) -> c_int, -1;
        rewinddir(d: *mut DIR) -> (), ();
        telldir(d: *mut DIR) -> c_long, -1;
        seekdir(d: *mut DIR, pos: c_long) -> (), ();
        dirfd(d: *mut DIR) -> c_int, -1;
        fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE, std::ptr::null_mut();
        fdopen(fd: c_int, mode: *const c_char) -> *mut FILE, std::ptr::null_mut();
    fclose(f: *mut FILE) -> c_int, libc::EOF;
    freopen64(path: *const c_char, mode: *const c_char, f: *mut FILE) -> *mut FILE, std::ptr::null_mut();
        fork() -> pid_t, -1;
        execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int, -1;
        execv(path: *const c_char, argv: *const *const c_char) -> c_int, -1;
        execvp(file: *const c_char, argv: *const *const c_char) -> c_int, -1;
        execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int, -1;
        fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int, -1;
        execveat(dirfd: c_int, path: *const c_char, argv: *const *const c_char, envp: *const *const c_char, flags: c_int) -> c_int, -1;
        posix_spawn(pid: *mut pid_t, path: *const c_char, fa: *const c_void, attr: *const c_void, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int, libc::ENOSYS;
        posix_spawnp(pid: *mut pid_t, file: *const c_char, fa: *const c_void, attr: *const c_void, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int, libc::ENOSYS;
        system(cmd: *const c_char) -> c_int, -1;
        popen(cmd: *const c_char, kind: *const c_char) -> *mut FILE, std::ptr::null_mut();
        sendfile64(out: c_int, inp: c_int, off: *mut off64_t, n: size_t) -> ssize_t, -1;
        copy_file_range(inp: c_int, off_in: *mut off64_t, out: c_int, off_out: *mut off64_t, n: size_t, flags: c_uint) -> ssize_t, -1;
        splice(inp: c_int, off_in: *mut off64_t, out: c_int, off_out: *mut off64_t, n: size_t, flags: c_uint) -> ssize_t, -1;
        getcwd(buf: *mut c_char, n: size_t) -> *mut c_char, std::ptr::null_mut();
        chdir(path: *const c_char) -> c_int, -1;
        fchdir(fd: c_int) -> c_int, -1;
        daemon(nochdir: c_int, noclose: c_int) -> c_int, -1;
        fts_read(fts: *mut c_void) -> *mut c_void, std::ptr::null_mut();
        fts64_read(fts: *mut c_void) -> *mut c_void, std::ptr::null_mut();
        fts_children(fts: *mut c_void, options: c_int) -> *mut c_void, std::ptr::null_mut();
        fts64_children(fts: *mut c_void, options: c_int) -> *mut c_void, std::ptr::null_mut();
        fts_close(fts: *mut c_void) -> c_int, -1;
        fts64_close(fts: *mut c_void) -> c_int, -1;
        nftw(dir: *const c_char, f: *const c_void, fds: c_int, flags: c_int) -> c_int, -1;
        nftw64(dir: *const c_char, f: *const c_void, fds: c_int, flags: c_int) -> c_int, -1;
        umask(mask: mode_t) -> mode_t, 0o022;
        setuid(uid: libc::uid_t) -> c_int, -1;
        setgid(gid: libc::gid_t) -> c_int, -1;
        seteuid(uid: libc::uid_t) -> c_int, -1;
        setegid(gid: libc::gid_t) -> c_int, -1;
        setreuid(r: libc::uid_t, e: libc::uid_t) -> c_int, -1;
        setregid(r: libc::gid_t, e: libc::gid_t) -> c_int, -1;
        setresuid(r: libc::uid_t, e: libc::uid_t, s: libc::uid_t) -> c_int, -1;
        setresgid(r: libc::gid_t, e: libc::gid_t, s: libc::gid_t) -> c_int, -1;
        setfsuid(uid: libc::uid_t) -> c_int, -1;
        setfsgid(gid: libc::gid_t) -> c_int, -1;
        setgroups(n: size_t, list: *const libc::gid_t) -> c_int, -1;
        initgroups(user: *const c_char, group: libc::gid_t) -> c_int, -1;
        unshare(flags: c_int) -> c_int, -1;
        setns(fd: c_int, nstype: c_int) -> c_int, -1;
        mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int, -1;
        mknodat(dirfd: c_int, path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int, -1;
        symlinkat(target: *const c_char, dirfd: c_int, path: *const c_char) -> c_int, -1;
        unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int, -1;
        renameat2(d1: c_int, p1: *const c_char, d2: c_int, p2: *const c_char, flags: c_uint) -> c_int, -1;
        linkat(d1: c_int, p1: *const c_char, d2: c_int, p2: *const c_char, flags: c_int) -> c_int, -1;
        fchmodat(dirfd: c_int, path: *const c_char, mode: mode_t, flags: c_int) -> c_int, -1;
        fchownat(dirfd: c_int, path: *const c_char, uid: libc::uid_t, gid: libc::gid_t, flags: c_int) -> c_int, -1;
        utimensat(dirfd: c_int, path: *const c_char, times: *const libc::timespec, flags: c_int) -> c_int, -1;
        utimes(path: *const c_char, tv: *const libc::timeval) -> c_int, -1;
        lutimes(path: *const c_char, tv: *const libc::timeval) -> c_int, -1;
        utime(path: *const c_char, buf: *const libc::utimbuf) -> c_int, -1;
        futimes(fd: c_int, tv: *const libc::timeval) -> c_int, -1;
        futimens(fd: c_int, times: *const libc::timespec) -> c_int, -1;
        posix_fadvise64(fd: c_int, off: off64_t, len: off64_t, advice: c_int) -> c_int, libc::ENOSYS;
        truncate64(path: *const c_char, len: off64_t) -> c_int, -1;
        fchmod(fd: c_int, mode: mode_t) -> c_int, -1;
        fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int, -1;
        fstatfs(fd: c_int, buf: *mut libc::statfs) -> c_int, -1;
        fstatfs64(fd: c_int, buf: *mut libc::statfs64) -> c_int, -1;
        fstatvfs(fd: c_int, buf: *mut libc::statvfs) -> c_int, -1;
        fstatvfs64(fd: c_int, buf: *mut libc::statvfs64) -> c_int, -1;
    }
}
pub use fns::*;

// The variadic ones: called with their one optional argument.
static OPENAT: AtomicUsize = AtomicUsize::new(0);
static FCNTL: AtomicUsize = AtomicUsize::new(0);
static SYSCALL: AtomicUsize = AtomicUsize::new(0);

/// syscall(2) with all six arguments (what the caller did not give is
/// passed on unread by the kernel).
#[allow(clippy::missing_safety_doc, clippy::too_many_arguments)]
pub unsafe fn syscall(
    n: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    let p = next(&SYSCALL, "syscall\0");
    if p == 0 {
        set_errno(libc::ENOSYS);
        return -1;
    }
    // SAFETY: libc's syscall, variadic in its arguments.
    let f: unsafe extern "C" fn(c_long, ...) -> c_long = unsafe { std::mem::transmute(p) };
    unsafe { f(n, a1, a2, a3, a4, a5, a6) }
}

#[allow(clippy::missing_safety_doc)]
pub unsafe fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    let p = next(&OPENAT, "openat64\0");
    if p == 0 {
        set_errno(libc::ENOSYS);
        return -1;
    }
    // SAFETY: libc's openat64, variadic in its mode.
    let f: unsafe extern "C" fn(c_int, *const c_char, c_int, ...) -> c_int =
        unsafe { std::mem::transmute(p) };
    unsafe { f(dirfd, path, flags, mode as c_uint) }
}

#[allow(clippy::missing_safety_doc)]
pub unsafe fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    let p = next(&FCNTL, "fcntl64\0");
    if p == 0 {
        set_errno(libc::ENOSYS);
        return -1;
    }
    // SAFETY: libc's fcntl64, variadic in its one argument.
    let f: unsafe extern "C" fn(c_int, c_int, ...) -> c_int = unsafe { std::mem::transmute(p) };
    unsafe { f(fd, cmd, arg) }
}

extern "C" {
    /// glibc's fopencookie (not in the libc crate for every target).
    pub fn fopencookie(
        cookie: *mut c_void,
        mode: *const c_char,
        funcs: CookieFunctions,
    ) -> *mut FILE;
}

/// glibc's `cookie_io_functions_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CookieFunctions {
    pub read: Option<unsafe extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t>,
    pub write: Option<unsafe extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t>,
    pub seek: Option<unsafe extern "C" fn(*mut c_void, *mut off64_t, c_int) -> c_int>,
    pub close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}
