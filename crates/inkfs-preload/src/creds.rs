//! The caller's credentials, cached: the ids and groups the engine checks
//! a served call with, and the umask a creation applies
//! (docs/KERNEL-FREE.md, "Credentials without a system call").
//!
//! Reading them costs three system calls (the two ids, getgroups) and an
//! allocation; a namespace call needs them once or twice, so an untar
//! made some 13 such calls per file. They change only through calls this
//! library interposes: the set*id family, setgroups and initgroups, umask,
//! unshare and setns (a user namespace maps the ids anew), and
//! `syscall(2)` with one of those numbers. Each of those, once the
//! kernel has made the change, bumps one process-wide generation; each
//! thread keeps its own copy tagged with the generation it read before
//! asking the kernel, and reads them again when the tag is old.
//!
//! Why per thread: the kernel keeps credentials per thread. glibc's set*id
//! changes every thread (it signals each and waits) before it returns, so
//! after the bump no thread can use the old ones; raw `syscall(SYS_setuid)`
//! changes the calling thread only, and each thread reading its own again
//! sees exactly what its own calls would be checked with.
//!
//! A thread in the middle of a served call while another thread's setuid
//! runs finishes that call with the credentials it started with, as a
//! system call in flight does in the kernel (glibc's signal reaches it
//! when the call returns); its next call uses the new ones.
//!
//! Who owns what: the generation is per process (a forked child inherits
//! it with the cached copies, which are still true: fork keeps the
//! credentials; exec starts the library anew). A vfork child is a fork
//! here (process.rs), so it cannot write its parent's copies.

use std::cell::RefCell;
use std::ffi::{c_int, c_long};
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use inkfs::api::Credentials;
use libc::{gid_t, mode_t, uid_t};

use crate::real;

/// Bumped after every change of this process's credentials or umask.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// The process's umask (u32::MAX until read): the kernel applies it to
/// what the mount creates; the server applies the one a request states.
static UMASK: AtomicU32 = AtomicU32::new(u32::MAX);

/// Which ids a check uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ids {
    /// The effective ids, umask 0 (a check: nothing is created).
    Effective,
    /// The real ids, umask 0 (access(2) and faccessat without AT_EACCESS).
    Real,
    /// The effective ids and the umask (a creation).
    Creator,
}

impl Ids {
    fn slot(self) -> usize {
        self as usize
    }
}

type Slot = Option<(u64, Rc<Credentials>)>;

thread_local! {
    static CACHE: RefCell<[Slot; 3]> = const { RefCell::new([None, None, None]) };
}

/// At load: the umask, from /proc/self/status (reading it with umask(2)
/// would change it for a moment under other threads).
pub fn init() {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return;
    };
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok());
    if let Some(m) = mask {
        UMASK.store(m & 0o777, Ordering::Relaxed);
    }
    changed();
}

/// The credentials of this thread as `ids` names them: the cached copy if
/// nothing changed since it was read. `None` for [`Ids::Creator`] while
/// the umask is unknown (the kernel then creates).
pub fn get(ids: Ids) -> Option<Rc<Credentials>> {
    // Read before asking the kernel: a change after this read bumps the
    // generation past it, and the copy made now is read again next time.
    let generation = GENERATION.load(Ordering::Acquire);
    let cached = CACHE
        .try_with(|c| {
            let c = c.try_borrow().ok()?;
            match &c[ids.slot()] {
                Some((g, cred)) if *g == generation => Some(cred.clone()),
                _ => None,
            }
        })
        .ok()
        .flatten();
    if let Some(c) = cached {
        // (No check of the umask's copy against the cache here: another
        // thread's umask may have stored it and not yet bumped the
        // generation, and the call is then ordered before that umask.)
        return Some(c);
    }
    let cred = Rc::new(read(ids)?);
    // A thread that is exiting (its cache gone), or a signal handler
    // that interrupted this thread's own update, just does not cache.
    let _ = CACHE.try_with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            c[ids.slot()] = Some((generation, cred.clone()));
        }
    });
    Some(cred)
}

