//! The current directory as the kernel holds it: its inode in the pool,
//! cached, so a relative path is walked from there, as the kernel walks
//! it (docs/KERNEL-FREE.md, "Built: relative paths from the current
//! directory's inode").
//!
//! Before, every relative path cost a getcwd and a walk from the mount's
//! root down to the current directory (the same first inodes for every
//! thread): a preloaded `git status` spent a fifth of its time there. The
//! kernel keeps the current directory as an inode, not a string; so does
//! this cache, filled by one `statx` of the current directory itself
//! (AT_EMPTY_PATH: no lookup, no permission check, as the kernel needs
//! none to use its own reference). The inode number the mount reports is
//! the pool's, and it cannot be handed to another inode while it is the
//! kernel's current directory: the kernel holds a reference, which the
//! server keeps the inode for even once removed ("Built: removals of
//! inodes the kernel holds").
//!
//! **Who invalidates it.** The current directory changes only by chdir
//! or fchdir, which this library sees when the program calls them
//! (interposed here), through `syscall(SYS_chdir)` and
//! `syscall(SYS_fchdir)` (creds.rs's `syscall` interposer), and inside
//! glibc where the library does not see the call: fts_read,
//! fts_children and fts_close without FTS_NOCHDIR, nftw with FTW_CHDIR,
//! daemon, and setns into a mount namespace. Each is wrapped by
//! [`changing`]: for its length the cache is not used by any thread (a
//! relative path takes the getcwd route, as before), and the generation
//! moves before and after it, so a copy filled while it ran is not kept.
//! A thread keeps its own copy tagged with the generation it read before
//! asking the kernel (as creds.rs does for credentials): a thread that
//! left CLONE_FS (unshare) has a current directory of its own, and each
//! thread's copy is what its own `statx` saw.
//!
//! A call racing another thread's chdir gets the old directory or the
//! new one, as a system call racing chdir does in the kernel. The
//! directory renamed or removed by anyone: the copy still names the
//! kernel's inode (a removed one is empty, and the engine refuses
//! entries in it with ENOENT, as the kernel). fork: the child inherits the
//! cwd and the forking thread's copy, still true; exec starts anew.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};

use crate::mounts::{self, Mount};
use crate::{lazy, real};

/// Moved before and after every change of the current directory.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// Changes in progress: while non-zero the cache is not used.
static CHANGING: AtomicU32 = AtomicU32::new(0);

/// The current directory, as this library uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cwd {
    /// On served mount `mount` (an index of mounts::all), inode `ino`.
    At { mount: usize, ino: u64 },
    /// Not on any FUSE mount: no relative path is served.
    Off,
    /// Not known (a change in progress, the kernel could not say, a
    /// mount the cache does not serve): the getcwd route.
    Unknown,
}

thread_local! {
    static CACHE: Cell<Option<(u64, Cwd)>> = const { Cell::new(None) };
}

/// The current directory: this thread's copy if nothing changed since it
/// was made, else the kernel's answer.
pub fn current() -> Cwd {
    if CHANGING.load(SeqCst) != 0 {
        return Cwd::Unknown;
    }
    let generation = GENERATION.load(SeqCst);
    let cached = CACHE.try_with(|c| c.get()).ok().flatten();
    if let Some((g, cwd)) = cached {
        if g == generation {
            return cwd;
        }
    }
    let cwd = ask_kernel();
    // A change that began while the kernel answered: not kept (the next
    // call asks again).
    if CHANGING.load(SeqCst) != 0 || GENERATION.load(SeqCst) != generation {
        return Cwd::Unknown;
    }
    let _ = CACHE.try_with(|c| c.set(Some((generation, cwd))));
    cwd
}

/// The kernel's current directory: its device and inode.
fn ask_kernel() -> Cwd {
    // SAFETY: all-zero is a valid statx; an empty NUL-terminated path.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    let flags = libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC;
    let r = unsafe {
        real::statx(
            libc::AT_FDCWD,
            c"".as_ptr(),
            flags,
            libc::STATX_INO,
            &mut sx,
        )
    };
    if r != 0 || sx.stx_mask & libc::STATX_INO == 0 {
        return Cwd::Unknown;
    }
    let dev = libc::makedev(sx.stx_dev_major, sx.stx_dev_minor);
    on_mount(dev, sx.stx_ino)
}

