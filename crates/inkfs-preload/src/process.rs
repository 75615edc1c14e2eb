//! fork and exec.
//!
//! **fork**: the child's descriptor table is a copy of the parent's and
//! points at the same shared open-file entries, so both move one offset,
//! as with the kernel's descriptions. Each entry gains the child's
//! references before the fork. The child forgets the parent's clients
//! (their epoch slots and sessions are the parent's) and attaches as its
//! own client at its first served call.
//!
//! **exec** (execve and every exec form, posix_spawn, system, popen; vfork
//! is made a fork, so the child's dup2 and close calls touch its own
//! table): the
//! new image knows nothing of the library's offsets. Each served
//! descriptor that survives the exec (no FD_CLOEXEC) has its offset
//! written to the kernel descriptor (lseek) and its entry handed to the
//! kernel for good: from then on every process sharing it, this one
//! included, uses the kernel descriptor and its offset, which the new
//! image moves. posix_spawn hands over every served descriptor, close-on-
//! exec or not: its file actions may dup2 one onto a number the child
//! keeps. The new image's library does not adopt inherited descriptors:
//! they stay kernel descriptors there.
//!
//! Placeholder descriptors (lazy.rs) are materialized first: before fork
//! every one (the child then shares kernel open files with its parent),
//! before an exec those that survive it. The exec interposers allocate
//! nothing (materializing is system calls only): a vfork child runs them
//! on its parent's memory.

use std::ffi::{c_char, c_int, c_void};

use libc::{pid_t, FILE};

use crate::table::{self, LOCAL};
use crate::{guard, lazy, mounts, real, stats};

#[no_mangle]
pub unsafe extern "C" fn fork() -> pid_t {
    // Placeholders get their kernel files first: parent and child then
    // share kernel open files, and the server's handles keep an unlinked
    // one alive whoever closes last (a hold is one process's).
    let _ = guard::run(|| lazy::materialize_all(|_| true));
    table::fork_refs(1);
    // SAFETY: as called.
    let pid = unsafe { real::fork() };
    if pid < 0 {
        table::fork_refs(-1);
    } else if pid == 0 {
        mounts::after_fork();
        lazy::after_fork();
        crate::cwd::after_fork();
        stats::reset();
    }
    pid
}

/// vfork: made a fork. A vfork child runs on its parent's memory, so the
/// dup2 and close calls it makes before exec would change the parent's
/// descriptor table; a forked child changes its own. (POSIX lets vfork be
/// fork; what it costs is the copy of the page tables.)
#[no_mangle]
pub unsafe extern "C" fn vfork() -> pid_t {
    // SAFETY: as called.
    unsafe { fork() }
}

#[no_mangle]
pub unsafe extern "C" fn __vfork() -> pid_t {
    // SAFETY: as called.
    unsafe { fork() }
}

/// Before an exec: hand every inherited served descriptor to the kernel.
pub fn before_exec() {
    hand_over(false);
}

/// Hand served descriptors to the kernel: those without FD_CLOEXEC, or
/// (`all`) every one, for a spawn whose file actions (dup2 onto another
/// number) may pass on a close-on-exec descriptor.
fn hand_over(all: bool) {
    // Placeholders that survive the exec get their kernel files first.
    let survives = |fd: c_int| {
        // SAFETY: no memory involved.
        let fdflags = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
        fdflags >= 0 && (all || fdflags & libc::FD_CLOEXEC == 0)
    };
    let _ = guard::run(|| lazy::materialize_all(survives));
    table::each(|fd, _, o| {
        if o.state.load(std::sync::atomic::Ordering::Acquire) != LOCAL {
            return;
        }
        // SAFETY: no memory involved.
        let fdflags = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
        if fdflags < 0 || (!all && fdflags & libc::FD_CLOEXEC != 0) {
            return;
        }
        let off = o.offset.load(std::sync::atomic::Ordering::Acquire);
        // SAFETY: no memory involved.
        unsafe { real::lseek64(fd, off as i64, libc::SEEK_SET) };
        o.state
            .store(table::KERNEL, std::sync::atomic::Ordering::Release);
    });
}

type Argv = *const *const c_char;