/// Ask the kernel (and the umask's copy).
fn read(ids: Ids) -> Option<Credentials> {
    let umask = match ids {
        Ids::Creator => {
            let m = UMASK.load(Ordering::Relaxed);
            if m == u32::MAX {
                return None;
            }
            m
        }
        Ids::Effective | Ids::Real => 0,
    };
    // SAFETY: these id calls cannot fail and touch no memory of ours.
    let (uid, gid) = unsafe {
        if ids == Ids::Real {
            (libc::getuid(), libc::getgid())
        } else {
            (libc::geteuid(), libc::getegid())
        }
    };
    Some(Credentials {
        uid,
        gid,
        groups: groups(),
        umask,
    })
}

/// The supplementary groups, however many.
fn groups() -> Vec<gid_t> {
    let mut groups = vec![0 as gid_t; 64];
    // SAFETY: the buffer holds `groups.len()` ids.
    let mut k = unsafe { libc::getgroups(groups.len() as c_int, groups.as_mut_ptr()) };
    if k < 0 {
        // SAFETY: size query, then a buffer of that size.
        let need = unsafe { libc::getgroups(0, std::ptr::null_mut()) }.max(0) as usize;
        groups.resize(need, 0);
        k = unsafe { libc::getgroups(groups.len() as c_int, groups.as_mut_ptr()) };
    }
    groups.truncate(k.max(0) as usize);
    groups
}

/// This process's credentials or umask may have changed: every thread
/// reads its own again at its next call. Called after the kernel's
/// change (a thread reading between the change and this bump caches what
/// it read under the old generation, and reads again).
fn changed() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Call `f` (the real change), then mark the credentials changed,
/// whatever `f` answered (a failed change costs one more read, nothing
/// else), keeping `f`'s errno.
fn changing<R>(f: impl FnOnce() -> R) -> R {
    let r = f();
    changed();
    r
}

#[no_mangle]
pub unsafe extern "C" fn umask(mask: mode_t) -> mode_t {
    // SAFETY: no memory involved.
    let old = unsafe { real::umask(mask) };
    UMASK.store(mask & 0o777, Ordering::Relaxed);
    changed();
    old
}

#[no_mangle]
pub unsafe extern "C" fn setuid(uid: uid_t) -> c_int {
    // SAFETY: no memory involved.
    changing(|| unsafe { real::setuid(uid) })
}

#[no_mangle]
pub unsafe extern "C" fn setgid(gid: gid_t) -> c_int {
    // SAFETY: no memory involved.
    changing(|| unsafe { real::setgid(gid) })
}

#[no_mangle]
pub unsafe extern "C" fn seteuid(uid: uid_t) -> c_int {
    // SAFETY: no memory involved.
    changing(|| unsafe { real::seteuid(uid) })
}

#[no_mangle]
pub unsafe extern "C" fn setegid(gid: gid_t) -> c_int {
    // SAFETY: no memory involved.
    changing(|| unsafe { real::setegid(gid) })
}

#[no_mangle]
pub unsafe extern "C" fn setreuid(r: uid_t, e: uid_t) -> c_int {
    // SAFETY: no memory involved.
    changing(|| unsafe { real::setreuid(r, e) })
}

#[no_mangle]
pub unsafe extern "C" fn setregid(r: gid_t, e: gid_t) -> c_int {
    // SAFETY: no memory involved.
    changing(|| unsafe { real::setregid(r, e) })
}

#[no_mangle]
pub unsafe extern "C" fn setresuid(r: uid_t, e: uid_t, s: uid_t) -> c_int {
    // SAFETY: no memory involved.
    changing(|| unsafe { real::setresuid(r, e, s) })
}

#[no_mangle]
pub unsafe extern "C" fn setresgid(r: gid_t, e: gid_t, s: gid_t) -> c_int {
    // SAFETY: no memory involved.
    changing(|| unsafe { real::setresgid(r, e, s) })
}

#[no_mangle]
pub unsafe extern "C" fn setfsuid(uid: uid_t) -> c_int {
    // SAFETY: no memory involved.
    changing(|| unsafe { real::setfsuid(uid) })
}

#[no_mangle]
pub unsafe extern "C" fn setfsgid(gid: gid_t) -> c_int {
    // SAFETY: no memory involved.
    changing(|| unsafe { real::setfsgid(gid) })
}