/// Where inode `ino` of device `dev` is: one mount of that device (two,
/// a bind mount: which one the kernel's cwd is under is not known here),
/// with no mount under it (paths are not resolved in those).
fn on_mount(dev: u64, ino: u64) -> Cwd {
    let mut found = mounts::all()
        .iter()
        .enumerate()
        .filter(|(_, m)| m.dev == dev);
    match (found.next(), found.next()) {
        (None, _) => Cwd::Off,
        (Some((i, m)), None) if servable(m) => Cwd::At { mount: i, ino },
        _ => Cwd::Unknown,
    }
}

fn servable(m: &Mount) -> bool {
    !m.has_submounts
}

/// The generation now: read before [`current`], and given to
/// [`unchanged_since`] after a call that must see the same directory.
pub fn generation() -> u64 {
    GENERATION.load(SeqCst)
}

/// Whether no change of the current directory began since `generation`
/// was read (so a getcwd made meanwhile names the directory
/// [`current`] answered then).
pub fn unchanged_since(generation: u64) -> bool {
    CHANGING.load(SeqCst) == 0 && GENERATION.load(SeqCst) == generation
}

/// Run `f`, which may change the current directory: no copy is used
/// while it runs, and none made before its end is kept. Before it, the
/// opens still in flight from the old directory finish and every
/// placeholder kept by a path relative to it gets its kernel file
/// (`settle`). Keeps `f`'s errno.
pub fn changing<R>(f: impl FnOnce() -> R) -> R {
    CHANGING.fetch_add(1, SeqCst);
    GENERATION.fetch_add(1, SeqCst);
    settle();
    let r = f();
    GENERATION.fetch_add(1, SeqCst);
    CHANGING.fetch_sub(1, SeqCst);
    r
}

/// Served opens from the current directory in flight, in this process
/// ([`Opening`]).
static OPENING: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// Of [`OPENING`], this thread's (a signal handler's chdir inside an
    /// open must not wait for that open).
    static OWN_OPENING: Cell<u32> = const { Cell::new(0) };
}

/// A served open of a path relative to the current directory, from
/// before it checks that no change of the directory began since its walk
/// read it (`path::Target::kept`) until its placeholder is registered
/// with that relative path. A change waits for it (`settle`), so the
/// change's materialization finds the placeholder: either the open saw
/// the change begin (and keeps no relative path), or the change sees the
/// open in flight. (Both sides' counters are SeqCst: the open's increment
/// comes before its check, the change's generation before its read of
/// the count.)
pub struct Opening(());

impl Opening {
    pub fn begin() -> Opening {
        OPENING.fetch_add(1, SeqCst);
        let _ = OWN_OPENING.try_with(|n| n.set(n.get() + 1));
        Opening(())
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        let _ = OWN_OPENING.try_with(|n| n.set(n.get() - 1));
        OPENING.fetch_sub(1, SeqCst);
    }
}

/// A change of the current directory is beginning (the generation moved):
/// wait for the opens from the old one in flight on other threads, then
/// materialize the placeholders kept by relative paths while the kernel
/// still resolves them from the old directory (lazy.rs). An open that
/// never ends (a thread stopped inside it) is waited for a second: its
/// placeholder may then stay lazy with a relative path, which a later
/// materialization's inode check refuses if the path names another file.
/// Keeps errno.
fn settle() {
    let own = OWN_OPENING.try_with(|n| n.get()).unwrap_or(0);
    // SAFETY: this thread's errno.
    let errno = unsafe { *libc::__errno_location() };
    let t = std::time::Instant::now();
    while OPENING.load(SeqCst) > own && t.elapsed() < std::time::Duration::from_secs(1) {
        std::thread::yield_now();
    }
    lazy::settle_relative();
    crate::names::set_errno(errno);
}

/// In the child after fork: it has one thread, whose copy is still true;
/// a change another thread of the parent had in progress is over (the
/// child's cwd is whatever the kernel copied).
pub fn after_fork() {
    CHANGING.store(0, SeqCst);
    // Only this thread's opens can still be in flight.
    OPENING.store(OWN_OPENING.try_with(|n| n.get()).unwrap_or(0), SeqCst);
    GENERATION.fetch_add(1, SeqCst);
}