#[no_mangle]
pub unsafe extern "C" fn execve(p: *const c_char, argv: Argv, envp: Argv) -> c_int {
    before_exec();
    // SAFETY: as called.
    unsafe { real::execve(p, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn execv(p: *const c_char, argv: Argv) -> c_int {
    before_exec();
    // SAFETY: as called.
    unsafe { real::execv(p, argv) }
}

#[no_mangle]
pub unsafe extern "C" fn execvp(f: *const c_char, argv: Argv) -> c_int {
    before_exec();
    // SAFETY: as called.
    unsafe { real::execvp(f, argv) }
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(f: *const c_char, argv: Argv, envp: Argv) -> c_int {
    before_exec();
    // SAFETY: as called.
    unsafe { real::execvpe(f, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: Argv, envp: Argv) -> c_int {
    before_exec();
    // SAFETY: as called.
    unsafe { real::fexecve(lazy::kernel(fd), argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn execveat(
    d: c_int,
    p: *const c_char,
    argv: Argv,
    envp: Argv,
    flags: c_int,
) -> c_int {
    before_exec();
    // SAFETY: as called.
    unsafe { real::execveat(lazy::kernel(d), p, argv, envp, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut pid_t,
    p: *const c_char,
    fa: *const c_void,
    attr: *const c_void,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    hand_over(true);
    // SAFETY: as called.
    unsafe { real::posix_spawn(pid, p, fa, attr, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut pid_t,
    f: *const c_char,
    fa: *const c_void,
    attr: *const c_void,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    hand_over(true);
    // SAFETY: as called.
    unsafe { real::posix_spawnp(pid, f, fa, attr, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn system(cmd: *const c_char) -> c_int {
    before_exec();
    // SAFETY: as called.
    unsafe { real::system(cmd) }
}

#[no_mangle]
pub unsafe extern "C" fn popen(cmd: *const c_char, kind: *const c_char) -> *mut FILE {
    before_exec();
    // SAFETY: as called.
    unsafe { real::popen(cmd, kind) }
}

// execl, execlp, execle: variadic lists of arguments ending with a null
// pointer (execle: then the environment). Defined with a fixed window of
// `MAX_ARGS` pointer arguments, which the x86-64 System V ABI passes where
// the variadic ones are (registers, then the caller's stack in order);
// only the arguments up to the terminating null are used. A longer list
// fails with E2BIG.
const MAX_ARGS: usize = 32;

macro_rules! execl_form {
    ($name:ident, $env:expr, $call:expr) => {
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name(
            p: *const c_char,
            a0: *const c_char,
            a1: *const c_char,
            a2: *const c_char,
            a3: *const c_char,
            a4: *const c_char,
            a5: *const c_char,
            a6: *const c_char,
            a7: *const c_char,
            a8: *const c_char,
            a9: *const c_char,
            a10: *const c_char,
            a11: *const c_char,
            a12: *const c_char,
            a13: *const c_char,
            a14: *const c_char,
            a15: *const c_char,
            a16: *const c_char,
            a17: *const c_char,
            a18: *const c_char,
            a19: *const c_char,
            a20: *const c_char,
            a21: *const c_char,
            a22: *const c_char,
            a23: *const c_char,
            a24: *const c_char,
            a25: *const c_char,
            a26: *const c_char,
            a27: *const c_char,
            a28: *const c_char,
            a29: *const c_char,
            a30: *const c_char,
            a31: *const c_char,
        ) -> c_int {
            let args: [*const c_char; MAX_ARGS] = [
                a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17,
                a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31,
            ];
            let Some(end) = args.iter().position(|a| a.is_null()) else {
                // SAFETY: this thread's errno.
                unsafe { *libc::__errno_location() = libc::E2BIG };
                return -1;
            };
            let with_env: bool = $env;
            let envp: Argv = if with_env {
                match args.get(end + 1) {
                    Some(e) => e.cast(),
                    None => {
                        // SAFETY: this thread's errno.
                        unsafe { *libc::__errno_location() = libc::E2BIG };
                        return -1;
                    }
                }
            } else {
                std::ptr::null()
            };
            let _ = envp;
            let call: unsafe fn(*const c_char, Argv, Argv) -> c_int = $call;
            // SAFETY: a null-terminated argument array, as the program gave.
            unsafe { call(p, args.as_ptr(), envp) }
        }
    };
}

execl_form!(execl, false, |p, a, _| unsafe { execv(p, a) });
execl_form!(execlp, false, |p, a, _| unsafe { execvp(p, a) });
execl_form!(execle, true, |p, a, e| unsafe { execve(p, a, e) });