#[no_mangle]
pub unsafe extern "C" fn setgroups(n: libc::size_t, list: *const gid_t) -> c_int {
    // SAFETY: the program's list of `n` groups, passed on.
    changing(|| unsafe { real::setgroups(n, list) })
}

/// glibc's initgroups calls its own setgroups, which the library does not
/// see.
#[no_mangle]
pub unsafe extern "C" fn initgroups(user: *const std::ffi::c_char, group: gid_t) -> c_int {
    // SAFETY: the program's user name, passed on.
    changing(|| unsafe { real::initgroups(user, group) })
}

/// A new or joined user namespace shows the ids through its own map.
#[no_mangle]
pub unsafe extern "C" fn unshare(flags: c_int) -> c_int {
    // SAFETY: no memory involved.
    changing(|| unsafe { real::unshare(flags) })
}

/// Joining a mount namespace also moves the current directory to its
/// root (cwd.rs).
#[no_mangle]
pub unsafe extern "C" fn setns(fd: c_int, nstype: c_int) -> c_int {
    // SAFETY: no memory involved.
    crate::cwd::changing(|| changing(|| unsafe { real::setns(fd, nstype) }))
}

/// The system call numbers that change a thread's credentials.
const CREDENTIAL_CALLS: [c_long; 12] = [
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
    libc::SYS_setgroups,
    libc::SYS_umask,
    libc::SYS_unshare,
    libc::SYS_setns,
];

/// The system call numbers that change the current directory (cwd.rs).
const CWD_CALLS: [c_long; 3] = [libc::SYS_chdir, libc::SYS_fchdir, libc::SYS_setns];

/// syscall(2): a raw credential change (Samba changes one thread's ids
/// so) marks the credentials changed, a raw chdir the current directory
/// (cwd.rs). Variadic in C: every argument is passed on (the x86-64 ABI reads them from the same registers and stack
/// slot whether or not the caller gave them, and the kernel ignores what
/// a call does not take).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn syscall(
    n: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    // SAFETY: the program's call, passed on as it made it.
    let call = || unsafe { real::syscall(n, a1, a2, a3, a4, a5, a6) };
    if CWD_CALLS.contains(&n) {
        // A directory placeholder gets its kernel file first, as fchdir's.
        let a1 = if n == libc::SYS_fchdir {
            c_long::from(crate::lazy::kernel(a1 as c_int))
        } else {
            a1
        };
        // SAFETY: as above, the descriptor materialized.
        let call = || unsafe { real::syscall(n, a1, a2, a3, a4, a5, a6) };
        return crate::cwd::changing(|| {
            if n == libc::SYS_setns {
                changing(call)
            } else {
                call()
            }
        });
    }
    if !CREDENTIAL_CALLS.contains(&n) {
        return call();
    }
    if n == libc::SYS_umask {
        // The kernel's umask is now `a1`: the copy follows.
        let r = call();
        if r >= 0 {
            UMASK.store(a1 as u32 & 0o777, Ordering::Relaxed);
        }
        changed();
        return r;
    }
    changing(call)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_kept_until_a_change_and_read_again_after_it() {
        let a = get(Ids::Effective).expect("ids");
        let b = get(Ids::Effective).expect("ids");
        assert!(Rc::ptr_eq(&a, &b), "the second call asked the kernel again");
        // SAFETY: no memory involved.
        assert_eq!(a.uid, unsafe { libc::geteuid() });
        changed();
        let c = get(Ids::Effective).expect("ids");
        assert!(!Rc::ptr_eq(&a, &c), "a change kept the old copy");
        assert_eq!(*a, *c);
        // The umask through the interposer: the next creation's copy
        // follows it, and the other slots are read again too.
        // SAFETY: no memory involved.
        let old = unsafe { umask(0o027) };
        assert_eq!(get(Ids::Creator).expect("umask known").umask, 0o027);
        assert!(!Rc::ptr_eq(&c, &get(Ids::Effective).expect("ids")));
        // SAFETY: as above.
        unsafe { umask(old) };
        assert_eq!(get(Ids::Creator).expect("umask known").umask, old & 0o777);
    }
}