#[no_mangle]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    // SAFETY: as called.
    changing(|| unsafe { real::chdir(path) })
}

/// A directory placeholder gets its kernel file first (lazy.rs).
#[no_mangle]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    let fd = lazy::kernel(fd);
    // SAFETY: as called.
    changing(|| unsafe { real::fchdir(fd) })
}

/// glibc's daemon changes to "/" (unless asked not to) with its own
/// chdir.
#[no_mangle]
pub unsafe extern "C" fn daemon(nochdir: c_int, noclose: c_int) -> c_int {
    // SAFETY: as called.
    changing(|| unsafe { real::daemon(nochdir, noclose) })
}

/// The head of glibc's `FTS` (fts.h; FTS64 has the same layout on
/// x86-64), up to the options fts_open was given.
#[repr(C)]
struct FtsHead {
    cur: *mut c_void,
    child: *mut c_void,
    array: *mut c_void,
    dev: libc::dev_t,
    path: *mut c_char,
    rfd: c_int,
    pathlen: c_int,
    nitems: c_int,
    compar: *mut c_void,
    options: c_int,
}

/// fts.h's FTS_NOCHDIR: the walk never changes directory.
const FTS_NOCHDIR: c_int = 0x0004;

/// Whether a walk of `fts` may change the current directory: not with
/// FTS_NOCHDIR (glibc sets it itself when it cannot keep the starting
/// directory open, at fts_open, before any change).
fn fts_chdirs(fts: *mut c_void) -> bool {
    if fts.is_null() {
        return false;
    }
    // SAFETY: the program's FTS, as fts_open returned it (glibc reads the
    // same field in the call that follows).
    let options = unsafe { (*fts.cast::<FtsHead>()).options };
    options & FTS_NOCHDIR == 0
}

macro_rules! fts_call {
    ($($name:ident ( fts $(, $a:ident : $t:ty)* ) -> $r:ty;)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(fts: *mut c_void $(, $a: $t)*) -> $r {
            // SAFETY: as called.
            let call = || unsafe { real::$name(fts $(, $a)*) };
            if fts_chdirs(fts) {
                changing(call)
            } else {
                call()
            }
        }
    )*};
}

fts_call! {
    fts_read(fts) -> *mut c_void;
    fts64_read(fts) -> *mut c_void;
    fts_children(fts, options: c_int) -> *mut c_void;
    fts64_children(fts, options: c_int) -> *mut c_void;
    fts_close(fts) -> c_int;
    fts64_close(fts) -> c_int;
}

/// ftw.h's FTW_CHDIR: nftw changes into each directory before calling the
/// program's function on its entries (and back at the end).
const FTW_CHDIR: c_int = 4;

#[no_mangle]
pub unsafe extern "C" fn nftw(
    dir: *const c_char,
    f: *const c_void,
    fds: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: as called.
    let call = || unsafe { real::nftw(dir, f, fds, flags) };
    if flags & FTW_CHDIR != 0 {
        changing(call)
    } else {
        call()
    }
}

#[no_mangle]
pub unsafe extern "C" fn nftw64(
    dir: *const c_char,
    f: *const c_void,
    fds: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: as called.
    let call = || unsafe { real::nftw64(dir, f, fds, flags) };
    if flags & FTW_CHDIR != 0 {
        changing(call)
    } else {
        call()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_kept_until_a_change_and_never_used_during_one() {
        // No FUSE mount in a unit test: the cwd is off every mount, and
        // that answer is cached until a change.
        assert_eq!(current(), Cwd::Off);
        let g = GENERATION.load(SeqCst);
        assert_eq!(current(), Cwd::Off);
        assert_eq!(GENERATION.load(SeqCst), g, "a read moved the generation");
        let during = changing(current);
        assert_eq!(during, Cwd::Unknown, "the cache was used during a change");
        assert!(GENERATION.load(SeqCst) >= g + 2);
        assert_eq!(current(), Cwd::Off);
        // fts and nftw without their chdir modes: no change.
        assert!(!fts_chdirs(std::ptr::null_mut()));
    }

    #[test]
    fn the_fts_head_has_glibcs_layout() {
        // fts.h: three pointers, dev_t, a pointer, three ints, the
        // compare function, then the options.
        assert_eq!(std::mem::offset_of!(FtsHead, options), 64);
    }
}
